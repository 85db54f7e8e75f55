-- Store what the controllers produced after a send (their ``on_send``), if
-- nobody wrote the scope since it was read.
--
-- ARGV: clock, state ttl ms, the release channel, then per scope: its name,
-- the packed policy, the version read, the new limits
-- (``fp,delay,conc,blk,jl,jh,due``) and the states (JSON); an empty version
-- skips the scope. Replies ``{now_ms, <controller
-- states>...}``: nothing more if every write was made, else the current
-- state of each scope whose version had moved (none of those is written).
--
-- (Runs after common.lua, in one script.)

local now = clock()
local ttl = tonumber(ARGV[2])
local channel = ARGV[3]
local n = (#ARGV - 3) / 5
local reply = {f(now)}
for i = 1, n do
  local k = (i - 1) * 6
  local b = 4 + (i - 1) * 5
  if ARGV[b + 2] ~= '' then
    local st = load_state(KEYS[k + 2], read_policy(ARGV[b + 1]))
    if st.ver == tonumber(ARGV[b + 2]) then
      if write_state(KEYS[k + 2], st, ARGV[b + 3], ARGV[b + 4], now, ttl) then
        wake_everyone(channel, ARGV[b])
      end
    else
      local inflight = redis.call('ZCOUNT', KEYS[k + 1], '(' .. f(now), '+inf')
      local state = controller_state(i, KEYS[k + 2], st, inflight)
      for m = 1, #state do reply[#reply + 1] = state[m] end
    end
  end
end
return reply
