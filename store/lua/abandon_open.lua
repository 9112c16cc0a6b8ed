-- A gateway gave up on an open whose outcome it does not know (timeout, cancellation). If the
-- open landed, close it; if not, leave a tombstone so that a late open is refused (§2.10).
-- KEYS[1..12] as CLOSE_SESSION  KEYS[13] abandoned tombstone
-- ARGV[1] session id  ARGV[2] terminal payload  ARGV[3] tombstone ttl ms
-- returns status: closed_open (the open had landed) | tombstoned | already_closed |
--   other_format
local keys = session_keys(KEYS[1], KEYS[2], KEYS[3], KEYS[4])
local wk = worker_keys(KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11],
                      KEYS[12])
local abandoned = KEYS[13]
local sid, terminal, ttl = ARGV[1], ARGV[2], ARGV[3]

local f = redis.call('HMGET', keys.rec, 'state', FORMAT_FIELD)
if not f[1] then
  redis.call('SET', abandoned, '1', 'PX', ttl)
  return 'tombstoned'
end
if f[2] ~= SESSION_FORMAT then return 'other_format' end
if f[1] == 'closed' then return 'already_closed' end
terminate(sid, keys, wk, terminal, REASON.open_abandoned)
return 'closed_open'
