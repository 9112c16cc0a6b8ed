-- Renew one gateway's attachment lease on one worker: every session it serves there at once
-- (one call per gateway and worker, whatever the number of sessions), and with it that
-- gateway's housekeeping of those sessions, so the housekeeping too costs one call per
-- (gateway, worker) and renewal period, never one per session: output trims, and the sessions
-- whose clients were active since the last renewal. All in the worker's slot (session keys
-- carry its hash tag). Safe to run twice: a trim to the same seq drops nothing more, and an
-- activity mark only moves a session's idle deadline later.
-- KEYS[1] worker gateways
-- KEYS[2i], KEYS[2i+1] (i = 1..n) the i-th trim's session record and output log
-- KEYS[2n+2] ... the records of the sessions with client activity
-- ARGV[1] gateway id ('': renew no lease, only the housekeeping)  ARGV[2] lease ms
-- ARGV[3] n, how many trims
-- ARGV[4i], ARGV[4i+1], ARGV[4i+2], ARGV[4i+3] (i = 1..n) the i-th trim: store epoch,
--   generation, highest acknowledged server_event_seq, tenant
-- returns {the lease's end (ms, Redis clock; 0 with no gateway id), {trim status, ...}}, a
--   trim's status: ok | stale | unknown (also: another tenant's session) | ahead | other_format
-- A trim drops the output the client acknowledged (session.event_ack) or took long ago, so
-- Redis holds only what a resume could still need (DESIGN §5: memory per session). Fenced:
-- only the current attachment may trim. An acknowledgement past the log's end ('ahead')
-- names events the log no longer has: a failover to a replica that lagged took them, and the
-- log numbers on from where the replica stood. The entries under those numbers now are new
-- ones the client has not seen (the session's terminal event, say): trimming to the
-- acknowledged seq would drop them unseen.
-- Activity: the idle TTL counts from 'active_ms', which the input appends do not write (no
-- per-chunk field write); a session with client activity since the last renewal gets it
-- here, at most one renewal period after the activity, so its idle expiry comes at most that
-- much late, never early. A closed session is left as it is.
local gateways, gid, lease_ms, trims = KEYS[1], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()

local function trim(rec, out_log, epoch, gen, upto, tenant)
  local f = redis.call('HMGET', rec, 'epoch', 'gen', 'tenant', FORMAT_FIELD)
  if not f[1] or f[3] ~= tenant then return 'unknown' end
  if f[4] ~= SESSION_FORMAT then return 'other_format' end
  if f[1] ~= epoch or f[2] ~= gen then return 'stale' end
  local last = output_top(out_log).seq
  if upto > last then return 'ahead' end
  -- The last entry stays whatever was acknowledged: it numbers the session's next event.
  redis.call('XTRIM', out_log, 'MINID', math.min(upto + 1, last) .. '-0')
  return 'ok'
end

local until_ms = 0
if gid ~= '' then
  until_ms = now + lease_ms
  redis.call('ZADD', gateways, until_ms, gid)
end
local trimmed = {}
for i = 1, trims do
  local a = 4 * i
  trimmed[i] = trim(KEYS[2 * i], KEYS[2 * i + 1], ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2]),
                    ARGV[a + 3])
end
for k = 2 * trims + 2, #KEYS do
  local f = redis.call('HMGET', KEYS[k], 'state', FORMAT_FIELD)
  if f[1] and f[1] ~= 'closed' and f[2] == SESSION_FORMAT then
    redis.call('HSET', KEYS[k], 'active_ms', now)
  end
end
return {until_ms, trimmed}
