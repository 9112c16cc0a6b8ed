-- The attached client acknowledged every event up to a seq (session.event_ack): drop them, so
-- Redis holds only what a resume could still need (DESIGN §5: memory per session). Fenced:
-- only the current attachment may trim.
-- KEYS[1] session record  KEYS[2] output log
-- ARGV[1] store epoch  ARGV[2] generation  ARGV[3] highest acknowledged server_event_seq
-- ARGV[4] tenant
-- returns status: ok | stale | unknown (also: another tenant's session) | ahead | other_format
-- An acknowledgement past the log's end ('ahead') names events the log no longer has: a
-- failover to a replica that lagged took them, and the log numbers on from where the replica
-- stood. The entries under those numbers now are new ones the client has not seen (the
-- session's terminal event, say): trimming to the acknowledged seq would drop them unseen.
local rec, out_log = KEYS[1], KEYS[2]
local epoch, gen, upto, tenant = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]

local f = redis.call('HMGET', rec, 'epoch', 'gen', 'tenant', 'out_seq', FORMAT_FIELD)
if not f[1] or f[3] ~= tenant then return 'unknown' end
if f[5] ~= SESSION_FORMAT then return 'other_format' end
if f[1] ~= epoch or f[2] ~= gen then return 'stale' end
if upto > tonumber(f[4]) then return 'ahead' end
redis.call('XTRIM', out_log, 'MINID', (upto + 1) .. '-0')
return 'ok'
