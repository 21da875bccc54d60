-- Weighted previous + current window counts, stored as "start:prev:cur".
-- Mirrors flask_quota.core.algorithms.sliding_window_counter. Returns as decide.lua reads it.

-- floor(a * b / c) and the remainder, exact for integers 0 <= a <= c < 2^52 and
-- 0 <= b < 2^53, where a * b itself may pass 2^53 (doubles are exact below it).
-- (math.floor, not common.lua's upvalue: tests run this file on its own.)
local function muldiv_below(a, b, c)
  if a * b < 4503599627370496 then -- 2^52: the product and q * c are exact
    local q = math.floor(a * b / c)
    local r = a * b - q * c
    if r < 0 then return q - 1, r + c end
    if r >= c then return q + 1, r - c end
    return q, r
  end
  -- Long multiplication, one bit of b at a time: the remainder stays below 2c.
  local q, r, bit = 0, 0, 1
  while bit * 2 <= b do bit = bit * 2 end
  while bit >= 1 do
    q, r = q * 2, r * 2
    if r >= c then q, r = q + 1, r - c end
    if b >= bit then
      b, r = b - bit, r + a
      if r >= c then q, r = q + 1, r - c end
    end
    bit = bit / 2
  end
  return q, r
end

-- The same for any count a >= 0 (a request charged past the limit may leave a > c).
local function muldiv(a, b, c)
  if a <= c then return muldiv_below(a, b, c) end
  local whole = math.floor(a / c)
  local rest = a - whole * c
  if rest < 0 then whole, rest = whole - 1, rest + c end
  if rest >= c then whole, rest = whole + 1, rest - c end
  local q, r = muldiv_below(rest, b, c)
  return whole * b + q, r
end

-- When the counts of a window starting at start have all gone: cur is the current count.
local function counter_reset_at(now, start, window, prev, cur)
  if cur > 0 then return start + 2 * window end
  if prev > 0 then return start + window end
  return now
end

-- A state holding the window after the current one (a reservation's): the windows
-- before it are full; callers reserve in it as its previous window's weight decays.
-- algorithms._counter_ahead.
local function counter_ahead(raw, ahead, now, limit, window, cost, wait)
  local _, p, c = string.match(raw, '^(%d+):(%d+):(%d+)$')
  local prev, cur = tonumber(p), tonumber(c)
  local reset = counter_reset_at(now, ahead, window, prev, cur)
  if cost == 0 then return 1, 0, reset, 0, raw, reset - now end
  if cost > limit then return 0, 0, reset, window end
  local need = limit - cur - cost
  local at, s, pv, c
  if need >= 0 then -- in the stored window
    at, s, pv, c = ahead, ahead, prev, cur + cost
    if need < prev then at = ahead + window - muldiv(need, window, prev) end
  else -- in the one after, as the stored window's own count decays
    need = limit - cost
    at, s, pv, c = ahead + window, ahead + window, cur, cost
    if need < cur then at = ahead + 2 * window - muldiv(need, window, cur) end
  end
  local retry = math.max(1, at - now)
  if retry > wait then return 0, 0, reset, retry end
  reset = counter_reset_at(now, s, window, pv, c)
  return 1, 0, reset, retry, format('%d:%d:%d', s, pv, c), reset - now
end

-- raw: the stored "start:prev:cur" from decide.lua's MGET (false when absent). wait: how
-- long the caller may wait (0: not at all); a cost that fits within it is reserved, in
-- this window or, stored ahead, the next (algorithms.sliding_window_counter).
local function sliding_window_counter(raw, now, limit, window, capacity, cost, wait)
  local start = now - now % window
  if raw then
    local held = tonumber(string.match(raw, '^(%d+):%d+:%d+$'))
    if held and held > start then return counter_ahead(raw, held, now, limit, window, cost, wait) end
  end
  local prev, cur = counter_counts_of(raw, start, window)
  -- The previous window's count, weighted by what is left of it, rounded up.
  local weighted, rest = muldiv(prev, window - (now - start), window)
  if rest > 0 then weighted = weighted + 1 end
  if weighted + cur + cost <= limit then
    local new_cur = cur + cost
    local reset = counter_reset_at(now, start, window, prev, new_cur)
    local value = format('%d:%d:%d', start, prev, new_cur)
    return 1, limit - weighted - new_cur, reset, 0, value, reset - now
  end
  local retry
  local need = limit - cur - cost
  if need >= 0 then
    retry = math.max(1, start + window - muldiv(need, window, prev) - now)
  elseif limit - cost < 0 then
    retry = window
  else
    retry = math.max(1, start + 2 * window - muldiv(limit - cost, window, cur) - now)
  end
  if cost > 0 and cost <= limit and retry <= wait then
    local s, p, c = start, prev, cur + cost -- this window, once the previous one decays
    if now + retry >= start + window then s, p, c = start + window, cur, cost end -- the next
    local reset = counter_reset_at(now, s, window, p, c)
    return 1, 0, reset, retry, format('%d:%d:%d', s, p, c), reset - now
  end
  return 0, math.max(0, limit - weighted - cur), counter_reset_at(now, start, window, prev, cur), retry
end
