-- Decide every tier of one request atomically, all-or-nothing.
-- KEYS[i]: the state key of tier i.
-- ARGV[1]: the checks, tier i's the i-th, separated by ";" (redis.decide_args); each
--          "code limit window_us capacity cost [wait_us]" (redis.check_args): the rate's
--          three numbers in hexadecimal, the cost in decimal, and for a caller who may
--          wait (wait=, delay=) how long, in hexadecimal: a cost that fits within it is
--          reserved, allowed with its retry_us the wait (the reply is then the long form). A code starting with "~" ("~tb")
--          marks a shadow check: its denial does not deny (all_allowed ignores it) and
--          it is charged only when it allows. A calendar window ("cw") has
--          "prev:start:end:next" as its window_us.
-- ARGV[2]: "decide" (absent: the same) or "peek" (peek never writes).
-- ARGV[3]: an integer microsecond time, only from flask_quota.testing; absent or ""
--          for the Redis server clock (production). Production sends ARGV[1] alone:
--          every argument is a Lua string the server makes on every call.
-- Returns {now, all_allowed, then per tier: allowed, remaining, reset_us, retry_us}
-- (core/reply.py's layout) when a check denied, and when every check allowed the
-- short form {now, 2, then per tier: remaining, reset_us}, leaving out a block gate
-- that lets by as the first check (its entry is 1, 0, now, 0): each integer of the
-- reply is work for the server (Reply.read rebuilds the long form).
--
-- An algorithm returns allowed, remaining, reset_us, retry_us and, when it allows
-- and has something to store, the state and its TTL in microseconds (a function for
-- the sliding log, whose write is more than one SET). Values, not a table and a
-- closure per tier: this script runs on every request, and Redis is shared by
-- every web server, so what it allocates is paid for by all of them.
-- Every state stored as a string is read in one MGET before any tier is decided (the
-- block gate's value too: only a caller who is blocked costs a PTTL). The sliding log
-- (a list) and a lease (a sorted set, its key naming a member) read their own.
local KNOWN = {tb = true, fw = true, swc = true, swl = true, cw = true, blk = true, ls = true,
  cap = true, cr = true}

-- A check's string, parsed: {code, shadow, limit, window, capacity, cost, interval,
-- tau, full_ttl, full_px, wait} (interval to full_px a token bucket's: a bucket that
-- was full stores its state for cost * interval, full_ttl, so that TTL's PX argument,
-- full_px, is printed once here and not on every such request; wait 0 unless the
-- caller may wait), or nil if it is not one.
local function spec_of(arg)
  -- The usual check first (no wait): under EVAL every call parses its checks again.
  local code, limit, window, capacity, cost =
    string.match(arg, '^(~?%l+) (%x+) ([-:%x]+) (%x+) (-?%d+)$')
  local wait = '0'
  if code == nil then
    code, limit, window, capacity, cost, wait =
      string.match(arg, '^(~?%l+) (%x+) ([-:%x]+) (%x+) (-?%d+) (%x+)$')
  end
  if code == nil then return nil end
  local shadow = string.byte(code, 1) == 126 -- "~"
  if shadow then code = string.sub(code, 2) end
  if not KNOWN[code] then return nil end
  limit, capacity, cost = tonumber(limit, 16), tonumber(capacity, 16), tonumber(cost)
  if code ~= 'cw' then window = tonumber(window, 16) end -- a calendar's stays its edges
  local spec = {code, shadow, limit, window, capacity, cost, false, false, false, false,
    tonumber(wait, 16)}
  if code == 'tb' then
    spec[7] = floor(window / limit)
    spec[8] = capacity * spec[7]
    spec[9] = cost * spec[7]
    spec[10] = format('%d', ceil(spec[9] / 1000))
  end
  return spec
end

-- A request's checks, parsed (spec_of), in ARGV's order; or nil and the string that is
-- not a check. A route sends the same checks argument on every request, so under FCALL
-- (whose library stays loaded) each is parsed once and kept: one string to look up, not
-- five numbers per tier to read. Bounded: past SHAPES_MAX the table starts over. (Under
-- EVAL the whole chunk runs on every call, so the table lasts one call.)
local SHAPES, shapes_held, SHAPES_MAX = {}, 0, 1000

local function shape_of(checks)
  local known = SHAPES[checks]
  if known then return known end
  local shape = {}
  for part in string.gmatch(checks, '[^;]+') do
    local spec = spec_of(part)
    if spec == nil then return nil, part end
    shape[#shape + 1] = spec
  end
  if shapes_held >= SHAPES_MAX then SHAPES, shapes_held = {}, 0 end
  SHAPES[checks], shapes_held = shape, shapes_held + 1
  return shape
end

-- The short reply of the checks before check i (all allowed) as long entries, when a
-- check denies or reserves (its retry must be told): {now, 1, then allowed, remaining,
-- reset, retry per check}; a first block gate left out had let by.
local function long_form(short, m, now, i, gate_first)
  local reply, n = {now, 1}, 2
  if i > 1 and gate_first and m - 2 < 2 * (i - 1) then
    reply[3], reply[4], reply[5], reply[6], n = 1, 0, now, 0, 6
  end
  for j = 3, m, 2 do
    reply[n + 1], reply[n + 2], reply[n + 3], reply[n + 4] = 1, short[j], short[j + 1], 0
    n = n + 4
  end
  return reply, n
end

local function decide(KEYS, ARGV)
  local now = script_now(ARGV[3])

  -- The tables are made with room for the usual request (the gate and three tiers):
  -- a table that grows reallocates each time it doubles, about 4% of the script's
  -- instructions. The nils only reserve slots; Redis ends the reply at the first nil.
  local reply, n = {now, 2, nil, nil, nil, nil, nil, nil}, 2
  local long = false -- the reply's form: long once a check denied
  -- key, state, PX (false: delete) and how to write it (0: over a state read, 1: a
  -- state read as absent, 2: a function) of each check that allowed
  local writes, w, fresh = {nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil}, 0, 0
  local call = redis.call
  local shape, bad = shape_of(ARGV[1])
  if shape == nil then return redis.error_reply('flask-quota: unknown algorithm ' .. bad) end
  -- Every key is read, in one MGET: a sliding log's list or a lease's set is read as
  -- absent there, and the log and the lease read their own.
  local values = KEYS
  if KEYS[1] then values = call('MGET', unpack(KEYS)) end

  for i = 1, #KEYS do
    local spec = shape[i]
    if spec == nil then return redis.error_reply('flask-quota: a key without a check') end
    local key, code, raw = KEYS[i], spec[1], values[i] -- raw: false when absent
    local allowed, remaining, reset, retry, state, ttl
    if code == 'tb' then
      allowed, remaining, reset, retry, state, ttl = token_bucket(raw, now, spec[7], spec[8],
        spec[4], spec[5], spec[6], spec[11])
    elseif code == 'blk' then -- the gate has no rate; an absent key (the usual) lets by
      if raw then allowed, remaining, reset, retry = block_gate(key, raw, now)
      else allowed, remaining, reset, retry = 1, 0, now, 0 end
    elseif code == 'fw' then
      allowed, remaining, reset, retry, state, ttl = fixed_window(raw, now, spec[3], spec[4],
        spec[5], spec[6], spec[11])
    elseif code == 'swc' then
      allowed, remaining, reset, retry, state, ttl = sliding_window_counter(raw, now, spec[3],
        spec[4], spec[5], spec[6], spec[11])
    elseif code == 'ls' or code == 'cap' then -- a lease (the fleet's capacity is one):
      -- limit is its slots, window its lifetime
      allowed, remaining, reset, retry, state = lease_gate(key, now, spec[3], spec[4], spec[6])
    elseif code == 'cr' then -- prepaid credits (credits.lua): a balance, not a rate
      allowed, remaining, reset, retry, state, ttl = credits_gate(raw, now, spec[6])
    elseif code == 'cw' then -- a calendar window: its window is its edges
      allowed, remaining, reset, retry, state, ttl = calendar_window(raw, now, spec[3], spec[4],
        spec[6])
    else -- swl
      allowed, remaining, reset, retry, state = sliding_window_log(key, now, spec[3], spec[4],
        spec[5], spec[6], spec[11])
    end
    if not long and (allowed == 0 or retry > 0) then -- a denial, or a reservation's wait
      long = true
      reply, n = long_form(reply, n, now, i, shape[1][1] == 'blk')
    end
    if allowed == 0 then
      if not spec[2] then reply[2] = 0 end
      -- A denial writes nothing, but a state repaired on reading (a token bucket read
      -- through a clock that stepped back), which charges nothing: see token_bucket.lua.
      if state and ARGV[2] ~= 'peek' then
        call('SET', key, state, 'PX', format('%d', ceil(ttl / 1000)))
      end
    -- A shadow check that would deny is not charged. Only what changed is written: a
    -- state equal to the stored one keeps its key (and its expiry, which the state
    -- fixes), and an empty state of an absent key has nothing to delete.
    elseif state then
      if ttl == nil then -- a function: the log's or the lease's own writes
        writes[w + 1], writes[w + 2], writes[w + 4] = key, state, 2
        w = w + 4
      elseif state == raw then -- unchanged
      else
        -- A TTL is sent to SET's PX in milliseconds, rounded up, as a string: Lua's %d
        -- costs less than the %.17g Redis would print a number argument with.
        local px = false
        if ttl <= 0 then -- nothing worth keeping
        elseif ttl == spec[9] then px = spec[10]
        else px = format('%d', ceil(ttl / 1000)) end
        if raw then
          writes[w + 1], writes[w + 2], writes[w + 3], writes[w + 4] = key, state, px, 0
          w = w + 4
        elseif px then
          writes[w + 1], writes[w + 2], writes[w + 3], writes[w + 4] = key, state, px, 1
          w, fresh = w + 4, fresh + 1
        end
      end
    end
    if long then
      reply[n + 1], reply[n + 2], reply[n + 3], reply[n + 4] = allowed, remaining, reset, retry
      n = n + 4
    elseif i > 1 or code ~= 'blk' then
      reply[n + 1], reply[n + 2] = remaining, reset
      n = n + 2
    end
  end

  if reply[2] ~= 0 and ARGV[2] ~= 'peek' then
    -- MGET answers nil for a key of another type as for a missing one, so a state read
    -- as absent is written first, with NX: a key that refuses it holds something else,
    -- and the call fails (as the GET it replaces did) with nothing written: the states
    -- written before it were absent, so deleting them undoes them. Never overwritten.
    for j = 1, fresh > 0 and w or 0, 4 do
      if writes[j + 3] == 1 and not call('SET', writes[j], writes[j + 1], 'PX',
                                         writes[j + 2], 'NX') then
        for u = 1, j - 1, 4 do
          if writes[u + 3] == 1 then call('DEL', writes[u]) end
        end
        return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
      end
    end
    for j = 1, fresh * 4 < w and w or 0, 4 do -- the rest, if any
      local how = writes[j + 3]
      if how == 0 then
        local px = writes[j + 2]
        if px then
          call('SET', writes[j], writes[j + 1], 'PX', px)
        else
          call('DEL', writes[j])
        end
      elseif how == 2 then
        writes[j + 1]()
      end
    end
  end

  return reply
end
