-- The decide script's entry for EVAL/EVALSHA (Redis runs the whole chunk on every call).
return decide(KEYS, ARGV)
