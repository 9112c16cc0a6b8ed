"""Every Lua script of the store, and nothing else.

Each script is a compare-and-set: it reads what it must check and writes only if the check holds,
atomically, so no read-then-write race exists in Python (style rule 6). Each starts with its
KEYS/ARGV/returns contract and binds them to named locals.

Conventions shared by all scripts:

* Time is the Redis server's own clock (``TIME``), in milliseconds, so every gateway, worker and
  reaper agrees on deadlines without trusting their host clocks. Redis >= 5 replicates script
  effects, so non-deterministic commands are allowed.
* Every key a script touches carries one hash tag (``store/keys.py``); keys derived inside a
  script from a session id (the reaper) share that tag, so Redis Cluster keeps them in one slot.
* Push notices are MessagePack arrays (``cmsgpack`` ships with Redis and Valkey) published with
  ``SPUBLISH`` (sharded pub/sub, also valid on a single node). Output notice: ``{"e", first_seq,
  {payload, ...}}`` or ``{"r", generation}`` (the lease moved to a newer connection). Worker
  notice: ``{"i", session_id, first_index, {payload, ...}, epoch, generation}`` (the fencing
  token the entries were written under), or for several sessions at once ``{"I", session_id,
  {{session_id, first_index, {payload, ...}, epoch, generation}, ...}}``, ``{"o",
  session_id}`` (placed) or ``{"c", session_id}`` (closed).
* Statuses come back as short strings that ``store/scripts.py`` turns into enums.
* Every script is safe to send twice. A connection can break after Redis ran a script and
  before its answer arrived; ``Scripts`` then sends it again, so a second run must change
  nothing: open recognises its own token digest, resume and input appends their call id,
  output appends their events' numbers (the worker numbers them); close, detach, trim, reap,
  heartbeat and tenant reservations check state that the first run already set.
"""

from __future__ import annotations

__all__ = [
    "ABANDON_OPEN",
    "APPEND_INPUT",
    "APPEND_OUTPUT",
    "CLOSE_SESSION",
    "DETACH",
    "GATEWAY_LEASE",
    "OPEN_SESSION",
    "REAP",
    "RESUME",
    "TENANT_OPEN_RATE",
    "TENANT_RESERVE",
    "TRIM_OUTPUT",
    "WORKER_HEARTBEAT",
]

# Shared helpers, prepended to the scripts that need them.
_PRELUDE = r"""
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Append already-encoded events to a session's output log, numbering them server_event_seq.
-- Returns the first seq used; pushes all of them in one notice.
local function append_events(rec, out_log, out_channel, payloads, max_entries)
  local first = tonumber(redis.call('HGET', rec, 'out_seq') or '0') + 1
  local seq = first - 1
  for _, payload in ipairs(payloads) do
    seq = seq + 1
    redis.call('XADD', out_log, 'MAXLEN', '~', max_entries, seq .. '-0', 'd', payload)
  end
  redis.call('HSET', rec, 'out_seq', seq)
  redis.call('SPUBLISH', out_channel, cmsgpack.pack({'e', first, payloads}))
  return first
end

-- append_events for a caller that read the record already and writes 'out_seq' itself (in one
-- HSET with whatever else it changes): returns the first and last seq used.
local function add_events(out_log, out_channel, payloads, max_entries, stored)
  local seq = stored
  for _, payload in ipairs(payloads) do
    seq = seq + 1
    redis.call('XADD', out_log, 'MAXLEN', '~', max_entries, seq .. '-0', 'd', payload)
  end
  redis.call('SPUBLISH', out_channel, cmsgpack.pack({'e', stored + 1, payloads}))
  return stored + 1, seq
end

-- A worker's keys, as the scripts that end sessions receive them (all in the worker's slot).
local function worker_keys(record, sessions, deadlines, channel, ended, gateways)
  return {record = record, sessions = sessions, deadlines = deadlines, channel = channel,
          ended = ended, gateways = gateways}
end

-- Attachment leases (DESIGN §2.6). A gateway holds the sessions it serves on a worker under one
-- lease per (gateway, worker): its score in the worker's gateways set, renewed in bulk, so the
-- cost of renewal grows with gateways x workers, never with sessions. The sessions it holds
-- there are the set '<gateways key>:<gateway id>'; a record's 'gw' names its holder.
local function attach_to(rec, sid, gateways, gid, lease_ms, now)
  if gid == '' then return end  -- a caller that serves no connection holds no lease
  local old = redis.call('HGET', rec, 'gw')
  if old and old ~= '' and old ~= gid then redis.call('SREM', gateways .. ':' .. old, sid) end
  redis.call('HSET', rec, 'gw', gid)
  redis.call('SADD', gateways .. ':' .. gid, sid)
  if tonumber(redis.call('ZSCORE', gateways, gid) or '0') < now + lease_ms then
    redis.call('ZADD', gateways, now + lease_ms, gid)
  end
end

local function let_go(rec, sid, gateways)
  local gid = redis.call('HGET', rec, 'gw')
  if gid and gid ~= '' then
    redis.call('SREM', gateways .. ':' .. gid, sid)
    redis.call('HSET', rec, 'gw', '')
  end
end

-- The one place a session ends: the terminal event goes last into the output log, the slot is
-- released, the worker is told, the session is queued on its worker's ended list (a reaper hands
-- its tenant place back: that key lives in another hash slot), and the keys get a retention TTL
-- so a late resume can still replay up to the terminal event. Callers check that the session is
-- not closed already, so each session is queued exactly once.
local function terminate(sid, rec, out_log, out_channel, wk, terminal, reason)
  local retention = tonumber(redis.call('HGET', rec, 'retention_ms') or '60000')
  local max_entries = tonumber(redis.call('HGET', rec, 'out_max') or '2048')
  append_events(rec, out_log, out_channel, {terminal}, max_entries + 1)
  let_go(rec, sid, wk.gateways)
  redis.call('HSET', rec, 'state', 'closed', 'reason', reason)
  if redis.call('SREM', wk.sessions, sid) == 1 then
    redis.call('HINCRBY', wk.record, 'used', -1)
  end
  local tenant = redis.call('HGET', rec, 'tenant')
  if tenant then
    redis.call('RPUSH', wk.ended, tenant .. ' ' .. sid)
    redis.call('PEXPIRE', wk.ended, 86400000)
  end
  redis.call('ZREM', wk.deadlines, sid)
  redis.call('SPUBLISH', wk.channel, cmsgpack.pack({'c', sid}))
  redis.call('PEXPIRE', rec, retention)
  redis.call('PEXPIRE', out_log, retention)
  redis.call('DEL', string.sub(rec, 1, -4) .. 'in')
end

-- The disconnect grace of a detachment: the one its detach asked for (a client that closed its
-- socket normally), else the session's own.
local function grace_of(grace_ms, detach_grace_ms)
  local asked = tonumber(detach_grace_ms or '0') or 0
  if asked > 0 then return asked end
  return tonumber(grace_ms)
end

-- When a session next needs the reaper: grace expiry once detached, idle expiry always.
local function next_deadline(rec)
  local f = redis.call('HMGET', rec, 'state', 'active_ms', 'idle_ms', 'detached_ms', 'grace_ms',
                       'dgrace')
  local deadline = tonumber(f[2]) + tonumber(f[3])
  if f[1] == 'detached' then
    deadline = math.min(deadline, tonumber(f[4]) + grace_of(f[5], f[6]))
  end
  return deadline
end
"""

