-- Shared helpers. Times are integer microseconds held in Lua doubles (exact below 2^53).
local function fmt(n)
  return string.format('%d', n)
end

-- Store a state for ttl microseconds, or drop it when nothing is worth keeping.
local function put(key, value, ttl)
  if ttl <= 0 then
    redis.call('DEL', key)
  else
    redis.call('SET', key, value, 'PX', math.ceil(ttl / 1000))
  end
end
