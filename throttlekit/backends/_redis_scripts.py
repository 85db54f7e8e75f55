"""The Lua scripts of the Redis backend (constant source; data only ever goes in KEYS/ARGV).

Every decision is made inside Redis, atomically, on Redis's own clock
(``TIME``); clients never send their clocks. Times inside the scripts are
milliseconds since the Unix epoch (floats with microsecond resolution) and
are formatted with ``%.3f`` before they are stored, because Redis turns Lua
numbers into strings with only 14 significant digits.

Keys of one scope (all share the hash tag ``{prefix:scope}``, so a scope is
Redis Cluster safe); ``KEYS`` holds six of them per scope, in this order:

``L`` leases
    sorted set: lease id -> expiry time. Its size is the scope's in-flight
    count; expired leases (crashed workers) are dropped before every decision.
``S`` state
    hash: ``next`` (earliest next send), ``last`` (last send) and ``factor``
    (its jitter factor), ``turn`` (the latest wake-up time handed to a waiting
    worker), backoff (``level``, ``step``,
    ``bconc``, ``bbase``, ``blk``, ``lsat``, ``lsig``, ``stepat``, ``bad``,
    ``good``, ``calm``, ``forgot``, ``pace``, ``paceu``) and AutoThrottle
    (``at``).
``T`` slot times
    sorted set: lease id -> send time of free concurrency slots that sent
    before (for ``slot_delay``).
``Q`` quota log
    sorted set: lease id -> send time, for the quota window.
``C`` quota costs
    hash: lease id -> cost, and ``=`` -> the sum of the live costs.
``W`` waiters flag
    a string that exists while some worker waits for a release; releases
    publish the scope's name on the backend's channel only then.
``X:<lease id>`` tombstone
    set for a minute when a caller gives up on an acquire call whose reply it
    never saw; the call, should it still arrive, then grants nothing.

A scope's policy travels in ``ARGV`` as :data:`POLICY_FIELDS` numbers (see
``_policy_args`` in :mod:`throttlekit.backends.redis`).

The backoff and AutoThrottle code mirrors ``throttlekit/_backoff.py`` and
``throttlekit/_autothrottle.py`` step for step (tests run both side by side).
"""

from __future__ import annotations

__all__ = [
    "ACQUIRE",
    "COMMON",
    "CONTROLLERS",
    "KEYS_PER_SCOPE",
    "POLICY_FIELDS",
    "RELEASE",
    "RENEW",
    "STATE",
]

#: Keys per scope in ``KEYS`` (leases, state, slots, quota log, quota costs, waiters).
KEYS_PER_SCOPE = 6
#: Numbers per scope policy in ``ARGV``.
POLICY_FIELDS = 19