OPEN_SESSION = _PRELUDE + r"""
-- Place a new session on one worker: check liveness and capacity, reserve the slot, write the
-- record, all in the worker's slot, so two opens can never take the same slot (DESIGN §2.1).
-- KEYS[1] worker record   KEYS[2] worker session set   KEYS[3] worker deadlines
-- KEYS[4] session record  KEYS[5] abandoned tombstone  KEYS[6] worker input channel
-- KEYS[7] worker gateways (attachment leases)
-- ARGV[1] session id  ARGV[2] store epoch  ARGV[3] token digest  ARGV[4] tenant
-- ARGV[5] grace ms    ARGV[6] idle ms      ARGV[7] out log max entries  ARGV[8] retention ms
-- ARGV[9] gateway id  ARGV[10] attachment lease ms
-- ARGV[11] the public session object (JSON; '' none: its worker published no profile)
-- ARGV[12] the session's capabilities (JSON; '' none)
-- ARGV[13] the model name the session asks for ('' any): the worker must list it
-- returns {status, generation}: status ok | abandoned | exists | unavailable | full |
--   other_model (the worker does not serve that name)
--   (a resend of an open that landed, same epoch and digest, answers ok again)
local worker, sessions, deadlines = KEYS[1], KEYS[2], KEYS[3]
local rec, abandoned, worker_channel, gateways = KEYS[4], KEYS[5], KEYS[6], KEYS[7]
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
local w = redis.call('HMGET', worker, 'state', 'alive_until', 'slots', 'used', 'models')
if w[1] ~= 'live' or tonumber(w[2]) < now then return {'unavailable', 0} end
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
redis.call('HSET', rec, 'state', 'attached', 'epoch', epoch, 'gen', 1, 'digest', digest,
  'rcid', '', 'tenant', tenant, 'out_seq', 0, 'in_n', 0, 'in_done', 0, 'cseq', 0,
  'created_ms', now,
  'active_ms', now, 'detached_ms', 0, 'grace_ms', grace_ms, 'idle_ms', idle_ms,
  'out_max', out_max, 'retention_ms', retention_ms)
-- What a resume through any gateway announces: the session as session.created showed it
-- (the worker's later session.updated replace it, see APPEND_OUTPUT) and its capabilities.
if session ~= '' then redis.call('HSET', rec, 'session', session) end
if caps ~= '' then redis.call('HSET', rec, 'caps', caps) end
redis.call('ZADD', deadlines, now + tonumber(idle_ms), sid)
attach_to(rec, sid, gateways, gid, lease_ms, now)
redis.call('SPUBLISH', worker_channel, cmsgpack.pack({'o', sid}))
return {'ok', 1}
"""

