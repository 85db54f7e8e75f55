-- Helpers every script starts with: the clock, numbers as text, releasing a lease.

local INF = math.huge

local function f(x) return string.format('%.3f', x) end
local function g(x) return string.format('%.17g', x) end

local function clock()
  if ARGV[1] ~= '' then return tonumber(ARGV[1]) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
end

-- Take `lease_id` out of the lease set `L`, and the expired leases with it:
-- whether it was there (1/0), and whether it was still valid.
local function drop_lease(L, lease_id, now, now_text)
  local expiry = tonumber(redis.call('ZSCORE', L, lease_id))
  local removed = redis.call('ZREM', L, lease_id)
  redis.call('ZREMRANGEBYSCORE', L, '-inf', now_text)
  return removed, expiry ~= nil and expiry > now
end

-- A release freed a slot: wake the first WAKE processes in the scope's line
-- of processes waiting for one (`W`), and them alone: ``"<name> <token>,..."``.
-- Two, not one: a process that left the line unserved loses its wake-up
-- (its waiters' next look finds the slot), and the first of two to ask gets
-- the slot; the other asks in vain and joins the line again at its end.
local WAKE = 2
local function wake_waiters(removed, W, channel, name)
  if removed ~= 1 then return end
  local first = redis.call('ZPOPMIN', W, WAKE)
  if first[1] then
    local tokens = first[1]
    if first[3] then tokens = tokens .. ',' .. first[3] end
    redis.call('PUBLISH', channel, name .. ' ' .. tokens)
  end
end

-- A write cut the scope's delay and the turns handed out (cut_turns): every
-- process's first waiter on it asks again.
local function wake_everyone(channel, name)
  redis.call('PUBLISH', channel, name .. ' *')
end
