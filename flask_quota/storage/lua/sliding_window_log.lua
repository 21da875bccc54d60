-- One list entry per unit of cost, oldest first.
-- Mirrors flask_quota.core.algorithms.sliding_window_log. Returns as decide.lua reads it; its
-- write is a function (trim, push, expire), not one value to SET.
local function sliding_window_log(key, now, limit, window, capacity, cost)
  local entries = redis.call('LRANGE', key, 0, -1)
  local live = {}
  for _, raw in ipairs(entries) do
    local ts = tonumber(raw)
    if ts ~= nil and ts > now - window then live[#live + 1] = ts end
  end
  local count = #live
  local dropped = #entries - count
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
  local reset = now
  if count > 0 then reset = live[count] + window end
  local retry = window
  if cost <= limit then retry = live[count + cost - limit] + window - now end
  return 0, limit - count, reset, retry
end