RESUME = _PRELUDE + r"""
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
-- KEYS[5] worker gateways (attachment leases)
-- ARGV[1] presented token digest  ARGV[2] new token digest  ARGV[3] control id
-- ARGV[4] session id  ARGV[5] tenant of the caller  ARGV[6] retry window ms
-- ARGV[7] call id (unique per call, kept by a resend: a resend changes nothing)
-- ARGV[8] gateway id  ARGV[9] attachment lease ms  ARGV[10] attempt number (0: none)
-- returns {status, generation, epoch, highest client seq, last server_event_seq,
--          first retained server_event_seq (0 if the log is empty), public session (JSON),
--          capabilities (JSON)}
--   status ok | closed (token valid, session over: replay only) | unknown | bad_token | stale
--   the session and capabilities ('' when the record has none) only with ok and closed: a
--   caller without the token learns nothing of the session
local rec, deadlines, out_channel, out_log = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local presented, fresh, control_id, sid, tenant = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local window, call_id = tonumber(ARGV[6]), ARGV[7]
local gateways, gid, lease_ms = KEYS[5], ARGV[8], tonumber(ARGV[9])
local attempt = tonumber(ARGV[10])

local f = redis.call('HMGET', rec, 'state', 'gen', 'epoch', 'digest', 'rcid', 'cseq', 'out_seq',
                     'tenant', 'prev', 'rcid_ms', 'rcall', 'ratt', 'session', 'caps')
if not f[1] or f[8] ~= tenant then return {'unknown', 0, '', 0, 0, 0, '', ''} end
local state, gen, epoch, digest, rcid = f[1], tonumber(f[2]), f[3], f[4], f[5]
local first = redis.call('XRANGE', out_log, '-', '+', 'COUNT', 1)
local first_seq = 0
if #first > 0 then first_seq = tonumber(string.match(first[1][1], '^(%d+)')) end
local answer = function(status, g)
  local session, caps = '', ''
  if status == 'ok' or status == 'closed' then session, caps = f[13] or '', f[14] or '' end
  return {status, g, epoch, tonumber(f[6]), tonumber(f[7]), first_seq, session, caps}
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
redis.call('ZADD', deadlines, next_deadline(rec), sid)
attach_to(rec, sid, gateways, gid, lease_ms, now)
redis.call('SPUBLISH', out_channel, cmsgpack.pack({'r', gen}))
return answer('ok', gen)
"""

DETACH = _PRELUDE + r"""
-- A connection was lost without session.close: start the disconnect grace, fenced on the
-- generation that connection served, so an old socket cannot detach a newer lease (§2.6).
-- KEYS[1] session record  KEYS[2] worker deadlines  KEYS[3] worker gateways
-- ARGV[1] session id  ARGV[2] store epoch  ARGV[3] generation served  ARGV[4] tenant
-- ARGV[5] grace ms for this detachment (0: the session's DISCONNECT grace)
-- returns status: ok | stale | closed | unknown (also: another tenant's session)
--   (detaching the same lease again is ok and changes nothing: the grace keeps its start)
local rec, deadlines, gateways = KEYS[1], KEYS[2], KEYS[3]
local sid, epoch, gen, tenant, detach_grace = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]

local f = redis.call('HMGET', rec, 'state', 'epoch', 'gen', 'tenant')
if not f[1] or f[4] ~= tenant then return 'unknown' end
if f[1] == 'closed' then return 'closed' end
if f[2] ~= epoch or f[3] ~= gen then return 'stale' end
if f[1] == 'detached' then return 'ok' end
redis.call('HSET', rec, 'state', 'detached', 'detached_ms', now_ms(), 'dgrace', detach_grace)
let_go(rec, sid, gateways)
redis.call('ZADD', deadlines, next_deadline(rec), sid)
return 'ok'
"""

TENANT_RESERVE = _PRELUDE + r"""
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
"""

TENANT_OPEN_RATE = _PRELUDE + r"""
-- Count one new session against its tenant's rate: at most a number of opens in any sliding
-- window (a log of the window's opens, so the bound is exact, not a fixed-window estimate).
-- The call id makes a resend (lost reply) count once.
-- KEYS[1] tenant open log (sorted set: call id -> open time ms)
-- ARGV[1] opens allowed per window  ARGV[2] window ms  ARGV[3] call id
-- returns 0 when the open may go ahead (and is counted), else ms until one would be allowed
local opens = KEYS[1]
local limit, window, call_id = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]

local now = now_ms()
redis.call('ZREMRANGEBYSCORE', opens, '-inf', now - window)
if redis.call('ZSCORE', opens, call_id) then return 0 end
if redis.call('ZCARD', opens) >= limit then
  local oldest = redis.call('ZRANGE', opens, 0, 0, 'WITHSCORES')
  return math.max(1, tonumber(oldest[2]) + window - now)
end
redis.call('ZADD', opens, now, call_id)
redis.call('PEXPIRE', opens, window)
return 0
"""

