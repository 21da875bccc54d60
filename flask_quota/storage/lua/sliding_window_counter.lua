-- Weighted previous + current window counts, stored as "start:prev:cur".
-- Mirrors flask_quota.algorithms.sliding_window_counter.
local function sliding_window_counter(key, now, limit, window, capacity, cost)
  local start = now - now % window
  local prev, cur = 0, 0
  local raw = redis.call('GET', key)
  if raw then
    local s, p, c = string.match(raw, '^(%d+):(%d+):(%d+)$')
    s = tonumber(s)
    if s == start then
      prev = tonumber(p); cur = tonumber(c)
    elseif s == start - window then
      prev = tonumber(c)
    end
  end
  local elapsed = now - start
  local estimate = prev * (window - elapsed) / window + cur
  local function reset_at(c)
    if c > 0 then return start + 2 * window end
    if prev > 0 then return start + window end
    return now
  end
  if estimate + cost <= limit then
    local new_cur = cur + cost
    local remaining = math.max(0, math.floor(limit - (prev * (window - elapsed) / window + new_cur)))
    local reset = reset_at(new_cur)
    local value = fmt(start) .. ':' .. fmt(prev) .. ':' .. fmt(new_cur)
    return {1, remaining, reset, 0, function() put(key, value, reset - now) end}
  end
  local retry
  local need = limit - cur - cost
  if need >= 0 then
    retry = math.max(1, start + window - math.floor(need * window / prev) - now)
  elseif limit - cost < 0 then
    retry = window
  else
    retry = math.max(1, start + 2 * window - math.floor((limit - cost) * window / cur) - now)
  end
  return {0, math.max(0, math.floor(limit - estimate)), reset_at(cur), retry}
end
