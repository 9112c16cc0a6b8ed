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
-- payloads, epoch, gen}, ...}} (the second element names a session, as in the single form).
-- returns, per session in order: {status, appended, highest client seq, current generation,
--   last index of the input log (ok and full only)}: status ok | full | stale | closed |
--   unknown (also: another tenant's session, answered as if it did not exist) | other_format
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
-- Cost: per session, one HMGET, one XADD per command and one HSET; per call, one SPUBLISH.
-- The client's activity (the record's 'active_ms', which the idle TTL counts from) is not
-- written here, per chunk: the gateway marks it in its next lease renewal (GATEWAY_LEASE).
local worker_channel, call_id = KEYS[1], ARGV[2]
local in_max = tonumber(ARGV[1])
-- The bytes the unread input may hold (0: no bound), as Redis counts the log's memory: a
-- session's input log is its unread backlog, whatever the size of each command.
local in_max_bytes = tonumber(ARGV[3])
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
  if biggest and 2 * held * (biggest + 64) + 8192 + adding <= in_max_bytes then
    return false
  end
  local usage = redis.call('MEMORY', 'USAGE', in_log) or 0
  return usage + adding > in_max_bytes
end

local function append_one(rec, in_log, sid, epoch, gen, tenant, at, count)
  local f = redis.call('HMGET', rec, 'state', 'epoch', 'gen', 'in_n', 'cseq', 'in_call',
                       'in_call_n', 'tenant', 'in_done', 'in_big', FORMAT_FIELD)
  if not f[1] or f[8] ~= tenant then return {'unknown', 0, 0, 0} end
  if f[11] ~= SESSION_FORMAT then return {'other_format', 0, 0, 0} end
  local cseq = tonumber(f[5])
  if f[6] == call_id then return {'ok', tonumber(f[7]), cseq, tonumber(gen), tonumber(f[4])} end
  if f[1] == 'closed' then return {'closed', 0, cseq, tonumber(f[3])} end
  if f[2] ~= epoch or f[3] ~= gen or f[1] ~= 'attached' then
    return {'stale', 0, cseq, tonumber(f[3])}
  end
  local n = tonumber(f[4])
  local fresh, top = fresh_commands(at, count, cseq)
  if #fresh > 0 then
    local unread = n - tonumber(f[9])
    if unread + #fresh > in_max then return {'full', 0, cseq, tonumber(gen), n} end
    if in_max_bytes > 0 and over_bytes(in_log, fresh, unread + TRIM_EVERY,
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
  redis.call('HSET', rec, 'in_n', n, 'cseq', top, 'in_call', call_id,
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
