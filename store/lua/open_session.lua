-- Place a new session on one worker: check liveness and capacity, reserve the slot, write the
-- record, all in the worker's slot, so two opens can never take the same slot (DESIGN §2.1).
-- KEYS[1] worker record   KEYS[2] worker session set   KEYS[3] worker deadlines
-- KEYS[4] session record  KEYS[5] abandoned tombstone  KEYS[6] worker input channel
-- KEYS[7] worker gateways (attachment leases)  KEYS[8] worker held set (see attach_to)
-- KEYS[9] session input log  KEYS[10] session output log
-- ARGV[1] session id  ARGV[2] store epoch  ARGV[3] token digest  ARGV[4] tenant
-- ARGV[5] grace ms    ARGV[6] idle ms      ARGV[7] out log max entries  ARGV[8] retention ms
-- ARGV[9] gateway id  ARGV[10] attachment lease ms
-- ARGV[11] the public session object (JSON; '' none: its worker published no profile)
-- ARGV[12] the session's capabilities (JSON; '' none)
-- ARGV[13] the model name the session asks for ('' any): the worker must list it
-- ARGV[14] input log max entries  ARGV[15] input log max bytes (0: none): the gateway's
--   bounds, which its worker keeps what it holds for checkpoints well inside
-- returns {status, generation}: status ok | abandoned | exists | unavailable | full |
--   other_model (the worker does not serve that name)
--   (a resend of an open that landed, same epoch and digest, answers ok again)
local worker, sessions, deadlines = KEYS[1], KEYS[2], KEYS[3]
local rec, abandoned, worker_channel, gateways, held = KEYS[4], KEYS[5], KEYS[6], KEYS[7],
                                                      KEYS[8]
local in_log, out_log = KEYS[9], KEYS[10]
local sid, epoch, digest, tenant = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local grace_ms, idle_ms, out_max, retention_ms = ARGV[5], ARGV[6], ARGV[7], ARGV[8]
local gid, lease_ms = ARGV[9], tonumber(ARGV[10])
local session, caps, model = ARGV[11], ARGV[12], ARGV[13]

if redis.call('EXISTS', abandoned) == 1 then return {'abandoned', 0} end
local placed = redis.call('HMGET', rec, 'epoch', 'digest', 'gen', 'state')
if placed[1] then
  -- The token digest is fresh per open: a match is this open's own resend (its reply was lost).
  if placed[1] == epoch and placed[2] == digest and placed[3] == '1' and placed[4] ~= 'closed'
  then
    return {'ok', 1}
  end
  return {'exists', 0}
end
local now = now_ms()
local w = redis.call('HMGET', worker, 'state', 'alive_until', 'slots', 'used', 'models',
                     FORMAT_FIELD)
-- A worker record of another format is not read: its fields may mean something else.
if w[1] ~= 'live' or w[6] ~= WORKER_FORMAT or tonumber(w[2]) < now then
  return {'unavailable', 0}
end
if model ~= '' then
  local serves = false
  for _, name in ipairs(cjson.decode(w[5] or '[]')) do
    if name == model then serves = true end
  end
  if not serves then return {'other_model', 0} end
end
if tonumber(w[4]) >= tonumber(w[3]) then return {'full', 0} end

redis.call('HINCRBY', worker, 'used', 1)
redis.call('SADD', sessions, sid)
redis.call('HSET', rec, FORMAT_FIELD, SESSION_FORMAT, 'state', 'attached', 'epoch', epoch,
  'gen', 1, 'digest', digest, 'rcid', '', 'tenant', tenant,
  'created_ms', now, 'active_ms', now, 'detached_ms', 0,
  'grace_ms', grace_ms, 'idle_ms', idle_ms,
  'out_max', out_max, 'retention_ms', retention_ms, 'in_max', ARGV[14],
  'in_max_bytes', ARGV[15],
  'owner', string.match(sid, '^sess_([^.]+)%.'), 'owner_epoch', 1)
-- What a resume through any gateway announces: the session as session.created showed it
-- (the worker's later session.updated replace it, see APPEND_OUTPUT) and its capabilities.
if session ~= '' then redis.call('HSET', rec, 'session', session) end
if caps ~= '' then redis.call('HSET', rec, 'caps', caps) end
-- The input log exists from here on, under generation 1's fence: appends never create it
-- (NOMKSTREAM), so one that comes after the session's end cannot bring it back.
redis.call('XADD', in_log, attached_fence(1) .. '-0', 'f', attached_fence(1), 'h', 0,
           'e:' .. epoch, 0)
-- So does the output log, empty (its first event is seq 1, ID '1-0'): the worker's appends
-- never create it either.
redis.call('XADD', out_log, '0-1', 'x', '')
redis.call('XDEL', out_log, '0-1')
redis.call('ZADD', deadlines, now + tonumber(idle_ms), sid)
attach_to(rec, sid, gateways, held, gid, lease_ms, now)
redis.call('SPUBLISH', worker_channel, cmsgpack.pack({'o', sid}))
return {'ok', 1}
