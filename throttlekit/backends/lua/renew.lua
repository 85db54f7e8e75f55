-- Extend a lease: ARGV clock, lease id, lease ms; KEYS the lease sets of its
-- scopes. Replies how many scopes still held it.
--
-- (Runs after common.lua, in one script.)

local now = clock()
local lease_id = ARGV[2]
local lease_ms = tonumber(ARGV[3])
local count = 0
for i = 1, #KEYS do
  local score = tonumber(redis.call('ZSCORE', KEYS[i], lease_id))
  if score and score > now then
    redis.call('ZADD', KEYS[i], f(math.max(score, now + lease_ms)), lease_id)
    expire_leases(KEYS[i], now)
    count = count + 1
  end
end
return count
