-- Charge without asking: quota.charge(n) after the response, past the limit if need be.
-- Mirrors flask_quota.core.adjust.charge_*; the bucket goes into debt and the next
-- request waits until it is paid off. The debt is bounded as in
-- flask_quota.core.algorithms.bound_debt, so every stored number stays below 2^53 (a cost
-- past 2^53 arrives rounded, but then the sum is past the bound too: min is exact).
-- KEYS[i]: a tier's state key.
-- ARGV[1]: "" for the Redis server clock; an integer microsecond time only in tests.
-- ARGV[2 + 5*(i-1) ...]: algorithm code, limit, window_us, capacity, cost.
-- Returns the clock it used.
local now = script_now(ARGV[1])
local MAX_DEBT = 31622400000000 -- algorithms.MAX_DEBT_US: 366 days past empty
local MAX_OVER = 1000000000000 -- rates.MAX_LIMIT: units a counter holds past its limit

local function charge_bucket(key, limit, window, capacity, cost)
  local interval = math.floor(window / limit)
  local tau = capacity * interval
  local tat = bucket_tat(redis.call('GET', key), now, tau)
  local base = now
  if tat ~= nil and tat > now then base = tat end
  local new_tat = math.min(base + cost * interval, now + tau + MAX_DEBT)
  put(key, bucket_state(new_tat, now, tau), new_tat - now)
end

local function charge_fixed(key, limit, window, capacity, cost)
  local start = now - now % window
  local raw = redis.call('GET', key)
  local held, c = string.match(raw or '', '^(%d+):(%d+)$')
  if held and tonumber(held) > start then -- held ahead by a reservation: charged there
    redis.call('SET', key, held .. ':' .. fmt(math.min(tonumber(c) + cost, limit + MAX_OVER)), 'KEEPTTL')
    return
  end
  local count = math.min(fixed_count_of(raw, start) + cost, limit + MAX_OVER)
  put(key, fmt(start) .. ':' .. fmt(count), start + window - now)
end

-- The newest limit + 1 entries decide as all of them would (see bound_debt).
-- A calendar window: its window argument is its edges (see calendar_span).
local function charge_calendar(key, limit, bounds, capacity, cost)
  local start, finish = calendar_span(bounds, now)
  local count = math.min(fixed_count(key, start) + cost, limit + MAX_OVER)
  put(key, fmt(start) .. ':' .. fmt(count), finish - now)
end

local function charge_log(key, limit, window, capacity, cost)
  local entries = redis.call('LRANGE', key, 0, -1)
  local dropped = 0
  for _, raw in ipairs(entries) do
    local ts = tonumber(raw)
    if ts == nil or ts <= now - window then dropped = dropped + 1 else break end
  end
  if dropped > 0 then redis.call('LTRIM', key, dropped, -1) end
  -- Behind any reservation's entries (ahead of now): the list stays in order.
  local at = now
  local last = tonumber(entries[#entries])
  if last and last > at then at = last end
  push_times(key, at, math.min(cost, limit + 1))
  redis.call('LTRIM', key, -(limit + 1), -1)
  redis.call('PEXPIRE', key, math.ceil((at + window - now) / 1000))
end

local function charge_counter(key, limit, window, capacity, cost)
  local start = now - now % window
  local raw = redis.call('GET', key)
  local held, p, c = string.match(raw or '', '^(%d+):(%d+):(%d+)$')
  if held and tonumber(held) > start then -- held ahead by a reservation: charged there
    c = math.min(tonumber(c) + cost, limit + MAX_OVER)
    redis.call('SET', key, held .. ':' .. p .. ':' .. fmt(c), 'KEEPTTL')
    return
  end
  local prev, cur = counter_counts_of(raw, start, window)
  cur = math.min(cur + cost, limit + MAX_OVER)
  put(key, fmt(start) .. ':' .. fmt(prev) .. ':' .. fmt(cur), start + 2 * window - now)
end

local charges = {
  tb = charge_bucket,
  fw = charge_fixed,
  cw = charge_calendar,
  swl = charge_log,
  swc = charge_counter,
  cr = function(key, limit, window, capacity, cost) credits_charge(key, now, cost) end,
}

for i, key in ipairs(KEYS) do
  local a = 2 + 5 * (i - 1)
  local charge = charges[ARGV[a]]
  if charge == nil then return redis.error_reply('flask-quota: unknown algorithm ' .. tostring(ARGV[a])) end
  local cost = tonumber(ARGV[a + 4])
  local window = ARGV[a + 2]
  if ARGV[a] ~= 'cw' then window = tonumber(window) end -- a calendar's edges stay text
  if cost > 0 then
    charge(key, tonumber(ARGV[a + 1]), window, tonumber(ARGV[a + 3]), cost)
  end
end
return now