TRIM_OUTPUT = r"""
-- The attached client acknowledged every event up to a seq (session.event_ack): drop them, so
-- Redis holds only what a resume could still need (DESIGN §5: memory per session). Fenced:
-- only the current attachment may trim.
-- KEYS[1] session record  KEYS[2] output log
-- ARGV[1] store epoch  ARGV[2] generation  ARGV[3] highest acknowledged server_event_seq
-- ARGV[4] tenant
-- returns status: ok | stale | unknown (also: another tenant's session) | ahead
-- An acknowledgement past the log's end ('ahead') names events the log no longer has: a
-- failover to a replica that lagged took them, and the log numbers on from where the replica
-- stood. The entries under those numbers now are new ones the client has not seen (the
-- session's terminal event, say): trimming to the acknowledged seq would drop them unseen.
local rec, out_log = KEYS[1], KEYS[2]
local epoch, gen, upto, tenant = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]

local f = redis.call('HMGET', rec, 'epoch', 'gen', 'tenant', 'out_seq')
if not f[1] or f[3] ~= tenant then return 'unknown' end
if f[1] ~= epoch or f[2] ~= gen then return 'stale' end
if upto > tonumber(f[4] or '0') then return 'ahead' end
redis.call('XTRIM', out_log, 'MINID', (upto + 1) .. '-0')
return 'ok'
"""

APPEND_INPUT = _PRELUDE + r"""
-- Fenced append of client commands to the input logs of one or more sessions of ONE worker
-- (they share its hash slot), deduplicated by client sequence number, the new entries pushed to
-- the worker in one notice per call (DESIGN §2.3, §2.4). A gateway batches every session it
-- serves on a worker into one call, so Redis sees one command per batch, not one per audio
-- chunk per session.
-- KEYS[1] worker channel
-- KEYS[2i], KEYS[2i+1] (i = 1..n) session record, input log of the i-th session
-- ARGV[1] input log max entries (the most unread commands a session may have)
-- ARGV[2] call id (unique per call, kept by a resend)
-- ARGV[3] input log max bytes (its MEMORY USAGE with the new commands; 0: no bound)
-- then per session: session id, store epoch, generation, tenant, entry count c,
--   and c pairs: client seq ('' when the client sent none), encoded command
-- Each entry keeps the fencing token it was written under, so the worker checks it again
-- before applying (DESIGN §2.3): fields 'd' the command (raw) and 'e:<epoch>' the generation.
-- The epoch is a field *name* because a stream stores the names of entries that repeat its
-- node's first entry's names once per node: it costs nothing per entry, the generation a
-- byte or two. The notice carries the token once per session: {'i', sid, first, payloads,
-- epoch, gen} when one session of the call has new entries, else {'I', sid, {{sid, first,
-- payloads, epoch, gen}, ...}} (the second element names a session so that a worker of a
-- version before batched notices ignores the kind and reads the logs on its poll).
-- returns, per session in order: {status, appended, highest client seq, current generation,
--   last index of the input log (ok and full only)}: status ok | full | stale | closed |
--   unknown (also: another tenant's session, answered as if it did not exist)
-- Backpressure, never trimming: the worker reports what it applied (APPEND_OUTPUT, the
-- record's 'in_done'), so a log's unread backlog is in_n - in_done. A session whose new
-- entries would take it past either cap is answered full: none of them is appended and
-- nothing of the record changes (the highest client seq stays, so the client may send them
-- again once the worker caught up). The other sessions of the call are not affected.
-- Dropping old entries instead would lose commands the client was told were taken, unread.
-- A resent call (its reply was lost, the client library sent it again) finds its call id in
-- the record and gets the first answer back, so commands without a client seq are not
-- appended twice. A full answer records no call id: a resend is decided afresh, which is
-- safe because the first run appended nothing.
-- Cost: per session, one HMGET, one XADD per command and one HSET; per call, TIME and one
-- SPUBLISH. The idle deadline is not moved here: an append only ever moves it later, and the
-- reaper schedules a session that it finds not due yet at its real deadline (see REAP).
local worker_channel, call_id = KEYS[1], ARGV[2]
local in_max = tonumber(ARGV[1])
-- The bytes the unread input may hold (0: no bound), as Redis counts the log's memory: a
-- session's input log is its unread backlog, whatever the size of each command.
local in_max_bytes = tonumber(ARGV[3])
-- APPEND_OUTPUT trims applied input once its position crosses a multiple of this, so a log
-- also holds fewer than this many applied entries (keep the two equal).
local TRIM_EVERY = 16
local now = now_ms()
local notices = {}

-- The argument positions of the commands that are new: no client seq, or one above the
-- highest appended (which rises as they are taken), and that highest seq after them.
local function fresh_commands(at, count, cseq)
  local fresh = {}
  for i = at, at + 2 * count - 1, 2 do
    local client_seq = tonumber(ARGV[i])
    if client_seq == nil or client_seq > cseq then
      if client_seq ~= nil then cseq = client_seq end
      fresh[#fresh + 1] = i
    end
  end
  return fresh, cseq
end

-- Whether the log with the fresh commands would hold more than in_max_bytes. MEMORY USAGE
-- only when a bound from the record does not already say no: at most `held` entries, none
-- larger than the largest ever appended ('in_big'), each with at most 64 bytes of framing,
-- in listpacks allocated at most twice their size, plus the stream's own 8 KiB.
local function over_bytes(in_log, fresh, held, biggest)
  local adding = 0
  for _, i in ipairs(fresh) do adding = adding + #ARGV[i + 1] end
  if biggest and held and 2 * held * (biggest + 64) + 8192 + adding <= in_max_bytes then
    return false
  end
  local usage = redis.call('MEMORY', 'USAGE', in_log) or 0
  return usage + adding > in_max_bytes
end

local function append_one(rec, in_log, sid, epoch, gen, tenant, at, count)
  local f = redis.call('HMGET', rec, 'state', 'epoch', 'gen', 'in_n', 'cseq', 'in_call',
                       'in_call_n', 'tenant', 'in_done', 'in_big')
  if not f[1] or f[8] ~= tenant then return {'unknown', 0, 0, 0} end
  local cseq = tonumber(f[5])
  if f[6] == call_id then return {'ok', tonumber(f[7]), cseq, tonumber(gen), tonumber(f[4])} end
  if f[1] == 'closed' then return {'closed', 0, cseq, tonumber(f[3])} end
  if f[2] ~= epoch or f[3] ~= gen or f[1] ~= 'attached' then
    return {'stale', 0, cseq, tonumber(f[3])}
  end
  local n = tonumber(f[4])
  local fresh, top = fresh_commands(at, count, cseq)
  if #fresh > 0 then
    -- A record from before 'in_done' was kept counts its log instead.
    local unread = f[9] and n - tonumber(f[9]) or redis.call('XLEN', in_log)
    if unread + #fresh > in_max then return {'full', 0, cseq, tonumber(gen), n} end
    if in_max_bytes > 0 and over_bytes(in_log, fresh, f[9] and unread + TRIM_EVERY,
                                       tonumber(f[10] or '')) then
      return {'full', 0, cseq, tonumber(gen), n}
    end
  end
  local first = n + 1
  local payloads = {}
  local biggest = tonumber(f[10] or '0')
  for _, i in ipairs(fresh) do
    n = n + 1
    redis.call('XADD', in_log, n .. '-0', 'd', ARGV[i + 1], 'e:' .. epoch, gen)
    payloads[#payloads + 1] = ARGV[i + 1]
    biggest = math.max(biggest, #ARGV[i + 1])
  end
  redis.call('HSET', rec, 'in_n', n, 'cseq', top, 'active_ms', now, 'in_call', call_id,
             'in_call_n', #payloads, 'in_big', biggest)
  if #payloads > 0 then
    notices[#notices + 1] = {sid, first, payloads, epoch, tonumber(gen)}
  end
  return {'ok', #payloads, top, tonumber(gen), n}
end

local answers = {}
local at = 4
for k = 2, #KEYS, 2 do
  local count = tonumber(ARGV[at + 4])
  answers[#answers + 1] = append_one(KEYS[k], KEYS[k + 1], ARGV[at], ARGV[at + 1],
                                     ARGV[at + 2], ARGV[at + 3], at + 5, count)
  at = at + 5 + 2 * count
end
if #notices == 1 then
  local only = notices[1]
  redis.call('SPUBLISH', worker_channel,
             cmsgpack.pack({'i', only[1], only[2], only[3], only[4], only[5]}))
elseif #notices > 1 then
  redis.call('SPUBLISH', worker_channel, cmsgpack.pack({'I', notices[1][1], notices}))
end
return answers
"""

