-- Hand back a lease of a sent request without feedback, in scopes without
-- slot delay or quota (the common release: nothing to read or write but the
-- lease sets): :data:`RELEASE` without its policies and state.
--
-- KEYS as for :data:`RELEASE`; ARGV: clock, lease id, channel, then each
-- scope's name. Replies as :data:`RELEASE` does once released:
-- ``"1,now_ms,found"``.
--
-- (Runs after base.lua, in one script.)

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
