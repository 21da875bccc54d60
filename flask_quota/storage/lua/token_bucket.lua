-- GCRA token bucket: one "theoretical arrival time" per key.
-- Mirrors flask_quota.core.algorithms.token_bucket. Returns as decide.lua reads it (see there).
-- raw: the stored time from decide.lua's MGET (false when absent). interval (the window
-- over the limit, rounded down) and tau (capacity * interval) are the check's, worked
-- out once per check (decide.lua's spec_of). wait: how long the caller may wait (0: not
-- at all); a cost that fits within it is reserved (algorithms.token_bucket).
local function token_bucket(raw, now, interval, tau, window, capacity, cost, wait)
  local tat = raw and tonumber(raw) -- false (absent): no call
  -- A debt ("tat:written"), or a TAT further ahead than a refill (the clock stepped
  -- back): read as common.lua's bucket_tat says. A plain TAT within a refill: no call.
  -- A state read through a clock that stepped back is stored as read even by a
  -- denial (state and TTL returned with it): it charges nothing, and the step is then
  -- paid once, not at every read (algorithms.token_bucket's repair).
  local repair, repair_ttl
  if raw and (not tat or tat - now > tau) then
    local plain = tat
    tat = bucket_tat(raw, now, tau)
    if plain or string.match(raw, ':(%d+)$') + 0 > now then
      repair, repair_ttl = bucket_state(tat, now, tau), tat - now
    end
  end
  local base = now
  if tat and tat > now then base = tat end
  if cost > capacity then -- never fits, however long the caller waits: say one window
    return 0, floor((tau - (base - now)) / interval), base, window, repair, repair_ttl
  end
  local new_tat = base + cost * interval
  if new_tat - now <= tau then
    -- floor(left / interval) without a call. Lua's a % b is a - floor(a / b) * b, so
    -- for integers this far below 2^53 (a TTL of years is 2^45) it is the same double.
    local left = tau - (new_tat - now)
    return 1, (left - left % interval) / interval, new_tat, 0, format('%d', new_tat), new_tat - now
  end
  local retry = new_tat - tau - now
  if retry <= wait then -- a reservation: past empty, so stored as a debt
    return 1, 0, new_tat, retry, bucket_state(new_tat, now, tau), new_tat - now
  end
  local remaining = floor((tau - (base - now)) / interval)
  return 0, remaining, base, retry, repair, repair_ttl
end
