-- Give back what decide.lua charged, for Redis Cluster's all-or-nothing across slots.
-- A request whose tiers live in different slots is decided one slot at a time;
-- when one slot denies, the slots that allowed call this to undo their charge.
-- KEYS[i]: a key decide.lua charged (a lease's names its member: see lease.lua).
-- ARGV[1]: "" for the Redis server clock; an integer microsecond time only in tests.
-- ARGV[2 + 6*(i-1) ...]: algorithm code, limit, window_us, capacity, cost, charged_at
--   (charged_at is the "now" that decide.lua returned for the charge).
-- Each undo is the inverse of the charge, applied to whatever the key holds now, so
-- charges made by other requests in between stay intact. Counters (fw, swl, swc)
-- come back exactly; the token bucket keeps the time that passed since the charge
-- (see refund_bucket), so a refund never gives more than was taken.
-- Returns the number of keys changed.
local now = script_now(ARGV[1])

-- GCRA's max(tat, now) forgets credit it cannot see, so an exact inverse does not
-- exist once others have charged. Subtracting the charge minus the time since it
-- was made is an upper bound of the state without our charge: never over-credit.
local function refund_bucket(key, limit, window, capacity, cost, charged_at)
  local interval = math.floor(window / limit)
  local tau = capacity * interval
  local tat = bucket_tat(redis.call('GET', key), now, tau)
  if tat == nil or tat <= now then return 0 end -- full again: the charge is gone
  -- A reservation (wait=) is charged when it is admitted, ahead: given back before, whole.
  local credit = cost * interval - math.max(0, now - charged_at)
  if credit <= 0 then return 0 end
  local new_tat = tat - credit
  put(key, bucket_state(new_tat, now, tau), new_tat - now)
  return 1
end

-- A fixed window charged in the window starting at start. A window ahead of now (a
-- reservation's) keeps its state even at 0: it also says the ones before are full.
local function refund_window(key, start, cost, ahead)
  local raw = redis.call('GET', key)
  if not raw then return 0 end
  local s, c = string.match(raw, '^(%d+):(%d+)$')
  if tonumber(s) ~= start then return 0 end -- window is over
  local count = math.max(0, tonumber(c) - cost)
  if count == 0 and not ahead then
    redis.call('DEL', key)
  else
    redis.call('SET', key, s .. ':' .. fmt(count), 'KEEPTTL')
  end
  return 1
end

local function refund_fixed(key, limit, window, capacity, cost, charged_at)
  local start = charged_at - charged_at % window
  return refund_window(key, start, cost, start > now - now % window)
end

-- A calendar window's "window" argument is the start of the window it was charged in.
local function refund_calendar(key, limit, start, capacity, cost, charged_at)
  return refund_window(key, start, cost)
end

local function refund_log(key, limit, window, capacity, cost, charged_at)
  -- Entries are bare timestamps: any `cost` entries equal to ours are ours to drop.
  local removed = redis.call('LREM', key, cost, fmt(charged_at))
  if removed > 0 then return 1 end
  return 0
end

local function refund_counter(key, limit, window, capacity, cost, charged_at)
  local raw = redis.call('GET', key)
  if not raw then return 0 end
  local s, p, c = string.match(raw, '^(%d+):(%d+):(%d+)$')
  s = tonumber(s); p = tonumber(p); c = tonumber(c)
  local start = charged_at - charged_at % window
  if s == start then
    c = math.max(0, c - cost) -- still the current window
  elseif s == start + window then
    p = math.max(0, p - cost) -- the window rolled: our charge is now "previous"
  elseif s + window == charged_at then
    -- a reservation admitted as the window it is counted in ends (adjust.refund_counter)
    c = math.max(0, c - cost)
  else
    return 0
  end
  if p == 0 and c == 0 then
    redis.call('DEL', key)
  else
    redis.call('SET', key, fmt(s) .. ':' .. fmt(p) .. ':' .. fmt(c), 'KEEPTTL')
  end
  return 1
end

local refunds = {
  tb = refund_bucket,
  fw = refund_fixed,
  cw = refund_calendar,
  swl = refund_log,
  swc = refund_counter,
  blk = function() return 0 end, -- a block gate charges nothing
  ls = release_lease, -- a lease undone with others (a denial in another slot); a release
  -- after the response alone is a plain ZREM (redis.py, released_leases)
  cap = release_lease, -- the fleet's capacity: a lease too
  cr = function(key, limit, window, capacity, cost) return credits_refund(key, now, cost) end,
}

local changed = 0
for i, key in ipairs(KEYS) do
  local a = 2 + 6 * (i - 1)
  local refund = refunds[ARGV[a]]
  if refund == nil then return redis.error_reply('flask-quota: unknown algorithm ' .. tostring(ARGV[a])) end
  local cost = tonumber(ARGV[a + 4])
  if cost > 0 then
    changed = changed + refund(key, tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]),
                               tonumber(ARGV[a + 3]), cost, tonumber(ARGV[a + 5]))
  end
end
return changed
