-- One flush's usage counts for one minute (see flask_quota/storage/redis_usage.py, RedisUsageSink).
-- The minute keeps three keys however many callers it saw, all in one hash slot:
-- KEYS[1]: hash "tier|a" / "tier|d" / "tier|s" (allowed, denied, shadow-denied) -> count, the minute's totals ("*" counts requests)
-- KEYS[2]: sorted set identity -> requests, trimmed to its ARGV[2] busiest members
-- KEYS[3]: hash identity -> JSON {"p": plan, "c": {"tier|a": count, ...}}, for those
--          members only (trimmed with them)
-- ARGV[1]: TTL in seconds; ARGV[2]: identities kept; ARGV[3]: n, then n pairs
--   (totals field, count); then per identity: identity, requests, plan ("" when
--   unknown), its tier counts as a JSON object.
-- Returns how many identities were trimmed, then Redis's TIME (seconds, microseconds):
-- the sink files its next flush by it (the storage's clock, not its server's).
if redis.replicate_commands then pcall(redis.replicate_commands) end -- writes follow TIME
local now = redis.call('TIME')
local ttl, keep, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local i = 4
for _ = 1, n do
  redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
  i = i + 2
end
while i <= #ARGV do
  local who, requests, plan = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  redis.call('ZINCRBY', KEYS[2], requests, who)
  local raw = redis.call('HGET', KEYS[3], who)
  local entry = raw and cjson.decode(raw) or {c = {}}
  if plan ~= '' then entry.p = plan end
  for field, count in pairs(cjson.decode(ARGV[i + 3])) do
    entry.c[field] = (entry.c[field] or 0) + count
  end
  redis.call('HSET', KEYS[3], who, cjson.encode(entry))
  i = i + 4
end
-- Only the busiest identities matter to the dashboard: drop the rest, and their details.
local gone = redis.call('ZRANGE', KEYS[2], 0, -keep - 1)
if #gone > 0 then
  redis.call('ZREMRANGEBYRANK', KEYS[2], 0, -keep - 1)
  for j = 1, #gone, 500 do -- unpack() has a small stack
    redis.call('HDEL', KEYS[3], unpack(gone, j, math.min(j + 499, #gone)))
  end
end
for _, key in ipairs(KEYS) do
  redis.call('EXPIRE', key, ttl)
end
return {#gone, tonumber(now[1]), tonumber(now[2])}
