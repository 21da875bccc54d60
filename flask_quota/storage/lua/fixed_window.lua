-- Counter per epoch-aligned window, stored as "start:count".
-- Mirrors flask_quota.core.algorithms.fixed_window. Returns as decide.lua reads it (see there).
local function fixed_window(key, now, limit, window, capacity, cost)
  local start = now - now % window
  local count = fixed_count(key, start)
  local finish = start + window
  if count + cost <= limit then
    local used = count + cost
    local reset = now
    local ttl = 0
    if used > 0 then reset = finish; ttl = finish - now end
    return 1, limit - used, reset, 0, fmt(start) .. ':' .. fmt(used), ttl
  end
  local reset = now
  if count > 0 then reset = finish end
  local retry = window
  if cost <= limit then retry = finish - now end
  return 0, limit - count, reset, retry
end
