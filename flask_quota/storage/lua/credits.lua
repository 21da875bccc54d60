-- Prepaid credits: a balance per caller and resource, never refilled by time. Mirrors
-- flask_quota.core.credits line by line (its docstring has the rules). The state is
-- one string, "version:debt|id:expires:units:left,...", the grants in spending order
-- (soonest expiry first, never-expiring last, then by id); expires 0 is never.
local CREDITS_TTL = 2592000000000 -- core.credits.TTL_US: 30 days after the last change
local CREDITS_SEED = -1 -- core.credits.SEED: no balance here, seed it from SQL

local function credits_parse(raw)
  local version, debt, body = string.match(raw, '^(%d+):(%d+)|(.*)$')
  local grants = {}
  for id, exp, units, left in string.gmatch(body, '(%d+):(%d+):(%d+):(%d+)') do
    grants[#grants + 1] = {tonumber(id), tonumber(exp), tonumber(units), tonumber(left)}
  end
  return tonumber(version), tonumber(debt), grants
end

local function credits_live(g, now)
  return g[2] == 0 or now < g[2]
end

local function credits_dump(version, debt, grants)
  local parts = {}
  for i, g in ipairs(grants) do
    parts[i] = fmt(g[1]) .. ':' .. fmt(g[2]) .. ':' .. fmt(g[3]) .. ':' .. fmt(g[4])
  end
  return fmt(version) .. ':' .. fmt(debt) .. '|' .. table.concat(parts, ',')
end

-- cost units from the live grants, front first; what they cannot cover becomes debt.
local function credits_spend(version, debt, grants, now, cost)
  local kept = {}
  for _, g in ipairs(grants) do
    if credits_live(g, now) then
      local take = cost < g[4] and cost or g[4]
      cost = cost - take
      kept[#kept + 1] = {g[1], g[2], g[3], g[4] - take}
    end
  end
  return version + 1, debt + cost, kept
end

-- decide.lua's check: raw is the state from its MGET (false when absent). Returns
-- allowed, remaining (the balance after), reset (now), retry (0, or CREDITS_SEED), and
-- when it allows the state and its TTL (the same string for a look of cost 0).
local function credits_gate(raw, now, cost)
  if not raw then return 0, 0, now, CREDITS_SEED end
  local version, debt, grants = credits_parse(raw)
  local available = -debt
  for _, g in ipairs(grants) do
    if credits_live(g, now) then available = available + g[4] end
  end
  if cost > available then return 0, available, now, 0 end
  if cost <= 0 then return 1, available, now, 0, raw, CREDITS_TTL end
  local v, d, kept = credits_spend(version, debt, grants, now, cost)
  return 1, available - cost, now, 0, credits_dump(v, d, kept), CREDITS_TTL
end

local function credits_write(key, version, debt, grants)
  redis.call('SET', key, credits_dump(version, debt, grants), 'PX', fmt(CREDITS_TTL / 1000))
end

-- A charge after the fact (quota.settle above the cost): into debt if need be. A
-- balance no longer held (lost meanwhile) is left to its seed: returns 0.
local function credits_charge(key, now, cost)
  local raw = redis.call('GET', key)
  if not raw then return 0 end
  local version, debt, grants = credits_parse(raw)
  credits_write(key, credits_spend(version, debt, grants, now, cost))
  return 1
end

-- Units given back: the debt first, then the live grants with room, latest-expiring
-- first, each up to what it gave.
local function credits_refund(key, now, cost)
  local raw = redis.call('GET', key)
  if not raw then return 0 end
  local version, debt, grants = credits_parse(raw)
  local paid = cost < debt and cost or debt
  cost = cost - paid
  local kept = {}
  for _, g in ipairs(grants) do
    if credits_live(g, now) then kept[#kept + 1] = {g[1], g[2], g[3], g[4]} end
  end
  for i = #kept, 1, -1 do
    if cost <= 0 then break end
    local room = kept[i][3] - kept[i][4]
    local back = cost < room and cost or room
    if back > 0 then
      kept[i][4] = kept[i][4] + back
      cost = cost - back
    end
  end
  credits_write(key, version + 1, debt - paid, kept)
  return 1
end

local function credits_before(a, b)
  local ax, bx = a[2] == 0, b[2] == 0
  if ax ~= bx then return bx end
  if a[2] ~= b[2] then return a[2] < b[2] end
  return a[1] < b[1]
end

-- A grant added once by its id (core.credits.add_grant): 1 when added, 0 when the
-- balance is not held (its seed reads the grant from SQL), has it, or it has expired.
local function credits_grant(key, now, id, expires, units)
  local raw = redis.call('GET', key)
  if not raw then return 0 end
  local version, debt, grants = credits_parse(raw)
  if expires ~= 0 and now >= expires then return 0 end
  local kept = {}
  for _, g in ipairs(grants) do
    if g[1] == id then return 0 end
    if credits_live(g, now) then kept[#kept + 1] = g end
  end
  local paid = debt < units and debt or units
  kept[#kept + 1] = {id, expires, units, units - paid}
  table.sort(kept, credits_before)
  credits_write(key, version + 1, debt - paid, kept)
  return 1
end