#: Helpers every script starts with: the clock, policies, state, effective limits, quota.
COMMON = r"""
local INF = math.huge

local function f(x) return string.format('%.3f', x) end
local function g(x) return string.format('%.17g', x) end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
end

local function read_policy(b)
  local a = ARGV
  return {
    conc = tonumber(a[b]), delay = tonumber(a[b + 1]), slot = tonumber(a[b + 2]),
    jlow = tonumber(a[b + 3]), jhigh = tonumber(a[b + 4]), quota = tonumber(a[b + 5]),
    window = tonumber(a[b + 6]), bon = tonumber(a[b + 7]), bfactor = tonumber(a[b + 8]),
    bmin = tonumber(a[b + 9]), bmax = tonumber(a[b + 10]), bwin = tonumber(a[b + 11]),
    bcf = tonumber(a[b + 12]), bjlow = tonumber(a[b + 13]), bjhigh = tonumber(a[b + 14]),
    aton = tonumber(a[b + 15]), atstart = tonumber(a[b + 16]), atmax = tonumber(a[b + 17]),
    attarget = tonumber(a[b + 18]),
  }
end

local NUMERIC = {'next', 'level', 'step', 'bconc', 'bbase', 'blk', 'lsat', 'stepat', 'bad',
                 'calm', 'forgot', 'pace', 'paceu', 'last', 'turn'}

-- A scope's state; absent numbers are 0 (times: "never"), good = -1 is "none known".
local function load_state(key, p)
  local v = redis.call('HMGET', key, 'next', 'level', 'step', 'bconc', 'bbase', 'blk', 'lsat',
                       'stepat', 'bad', 'calm', 'forgot', 'pace', 'paceu', 'last', 'turn', 'good',
                       'at', 'lsig', 'factor')
  local st = {}
  for i = 1, #NUMERIC do st[NUMERIC[i]] = tonumber(v[i]) or 0 end
  st.good = tonumber(v[16]) or -1
  st.at = tonumber(v[17])
  st.lsig = v[18] or ''
  st.factor = tonumber(v[19]) or 1
  if st.at == nil and p.aton == 1 then st.at = math.max(p.delay, p.atstart) end
  return st
end

local function save_state(key, st, now, ttl)
  redis.call('HSET', key, 'next', f(st.next), 'level', st.level, 'step', g(st.step),
             'bconc', st.bconc, 'bbase', st.bbase, 'blk', f(st.blk), 'lsat', f(st.lsat),
             'stepat', f(st.stepat), 'bad', g(st.bad), 'good', g(st.good), 'calm', st.calm,
             'forgot', st.forgot, 'pace', g(st.pace), 'paceu', f(st.paceu), 'lsig', st.lsig,
             'last', f(st.last), 'turn', f(st.turn), 'factor', g(st.factor))
  if st.at ~= nil then redis.call('HSET', key, 'at', g(st.at)) end
  local keep = math.max(ttl, st.blk - now, st.next - now, st.paceu - now, st.turn - now)
  redis.call('PEXPIRE', key, math.ceil(keep) + 1000)
end

-- The key expires with its last lease.
local function expire_leases(key, now)
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[2] then redis.call('PEXPIRE', key, math.ceil(tonumber(last[2]) - now) + 1000) end
end

-- Effective limits: the policy moved by backoff and AutoThrottle (ledger.refresh()).
local function effective(st, p)
  local delay, conc, jl, jh, blk = p.delay, p.conc, p.jlow, p.jhigh, 0
  if p.bon > 0 then
    local bd = math.max(st.step, st.pace)
    if bd > delay then delay = bd end
    if st.level > 0 then jl, jh = p.bjlow, p.bjhigh end
    if st.bconc > 0 and (conc == 0 or st.bconc < conc) then conc = st.bconc end
    blk = st.blk
  end
  if p.aton == 1 and st.at ~= nil and st.at > delay then delay = st.at end
  return delay, conc, jl, jh, blk
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

-- When `cost` more fits in the quota (-INF: now; ledger._quota_ready()).
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
"""

#: Backoff and AutoThrottle, on a scope's state table (times in ms).
CONTROLLERS = r"""
local function backoff_active(st) return st.level > 0 or st.bconc > 0 end

-- A quiet window passed: one step toward the policy (BackoffState._step_back).
local function step_back(st, p, now)
  local old = st.step
  st.stepat = now
  if st.bconc > 0 then
    local raised = math.max(st.bconc + 1, math.floor(st.bconc / p.bcf))
    local ceiling = p.conc
    if ceiling == 0 then ceiling = st.bbase end
    if ceiling > 0 and raised >= ceiling then
      st.bconc = 0
      st.bbase = 0
    else
      st.bconc = raised
    end
  else
    if st.good < 0 or old < st.good then st.good = old end
    local floor = p.delay
    local target
    if st.bad > floor then
      target = (old + st.bad) / 2
      if old - target < 0.025 * old then
        st.calm = st.calm + 1
        if st.calm >= 10 then
          st.calm = 0
          if st.forgot == 1 then st.bad = floor else st.bad = st.bad / p.bfactor end
          st.forgot = 1
        end
        return
      end
    else
      target = old / p.bfactor
    end
    if target <= floor or target < 10 then target = 0 end
    st.step = target
  end
  st.level = math.max(1, st.level - 1)
  if st.step == 0 and st.bconc == 0 then
    st.level = 0
    st.bad = 0
    st.good = -1
    st.calm = 0
  end
end

-- A backoff signal (BackoffState._step_up); `enforced` is the delay that was
-- in force (policy, AutoThrottle, pace, backoff).
local function step_up(st, p, now, inflight, enforced)
  local old = st.step
  local in_force = math.max(old, enforced)
  if st.level > 0 and old >= p.bmax then
    local base = st.bconc
    if base == 0 then base = p.conc end
    if base == 0 then base = math.max(1, inflight) end
    if st.bbase == 0 then st.bbase = base end
    st.bconc = math.max(1, math.floor(base * p.bcf))
  else
    local stepped
    if old == 0 then
      st.bad = in_force
      stepped = math.max(p.bmin, in_force * p.bfactor)
    elseif st.good >= 0 and in_force < st.good then
      st.bad = math.max(st.bad, in_force)
      stepped = st.good
    elseif st.good >= 0 then
      stepped = in_force * (1 + (p.bfactor - 1) / 8)
      st.good = -1
    else
      st.bad = math.max(st.bad, in_force)
      stepped = in_force * p.bfactor
    end
    st.step = math.min(p.bmax, stepped)
  end
  st.level = st.level + 1
  st.calm = 0
  st.forgot = 0
  st.stepat = now
end

-- A send at `now` (BackoffState.on_send).
local function on_send(st, p, now)
  if p.bon == 0 then return end
  if backoff_active(st) and now - math.max(st.lsat, st.stepat) >= p.bwin then
    step_back(st, p, now)
  end
  if st.pace > 0 and now >= st.paceu then
    st.pace = 0
    st.paceu = 0
  end
end

-- Feedback at `now` (BackoffState.on_feedback, AutoThrottleState.on_feedback).
-- fb: signal (0/1), name, sent, hwait (-1 none), pace (-1 none), pacefor,
--     latency (-1 none), status (0 none), adjust (0/1)
local function on_feedback(st, p, now, fb, inflight)
  local enforced = effective(st, p)
  if p.bon > 0 then
    if fb.hwait > 0 then st.blk = math.max(st.blk, now + math.min(fb.hwait, p.bmax)) end
    if fb.pace >= 0 then
      st.pace = math.min(fb.pace, p.bmax)
      st.paceu = now + math.min(fb.pacefor, p.bmax)
    end
    if fb.signal == 0 then
      if backoff_active(st) and now - math.max(st.lsat, st.stepat) >= p.bwin then
        step_back(st, p, now)
      end
    else
      st.lsig = fb.name
      st.lsat = now
      if p.bon == 1 and fb.sent > st.stepat then step_up(st, p, now, inflight, enforced) end
    end
  end
  if p.aton == 1 and fb.latency >= 0 and fb.status > 0 and fb.adjust == 1 then
    local old = st.at
    local target = fb.latency / p.attarget
    local new = math.max(target, (old + target) / 2)
    new = math.min(math.max(p.delay, new), p.atmax)
    if fb.status ~= 200 and new <= old then new = old end
    st.at = new
  end
end
"""

