-- GCRA token bucket: one "theoretical arrival time" per key.
-- Mirrors flask_quota.core.algorithms.token_bucket. Returns as decide.lua reads it (see there).
-- raw: the stored time from decide.lua's MGET (false when absent). interval (the window
-- over the limit, rounded down) and tau (capacity * interval) are the check's, worked
-- out once per check (decide.lua's spec_of).
local function token_bucket(raw, now, interval, tau, window, capacity, cost)
  local tat = raw and tonumber(raw) -- false (absent): no call
  local base = now
  if tat and tat > now then base = tat end
  if cost > capacity then -- never fits, however long the caller waits: say one window
    return 0, floor((tau - (base - now)) / interval), base, window
  end
  local new_tat = base + cost * interval
  if new_tat - now <= tau then
    -- floor(left / interval) without a call. Lua's a % b is a - floor(a / b) * b, so
    -- for integers this far below 2^53 (a TTL of years is 2^45) it is the same double.
    local left = tau - (new_tat - now)
    return 1, (left - left % interval) / interval, new_tat, 0, format('%d', new_tat), new_tat - now
  end
  local remaining = floor((tau - (base - now)) / interval)
  return 0, remaining, base, new_tat - tau - now
end
