"""The Lua scripts of the Redis backend: admission and bookkeeping, nothing else.

The controllers (backoff, AutoThrottle, rampup, custom ones) run in Python,
in the processes (:mod:`._redis_state`); Redis keeps what they produced and
the scripts only read it. Every script is atomic and reads Redis's own clock
(``TIME``), so the workers' clocks never matter; ``ARGV[1]`` may instead give
the time (tests drive the backend in virtual time that way; ``''`` = ``TIME``).
Times are milliseconds since the Unix epoch; ``next``/``last`` are stored with
``%.3f`` (Redis turns Lua numbers into strings with only 14 digits), values
the client sent are stored as it formatted them.

Keys of one scope (all share the hash tag ``{prefix:scope}``, so a scope is
Redis Cluster safe); ``KEYS`` holds six per scope, in this order, then the
tombstone of the call:

``L`` leases
    sorted set: lease id -> expiry time. Its size is the scope's in-flight
    count; expired leases (crashed workers) are dropped before every decision.
``S`` state
    hash. Bookkeeping: ``next`` (earliest next send), ``last`` (last send) and
    ``factor`` (its jitter factor), ``turn`` (the latest wake-up handed to a
    waiting worker). What the controllers produced (written only by a
    version check, see :data:`RELEASE` and :data:`SYNC`): ``ver``, ``ctl``
    (their states, JSON), ``fp`` (the fingerprint of the policy they ran
    with) and the effective limits ``delay``, ``conc`` (0 = unlimited),
    ``blk`` (blocked until), ``jl``/``jh`` (jitter) and ``due`` (the earliest
    time a send must run the controllers' ``on_send``).
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

A scope's policy travels as one MessagePack array (``PolicyArgs.wire`` in
:mod:`._redis_state`; ``cmsgpack`` reads it in a fraction of the time text
takes to split): the fingerprint, then the limits its fresh controllers give
(used while the scope has no stored state), its slot delay, quota and window.
"""

from __future__ import annotations

__all__ = ["ACQUIRE", "KEYS_PER_SCOPE", "PLAIN_RELEASE", "RELEASE", "RENEW", "STATE", "SYNC"]

#: Keys per scope in ``KEYS`` (leases, state, slots, quota log, quota costs, waiters).
KEYS_PER_SCOPE = 6

#: Helpers every script starts with: the clock, numbers as text, releasing a lease.
_BASE = r"""
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

-- A release freed a slot: wake the scope's waiters, if some wait (flag `W`).
local function wake_waiters(removed, W, channel, name)
  if removed == 1 and redis.call('EXISTS', W) == 1 then redis.call('PUBLISH', channel, name) end
end
"""

#: Helpers of the scripts that read policies and state: policies, state, quota.
_COMMON = (
    _BASE
    + r"""

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

-- Store what the controllers produced (limits in seconds: fp, delay, conc,
-- blk, jl, jh, due). A new delay applies from the last send, with the jitter
-- drawn then. Empty limits: only the version was checked, nothing changes.
local function write_state(key, st, limits, ctl, now, ttl)
  if limits == '' then return end
  local v = split(limits)
  local delay = tonumber(v[2]) * 1000
  if st.next ~= nil and delay ~= st.delay then
    st.next = st.next + (delay - st.delay) * st.factor
    redis.call('HSET', key, 'next', f(st.next))
  end
  st.ver = st.ver + 1
  st.delay, st.conc, st.blk = delay, tonumber(v[3]), tonumber(v[4]) * 1000
  redis.call('HSET', key, 'ver', st.ver, 'ctl', ctl, 'fp', v[1], 'delay', v[2], 'conc', v[3],
             'blk', v[4], 'jl', v[5], 'jh', v[6], 'due', v[7])
  keep_state(key, st, now, ttl)
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
"""
)

