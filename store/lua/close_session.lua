-- End a session from outside its worker (abandoned open, operator close). Unfenced by design:
-- closing is idempotent, and the closed state fences every later write.
-- KEYS[1] session record  KEYS[2] input log  KEYS[3] output log  KEYS[4] output channel
-- KEYS[5] worker record  KEYS[6] worker session set  KEYS[7] worker deadlines
-- KEYS[8] worker channel  KEYS[9] worker ended list  KEYS[10] worker gateways
-- KEYS[11] worker held set (see attach_to)  KEYS[12] worker moved set
-- ARGV[1] session id  ARGV[2] terminal payload  ARGV[3] reason
-- returns status: ok | closed | unknown | other_format
local keys = session_keys(KEYS[1], KEYS[2], KEYS[3], KEYS[4])
local wk = worker_keys(KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11],
                      KEYS[12])
local sid, terminal, reason = ARGV[1], ARGV[2], ARGV[3]

local f = redis.call('HMGET', keys.rec, 'state', FORMAT_FIELD)
if not f[1] then return 'unknown' end
if f[2] ~= SESSION_FORMAT then return 'other_format' end
if f[1] == 'closed' then return 'closed' end
terminate(sid, keys, wk, terminal, reason)
return 'ok'
