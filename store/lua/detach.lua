-- A connection was lost without session.close: start the disconnect grace, fenced on the
-- generation that connection served, so an old socket cannot detach a newer lease (§2.6).
-- KEYS[1] session record  KEYS[2] worker deadlines  KEYS[3] worker held set (see attach_to)
-- KEYS[4] session input log (its fence is raised: the detached holder can append no more)
-- KEYS[5] worker channel (told of the raised fence)
-- ARGV[1] session id  ARGV[2] store epoch  ARGV[3] generation served  ARGV[4] tenant
-- ARGV[5] grace ms for this detachment (0: the session's DISCONNECT grace)
-- returns status: ok | stale | closed | unknown (also: another tenant's session) | other_format
--   (detaching the same lease again is ok and changes nothing: the grace keeps its start)
local rec, deadlines, held, in_log, worker_channel = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local sid, epoch, gen, tenant, detach_grace = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]

local f = redis.call('HMGET', rec, 'state', 'epoch', 'gen', 'tenant', FORMAT_FIELD)
if not f[1] or f[4] ~= tenant then return 'unknown' end
if f[5] ~= SESSION_FORMAT then return 'other_format' end
if f[1] == 'closed' then return 'closed' end
if f[2] ~= epoch or f[3] ~= gen then return 'stale' end
if f[1] == 'detached' then return 'ok' end
redis.call('HSET', rec, 'state', 'detached', 'detached_ms', now_ms(), 'dgrace', detach_grace)
raise_fence(in_log, detached_fence(gen), epoch, worker_channel, sid)
let_go(rec, sid, held)
redis.call('ZADD', deadlines, next_deadline(rec), sid)
return 'ok'
