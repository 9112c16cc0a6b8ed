-- Attach a new connection: verify the token digest, bump the lease generation (the fencing
-- token), rotate the token, tell the old connection it was replaced (DESIGN §2.7).
-- A session belongs to the tenant that opened it: another tenant's resume is answered as if
-- the session did not exist, before the token is looked at, so the answer reveals nothing.
-- A retry of a resume that landed but whose answer was lost (through any gateway) presents the
-- token that resume rotated from, under the same control id, and rotates to the same new
-- token (the gateway derives it from those two): within the retry window it is accepted and
-- keeps that token. It is a resume like any other: a newer generation fences whichever
-- connection the lost answer was for. A different control id with the old token is refused.
-- Attempts of one resume are numbered by the client (1, 2, 3, ...; 0: not numbered): a copy
-- of an earlier attempt that lands late (it waited out a failover inside its gateway, while
-- the client gave up on it and a later attempt attached) is refused as 'stale' instead of
-- taking the session from the connection the client now uses.
-- KEYS[1] session record  KEYS[2] worker deadlines  KEYS[3] output channel  KEYS[4] output log
-- KEYS[5] worker gateways (attachment leases)  KEYS[6] worker held set (see attach_to)
-- KEYS[7] input log (its fence is raised to the new generation's)  KEYS[8] worker channel
-- ARGV[1] presented token digest  ARGV[2] new token digest  ARGV[3] control id
-- ARGV[4] session id  ARGV[5] tenant of the caller  ARGV[6] retry window ms
-- ARGV[7] call id (unique per call, kept by a resend: a resend changes nothing)
-- ARGV[8] gateway id  ARGV[9] attachment lease ms  ARGV[10] attempt number (0: none)
-- returns {status, generation, epoch, highest client seq in the input log, last
--          server_event_seq, first retained server_event_seq (0 if the log is empty), public
--          session (JSON), capabilities (JSON), the input log's last index (its writer
--          numbers on from there) and the largest command it holds (bytes)}
--   status ok | closed (token valid, session over: replay only) | unknown | bad_token | stale
--   | other_format (the record is of another format: nothing of it is read)
--   the session and capabilities ('' when the record has none) only with ok and closed: a
--   caller without the token learns nothing of the session
local rec, deadlines, out_channel, out_log = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local presented, fresh, control_id, sid, tenant = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local window, call_id = tonumber(ARGV[6]), ARGV[7]
local gateways, held, gid, lease_ms = KEYS[5], KEYS[6], ARGV[8], tonumber(ARGV[9])
local in_log, worker_channel = KEYS[7], KEYS[8]
local attempt = tonumber(ARGV[10])

local f = redis.call('HMGET', rec, 'state', 'gen', 'epoch', 'digest', 'rcid', 'cseq_end',
                     FORMAT_FIELD, 'tenant', 'prev', 'rcid_ms', 'rcall', 'ratt', 'session', 'caps')
if not f[1] or f[8] ~= tenant then return {'unknown', 0, '', 0, 0, 0, '', '', 0, 0} end
if f[7] ~= SESSION_FORMAT then return {'other_format', 0, '', 0, 0, 0, '', '', 0, 0} end
local state, gen, epoch, digest, rcid = f[1], tonumber(f[2]), f[3], f[4], f[5]
local first = redis.call('XRANGE', out_log, '-', '+', 'COUNT', 1)
local first_seq = 0
if #first > 0 then first_seq = tonumber(string.match(first[1][1], '^(%d+)')) end
-- The highest client seq appended: the input log's last entry says (each carries it), and
-- a closed session's log is gone, so its end kept it in the record.
local top = input_top(in_log)
local cseq = top and top.h or tonumber(f[6] or '0')
local last_index = top and top.index or 0
local biggest = top and top.biggest or 0
local answer = function(status, g)
  local session, caps = '', ''
  if status == 'ok' or status == 'closed' then session, caps = f[13] or '', f[14] or '' end
  return {status, g, epoch, cseq, output_top(out_log).seq, first_seq, session, caps,
          last_index, biggest}
end

if f[11] == call_id then return answer('ok', gen) end  -- this very call, sent again
local now = now_ms()
local retry = control_id ~= '' and rcid == control_id and digest == fresh
  and f[9] == presented and now < tonumber(f[10] or '0') + window
-- Digests, not tokens, are compared: a timing difference reveals nothing about the token.
if not retry and digest ~= presented then return answer('bad_token', 0) end
local landed_attempt = tonumber(f[12] or '0')
-- The same number again is that attempt resent by its gateway, not a stale copy.
if retry and attempt > 0 and attempt < landed_attempt then return answer('stale', 0) end
if state == 'closed' then return answer('closed', gen) end

gen = gen + 1
redis.call('HSET', rec, 'state', 'attached', 'gen', gen, 'active_ms', now, 'detached_ms', 0,
           'rcall', call_id)
if not retry then
  redis.call('HSET', rec, 'digest', fresh, 'prev', presented, 'rcid', control_id,
             'rcid_ms', now, 'ratt', attempt)
elseif attempt > landed_attempt then
  redis.call('HSET', rec, 'ratt', attempt)
end
raise_fence(in_log, attached_fence(gen), epoch, worker_channel, sid)
redis.call('ZADD', deadlines, next_deadline(rec), sid)
attach_to(rec, sid, gateways, held, gid, lease_ms, now)
redis.call('SPUBLISH', out_channel, cmsgpack.pack({'r', gen}))
return answer('ok', gen)
