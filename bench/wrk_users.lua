-- wrk script: rotate the X-User header over 10,000 users, like the in-process benchmarks
-- (BENCH_USERS in the environment sets another count).
local counter = 0
local users = tonumber(os.getenv("BENCH_USERS") or "10000")

request = function()
  counter = counter + 1
  return wrk.format("GET", nil, {["X-User"] = "user" .. (counter % users)})
end
