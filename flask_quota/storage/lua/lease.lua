-- A lease gate (flask_quota.core.leases, whose lease_step this mirrors): one of
-- `limit` slots. The key is "<set key> <member>"; the set is a sorted set of the
-- members holding a slot, scored by when each expires on the server clock
-- (QUOTA_LEASE_SECONDS after it was taken), so a slot a killed worker never gave
-- back comes free by itself. `cost` 1 takes a slot, 0 only looks (a peek).
local RETRY_US = 1000000 -- leases.RETRY_US

local function lease_parts(key)
  return string.match(key, '^(.*) (%S*)$')
end

local function lease_gate(key, now, limit, window, cost)
  local set, member = lease_parts(key)
  local held = redis.call('ZCOUNT', set, '(' .. fmt(now), '+inf') -- live members only
  if held + cost > limit then
    -- Reset: the oldest live lease's expiry, when a slot is sure to be free.
    local oldest = redis.call('ZRANGEBYSCORE', set, '(' .. fmt(now), '+inf', 'LIMIT', 0, 1,
                              'WITHSCORES')
    local sure = now + RETRY_US
    if oldest[2] then sure = tonumber(oldest[2]) end
    return 0, 0, sure, RETRY_US
  end
  if cost == 0 then return 1, limit - held, now, 0 end
  return 1, limit - held - 1, now, 0, function()
    redis.call('ZREMRANGEBYSCORE', set, '-inf', fmt(now)) -- the expired go first
    redis.call('ZADD', set, fmt(now + window), member)
    redis.call('PEXPIRE', set, ceil(window / 1000)) -- the newest lives longest
  end
end

-- Give a slot back: the member leaves the set (absent: already expired or given back).
local function release_lease(key)
  local set, member = lease_parts(key)
  return redis.call('ZREM', set, member)
end
