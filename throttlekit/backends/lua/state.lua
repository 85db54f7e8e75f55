-- Read one scope without changing it: KEYS its six keys, ARGV clock and its
-- packed policy. Replies now, in flight, next send, quota used, then its
-- controller state (see ``controller_state``) and blocked until.
--
-- (Runs after common.lua, in one script.)

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
