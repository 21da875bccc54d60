-- Counter per epoch-aligned window, stored as "start:count".
-- Mirrors flask_quota.core.algorithms.fixed_window (and window_step). Returns as
-- decide.lua reads it (see there).
-- raw: the stored "start:count" from decide.lua's MGET (false when absent).
local function window_step(raw, now, limit, start, finish, cost)
  local count = fixed_count_of(raw, start)
  if count + cost <= limit then
    local used = count + cost
    local reset = now
    local ttl = 0
    if used > 0 then reset = finish; ttl = finish - now end
    return 1, limit - used, reset, 0, format('%d:%d', start, used), ttl
  end
  local reset = now
  if count > 0 then reset = finish end
  local retry = finish - start
  if cost <= limit then retry = finish - now end
  return 0, limit - count, reset, retry
end

local function fixed_window(raw, now, limit, window, capacity, cost)
  local start = now - now % window
  return window_step(raw, now, limit, start, start + window, cost)
end

-- A calendar month or year: the same counter, its edges from calendar_span.
local function calendar_window(raw, now, limit, bounds, cost)
  local start, finish = calendar_span(bounds, now)
  return window_step(raw, now, limit, start, finish, cost)
end