APPEND_OUTPUT = _PRELUDE + r"""
-- A worker appends events to the output logs of one or more of its sessions (one hash slot),
-- so a busy worker writes all its sessions' output in one call per flush. Fenced at the
-- resource: a worker that was declared lost is refused whole, a session that is closed or
-- unknown is refused alone (§2.3, §2.9). With a terminal payload a session ends after its
-- events, exactly once. A session object (the newest session.updated among the events) is
-- stored in the record with them, so a resume through any gateway announces it.
-- KEYS[1] worker record  KEYS[2] worker session set  KEYS[3] worker deadlines
-- KEYS[4] worker channel  KEYS[5] worker ended list  KEYS[6] worker gateways
-- KEYS[3i+4], KEYS[3i+5], KEYS[3i+6] (i = 1..n): session record, output log, output channel
-- ARGV per session: session id, terminal payload ('' for none), terminal reason,
--   input applied up to (0: leave the input log alone; recorded as 'in_done', the entries
--   trimmed per TRIM_EVERY below), the server_event_seq of the first
--   event (0: whatever comes next), the session object (JSON; '' none), event count c,
--   then c encoded events
-- returns {'fenced'} if the worker was declared lost, else per session in order
--   {status, first seq (0 if no events) or, for gap, the log's last seq}:
--   status ok | closed | unknown | gap | conflict
-- Numbered events make a resend exactly-once: a call whose reply was lost (the client library
-- resends it) or a flush retried with more events finds its first events stored already and
-- appends only the rest. A first seq past the log's end or an applied input index past the
-- input log's end (gap), or a resent event that differs from the stored one (conflict), means
-- the worker and the store disagree (a bug, or a failover that lost writes): nothing is
-- written, and the worker ends the session loudly.
local worker = KEYS[1]
local wk = worker_keys(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6])

local worker_state = redis.call('HGET', worker, 'state')
if not worker_state or worker_state == 'lost' then return {'fenced'} end
-- Applied input is trimmed once the position crosses a multiple of this (APPEND_INPUT bounds
-- a log's bytes with it: keep the two equal), and always on a report without events (the
-- worker sends those to trim): XTRIM per event would be one command per audio chunk.
local TRIM_EVERY = 16

local function append_one(sid, rec, out_log, out_channel, terminal, reason, applied, first,
                          session, at, count)
  local f = redis.call('HMGET', rec, 'state', 'out_seq', 'in_n', 'in_done', 'out_max')
  if not f[1] then return {'unknown', 0} end
  if f[1] == 'closed' then return {'closed', 0} end
  local stored = tonumber(f[2])
  -- The worker applied input this log never had: the store lost acknowledged writes (a
  -- failover to a replica that lagged). Its later input would reuse those indices.
  if applied > tonumber(f[3]) then return {'gap', stored} end
  local skip = 0
  if first > 0 then
    if first > stored + 1 then return {'gap', stored} end
    skip = math.min(stored + 1 - first, count)
    -- Only a resend has events stored already; those still in the log must be the same bytes.
    if skip > 0 then
      local held = redis.call('XRANGE', out_log, first .. '-0', (first + skip - 1) .. '-0')
      for _, entry in ipairs(held) do
        local seq = tonumber(string.match(entry[1], '^(%d+)'))
        if entry[2][2] ~= ARGV[at + seq - first] then return {'conflict', stored} end
      end
    end
  end
  local changes = {}
  local done = tonumber(f[4] or '0')
  -- The worker applied these commands; only a gap fill could still read them. Dropping them
  -- keeps an attached session's Redis memory to what is in flight (DESIGN §5).
  if applied > 0 and (count == 0
      or math.floor(applied / TRIM_EVERY) > math.floor(done / TRIM_EVERY)) then
    redis.call('XTRIM', string.sub(rec, 1, -4) .. 'in', 'MINID', (applied + 1) .. '-0')
  end
  if applied > done then changes[#changes + 1], changes[#changes + 2] = 'in_done', applied end
  if count > skip then
    local payloads = {}
    for i = at + skip, at + count - 1 do payloads[#payloads + 1] = ARGV[i] end
    -- The model's output is no activity: the idle TTL counts the client's alone.
    local appended, last = add_events(out_log, out_channel, payloads, f[5], stored)
    changes[#changes + 1], changes[#changes + 2] = 'out_seq', last
    if first == 0 then first = appended end
  end
  -- Stored again by a resend: the same object, so nothing changes.
  if session ~= '' then changes[#changes + 1], changes[#changes + 2] = 'session', session end
  if #changes > 0 then redis.call('HSET', rec, unpack(changes)) end
  if terminal ~= '' then
    terminate(sid, rec, out_log, out_channel, wk, terminal, reason)
  end
  if count == 0 then first = 0 end
  return {'ok', first}
end

local answers = {}
local at = 1
for k = 7, #KEYS, 3 do
  local count = tonumber(ARGV[at + 6])
  answers[#answers + 1] = append_one(ARGV[at], KEYS[k], KEYS[k + 1], KEYS[k + 2], ARGV[at + 1],
                                     ARGV[at + 2], tonumber(ARGV[at + 3]),
                                     tonumber(ARGV[at + 4]), ARGV[at + 5], at + 7, count)
  at = at + 7 + count
end
return answers
"""