#: Try to take a lease on every scope at once.
#:
#: ARGV: clock, lease id, lease ms, reserve-ahead ms, state ttl ms, release
#: recheck ms, the turn this caller was given last (ms, 0 = none; a value
#: Redis handed out, not a client clock), the exact send time of a part of
#: a request across cluster slots (``'+ms'`` from now, or ms; ``''`` = none:
#: as soon as may be); then per scope: cost, a uniform
#: random number in [0, 1) for the jitter, the leases the caller holds that
#: Redis may not count (granted while it was away), whether the caller wants
#: the controllers' state with the grant (1: its policy has controllers), and
#: the packed policy.
#: Replies ``"1,wait_ms,send_at_ms,now_ms"`` (granted: send after
#: ``wait_ms``; one string, the cheapest reply to read), or the values ``1,
#: wait_ms, send_at_ms, now_ms, due, <controller states>...`` in one string,
#: one per line: the states, seven values each (see ``controller_state``),
#: first of the ``due`` scopes whose controllers must run ``on_send`` now,
#: then of those that have stored state or whose caller wants it (for the
#: feedback of the release), or
#: ``{0, wait_ms, scope_index, reason, now_ms[, turn_ms, reopens_ms, cause,
#: delay]}`` with reason 1 = concurrency full (wait for a release or the
#: earliest lease expiry), 2 = delay, slot delay, quota or server block (try
#: again after ``wait_ms``; the blocking scope reopens, slot delays aside,
#: after ``reopens_ms`` because of cause 1 = a server block, 2 = its quota, 3
#: = its delay, which is ``delay`` seconds), 3 = this lease id was handed
#: back already, 4 = the exact send time has passed (ask every part again).
#: A part granted at an exact time keeps what it changed of its scopes'
#: pacing (``un`` in the state), so that handing it back unsent (used 0,
#: see :data:`RELEASE`) undoes it when no send came since.
#:
#: An uncontended grant makes eight Redis calls: TIME, the tombstone and
#: retry checks, the state, the lease, the bookkeeping and two expiry checks
#: (an expiry is written only when it must move); a ninth counts the live
#: leases under a concurrency limit.
ACQUIRE = (
    _COMMON
    + r"""
local now = clock()
local now_text = f(now)
local lease_id = ARGV[2]
local lease_ms, reserve = tonumber(ARGV[3]), tonumber(ARGV[4])
local ttl, recheck = tonumber(ARGV[5]), tonumber(ARGV[6])
local myturn = tonumber(ARGV[7])
-- A part of a request across slots is granted at one time on every part:
-- '+ms' from now (the first part), or that time (the others); '' = as soon as may be.
local at = ARGV[8]
local exact = nil
if at ~= '' then
  if string.sub(at, 1, 1) == '+' then exact = now + tonumber(string.sub(at, 2))
  else exact = tonumber(at) end
  -- (Past it already: the caller asks all the parts again.)
  if exact < now then return {0, '0', 1, 4, now_text} end
end
local n = (#ARGV - 8) / 5

-- A call that its caller gave up on (cancelled while the request was on its
-- way) and that arrives after the hand-back must not grant anything.
if redis.call('EXISTS', KEYS[#KEYS]) == 1 then return {0, '0', 1, 3, now_text} end
-- A retried call (the reply was lost) returns the grant it already made.
local held = redis.call('ZSCORE', KEYS[1], lease_id)
if held then
  local t = tonumber(held) - lease_ms
  return '1,' .. f(math.max(0, t - now)) .. ',' .. f(t) .. ',' .. now_text
end

local scopes = {}
local ready, blocker = now, 1
local reopens, cause, delay = now, 3, '0'
local pacing = 0
for i = 1, n do
  local k = (i - 1) * 6
  local b = 9 + (i - 1) * 5
  local s = {L = KEYS[k + 1], S = KEYS[k + 2], T = KEYS[k + 3], Q = KEYS[k + 4],
             C = KEYS[k + 5], cost = tonumber(ARGV[b]), u = tonumber(ARGV[b + 1]),
             want = ARGV[b + 3] == '1'}
  local extra = tonumber(ARGV[b + 2])
  local p = read_policy(ARGV[b + 4])
  s.p = p
  local st = load_state(s.S, p)
  s.st = st
  if st.conc > 0 then
    -- The live leases (releases drop the expired ones of crashed workers).
    s.inflight = redis.call('ZCOUNT', s.L, '(' .. now_text, '+inf')
    if s.inflight + extra >= st.conc then
      -- Full: wait for a release, or the earliest lease expiry (or, full with
      -- leases Redis does not hold, look again soon).
      redis.call('ZREMRANGEBYSCORE', s.L, '-inf', now_text)
      local first = redis.call('ZRANGE', s.L, 0, 0, 'WITHSCORES')
      local wait = 50
      if first[2] and s.inflight >= st.conc then wait = tonumber(first[2]) - now end
      redis.call('SET', KEYS[k + 6], '1', 'PX', math.ceil(recheck) + 1000)
      return {0, f(wait), i, 1, now_text}
    end
  end
  -- When it reopens as far as time goes (ScopeLedger.reopens_at()), and why:
  -- 1 a server block, 2 its quota, 3 its delay.
  local r = math.max(st.next or -INF, st.blk)
  local why = 3
  if st.blk >= r then why = 1 end
  if p.quota >= 0 and s.cost > 0 then
    local q = quota_ready(s.Q, s.C, s.cost, p.quota, p.window, now)
    if q > r then r, why = q, 2 end
  end
  local reopen = r
  s.nslots = 0
  if p.slot > 0 and st.conc > 0 then
    s.nslots = redis.call('ZCARD', s.T)
    if s.nslots > 0 and s.nslots >= st.conc - s.inflight then
      local first = redis.call('ZRANGE', s.T, 0, 0, 'WITHSCORES')
      r = math.max(r, tonumber(first[2]) + p.slot)
    end
  end
  if r > ready then
    ready = r
    blocker = i
    reopens, cause, delay = reopen, why, delay_text(st)
  end
  if st.delay > pacing then pacing = st.delay end
  scopes[i] = s
end

-- A send may be reserved up to `reserve` ms ahead, but less than one delay, so
-- that at most one reserved lease per scope holds a slot before its send.
if pacing > 0 then reserve = math.min(reserve, 0.9 * pacing) end
if exact ~= nil then reserve = exact - now end
if ready - now > reserve then
  -- Not yet. Hand out turns one delay apart, so that the workers waiting on
  -- this scope wake one after the other instead of all at once (a hint, not a
  -- reservation: whoever asks first when a send is due gets it). A worker
  -- wakes `reserve` ms before its turn, so its next attempt can reserve it.
  -- A worker that comes for its turn and finds the send moved by less than a
  -- delay (someone before it was late) keeps its place.
  local s = scopes[blocker]
  local st = s.st
  local turn = ready
  if not (myturn > 0 and ready <= myturn + pacing) then
    if st.delay > 0 and st.turn + st.delay > turn then turn = st.turn + st.delay end
  end
  if turn > st.turn and turn < INF then
    st.turn = turn
    redis.call('HSET', s.S, 'turn', f(turn))
    keep_state(s.S, st, now, ttl)
  end
  return {0, f(math.max(0, turn - now - reserve)), blocker, 2, now_text, f(turn),
          f(math.max(0, reopens - now)), cause, delay}
end

local t = exact or math.max(now, ready)
-- (Numbers are formatted only when they differ: a string.format is a
-- good part of an uncontended grant's time in Redis.)
local t_text = now_text
if t ~= now then t_text = f(t) end
local due, kept = {}, {}
for i = 1, n do
  local s = scopes[i]
  local st = s.st
  redis.call('ZADD', s.L, f(t + lease_ms), lease_id)
  extend(s.L, math.ceil(t + lease_ms - now) + 1000, lease_ms)
  local before = {st.next, st.last, st.factor}
  st.factor = 1 + st.jl
  if st.jl ~= st.jh then st.factor = 1 + (st.jl + (st.jh - st.jl) * s.u) end
  st.last = t
  st.next = t + st.delay * st.factor
  if exact ~= nil then remember(s.S, lease_id, before, st.next) end
  if s.nslots > 0 and s.nslots >= st.conc - s.inflight then redis.call('ZPOPMIN', s.T) end
  local next_text, factor_text = t_text, '1'
  if st.next ~= t then next_text = f(st.next) end
  if st.factor ~= 1 then factor_text = g(st.factor) end
  redis.call('HSET', s.S, 'next', next_text, 'last', t_text, 'factor', factor_text)
  keep_state(s.S, st, now, ttl)
  -- The controllers must see this send (or rerun with this caller's policy);
  -- or their state comes with the grant, so that the release can run them on
  -- its feedback and write the result at once (if the version and the
  -- leases in flight are still those).
  local must = t >= st.due or st.fp ~= s.p.fp
  if must or s.want or st.ver > 0 then
    local inflight = s.inflight
    if inflight then
      inflight = inflight + 1
    else
      inflight = redis.call('ZCOUNT', s.L, '(' .. now_text, '+inf')
    end
    local state = controller_state(i, s.S, st, inflight)
    local into = kept
    if must then into = due end
    for m = 1, #state do into[#into + 1] = state[m] end
  end
  local p = s.p
  if p.quota >= 0 then
    redis.call('ZADD', s.Q, t_text, lease_id)
    redis.call('HSET', s.C, lease_id, g(s.cost))
    redis.call('HINCRBYFLOAT', s.C, '=', g(s.cost))
    local keep = math.ceil(t - now + p.window) + 1000
    redis.call('PEXPIRE', s.Q, keep)
    redis.call('PEXPIRE', s.C, keep)
  end
end
local wait = '0.000'
if t ~= now then wait = f(t - now) end
if #due + #kept == 0 then return '1,' .. wait .. ',' .. t_text .. ',' .. now_text end
local reply = {1, wait, t_text, now_text, #due / 7}
for m = 1, #due do reply[#reply + 1] = due[m] end
for m = 1, #kept do reply[#reply + 1] = kept[m] end
return table.concat(reply, '\n')  -- (JSON holds no raw newline)
"""
)