#: Try to take a lease on every scope at once.
#:
#: KEYS: six per scope, then the lease's tombstone (``{prefix:first scope}:X:<lease id>``).
#: ARGV: lease id, lease ms, reserve-ahead ms, state ttl ms, release recheck ms,
#: number of scopes, the turn this caller was given last (ms, 0 = none; a value
#: Redis handed out, not a client clock); then per scope: cost, a uniform random number in [0, 1)
#: for the jitter, and the policy. Replies ``{1, wait_ms, send_at_ms, now_ms}`` (granted:
#: send after ``wait_ms``) or ``{0, wait_ms, scope_index, reason, now_ms[, turn_ms]}`` with reason
#: 1 = concurrency full (wait for a release or the earliest lease expiry),
#: 2 = delay, slot delay, quota or server block (try again after ``wait_ms``),
#: 3 = this lease id was handed back already (its caller gave up).
ACQUIRE = (
    COMMON
    + CONTROLLERS
    + r"""
local now = now_ms()
local lease_id = ARGV[1]
local lease_ms = tonumber(ARGV[2])
local reserve = tonumber(ARGV[3])
local ttl = tonumber(ARGV[4])
local recheck = tonumber(ARGV[5])
local n = tonumber(ARGV[6])
local myturn = tonumber(ARGV[7])

-- A call that its caller gave up on (cancelled while the request was on its
-- way) and that arrives after the hand-back must not grant anything.
if redis.call('EXISTS', KEYS[#KEYS]) == 1 then return {0, '0', 1, 3, f(now)} end
-- A retried call (the reply was lost) returns the grant it already made.
local held = redis.call('ZSCORE', KEYS[1], lease_id)
if held then
  local t = tonumber(held) - lease_ms
  return {1, f(math.max(0, t - now)), f(t), f(now)}
end

local scopes = {}
local ready, blocker = now, 1
local pacing = 0
for i = 1, n do
  local k = (i - 1) * 6
  local b = 8 + (i - 1) * 21
  local s = {L = KEYS[k + 1], S = KEYS[k + 2], T = KEYS[k + 3], Q = KEYS[k + 4],
             C = KEYS[k + 5], cost = tonumber(ARGV[b]), u = tonumber(ARGV[b + 1])}
  local p = read_policy(b + 2)
  s.p = p
  redis.call('ZREMRANGEBYSCORE', s.L, '-inf', f(now))
  s.inflight = redis.call('ZCARD', s.L)
  s.st = load_state(s.S, p)
  local blk
  s.delay, s.conc, s.jl, s.jh, blk = effective(s.st, p)
  if s.conc > 0 and s.inflight >= s.conc then
    local first = redis.call('ZRANGE', s.L, 0, 0, 'WITHSCORES')
    local wait = tonumber(first[2]) - now
    redis.call('SET', KEYS[k + 6], '1', 'PX', math.ceil(recheck) + 1000)
    return {0, f(wait), i, 1, f(now)}
  end
  local r = math.max(s.st.next, blk)
  s.nslots = 0
  if p.slot > 0 and s.conc > 0 then
    s.nslots = redis.call('ZCARD', s.T)
    if s.nslots > 0 and s.nslots >= s.conc - s.inflight then
      local first = redis.call('ZRANGE', s.T, 0, 0, 'WITHSCORES')
      r = math.max(r, tonumber(first[2]) + p.slot)
    end
  end
  if p.quota >= 0 and s.cost > 0 then
    r = math.max(r, quota_ready(s.Q, s.C, s.cost, p.quota, p.window, now))
  end
  if r > ready then
    ready = r
    blocker = i
  end
  if s.delay > pacing then pacing = s.delay end
  scopes[i] = s
end

-- A send may be reserved up to `reserve` ms ahead, but less than one delay, so
-- that at most one reserved lease per scope holds a slot before its send.
if pacing > 0 then reserve = math.min(reserve, 0.9 * pacing) end
if ready - now > reserve then
  -- Not yet. Hand out turns one delay apart, so that the workers waiting on
  -- this scope wake one after the other instead of all at once (a hint, not a
  -- reservation: whoever asks first when a send is due gets it). A worker
  -- wakes `reserve` ms before its turn, so its next attempt can reserve it.
  -- A worker that comes for its turn and finds the send moved by less than a
  -- delay (someone before it was late) keeps its place: it comes back for
  -- that send instead of queueing behind everyone again.
  local s = scopes[blocker]
  local turn = ready
  if not (myturn > 0 and ready <= myturn + pacing) then
    if s.delay > 0 and s.st.turn + s.delay > turn then turn = s.st.turn + s.delay end
  end
  if turn > s.st.turn then
    s.st.turn = turn
    save_state(s.S, s.st, now, ttl)
  end
  return {0, f(math.max(0, turn - now - reserve)), blocker, 2, f(now), f(turn)}
end

local t = math.max(now, ready)
for i = 1, n do
  local s = scopes[i]
  local p = s.p
  redis.call('ZADD', s.L, f(t + lease_ms), lease_id)
  expire_leases(s.L, now)
  local st = s.st
  if s.jl ~= s.jh then st.factor = 1 + s.jl + s.u * (s.jh - s.jl) else st.factor = 1 + s.jl end
  st.last = t
  st.next = t + s.delay * st.factor
  if s.nslots > 0 and s.nslots >= s.conc - s.inflight then redis.call('ZPOPMIN', s.T) end
  on_send(st, p, t)
  local delay = effective(st, p)
  if delay ~= s.delay then st.next = t + delay * st.factor end
  save_state(s.S, s.st, now, ttl)
  if p.quota >= 0 then
    redis.call('ZADD', s.Q, f(t), lease_id)
    redis.call('HSET', s.C, lease_id, g(s.cost))
    redis.call('HINCRBYFLOAT', s.C, '=', g(s.cost))
    local keep = math.ceil(t - now + p.window) + 1000
    redis.call('PEXPIRE', s.Q, keep)
    redis.call('PEXPIRE', s.C, keep)
  end
end
return {1, f(t - now), f(t), f(now)}
"""
)

