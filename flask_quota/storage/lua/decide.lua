-- Decide every tier of one request atomically, all-or-nothing.
-- KEYS[i]: the state key of tier i.
-- ARGV[1]: "decide" or "peek" (peek never writes).
-- ARGV[2]: "" to use the Redis server clock (production); an integer
--          microsecond time only from flask_quota.testing.
-- ARGV[3 + 5*(i-1) ...]: algorithm code, limit, window_us, capacity, cost; the
--          rate's three numbers in hexadecimal (see redis.check_args). A code
--          starting with "~" ("~tb") marks a shadow check: its denial does not deny
--          (all_allowed ignores it) and it is charged only when it allows. A
--          calendar window ("cw") has "prev:start:end:next" as its window_us.
-- Returns {now, all_allowed, then per tier: allowed, remaining, reset_us, retry_us}.
--
-- An algorithm returns allowed, remaining, reset_us, retry_us and, when it allows
-- and has something to store, the state and its TTL in microseconds (a function for
-- the sliding log, whose write is more than one SET). Values, not a table and a
-- closure per tier: this script runs on every request, and Redis is shared by
-- every web server, so what it allocates is paid for by all of them.
local algorithms = {
  tb = token_bucket,
  fw = fixed_window,
  swl = sliding_window_log,
  swc = sliding_window_counter,
}

local now = script_now(ARGV[2])

-- Both tables are made with room for the usual request (the gate and three tiers):
-- a table that grows reallocates each time it doubles, about 4% of the script's
-- instructions. The nils only reserve slots; Redis ends the reply at the first nil.
local reply, n = {now, 1, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
                  nil, nil}, 2
local writes, w = {nil, nil, nil, nil, nil, nil, nil, nil, nil}, 0 -- key, state, ttl of each
                                                                  -- check that allowed
for i, key in ipairs(KEYS) do
  local a = 3 + 5 * (i - 1)
  local code = ARGV[a]
  local shadow = string.byte(code, 1) == 126 -- "~"
  if shadow then code = string.sub(code, 2) end
  local allowed, remaining, reset, retry, state, ttl
  if code == 'blk' then -- the gate has no rate: its arguments are not parsed
    allowed, remaining, reset, retry = block_gate(key, now)
  elseif code == 'ls' then -- a lease: limit is its slots, window its lifetime
    allowed, remaining, reset, retry, state = lease_gate(key, now, tonumber(ARGV[a + 1], 16),
      tonumber(ARGV[a + 2], 16), tonumber(ARGV[a + 4]))
  elseif code == 'cw' then -- a calendar window: its window argument is its edges
    allowed, remaining, reset, retry, state, ttl = calendar_window(key, now,
      tonumber(ARGV[a + 1], 16), ARGV[a + 2], tonumber(ARGV[a + 4]))
  else
    local algorithm = algorithms[code]
    if algorithm == nil then return redis.error_reply('flask-quota: unknown algorithm ' .. tostring(ARGV[a])) end
    allowed, remaining, reset, retry, state, ttl = algorithm(key, now, tonumber(ARGV[a + 1], 16),
      tonumber(ARGV[a + 2], 16), tonumber(ARGV[a + 3], 16), tonumber(ARGV[a + 4]))
  end
  if allowed == 0 then
    if not shadow then reply[2] = 0 end
  elseif state then -- a shadow check that would deny is not charged
    writes[w + 1], writes[w + 2], writes[w + 3] = key, state, ttl
    w = w + 3
  end
  reply[n + 1], reply[n + 2], reply[n + 3], reply[n + 4] = allowed, remaining, reset, retry
  n = n + 4
end

if reply[2] == 1 and ARGV[1] == 'decide' then
  for j = 1, w, 3 do
    local state = writes[j + 1]
    if type(state) == 'function' then state() else put(writes[j], state, writes[j + 2]) end
  end
end

return reply
