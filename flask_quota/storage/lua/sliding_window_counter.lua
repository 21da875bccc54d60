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

-- raw: the stored "start:prev:cur" from decide.lua's MGET (false when absent).
local function sliding_window_counter(raw, now, limit, window, capacity, cost)
  local start = now - now % window
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
  return 0, math.max(0, limit - weighted - cur), counter_reset_at(now, start, window, prev, cur), retry
end
