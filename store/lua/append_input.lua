-- Append client commands to the input logs of one or more sessions of ONE worker (they share
-- its hash slot), deduplicated by client sequence number, the new entries pushed to the worker
-- in one notice per call (DESIGN §2.3, §2.4). A gateway batches every session it serves on a
-- worker into one call. On the store's own connections sessions take this script only when
-- their writer cannot append them as plain XADDs in a MULTI (store/input_appends.py: it does
-- not know where a log stands, the entries may reach a cap, or a plain append was refused or
-- its reply lost); those entries are the ones below (or several commands packed in one, which
-- readers unpack), so either path reads the other's.
-- KEYS[1] worker channel
-- KEYS[2i], KEYS[2i+1] (i = 1..n) session record, input log of the i-th session
-- ARGV[1] input log max entries (the most unread commands a session may have)
-- ARGV[2] input log max bytes (its MEMORY USAGE with the new commands; 0: no bound)
-- ARGV[3] call id (unique per call, kept by a resend)
-- ARGV[4] '1': push the new entries to the worker; '0': the worker reads its logs itself,
--   once per tick (a frame backend's, see store/keys.py), so no push is sent
-- then per session: session id, store epoch, generation, the index the caller last wrote
--   (-1: unknown, read the log), the highest client seq it appended, the largest command
--   it knows the log to hold (bytes), entry count c,
--   and c pairs: client seq ('' when the client sent none), encoded command
-- returns, per session in order: {status, appended, highest client seq, current generation,
--   last index of the input log, the largest command it holds and how many entries it holds
--   now (ok, full and rewound only; -1 where the call did not count them)}: status ok | full
--   | rewound | stale | closed | unknown | other_format; rewound: the log ends before the
--   index the caller last wrote, nothing appended
-- The fence is in each entry's ID ('<fence>-<index>', see raise_fence): the holder of
-- generation g appends under 2g with XADD '<2g>-*', so Redis numbers the entry one above the
-- log's last index under that fence, and refuses it outright once a resume or a detachment
-- raised the fence: no older holder can append. Nothing of the record is read or written on
-- the way; the rare refusals read it to say why. The caller says which index it wrote last,
-- and the index Redis gives must follow it: a lower one means the log lost entries the
-- caller was told were stored (a failover to a replica that lacked them), so the entry is
-- taken back and the caller told (rewound); a higher one, another call under the same
-- generation came between (its caller numbers on from the answer). A log whose last entry is
-- under an older fence than the caller's (the failover took the marker of the caller's own
-- generation too) numbers the entry 0 under the caller's fence: rewound as well. A caller that does not know the index (-1: its first call, or a resend
-- after a lost reply) reads the log's last entry, which must be under its fence exactly; a
-- last entry this very call wrote (a resend) answers as the first run did.
-- Each entry: 'd' the command (raw), 'h' the highest client seq appended up to it, and
-- 'e:<epoch>' the generation, the token the worker checks again before applying (DESIGN
-- §2.3); the last of a call also 'c' the call id, 'n' how many the call appended and 'b' the
-- largest command appended to the session so far (bytes: the byte cap's bound). Neither
-- the caller's tenant nor its epoch is checked here: only an open or a resume of the
-- session's own tenant hands out a generation, and the worker refuses an entry under another
-- epoch than the record's.
-- Backpressure, never trimming: the worker trims what it applied, keeping its last applied
-- entry, so the log's length less one is what it has not read yet (at most INPUT_TRIM_EVERY,
-- store/logs.py, applied entries and the fence markers more). A session whose new entries would take it past either
-- cap is answered full, and nothing is appended (the client may send them again).
-- The notice carries the token and the fence once per session: {'i', sid, first, payloads,
-- epoch, gen, fence} when one session of the call has new entries, else {'I', sid, {{sid,
-- first, payloads, epoch, gen, fence}, ...}} (the second element names a session).
local worker_channel = KEYS[1]
local in_max, in_max_bytes = tonumber(ARGV[1]), tonumber(ARGV[2])
local call_id = ARGV[3]
local push = ARGV[4] == '1'
local notices = {}

-- Why a session's log refused the caller (rare): from the record.
local function refusal(rec, cseq)
  local f = redis.call('HMGET', rec, 'state', 'gen', FORMAT_FIELD)
  if not f[1] then return {'unknown', 0, 0, 0} end
  if f[3] ~= SESSION_FORMAT then return {'other_format', 0, 0, 0} end
  if f[1] == 'closed' then return {'closed', 0, cseq, tonumber(f[2])} end
  return {'stale', 0, cseq, tonumber(f[2])}
end

