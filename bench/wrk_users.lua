-- wrk script: rotate the X-User header over 10,000 users, like the in-process benchmarks.
local counter = 0

request = function()
  counter = counter + 1
  return wrk.format("GET", nil, {["X-User"] = "user" .. (counter % 10000)})
end