CLOSE_SESSION = _PRELUDE + r"""
-- End a session from outside its worker (abandoned open, operator close). Unfenced by design:
-- closing is idempotent, and the closed state fences every later write.
-- KEYS[1] session record  KEYS[2] output log  KEYS[3] output channel  KEYS[4] worker record
-- KEYS[5] worker session set  KEYS[6] worker deadlines  KEYS[7] worker channel
-- KEYS[8] worker ended list  KEYS[9] worker gateways
-- ARGV[1] session id  ARGV[2] terminal payload  ARGV[3] reason
-- returns status: ok | closed | unknown
local rec, out_log, out_channel = KEYS[1], KEYS[2], KEYS[3]
local wk = worker_keys(KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9])
local sid, terminal, reason = ARGV[1], ARGV[2], ARGV[3]

local state = redis.call('HGET', rec, 'state')
if not state then return 'unknown' end
if state == 'closed' then return 'closed' end
terminate(sid, rec, out_log, out_channel, wk, terminal, reason)
return 'ok'
"""

ABANDON_OPEN = _PRELUDE + r"""
-- A gateway gave up on an open whose outcome it does not know (timeout, cancellation). If the
-- open landed, close it; if not, leave a tombstone so that a late open is refused (§2.10).
-- KEYS[1..9] as CLOSE_SESSION  KEYS[10] abandoned tombstone
-- ARGV[1] session id  ARGV[2] terminal payload  ARGV[3] tombstone ttl ms
-- returns status: closed_open (the open had landed) | tombstoned | already_closed
local rec, out_log, out_channel = KEYS[1], KEYS[2], KEYS[3]
local wk = worker_keys(KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9])
local abandoned = KEYS[10]
local sid, terminal, ttl = ARGV[1], ARGV[2], ARGV[3]

local state = redis.call('HGET', rec, 'state')
if not state then
  redis.call('SET', abandoned, '1', 'PX', ttl)
  return 'tombstoned'
end
if state == 'closed' then return 'already_closed' end
terminate(sid, rec, out_log, out_channel, wk, terminal, 'open_abandoned')
return 'closed_open'
"""