#: Store what the controllers produced after a send (their ``on_send``), if
#: nobody wrote the scope since it was read.
#:
#: ARGV: clock, state ttl ms, then per scope: the packed policy, the version
#: read, the new limits (``fp,delay,conc,blk,jl,jh,due``) and the states
#: (JSON); an empty version skips the scope. Replies ``{now_ms, <controller
#: states>...}``: nothing more if every write was made, else the current
#: state of each scope whose version had moved (none of those is written).
SYNC = (
    _COMMON
    + r"""
local now = clock()
local ttl = tonumber(ARGV[2])
local n = (#ARGV - 2) / 4
local reply = {f(now)}
for i = 1, n do
  local k = (i - 1) * 6
  local b = 3 + (i - 1) * 4
  if ARGV[b + 1] ~= '' then
    local st = load_state(KEYS[k + 2], read_policy(ARGV[b]))
    if st.ver == tonumber(ARGV[b + 1]) then
      write_state(KEYS[k + 2], st, ARGV[b + 2], ARGV[b + 3], now, ttl)
    else
      local inflight = redis.call('ZCOUNT', KEYS[k + 1], '(' .. f(now), '+inf')
      local state = controller_state(i, KEYS[k + 2], st, inflight)
      for m = 1, #state do reply[#reply + 1] = state[m] end
    end
  end
end
return reply
"""
)