#: Hand a lease back, with the feedback of its request.
#:
#: KEYS: as for :data:`ACQUIRE`.
#: ARGV: lease id, send time ms, used (1 = sent, 0 = never sent: refund its
#: quota), header wait ms (-1), pace ms (-1), pace-for ms, latency ms (-1),
#: status (0 = none), adjust (0/1), signal name, channel, state ttl ms, number
#: of scopes; then per scope: scope name, consumed cost (-1 = as declared),
#: backoff signal (1, 0, or -1 = no feedback for this scope) and the policy.
#: Replies the number of scopes where the lease was still valid (fewer than
#: the scopes: it had expired).
RELEASE = (
    COMMON
    + CONTROLLERS
    + r"""
local now = now_ms()
local lease_id = ARGV[1]
local used = tonumber(ARGV[3])
local fb = {sent = tonumber(ARGV[2]), hwait = tonumber(ARGV[4]), pace = tonumber(ARGV[5]),
            pacefor = tonumber(ARGV[6]), latency = tonumber(ARGV[7]), status = tonumber(ARGV[8]),
            adjust = tonumber(ARGV[9]), name = ARGV[10]}
local channel = ARGV[11]
local ttl = tonumber(ARGV[12])
local n = tonumber(ARGV[13])
local found = 0
for i = 1, n do
  local k = (i - 1) * 6
  local L, S, T, Q, C, W = KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4], KEYS[k + 5],
                           KEYS[k + 6]
  local b = 14 + (i - 1) * 22
  local name = ARGV[b]
  local consumed = tonumber(ARGV[b + 1])
  fb.signal = tonumber(ARGV[b + 2])
  local p = read_policy(b + 3)
  local expiry = tonumber(redis.call('ZSCORE', L, lease_id))
  local removed = redis.call('ZREM', L, lease_id)
  if expiry and expiry > now then found = found + 1 end
  redis.call('ZREMRANGEBYSCORE', L, '-inf', f(now))
  local inflight = redis.call('ZCARD', L)
  if used == 1 and fb.signal >= 0 then
    local st = load_state(S, p)
    local before = effective(st, p)
    on_feedback(st, p, now, fb, inflight + removed)
    local after = effective(st, p)
    if after ~= before and st.last > 0 then
      -- A new delay applies from the last send, with the jitter drawn then.
      st.next = st.last + after * st.factor
    end
    save_state(S, st, now, ttl)
  end
  if used == 1 and removed == 1 and p.slot > 0 then
    -- The freed slot remembers its send time (ScopeLedger.release()).
    local _, conc = effective(load_state(S, p), p)
    if conc > 0 then
      redis.call('ZADD', T, f(fb.sent), lease_id)
      local extra = redis.call('ZCARD', T) - math.max(0, conc - inflight)
      if extra > 0 then redis.call('ZPOPMIN', T, extra) end
      if redis.call('EXISTS', T) == 1 then
        redis.call('PEXPIRE', T, math.ceil(math.max(0, fb.sent + p.slot - now)) + 1000)
      end
    end
  end
  if p.quota >= 0 then
    local actual = -1
    if used == 0 then actual = 0 elseif consumed >= 0 then actual = consumed end
    if actual >= 0 then
      local old = tonumber(redis.call('HGET', C, lease_id))
      if old then
        redis.call('HSET', C, lease_id, g(actual))
        redis.call('HINCRBYFLOAT', C, '=', g(actual - old))
      end
    end
  end
  if removed == 1 and redis.call('EXISTS', W) == 1 then
    redis.call('PUBLISH', channel, name)
  end
end
if used == 0 and found == 0 then
  -- Handing back a grant that was never seen: if the acquire call is still on
  -- its way, it must not grant (see ACQUIRE).
  redis.call('SET', KEYS[#KEYS], '1', 'PX', 60000)
end
return found
"""
)

