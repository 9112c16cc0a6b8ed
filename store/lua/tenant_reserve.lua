-- Count a session against its tenant's cap (DESIGN §2.1). A reservation is a lease: it expires
-- unless the gateway serving the session renews it, so a crashed gateway or a session that
-- ended unseen never holds a place for long. Reserve is checked against the cap; renew is not
-- (the sessions exist already) and extends each reservation that is still held, never one that
-- was released: a renewal racing the session's end must not take its place back. A gateway
-- renews all the sessions of one tenant it serves in one call per renewal period.
-- KEYS[1] tenant session set
-- ARGV[1] reserve | renew  ARGV[2] cap (0: none)  ARGV[3] lease ms
-- ARGV[4] ... session ids (reserve: one)
-- returns reserve: status ok | full; renew: per session, ok | released (a place no longer held)
local tenant = KEYS[1]
local mode, cap, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])

local now = now_ms()
redis.call('ZREMRANGEBYSCORE', tenant, '-inf', now)
if mode == 'renew' then
  local answers, renewed = {}, false
  for i = 4, #ARGV do
    local sid = ARGV[i]
    if redis.call('ZADD', tenant, 'XX', 'CH', now + lease, sid) == 0
        and redis.call('ZSCORE', tenant, sid) == false then
      answers[#answers + 1] = 'released'
    else
      answers[#answers + 1] = 'ok'
      renewed = true
    end
  end
  if renewed then redis.call('PEXPIRE', tenant, lease) end
  return answers
end
local sid = ARGV[4]
if cap > 0 and redis.call('ZSCORE', tenant, sid) == false
    and redis.call('ZCARD', tenant) >= cap then
  return 'full'
end
redis.call('ZADD', tenant, now + lease, sid)
redis.call('PEXPIRE', tenant, lease)
return 'ok'
