-- Hand a lease back, after storing what the controllers made of its feedback.
--
-- ARGV: clock, lease id, send time ms, used (1 = sent, 0 = never sent: refund
-- its quota, 2 = sent, and its feedback announces no limit: see below),
-- channel, state ttl ms; then per scope: scope name, consumed
-- cost (-1 = as declared), want (0 = no feedback for this scope, 1 = feedback:
-- its controllers must run if it has stored state, 2 = they must run), the
-- packed policy ('' when want is 0 and it has no slot delay or quota), the
-- version read ('' = nothing to write), the new limits, the states, and the
-- leases in flight the controllers were shown (a write computed on the state
-- that came with the grant stands only if as many are still in flight; '' =
-- not checked).
--
-- The controllers run before the release, as they would in memory (feedback
-- comes while the request is in flight): if a scope that wants feedback
-- carries no write, or a write's version (or in-flight count) moved, nothing
-- changes and the reply is ``{0, now_ms, <controller states>...}`` (run
-- them, then call again). Otherwise every write is stored, the lease released, and the reply
-- is the string ``"1,now_ms,found"``, ``found`` the number of scopes where
-- the lease was still valid (fewer than the scopes: it had expired).
--
-- A feedback that announces no limit (used = 2: a success without rate-limit
-- headers) need not be stored before the slot is free: where writes moved,
-- the lease is released at once and the reply is ``{2, now_ms, found,
-- <controller states>...}``; the call again stores the writes (a release of
-- a lease already released changes nothing else). With three processes
-- sharing a scope, another's feedback moves the state during almost every
-- request, and the slot stayed held for the second round trip.
--
-- (Runs after common.lua, in one script.)

local now = clock()
local lease_id = ARGV[2]
local sent = tonumber(ARGV[3])
local used = tonumber(ARGV[4])
local early = used == 2
if early then used = 1 end
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
local moved = #pending > 1
if moved and not early then return {0, unpack(pending)} end

local found = 0
local now_text = pending[1]
for i = 1, n do
  local s = scopes[i]
  local st = s.st
  if s.ver ~= '' and not moved and write_state(s.S, st, s.limits, s.ctl, now, ttl) then
    wake_everyone(channel, s.name)
  end
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
if moved then return {2, now_text, found, unpack(pending, 2)} end
return '1,' .. now_text .. ',' .. found
