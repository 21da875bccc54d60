-- A block gate: denies while the caller's block key lives; never writes.
-- Mirrors flask_quota.core.algorithms.block_gate (the key's TTL is the rest of the block).
-- Takes no rate: decide.lua does not parse the gate's arguments. raw is the key's value
-- from decide.lua's MGET: false (no block, the usual case) needs no PTTL.
local function block_gate(key, raw, now)
  if not raw then return 1, 0, now, 0 end
  local ttl = redis.call('PTTL', key)
  if ttl > 0 then return 0, 0, now + ttl * 1000, ttl * 1000 end
  return 1, 0, now, 0
end