REAP = _PRELUDE + r"""
-- Run by any gateway, for one worker: declare the worker lost if its heartbeat lapsed (closing
-- all its sessions with worker_lost); else detach the sessions of gateways whose attachment
-- lease lapsed (their grace starts), then expire due sessions. The state checks make exactly
-- one reaper win and write exactly one terminal event (DESIGN §2.6, §2.8, §2.9).
-- KEYS[1] worker record  KEYS[2] worker session set  KEYS[3] worker deadlines
-- KEYS[4] worker channel  KEYS[5] worker ended list  KEYS[6] worker gateways
-- ARGV[1] key prefix of this worker's sessions ('dg:{w...}:s:')
-- ARGV[2] terminal payload: worker lost  ARGV[3] terminal: grace expired
-- ARGV[4] terminal: idle expired         ARGV[5] max sessions to expire in this call
-- ARGV[6] outage ms: a longer gap since any reaper last reached this worker's slot means the
--         slot was out of reach (its master failed over, Redis restarted, no gateway ran)
-- ARGV[7] most ended sessions to hand back for tenant release in this call
-- ARGV[8] attachment lease ms (a lapsed lease counts only a full lease after an outage)
-- returns {worker state, sessions ended, {'<tenant> <session id>', ...}, sessions detached,
--          outage ms (the gap this call ended, 0 if none)}:
--   the list holds sessions that ended since any reaper last asked (wherever they ended),
--   each handed to exactly one reaper, which releases their tenant places
-- A worker cannot heartbeat while its slot is out of reach, so after an outage a lapsed
-- heartbeat is only a loss once the worker had a full TTL to beat again; and a client could
-- neither resume nor show activity, so grace and idle time count from then too. The outage is
-- seen here, per slot, from the gap between reaps (the record's reaped_ms and reached_ms travel
-- with the slot to a promoted replica), not by a reaper: on a Cluster one master may fail over
-- while every reaper reaches the others, and a reaper's call may wait out the failover inside
-- the client and succeed.
local worker, sessions, deadlines, worker_channel = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local ended_list, gateways = KEYS[5], KEYS[6]
local wk = worker_keys(worker, sessions, deadlines, worker_channel, ended_list, gateways)
local prefix, lost_event, grace_event, idle_event = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local budget, outage_ms, release_budget = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
local lease_ms = tonumber(ARGV[8])

local function keys_of(sid)
  local base = prefix .. string.match(sid, '%.(%x+)$')
  return base .. ':rec', base .. ':out', base .. ':events'
end
local function finish(sid, terminal, reason)
  local rec, out_log, out_channel = keys_of(sid)
  terminate(sid, rec, out_log, out_channel, wk, terminal, reason)
end
local function take_ended(count)
  return redis.call('LPOP', ended_list, count) or {}
end
-- A gateway that stopped renewing (killed, paused, partitioned) holds its sessions no more:
-- each is detached as a lost connection would have detached it. After an outage a gateway
-- gets a full lease from Redis's return to renew first.
local function detach_lapsed(now, recovered)
  if now < recovered + lease_ms then return 0 end
  local detached = 0
  for _, gid in ipairs(redis.call('ZRANGEBYSCORE', gateways, '-inf', '(' .. now)) do
    local held = gateways .. ':' .. gid
    for _, sid in ipairs(redis.call('SMEMBERS', held)) do
      local rec = keys_of(sid)
      local f = redis.call('HMGET', rec, 'state', 'gw')
      if f[1] == 'attached' and f[2] == gid then
        redis.call('HSET', rec, 'state', 'detached', 'detached_ms', now, 'gw', '', 'dgrace', 0)
        redis.call('ZADD', deadlines, next_deadline(rec), sid)
        detached = detached + 1
      end
    end
    redis.call('DEL', held)
    redis.call('ZREM', gateways, gid)
  end
  return detached
end

local now = now_ms()
local w = redis.call('HMGET', worker, 'state', 'alive_until', 'ttl_ms', 'reaped_ms',
                     'reached_ms')
local ended = 0
-- recovered: since when reapers reached this slot without a gap (0: as far as is known).
local recovered, outage = tonumber(w[5] or '0'), 0
if w[1] and w[1] ~= 'lost' then
  local seen = tonumber(w[4] or '0')
  if seen > 0 and now - seen > outage_ms then
    recovered, outage = now, now - seen
  end
  redis.call('HSET', worker, 'reaped_ms', now, 'reached_ms', recovered)
end
local lapsed = w[1] and w[1] ~= 'lost' and tonumber(w[2]) < now
if lapsed and now < recovered + tonumber(w[3] or '0') then
  lapsed = false  -- it may not have been able to beat since its slot came back
end
if lapsed then
  redis.call('HSET', worker, 'state', 'lost')
  redis.call('PEXPIRE', worker, 86400000)
  for _, sid in ipairs(redis.call('SMEMBERS', sessions)) do
    local rec = keys_of(sid)
    if redis.call('HGET', rec, 'state') ~= 'closed' then
      finish(sid, lost_event, 'worker_lost')
      ended = ended + 1
    end
  end
  redis.call('DEL', sessions, deadlines)
  for _, gid in ipairs(redis.call('ZRANGE', gateways, 0, -1)) do
    redis.call('DEL', gateways .. ':' .. gid)
  end
  redis.call('DEL', gateways)
  -- No reaper visits a lost worker again: hand back every ended session now.
  return {'lost', ended, take_ended(redis.call('LLEN', ended_list) + 1), 0, outage}
end

local detached = detach_lapsed(now, recovered)

for _, sid in ipairs(redis.call('ZRANGEBYSCORE', deadlines, '-inf', now, 'LIMIT', 0, budget)) do
  local rec = keys_of(sid)
  local f = redis.call('HMGET', rec, 'state', 'active_ms', 'idle_ms', 'detached_ms', 'grace_ms',
                       'dgrace')
  local grace = f[1] and grace_of(f[5], f[6])
  if not f[1] or f[1] == 'closed' then
    redis.call('ZREM', deadlines, sid)
  elseif f[1] == 'detached' and now >= math.max(tonumber(f[4]), recovered) + grace
  then
    -- A client could not resume while Redis was away: its grace counts from Redis's return.
    finish(sid, grace_event, 'disconnect_grace_expired')
    ended = ended + 1
  elseif now >= math.max(tonumber(f[2]), recovered) + tonumber(f[3]) then
    finish(sid, idle_event, 'idle_ttl_expired')
    ended = ended + 1
  else
    local due = math.max(tonumber(f[2]), recovered) + tonumber(f[3])
    if f[1] == 'detached' then
      due = math.min(due, math.max(tonumber(f[4]), recovered) + grace)
    end
    redis.call('ZADD', deadlines, due, sid)
  end
end
return {w[1] or 'unknown', ended, take_ended(release_budget), detached, outage}
"""

