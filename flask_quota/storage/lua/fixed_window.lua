-- Counter per epoch-aligned window, stored as "start:count".
-- Mirrors flask_quota.core.algorithms.fixed_window (and window_step). Returns as
-- decide.lua reads it (see there).
-- raw: the stored "start:count" from decide.lua's MGET (false when absent).
-- wait: how long the caller may wait (0: not at all); a cost that fits in the next
-- window, starting within it, is reserved there: the state then holds that window, and
-- a state holding a later window says this one is full (window_ahead).

-- A state holding a window after the current one (a reservation's): the windows before
-- it are full; callers reserve in it or in the one after. algorithms._window_ahead.
local function window_ahead(raw, now, limit, length, cost, wait)
  local a, c = string.match(raw, '^(%d+):(%d+)$')
  local ahead, count = tonumber(a), tonumber(c)
  local ttl = ahead + length - now
  if cost == 0 then return 1, 0, ahead + length, 0, raw, ttl end
  local retry
  if count + cost <= limit then
    retry = ahead - now
    if retry <= wait then
      return 1, 0, ahead + length, retry, format('%d:%d', ahead, count + cost), ttl
    end
  else
    retry = length
    if cost <= limit then retry = ahead + length - now end
    if cost <= limit and retry <= wait then
      return 1, 0, ahead + 2 * length, retry, format('%d:%d', ahead + length, cost), ttl + length
    end
  end
  return 0, 0, ahead + length, retry
end

local function window_step(raw, now, limit, start, finish, cost, wait)
  if raw and wait then -- (a calendar window passes none: it never reserves)
    local held = tonumber(string.match(raw, '^(%d+):%d+$'))
    if held and held > start then return window_ahead(raw, now, limit, finish - start, cost, wait) end
  end
  local count = fixed_count_of(raw, start)
  if count + cost <= limit then
    local used = count + cost
    local reset = now
    local ttl = 0
    if used > 0 then reset = finish; ttl = finish - now end
    return 1, limit - used, reset, 0, format('%d:%d', start, used), ttl
  end
  if wait and wait > 0 and cost > 0 and cost <= limit and finish - now <= wait then -- next
    local length = finish - start
    return 1, 0, finish + length, finish - now, format('%d:%d', finish, cost), finish + length - now
  end
  local reset = now
  if count > 0 then reset = finish end
  local retry = finish - start
  if cost <= limit then retry = finish - now end
  return 0, limit - count, reset, retry
end

local function fixed_window(raw, now, limit, window, capacity, cost, wait)
  local start = now - now % window
  return window_step(raw, now, limit, start, start + window, cost, wait)
end

-- A calendar month or year: the same counter, its edges from calendar_span.
local function calendar_window(raw, now, limit, bounds, cost)
  local start, finish = calendar_span(bounds, now)
  return window_step(raw, now, limit, start, finish, cost)
end