#: Hand a lease back, after storing what the controllers made of its feedback.
#:
#: ARGV: clock, lease id, send time ms, used (1 = sent, 0 = never sent: refund
#: its quota), channel, state ttl ms; then per scope: scope name, consumed
#: cost (-1 = as declared), want (0 = no feedback for this scope, 1 = feedback:
#: its controllers must run if it has stored state, 2 = they must run), the
#: packed policy ('' when want is 0 and it has no slot delay or quota), the
#: version read ('' = nothing to write), the new limits, the states, and the
#: leases in flight the controllers were shown (a write computed on the state
#: that came with the grant stands only if as many are still in flight; '' =
#: not checked).
#:
#: The controllers run before the release, as they would in memory (feedback
#: comes while the request is in flight): if a scope that wants feedback
#: carries no write, or a write's version (or in-flight count) moved, nothing
#: changes and the reply is ``{0, now_ms, <controller states>...}`` (run
#: them, then call again). Otherwise every write is stored, the lease released, and the reply
#: is the string ``"1,now_ms,found"``, ``found`` the number of scopes where
#: the lease was still valid (fewer than the scopes: it had expired).
RELEASE = (
    _COMMON
    + r"""
local now = clock()
local lease_id = ARGV[2]
local sent = tonumber(ARGV[3])
local used = tonumber(ARGV[4])
local channel = ARGV[5]
local ttl = tonumber(ARGV[6])
local n = (#ARGV - 6) / 8
-- (A release without feedback, slot delay or quota is sent no policy.)
local NO_POLICY = {slot = 0, quota = -1}
local scopes = {}
local pending = {f(now)}
for i = 1, n do
  local k = (i - 1) * 6
  local b = 7 + (i - 1) * 8
  local s = {L = KEYS[k + 1], S = KEYS[k + 2], T = KEYS[k + 3], Q = KEYS[k + 4],
             C = KEYS[k + 5], W = KEYS[k + 6], name = ARGV[b],
             consumed = tonumber(ARGV[b + 1]), want = tonumber(ARGV[b + 2]),
             p = NO_POLICY, ver = ARGV[b + 4], limits = ARGV[b + 5],
             ctl = ARGV[b + 6], flying = ARGV[b + 7]}
  if ARGV[b + 3] ~= '' then s.p = read_policy(ARGV[b + 3]) end
  local stale = s.want == 2
  if s.ver ~= '' or s.want == 1 or s.p.slot > 0 then
    -- (A release without feedback or slot delay needs no state.)
    s.st = load_state(s.S, s.p)
    if s.ver ~= '' then
      stale = s.st.ver ~= tonumber(s.ver)
      if not stale and s.flying ~= '' then
        -- Run on the state read at the grant: as good only with as many in flight.
        stale = redis.call('ZCOUNT', s.L, '(' .. f(now), '+inf') ~= tonumber(s.flying)
      end
    elseif s.want == 1 then
      stale = s.st.ver > 0
    end
  end
  if stale then
    s.st = s.st or load_state(s.S, s.p)
    local inflight = redis.call('ZCOUNT', s.L, '(' .. f(now), '+inf')
    local state = controller_state(i, s.S, s.st, inflight)
    for m = 1, #state do pending[#pending + 1] = state[m] end
  end
  scopes[i] = s
end
if #pending > 1 then return {0, unpack(pending)} end

local found = 0
local now_text = pending[1]
for i = 1, n do
  local s = scopes[i]
  local st = s.st
  if s.ver ~= '' then write_state(s.S, st, s.limits, s.ctl, now, ttl) end
  local removed, valid = drop_lease(s.L, lease_id, now, now_text)
  if valid then found = found + 1 end
  if used == 0 and removed == 1 then undo(s.S, lease_id, sent) end
  if used == 1 and removed == 1 and s.p.slot > 0 and st.conc > 0 then
    -- The freed slot remembers its send time (ScopeLedger.release()).
    local inflight = redis.call('ZCARD', s.L)
    redis.call('ZADD', s.T, f(sent), lease_id)
    local extra = redis.call('ZCARD', s.T) - math.max(0, st.conc - inflight)
    if extra > 0 then redis.call('ZPOPMIN', s.T, extra) end
    if redis.call('EXISTS', s.T) == 1 then
      redis.call('PEXPIRE', s.T, math.ceil(math.max(0, sent + s.p.slot - now)) + 1000)
    end
  end
  if s.p.quota >= 0 then
    local actual = -1
    if used == 0 then actual = 0 elseif s.consumed >= 0 then actual = s.consumed end
    if actual >= 0 then
      local old = tonumber(redis.call('HGET', s.C, lease_id))
      if old then
        redis.call('HSET', s.C, lease_id, g(actual))
        redis.call('HINCRBYFLOAT', s.C, '=', g(actual - old))
      end
    end
  end
  wake_waiters(removed, s.W, channel, s.name)
end
if used == 0 and found == 0 then
  -- Handing back a grant that was never seen: if the acquire call is still on
  -- its way, it must not grant (see ACQUIRE).
  redis.call('SET', KEYS[#KEYS], '1', 'PX', 60000)
end
return '1,' .. now_text .. ',' .. found
"""
)

