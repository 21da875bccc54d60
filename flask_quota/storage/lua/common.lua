-- Shared helpers. Times are integer microseconds held in Lua doubles (exact below 2^53).
-- The library functions the request path calls are upvalues (a global's lookup is two
-- table reads per use), set by script_now, which every entry calls first: a function
-- library is loaded where math and string cannot be reached. (tostring would not do
-- for fmt: Lua 5.1 prints a number with %.14g, which rounds a microsecond time.)
local floor, ceil, format, modern
local function fmt(n)
  return format('%d', n)
end

-- Store a state for ttl microseconds, or drop it when nothing is worth keeping.
local function put(key, value, ttl)
  if ttl <= 0 then
    redis.call('DEL', key)
  else
    redis.call('SET', key, value, 'PX', ceil(ttl / 1000))
  end
end

-- Append n copies of the time now to the list at key. unpack() returns at most
-- about 8,000 values, so a large n is pushed in chunks.
local function push_times(key, now, n)
  local stamp = fmt(now)
  while n > 0 do
    local args = {}
    for i = 1, math.min(n, 1000) do args[i] = stamp end
    redis.call('RPUSH', key, unpack(args))
    n = n - #args
  end
end

-- The script's clock: ARGV's integer microsecond time (tests only) or, when it is
-- "", the Redis server's. Effects replication first, so writes may follow TIME.
-- Redis 7 (the first with REDIS_VERSION_NUM) always replicates effects, and its
-- replicate_commands is a no-op: only an older server is asked. The upvalues above
-- are set once where they last (a function library: Redis 7+, so `modern`); a
-- script's chunk runs anew on every call, and sets them every time.
local function script_now(arg)
  if not modern then
    floor, ceil, format = math.floor, math.ceil, string.format
    modern = redis.REDIS_VERSION_NUM ~= nil
    if not modern and redis.replicate_commands then pcall(redis.replicate_commands) end
  end
  local now = arg and tonumber(arg)
  if not now then
    local t = redis.call('TIME')
    now = t[1] * 1000000 + t[2] -- TIME's two integers, read as tonumber would
  end
  return now
end

-- A token bucket's TAT from its stored state raw (false when absent), read at now, and
-- what to store for a TAT written at now. Mirrors flask_quota.core.algorithms'
-- bucket_tat and bucket_state: a plain TAT is at most tau (a refill) ahead of the clock
-- that wrote it; a debt is stored as "tat:written". One further ahead than it could have
-- been written means the server's clock stepped back: a plain TAT then reads as an empty
-- bucket, a debt as it stood when charged.
local function bucket_tat(raw, now, tau)
  if not raw then return nil end
  local tat = tonumber(raw)
  if tat then
    if tat - now > tau then return now + tau end
    return tat
  end
  local t, w = string.match(raw, '^(%d+):(%d+)$')
  tat, w = tonumber(t), tonumber(w)
  if tat and now < w then return tat - (w - now) end
  return tat
end

local function bucket_state(tat, now, tau)
  if tat - now > tau then return fmt(tat) .. ':' .. fmt(now) end
  return fmt(tat)
end

-- A fixed window's count if its stored state raw ("start:count"; false when the key
-- is absent) holds the window starting at start. decide.lua reads every string state
-- of a request in one MGET and hands each algorithm its raw value.
local function fixed_count_of(raw, start)
  if raw then
    local s, c = string.match(raw, '^(%d+):(%d+)$')
    if tonumber(s) == start then return tonumber(c) end
  end
  return 0
end

local function fixed_count(key, start)
  return fixed_count_of(redis.call('GET', key), start)
end

-- A sliding counter's previous and current counts, from its stored state raw
-- ("start:prev:cur"), for the window starting at start: the stored current count
-- becomes "previous" one window later.
local function counter_counts_of(raw, start, window)
  if raw then
    local s, p, c = string.match(raw, '^(%d+):(%d+):(%d+)$')
    s = tonumber(s)
    if s == start then return tonumber(p), tonumber(c) end
    if s == start - window then return tonumber(c), 0 end
  end
  return 0, 0
end

local function counter_counts(key, start, window)
  return counter_counts_of(redis.call('GET', key), start, window)
end

-- A calendar window's start and end (flask_quota.core.calendar): of the windows whose
-- edges are "prev:start:end:next", the one now falls in. The client computed them
-- around its estimate of the server's clock; the server's picks, so no time zone is
-- known in Lua. A server clock outside all three windows (a client clock far off) is
-- refused with the server's time, before anything is written: the client moves its
-- estimate there and asks again (flask_quota.storage.redis.StorageTime).
local function calendar_span(bounds, now)
  local b0, b1, b2, b3 = string.match(bounds, '^(-?%d+):(-?%d+):(-?%d+):(-?%d+)$')
  b0, b1, b2, b3 = tonumber(b0), tonumber(b1), tonumber(b2), tonumber(b3)
  if now < b0 or now >= b3 then
    error({err = 'flask-quota: calendar skew now=' .. fmt(now)})
  end
  if now < b1 then return b0, b1 end
  if now < b2 then return b1, b2 end
  return b2, b3
end
