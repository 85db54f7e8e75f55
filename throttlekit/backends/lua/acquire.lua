-- Try to take a lease on every scope at once.
--
-- ARGV: clock, lease id, lease ms, reserve-ahead ms, state ttl ms, release
-- recheck ms, the caller's process token (its place in a full scope's line
-- of processes), the turn this caller was given last (ms, 0 = none; a value
-- Redis handed out, not a client clock), the exact send time of a part of
-- a request across cluster slots (``'+ms'`` from now, or ms; ``''`` = none:
-- as soon as may be); then per scope: cost, a uniform
-- random number in [0, 1) for the jitter, the leases the caller holds that
-- Redis may not count (granted while it was away), whether the caller wants
-- the controllers' state with the grant (1: its policy has controllers), and
-- the packed policy.
-- Replies ``"1,wait_ms,send_at_ms,now_ms"`` (granted: send after
-- ``wait_ms``; one string, the cheapest reply to read), or the values ``1,
-- wait_ms, send_at_ms, now_ms, due, <controller states>...`` in one string,
-- one per line: the states, seven values each (see ``controller_state``),
-- first of the ``due`` scopes whose controllers must run ``on_send`` now,
-- then of those that have stored state or whose caller wants it (for the
-- feedback of the release), or
-- ``{0, wait_ms, scope_index, reason, now_ms[, turn_ms, reopens_ms, cause,
-- delay]}`` with reason 1 = concurrency full (wait for a release or the
-- earliest lease expiry), 2 = delay, slot delay, quota or server block (try
-- again after ``wait_ms``; the blocking scope reopens, slot delays aside,
-- after ``reopens_ms`` because of cause 1 = a server block, 2 = its quota, 3
-- = its delay, which is ``delay`` seconds), 3 = this lease id was handed
-- back already, 4 = the exact send time has passed (ask every part again).
-- A part granted at an exact time keeps what it changed of its scopes'
-- pacing (``un`` in the state), so that handing it back unsent (used 0,
-- see :data:`RELEASE`) undoes it when no send came since.
--
-- An uncontended grant makes eight Redis calls: TIME, the tombstone and
-- retry checks, the state, the lease, the bookkeeping and two expiry checks
-- (an expiry is written only when it must move); under a concurrency limit,
-- a ninth counts the live leases and a tenth takes the caller out of the
-- scope's line of processes.
--
-- (Runs after common.lua, in one script.)

local now = clock()
local now_text = f(now)
local lease_id = ARGV[2]
local lease_ms, reserve = tonumber(ARGV[3]), tonumber(ARGV[4])
local ttl, recheck = tonumber(ARGV[5]), tonumber(ARGV[6])
local token = ARGV[7]
local myturn = tonumber(ARGV[8])
-- A part of a request across slots is granted at one time on every part:
-- '+ms' from now (the first part), or that time (the others); '' = as soon as may be.
local at = ARGV[9]
local exact = nil
if at ~= '' then
  if string.sub(at, 1, 1) == '+' then exact = now + tonumber(string.sub(at, 2))
  else exact = tonumber(at) end
  -- (Past it already: the caller asks all the parts again.)
  if exact < now then return {0, '0', 1, 4, now_text} end
end
local n = (#ARGV - 9) / 5

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
  local b = 10 + (i - 1) * 5
  local s = {L = KEYS[k + 1], S = KEYS[k + 2], T = KEYS[k + 3], Q = KEYS[k + 4],
             C = KEYS[k + 5], W = KEYS[k + 6], cost = tonumber(ARGV[b]), u = tonumber(ARGV[b + 1]),
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
      -- In the scope's line of processes (by when each first asked): a
      -- release wakes the first two of them, not every process that waits.
      redis.call('ZADD', s.W, 'NX', now_text, token)
      redis.call('PEXPIRE', s.W, math.ceil(recheck) + 1000)
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

-- A send may be reserved up to `reserve` ms ahead, several delays ahead at a
-- fast pace: a worker that wakes late for its turn still sends at the time
-- reserved for it, and no send time goes unused. A reserved lease holds a
-- concurrency slot until its send, which costs the scope no send: none can go
-- before the reserved ones (the delay); at most `reserve` / delay of them wait.
if exact ~= nil then reserve = exact - now end
if ready - now > reserve then
  -- Waiting for time, not for a slot: out of the scopes' lines of processes
  -- (a wake-up for a slot would find no waiter to take it).
  for i = 1, n do
    if scopes[i].st.conc > 0 then redis.call('ZREM', scopes[i].W, token) end
  end
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
  if st.conc > 0 then redis.call('ZREM', s.W, token) end  -- (served: out of the line)
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