-- The argument positions of the commands that are new: no client seq, or one above the
-- highest appended (which rises as they are taken), each with the highest seq after it.
local function fresh_commands(at, count, cseq)
  local fresh, highest = {}, {}
  for i = at, at + 2 * count - 1, 2 do
    local client_seq = tonumber(ARGV[i])
    if client_seq == nil or client_seq > cseq then
      if client_seq ~= nil then cseq = client_seq end
      fresh[#fresh + 1], highest[#highest + 1] = i, cseq
    end
  end
  return fresh, highest
end

-- Whether `fresh` would take the log past a cap, the log holding `held` entries (the
-- caller's bound, store/input_appends.py, is this one). MEMORY USAGE only when the entries' most
-- possible size does not already say no: none larger than the largest ever appended
-- (`biggest`), each with 64 bytes of framing, in listpacks allocated at most twice their
-- size, plus the stream's own 8 KiB.
local function over_caps(in_log, held, fresh, biggest)
  if held - 1 + #fresh > in_max then return true end
  if in_max_bytes <= 0 then return false end
  local adding = 0
  for _, i in ipairs(fresh) do adding = adding + #ARGV[i + 1] end
  if 2 * held * (biggest + 64) + 8192 + adding <= in_max_bytes then return false end
  return (redis.call('MEMORY', 'USAGE', in_log) or 0) + adding > in_max_bytes
end

local function append_one(rec, in_log, sid, epoch, gen, index, cseq, biggest, at, count)
  local fence = attached_fence(gen)
  if index < 0 then
    local top = input_top(in_log)
    if top == nil or top.fence ~= fence then return refusal(rec, top and top.h or 0) end
    if top.call == call_id then
      return {'ok', top.count, top.h, tonumber(gen), top.index, top.biggest, -1}
    end
    index, cseq, biggest = top.index, math.max(cseq, top.h), top.biggest
  end
  local fresh, highest = fresh_commands(at, count, cseq)
  if #fresh == 0 then return {'ok', 0, cseq, tonumber(gen), index, biggest, -1} end
  local held = redis.call('XLEN', in_log)
  if over_caps(in_log, held, fresh, biggest) then
    return {'full', 0, cseq, tonumber(gen), index, biggest, held}
  end
  for _, i in ipairs(fresh) do biggest = math.max(biggest, #ARGV[i + 1]) end
  local first, payloads = nil, {}
  for k, i in ipairs(fresh) do
    local added
    if k < #fresh then
      added = redis.pcall('XADD', in_log, 'NOMKSTREAM', fence .. '-*', 'd', ARGV[i + 1],
                          'h', highest[k], 'e:' .. epoch, gen)
    else
      added = redis.pcall('XADD', in_log, 'NOMKSTREAM', fence .. '-*', 'd', ARGV[i + 1],
                          'h', highest[k], 'e:' .. epoch, gen, 'c', call_id, 'n', #fresh,
                          'b', biggest)
    end
    if added == false then return refusal(rec, cseq) end  -- no log: the session is over
    if type(added) == 'table' then
      -- A fence above the caller's (the first entry only: the rest follow it).
      if not string.find(added.err, 'equal or smaller', 1, true) then error(added) end
      return refusal(rec, cseq)
    end
    local got = tonumber(string.match(added, '%-(%d+)$'))
    if got < index + 1 then
      -- Taken back: the log ends before what the caller wrote (the caller ends the session).
      redis.call('XDEL', in_log, added)
      return {'rewound', 0, cseq, tonumber(gen), got - 1, biggest, -1}
    end
    index = got
    first = first or got
    payloads[#payloads + 1] = ARGV[i + 1]
  end
  notices[#notices + 1] = {sid, first, payloads, epoch, tonumber(gen), fence}
  return {'ok', #fresh, highest[#fresh], tonumber(gen), index, biggest, held + #fresh}
end

local answers = {}
local at = 5
for k = 2, #KEYS, 2 do
  local count = tonumber(ARGV[at + 6])
  answers[#answers + 1] = append_one(KEYS[k], KEYS[k + 1], ARGV[at], ARGV[at + 1],
                                     ARGV[at + 2], tonumber(ARGV[at + 3]),
                                     tonumber(ARGV[at + 4]), tonumber(ARGV[at + 5]), at + 7,
                                     count)
  at = at + 7 + 2 * count
end
if not push then
  return answers
elseif #notices == 1 then
  local only = notices[1]
  redis.call('SPUBLISH', worker_channel,
             cmsgpack.pack({'i', only[1], only[2], only[3], only[4], only[5], only[6]}))
elseif #notices > 1 then
  redis.call('SPUBLISH', worker_channel, cmsgpack.pack({'I', notices[1][1], notices}))
end
return answers
