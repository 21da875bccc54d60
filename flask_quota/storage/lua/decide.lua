-- Decide every tier of one request atomically, all-or-nothing.
-- KEYS[i]: the state key of tier i.
-- ARGV[1]: "decide" or "peek" (peek never writes).
-- ARGV[2]: "" to use the Redis server clock (production); an integer
--          microsecond time only from flask_quota.testing.
-- ARGV[3 + 5*(i-1) ...]: algorithm code, limit, window_us, capacity, cost. A code
--          starting with "~" ("~tb") marks a shadow check: its denial does not deny
--          (all_allowed ignores it) and it is charged only when it allows.
-- Returns {now, all_allowed, then per tier: allowed, remaining, reset_us, retry_us}.
local algorithms = {
  tb = token_bucket,
  fw = fixed_window,
  swl = sliding_window_log,
  swc = sliding_window_counter,
  blk = block_gate,
}

local now = script_now(ARGV[2])

local results = {}
local all_allowed = 1
for i, key in ipairs(KEYS) do
  local a = 3 + 5 * (i - 1)
  local code = ARGV[a]
  local shadow = string.byte(code, 1) == 126 -- "~"
  if shadow then code = string.sub(code, 2) end
  local algorithm = algorithms[code]
  if algorithm == nil then return redis.error_reply('flask-quota: unknown algorithm ' .. tostring(ARGV[a])) end
  local r = algorithm(key, now, tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]),
                      tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]))
  if r[1] == 0 and not shadow then all_allowed = 0 end
  results[i] = r
end

if all_allowed == 1 and ARGV[1] == 'decide' then
  for _, r in ipairs(results) do
    if r[1] == 1 then r[5]() end -- a shadow check that would deny is not charged
  end
end

local reply = {now, all_allowed}
for _, r in ipairs(results) do
  reply[#reply + 1] = r[1]
  reply[#reply + 1] = r[2]
  reply[#reply + 1] = r[3]
  reply[#reply + 1] = r[4]
end
return reply
