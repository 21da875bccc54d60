-- One list entry per unit of cost, oldest first.
-- Mirrors flask_quota.core.algorithms.sliding_window_log. Returns as decide.lua reads it; its
-- write is a function (trim, push, expire), not one value to SET.
-- wait: how long the caller may wait (0: not at all). A reservation's entries carry the
-- time it will be admitted, ahead of now; a caller finding such entries queues behind
-- them (log_reserve), so the list stays in order and the oldest entries are its head.

-- A reservation: entries at the time the cost fits (once the oldest entries in its
-- way expire), never before the last waiter's. algorithms._log_reserve.
local function log_reserve(key, live, dropped, now, limit, window, cost, wait)
  local count = #live
  if cost > limit then return 0, math.max(0, limit - count), live[count] + window, window end
  local over = count + cost - limit
  local at = now
  if over > 0 then at = live[over] + window end
  if live[count] > at then at = live[count] end
  if at - now <= wait then
    return 1, 0, at + window, at - now, function()
      if dropped > 0 then redis.call('LTRIM', key, dropped, -1) end
      push_times(key, at, cost)
      redis.call('PEXPIRE', key, ceil((at + window - now) / 1000))
    end
  end
  return 0, math.max(0, limit - count), at + window, at - now
end

local function sliding_window_log(key, now, limit, window, capacity, cost, wait)
  local entries = redis.call('LRANGE', key, 0, -1)
  local live = {}
  for _, raw in ipairs(entries) do
    local ts = tonumber(raw)
    if ts ~= nil and ts > now - window then live[#live + 1] = ts end
  end
  local count = #live
  local dropped = #entries - count
  if count > 0 and live[count] > now and cost > 0 then -- callers are waiting: queue behind
    return log_reserve(key, live, dropped, now, limit, window, cost, wait)
  end
  if count + cost <= limit then
    local last = now
    if cost == 0 then last = live[count] end
    local reset = now
    if last ~= nil then reset = last + window end
    return 1, limit - count - cost, reset, 0, function()
      if dropped > 0 then redis.call('LTRIM', key, dropped, -1) end
      push_times(key, now, cost)
      if reset - now <= 0 then
        redis.call('DEL', key)
      else
        redis.call('PEXPIRE', key, ceil((reset - now) / 1000))
      end
    end
  end
  if wait > 0 and cost > 0 and cost <= limit then
    return log_reserve(key, live, dropped, now, limit, window, cost, wait)
  end
  local reset = now
  if count > 0 then reset = live[count] + window end
  local retry = window
  if cost <= limit then retry = live[count + cost - limit] + window - now end
  return 0, limit - count, reset, retry
end