#: Hand back a lease of a sent request without feedback, in scopes without
#: slot delay or quota (the common release: nothing to read or write but the
#: lease sets): :data:`RELEASE` without its policies and state.
#:
#: KEYS as for :data:`RELEASE`; ARGV: clock, lease id, channel, then each
#: scope's name. Replies as :data:`RELEASE` does once released:
#: ``"1,now_ms,found"``.
PLAIN_RELEASE = (
    _BASE
    + r"""
local now = clock()
local now_text = f(now)
local lease_id = ARGV[2]
local found = 0
for i = 1, #ARGV - 3 do
  local k = (i - 1) * 6
  local removed, valid = drop_lease(KEYS[k + 1], lease_id, now, now_text)
  if valid then found = found + 1 end
  wake_waiters(removed, KEYS[k + 6], ARGV[3], ARGV[3 + i])
end
return '1,' .. now_text .. ',' .. found
"""
)

#: Extend a lease: ARGV clock, lease id, lease ms; KEYS the lease sets of its
#: scopes. Replies how many scopes still held it.
RENEW = (
    _COMMON
    + r"""
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
"""
)

#: Read one scope without changing it: KEYS its six keys, ARGV clock and its
#: packed policy. Replies now, in flight, next send, quota used, then its
#: controller state (see ``controller_state``) and blocked until.
STATE = (
    _COMMON
    + r"""
local now = clock()
local p = read_policy(ARGV[2])
local L, S, Q, C = KEYS[1], KEYS[2], KEYS[4], KEYS[5]
local inflight = redis.call('ZCOUNT', L, '(' .. f(now), '+inf')
local st = load_state(S, p)
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
local reply = {f(now), inflight, f(st.next or -1), g(math.max(0, used))}
local state = controller_state(1, S, st, inflight)
for m = 1, #state do reply[#reply + 1] = state[m] end
reply[#reply + 1] = g(st.blk)
return reply
"""
)