#: Extend a lease: ARGV lease id, lease ms; KEYS the lease sets of its scopes.
#: Replies how many scopes still held it.
RENEW = (
    COMMON
    + r"""
local now = now_ms()
local lease_id = ARGV[1]
local lease_ms = tonumber(ARGV[2])
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
"""
)

#: Read one scope without changing it: KEYS its six keys, ARGV its policy.
#: Replies now, in flight, effective delay, effective concurrency (0 =
#: unlimited), blocked until, next send, backoff level, last signal, last
#: signal time, quota used (all times in ms).
STATE = (
    COMMON
    + r"""
local now = now_ms()
local p = read_policy(1)
local L, S, Q, C = KEYS[1], KEYS[2], KEYS[4], KEYS[5]
local inflight = redis.call('ZCOUNT', L, '(' .. f(now), '+inf')
local st = load_state(S, p)
local delay, conc, _, _, blk = effective(st, p)
local used = 0
if p.quota >= 0 then
  used = tonumber(redis.call('HGET', C, '=')) or 0
  local old = redis.call('ZRANGEBYSCORE', Q, '-inf', f(now - p.window))
  for j = 1, #old, 500 do
    local chunk = {}
    for m = j, math.min(j + 499, #old) do chunk[#chunk + 1] = old[m] end
    local costs = redis.call('HMGET', C, unpack(chunk))
    for m = 1, #chunk do used = used - (tonumber(costs[m]) or 0) end
  end
end
return {f(now), inflight, g(delay), conc, f(blk), f(st.next), st.level, st.lsig, f(st.lsat),
        g(math.max(0, used))}
"""
)
