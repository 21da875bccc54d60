-- Add one grant to a balance the storage holds (flask_quota.credits: after the grant's
-- row commits, and again by every worker's sync for recent grants: idempotent by id).
-- KEYS[1]: the balance. ARGV[1]: "" for the server clock (an integer microsecond time
-- only in tests); ARGV[2..4]: the grant's id, expiry (0: never) and units.
-- Returns 1 when added, 0 otherwise (see credits_grant).
local now = script_now(ARGV[1])
return credits_grant(KEYS[1], now, tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]))
