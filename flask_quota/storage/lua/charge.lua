-- Charge without asking: quota.charge(n) after the response, past the limit if need be.
-- Mirrors flask_quota.adjust.charge_*; the bucket goes into debt and the next
-- request waits until it is paid off.
-- KEYS[i]: a tier's state key.
-- ARGV[1]: "" for the Redis server clock; an integer microsecond time only in tests.
-- ARGV[2 + 5*(i-1) ...]: algorithm code, limit, window_us, capacity, cost.
-- Returns the clock it used.
local now = script_now(ARGV[1])

local function charge_bucket(key, limit, window, cost)
  local tat = tonumber(redis.call('GET', key))
  local base = now
  if tat ~= nil and tat > now then base = tat end
  local new_tat = base + cost * math.floor(window / limit)
  put(key, fmt(new_tat), new_tat - now)
end

local function charge_fixed(key, limit, window, cost)
  local start = now - now % window
  local count = fixed_count(key, start)
  put(key, fmt(start) .. ':' .. fmt(count + cost), start + window - now)
end

local function charge_log(key, limit, window, cost)
  local entries = redis.call('LRANGE', key, 0, -1)
  local dropped = 0
  for _, raw in ipairs(entries) do
    local ts = tonumber(raw)
    if ts == nil or ts <= now - window then dropped = dropped + 1 else break end
  end
  if dropped > 0 then redis.call('LTRIM', key, dropped, -1) end
  push_times(key, now, cost)
  redis.call('PEXPIRE', key, math.ceil(window / 1000))
end

local function charge_counter(key, limit, window, cost)
  local start = now - now % window
  local prev, cur = counter_counts(key, start, window)
  cur = cur + cost
  put(key, fmt(start) .. ':' .. fmt(prev) .. ':' .. fmt(cur), start + 2 * window - now)
end

local charges = {
  tb = charge_bucket,
  fw = charge_fixed,
  swl = charge_log,
  swc = charge_counter,
}

for i, key in ipairs(KEYS) do
  local a = 2 + 5 * (i - 1)
  local charge = charges[ARGV[a]]
  if charge == nil then return redis.error_reply('flask-quota: unknown algorithm ' .. tostring(ARGV[a])) end
  local cost = tonumber(ARGV[a + 4])
  if cost > 0 then charge(key, tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), cost) end
end
return now
