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
-- Every state stored as a string is read in one MGET before any tier is decided (the
-- block gate's value too: only a caller who is blocked costs a PTTL). The sliding log
-- (a list) and a lease (a sorted set, its key naming a member) read their own.
local algorithms = {
  tb = token_bucket,
  fw = fixed_window,
  swc = sliding_window_counter,
}
local OWN_READS = {swl = true, ['~swl'] = true, ls = true, ['~ls'] = true}

local function decide(KEYS, ARGV)
  local now = script_now(ARGV[2])

  -- The tables are made with room for the usual request (the gate and three tiers):
  -- a table that grows reallocates each time it doubles, about 4% of the script's
  -- instructions. The nils only reserve slots; Redis ends the reply at the first nil.
  local reply, n = {now, 1, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
                    nil, nil, nil}, 2
  -- key, state, ttl and "read as absent" of each check that allowed
  local writes, w = {nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil}, 0
  local names, at, m = {nil, nil, nil, nil}, {nil, nil, nil, nil}, 0 -- MGET's keys; KEYS[i]'s
  for i, key in ipairs(KEYS) do                                     -- place among them
    if not OWN_READS[ARGV[3 + 5 * (i - 1)]] then
      m = m + 1
      names[m], at[i] = key, m
    end
  end
  local values = {}
  if m > 0 then values = redis.call('MGET', unpack(names, 1, m)) end

  for i, key in ipairs(KEYS) do
    local a = 3 + 5 * (i - 1)
    local code = ARGV[a]
    local shadow = string.byte(code, 1) == 126 -- "~"
    if shadow then code = string.sub(code, 2) end
    local raw = nil -- nil: not read here; false: read, absent
    if at[i] then raw = values[at[i]] end
    local allowed, remaining, reset, retry, state, ttl
    if code == 'blk' then -- the gate has no rate: its arguments are not parsed
      allowed, remaining, reset, retry = block_gate(key, raw, now)
    elseif code == 'ls' then -- a lease: limit is its slots, window its lifetime
      allowed, remaining, reset, retry, state = lease_gate(key, now, tonumber(ARGV[a + 1], 16),
        tonumber(ARGV[a + 2], 16), tonumber(ARGV[a + 4]))
    elseif code == 'cw' then -- a calendar window: its window argument is its edges
      allowed, remaining, reset, retry, state, ttl = calendar_window(raw, now,
        tonumber(ARGV[a + 1], 16), ARGV[a + 2], tonumber(ARGV[a + 4]))
    elseif code == 'swl' then
      allowed, remaining, reset, retry, state = sliding_window_log(key, now,
        tonumber(ARGV[a + 1], 16), tonumber(ARGV[a + 2], 16), tonumber(ARGV[a + 3], 16),
        tonumber(ARGV[a + 4]))
    else
      local algorithm = algorithms[code]
      if algorithm == nil then return redis.error_reply('flask-quota: unknown algorithm ' .. tostring(ARGV[a])) end
      allowed, remaining, reset, retry, state, ttl = algorithm(raw, now, tonumber(ARGV[a + 1], 16),
        tonumber(ARGV[a + 2], 16), tonumber(ARGV[a + 3], 16), tonumber(ARGV[a + 4]))
    end
    if allowed == 0 then
      if not shadow then reply[2] = 0 end
    -- A shadow check that would deny is not charged. Only what changed is written: a
    -- state equal to the stored one keeps its key (and its expiry, which the state
    -- fixes), and an empty state of an absent key has nothing to delete.
    elseif state and state ~= raw and not (raw == false and ttl <= 0) then
      writes[w + 1], writes[w + 2], writes[w + 3], writes[w + 4] = key, state, ttl, raw == false
      w = w + 4
    end
    reply[n + 1], reply[n + 2], reply[n + 3], reply[n + 4] = allowed, remaining, reset, retry
    n = n + 4
  end

  if reply[2] == 1 and ARGV[1] == 'decide' then
    -- MGET answers nil for a key of another type as for a missing one, so a state read
    -- as absent is written first, with NX: a key that refuses it holds something else,
    -- and the call fails (as the GET it replaces did) with nothing written: the states
    -- written before it were absent, so deleting them undoes them. Never overwritten.
    for j = 1, w, 4 do
      if writes[j + 3] and not redis.call('SET', writes[j], writes[j + 1], 'PX',
                                          math.ceil(writes[j + 2] / 1000), 'NX') then
        for u = 1, j - 1, 4 do
          if writes[u + 3] then redis.call('DEL', writes[u]) end
        end
        return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
      end
    end
    for j = 1, w, 4 do
      if not writes[j + 3] then
        local state = writes[j + 1]
        if type(state) == 'function' then state() else put(writes[j], state, writes[j + 2]) end
      end
    end
  end

  return reply
end
