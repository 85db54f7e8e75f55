-- Helpers of the scripts that read policies and state: policies, state, quota.
--
-- (Runs after base.lua, in one script.)

local function split(text)
  local v = {}
  for item in string.gmatch(text, '[^,]+') do v[#v + 1] = item end
  return v
end

-- A packed policy, a MessagePack array (times in seconds): fingerprint, then
-- the limits its fresh controllers give (delay, conc, blk, jl, jh, due), then
-- slot delay, quota (-1 = none) and window. Times come out in ms.
local function read_policy(data)
  local v = cmsgpack.unpack(data)
  return {fp = v[1], delay_s = v[2], delay = v[2] * 1000, conc = v[3], blk = v[4] * 1000,
          jl = v[5], jh = v[6], due = v[7] * 1000, slot = v[8] * 1000, quota = v[9],
          window = v[10] * 1000}
end

-- A scope's delay (seconds) as the text the client reads.
local function delay_text(st)
  return st.delay_text or g(st.delay_s)
end

-- The scope's bookkeeping and the limits in force: those its controllers
-- stored, or (none stored yet) those the policy's fresh controllers give.
local function load_state(key, p)
  local v = redis.call('HMGET', key, 'next', 'last', 'factor', 'turn', 'ver', 'fp', 'delay',
                       'conc', 'blk', 'jl', 'jh', 'due')
  local st = {next = tonumber(v[1]), last = tonumber(v[2]), factor = tonumber(v[3]) or 1,
              turn = tonumber(v[4]) or 0, ver = tonumber(v[5]) or 0}
  if st.ver > 0 then
    st.fp, st.delay_text, st.delay = v[6], v[7], tonumber(v[7]) * 1000
    st.conc, st.blk = tonumber(v[8]), tonumber(v[9]) * 1000
    st.jl, st.jh, st.due = tonumber(v[10]), tonumber(v[11]), tonumber(v[12]) * 1000
  else
    st.fp, st.delay_s, st.delay, st.conc, st.blk = p.fp, p.delay_s, p.delay, p.conc, p.blk
    st.jl, st.jh, st.due = p.jl, p.jh, p.due
  end
  return st
end

-- Let `key` live at least `ms` more. Its expiry is only ever pushed back, and
-- then `slack` ms further, so that a busy key is not given a new expiry (a
-- write) on every call: PTTL is a read.
local function extend(key, ms, slack)
  local left = redis.call('PTTL', key)
  if left >= ms then return end  -- (-1: no expiry yet; -2: no key, PEXPIRE does nothing)
  redis.call('PEXPIRE', key, math.ceil(ms + slack))
end

-- The state outlives its last use by the state ttl (up to an eighth more),
-- and any block, pending send or turn it holds.
local function keep_state(key, st, now, ttl)
  local keep = math.max(ttl, st.blk - now, (st.next or 0) - now, st.turn - now)
  extend(key, math.ceil(keep) + 1000, ttl / 8)
end

-- What the controllers of a scope need to run: {index, in flight, version,
-- states, delay (s), concurrency, fingerprint}.
local function controller_state(i, key, st, inflight)
  local ctl = ''
  if st.ver > 0 then ctl = redis.call('HGET', key, 'ctl') or '' end
  return {i, inflight, st.ver, ctl, delay_text(st), st.conc, st.fp}
end

-- A delay that shortens reaches the processes already waiting late: each
-- sleeps to a turn handed out one old delay after the one before. Where that
-- would leave a send unused (turns handed out up to `st.turn`, k = that span
-- / old delay of them, each k (old - new) / new sends late in all), the
-- turns start again: the caller publishes "<scope> *", and every process's
-- first waiter asks again, for a turn at the new delay. Not for a cut of
-- less than CUT_LEAST of the delay: AutoThrottle moves its delay a little
-- on every answer, and each waiting process would ask again every time
-- (the turns at the old delay soon run out anyway).
local CUT_LEAST = 0.25
local function cut_turns(key, st, old, now)
  local from = math.max(now, st.next or now)
  if st.turn <= from or old - st.delay < CUT_LEAST * old
      or (st.turn - from) * (old - st.delay) < old * st.delay then
    return false
  end
  st.turn = 0
  redis.call('HSET', key, 'turn', '0')
  return true
end

-- Store what the controllers produced (limits in seconds: fp, delay, conc,
-- blk, jl, jh, due). A new delay applies from the last send, with the jitter
-- drawn then. Empty limits: only the version was checked, nothing changes.
-- Returns whether the waiters' turns must be handed out again (cut_turns).
local function write_state(key, st, limits, ctl, now, ttl)
  if limits == '' then return false end
  local v = split(limits)
  local delay = tonumber(v[2]) * 1000
  local old = st.delay
  if st.next ~= nil and delay ~= st.delay then
    st.next = st.next + (delay - st.delay) * st.factor
    redis.call('HSET', key, 'next', f(st.next))
  end
  st.ver = st.ver + 1
  st.delay, st.conc, st.blk = delay, tonumber(v[3]), tonumber(v[4]) * 1000
  redis.call('HSET', key, 'ver', st.ver, 'ctl', ctl, 'fp', v[1], 'delay', v[2], 'conc', v[3],
             'blk', v[4], 'jl', v[5], 'jh', v[6], 'due', v[7])
  keep_state(key, st, now, ttl)
  return delay < old and cut_turns(key, st, old, now)
end

-- The key expires with its last lease (renewals: they may shorten its expiry).
local function expire_leases(key, now)
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[2] then redis.call('PEXPIRE', key, math.ceil(tonumber(last[2]) - now) + 1000) end
end

-- A part of a request across slots may be handed back unsent (another part
-- refused): keep what its grant changed of the pacing, to undo it then.
local function remember(key, lease_id, before, next)
  local old = {}
  for m = 1, 3 do
    if before[m] == nil then old[m] = 'x' else old[m] = g(before[m]) end
  end
  redis.call('HSET', key, 'un', table.concat({lease_id, old[1], old[2], old[3], f(next)}, ','))
end

-- Undo the pacing of `lease_id`'s grant (sent at `sent`) if no send came since.
local function undo(key, lease_id, sent)
  local kept = redis.call('HGET', key, 'un')
  if not kept then return end
  local v = split(kept)
  if v[1] ~= lease_id then return end
  redis.call('HDEL', key, 'un')
  local now_state = redis.call('HMGET', key, 'next', 'last')
  if tonumber(now_state[2]) ~= sent or tonumber(now_state[1]) ~= tonumber(v[5]) then return end
  local fields = {'next', 'last', 'factor'}
  for m = 1, 3 do
    if v[m + 1] == 'x' then redis.call('HDEL', key, fields[m])
    else redis.call('HSET', key, fields[m], v[m + 1]) end
  end
end

-- Live quota used in the window; forgets entries that left it.
local function quota_used(Q, C, window, now)
  local limit = f(now - window)
  local old = redis.call('ZRANGEBYSCORE', Q, '-inf', limit)
  local used = tonumber(redis.call('HGET', C, '=')) or 0
  if #old == 0 then return used end
  for j = 1, #old, 500 do
    local chunk = {}
    for m = j, math.min(j + 499, #old) do chunk[#chunk + 1] = old[m] end
    local costs = redis.call('HMGET', C, unpack(chunk))
    for m = 1, #chunk do used = used - (tonumber(costs[m]) or 0) end
    redis.call('HDEL', C, unpack(chunk))
  end
  redis.call('ZREMRANGEBYSCORE', Q, '-inf', limit)
  if redis.call('ZCARD', Q) == 0 then
    redis.call('DEL', Q, C)
    return 0
  end
  redis.call('HSET', C, '=', g(used))
  return used
end

-- When `cost` more fits in the quota (-INF: now; ScopeLedger._quota_ready()).
local function quota_ready(Q, C, cost, quota, window, now)
  local excess = quota_used(Q, C, window, now) + cost - quota
  if excess <= 1e-9 then return -INF end
  local freed, start = 0, 0
  while true do
    local entries = redis.call('ZRANGE', Q, start, start + 199, 'WITHSCORES')
    if #entries == 0 then return INF end
    local ids = {}
    for m = 1, #entries, 2 do ids[#ids + 1] = entries[m] end
    local costs = redis.call('HMGET', C, unpack(ids))
    for m = 1, #ids do
      freed = freed + (tonumber(costs[m]) or 0)
      if freed >= excess - 1e-9 then return tonumber(entries[2 * m]) + window end
    end
    start = start + 200
  end
end
