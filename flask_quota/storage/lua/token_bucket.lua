-- GCRA token bucket: one "theoretical arrival time" per key.
-- Mirrors flask_quota.core.algorithms.token_bucket. Returns as decide.lua reads it (see there).
-- raw: the stored time from decide.lua's MGET (false when absent).
local function token_bucket(raw, now, limit, window, capacity, cost)
  local interval = math.floor(window / limit)
  local tau = capacity * interval
  local tat = tonumber(raw)
  local base = now
  if tat ~= nil and tat > now then base = tat end
  if cost > capacity then -- never fits, however long the caller waits: say one window
    return 0, math.floor((tau - (base - now)) / interval), base, window
  end
  local new_tat = base + cost * interval
  if new_tat - now <= tau then
    local remaining = math.floor((tau - (new_tat - now)) / interval)
    return 1, remaining, new_tat, 0, fmt(new_tat), new_tat - now
  end
  local remaining = math.floor((tau - (base - now)) / interval)
  return 0, remaining, base, new_tat - tau - now
end