GATEWAY_LEASE = _PRELUDE + r"""
-- Renew one gateway's attachment lease on one worker: every session it serves there at once
-- (one call per gateway and worker, whatever the number of sessions). Safe to run twice.
-- KEYS[1] worker gateways
-- ARGV[1] gateway id  ARGV[2] lease ms
-- returns the lease's end (ms, Redis clock)
local gateways, gid, lease_ms = KEYS[1], ARGV[1], tonumber(ARGV[2])
local until_ms = now_ms() + lease_ms
redis.call('ZADD', gateways, until_ms, gid)
return until_ms
"""

WORKER_HEARTBEAT = _PRELUDE + r"""
-- Register (first call) or renew a worker. A worker once declared lost is fenced for good: it
-- must stop writing and come back under a new id (DESIGN §2.9). Draining is sticky; 'busy'
-- (not admitting: no spare tick budget) is decided anew on every beat.
-- KEYS[1] worker record
-- ARGV[1] slots  ARGV[2] ttl ms  ARGV[3] register (1 on the first call, else 0)
-- ARGV[4] drain (1 to stop admitting new sessions for good)
-- ARGV[5] admit (1 while the worker takes new sessions, 0 while it is busy)
-- ARGV[6] profile: the JSON default session and capabilities of the worker's new sessions,
--         stored on registration ('' none; renewals send none: it never changes)
-- ARGV[7] backend: the name of the backend it serves, stored on registration as 'backend'
--         ('' or absent: none, as from a worker older than this argument)
-- ARGV[8] tick p99, stored on every beat as 'tick_p99_ms': the engine's rolling p99 tick time
--         in ms, 'idle' (an engine with too few recent ticks), '' (no engine); absent (an older
--         worker): the field is left as it is
-- ARGV[9] models: the JSON array of the model names it serves (store/models.py), stored on
--         registration as 'models' ('' or absent: none), with the registration time as
--         'since_ms'
-- returns {status, alive_until}: status live | busy | draining | lost
local worker = KEYS[1]
local slots, ttl, register, drain, admit = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[5]
local profile, backend, tick_p99, models = ARGV[6] or '', ARGV[7] or '', ARGV[8], ARGV[9] or ''

local state = redis.call('HGET', worker, 'state')
if state == 'lost' or (not state and register ~= '1') then return {'lost', 0} end
local now = now_ms()
if not state then
  -- The registration counts as a reaper's visit (reaped_ms): a first reap after an outage
  -- can then tell the gap (see REAP).
  redis.call('HSET', worker, 'used', 0, 'reaped_ms', now)
end
if drain == '1' or state == 'draining' then
  state = 'draining'
elseif admit == '0' then
  state = 'busy'
else
  state = 'live'
end
local alive_until = now + ttl
-- One HSET per beat, whatever it carries: a beat is a fixed cost of every worker.
local fields = {'state', state, 'slots', slots, 'alive_until', alive_until, 'ttl_ms', ttl}
local function also(name, value) fields[#fields + 1], fields[#fields + 2] = name, value end
if register == '1' and profile ~= '' then also('profile', profile) end
if register == '1' and backend ~= '' then also('backend', backend) end
if register == '1' and models ~= '' then also('models', models) end
if register == '1' then also('since_ms', now) end
if tick_p99 then also('tick_p99_ms', tick_p99) end
redis.call('HSET', worker, unpack(fields))
return {state, alive_until}
"""
