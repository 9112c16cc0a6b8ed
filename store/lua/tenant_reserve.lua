-- Count a session against its tenant's cap (DESIGN §2.1). A reservation is a lease: it expires
-- unless the gateway serving the session renews it, so a crashed gateway or a session that
-- ended unseen never holds a place for long. Reserve is checked against the cap; renew is not
-- (the session exists already) and extends a reservation that is still held, never one that
-- was released: a renewal racing the session's end must not take its place back.
-- KEYS[1] tenant session set
-- ARGV[1] session id  ARGV[2] cap (0: none)  ARGV[3] lease ms  ARGV[4] reserve | renew
-- returns status: ok | full | released (renew of a place no longer held)
local tenant = KEYS[1]
local sid, cap, lease, mode = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]

local now = now_ms()
redis.call('ZREMRANGEBYSCORE', tenant, '-inf', now)
if mode == 'renew' then
  if redis.call('ZADD', tenant, 'XX', 'CH', now + lease, sid) == 0
      and redis.call('ZSCORE', tenant, sid) == false then
    return 'released'
  end
  redis.call('PEXPIRE', tenant, lease)
  return 'ok'
end
if cap > 0 and redis.call('ZSCORE', tenant, sid) == false
    and redis.call('ZCARD', tenant) >= cap then
  return 'full'
end
redis.call('ZADD', tenant, now + lease, sid)
redis.call('PEXPIRE', tenant, lease)
return 'ok'
