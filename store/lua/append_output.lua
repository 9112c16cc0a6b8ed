-- A worker appends events to the output logs of one or more of its sessions (one hash slot),
-- so a busy worker writes all its sessions' output in one call per flush. The path each chunk
-- takes reads and writes nothing of the session record: per session, one read of the output
-- log's last entry, an XADD per event and one push of what landed. Redis does the fencing:
-- a session's log exists from its open (appends never create it, so one after its end and
-- expiry brings nothing back), and its terminal event is kept last by the log's last ID (a
-- closed session refuses every later XADD). A worker declared lost is refused whole from the
-- moment the reaper marks it (one read of its state per call, whatever the number of
-- sessions): the reaper ends its sessions in later calls, and until then only this read
-- keeps it from writing (DESIGN §2.9).
-- A checkpoint (docs/design/hand-over.md) rides the events it reflects, the last of them its
-- event: taken at a response's end, where a client's next turn may follow before any later
-- call could write it, it is stored with them or not at all. Rare, it reads the record.
-- With a terminal payload a session ends after its events, exactly once. A session object
-- (the newest session.updated among the events) is stored in the record with them, so a
-- resume through any gateway announces it; its 'idle_timeout_s' (the seed's session setting,
-- which the worker checked) becomes the session's idle TTL, its deadline moved to match. Both
-- are rare, and only they read the record.
-- KEYS[1] worker record  KEYS[2] worker session set  KEYS[3] worker deadlines
-- KEYS[4] worker channel  KEYS[5] worker ended list  KEYS[6] worker gateways
-- KEYS[7] worker held set (see attach_to)  KEYS[8] worker moved set
-- KEYS[4i+5] .. KEYS[4i+8] (i = 1..n): session record, input log, output log, output channel
-- ARGV[1] '1': the writer is the worker of KEYS[1] (the sessions' home), refused whole once
--   lost; '0': it writes sessions of this home it took over, which their owner epochs alone
--   fence (the home's worker may be long gone)
-- then per session: session id, the owner epoch the worker serves it under (a session another
--   worker took over, its record's epoch past this one, is refused: docs/design/hand-over.md),
--   the server_event_seq of the first event (0: whatever comes
--   next), the output log's entry bound (MAXLEN ~; '': the record's, one read more), the ID
--   of the input entry to trim the input log to ('<fence>-<index>', kept with everything
--   after it; '' leaves it alone), terminal payload ('' none), terminal reason, the session
--   object (JSON; '' none), the checkpoint's input entry ID, kept entry ID and core state
--   ('' '' '': none; the fields of write_checkpoint.lua), event count c, then c encoded events
-- returns {'fenced'} if the worker was declared lost (or its record is gone), else per
--   session in order {status, first seq (0 if no events) or, for gap and conflict, the log's
--   last seq}: status ok | closed | unknown | gap | conflict | other_format (the
--   last two for a terminal or a session object, the only parts that read the record) |
--   moved (another worker serves it; nothing written)
-- Numbered events make a resend exactly-once: a call whose reply was lost (the client library
-- resends it) or a flush retried with more events finds its first events stored already and
-- appends only the rest. A first seq past the log's end (gap), or a resent event that differs
-- from the stored one (conflict), means the worker and the store disagree (a bug, or a
-- failover that lost writes): nothing is written, and the worker ends the session loudly.
local wk = worker_keys(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8])

-- The owner epochs are read only where they can differ (see flush_output.lua).
local check_owners = true
if ARGV[1] == '1' then
  local w = redis.call('HMGET', KEYS[1], 'state', 'moved')
  if not w[1] or w[1] == 'lost' then return {'fenced'} end
  check_owners = tonumber(w[2] or '0') > 0
end

-- Whether the events a resend carries again are the ones the log holds under their numbers
-- (those trimmed since cannot be compared, and are taken as stored).
local function stored_already(out_log, first, skip, at)
  local held = redis.call('XRANGE', out_log, first .. '-0', (first + skip - 1) .. '-0')
  for _, entry in ipairs(held) do
    local seq = tonumber(string.match(entry[1], '^(%d+)'))
    if entry[2][2] ~= ARGV[at + seq - first] then return false end
  end
  return true
end

-- The record's state, when a rare part of the flush must change it: nil and an answer when
-- it may not.
local function record_state(rec)
  local f = redis.call('HMGET', rec, 'state', FORMAT_FIELD)
  if not f[1] then return nil, 'unknown' end
  if f[2] ~= SESSION_FORMAT then return nil, 'other_format' end
  if f[1] == 'closed' then return nil, 'closed' end
  return f[1], nil
end

local function store_session(sid, rec, session)
  redis.call('HSET', rec, 'session', session)
  local idle_s = cjson.decode(session)['idle_timeout_s']
  if type(idle_s) == 'number' and idle_s > 0 then
    redis.call('HSET', rec, 'idle_ms', math.floor(idle_s * 1000))
    redis.call('ZADD', wk.deadlines, next_deadline(rec), sid)
  end
end

local function append_one(sid, keys, owner_epoch, first, out_max, trim_to, terminal, reason,
                          session, checkpoint, at, count)
  if check_owners and owner_epoch_of(keys.rec) ~= owner_epoch then return {'moved', 0} end
  local top = output_top(keys.out_log)
  if top.closed then return {'closed', 0} end
  if first == 0 then first = top.seq + 1 end
  local skip = 0
  if count > 0 then
    if first > top.seq + 1 then
      -- A log that is gone lost nothing: the session ended and expired.
      if redis.call('EXISTS', keys.out_log) == 0 then return {'unknown', 0} end
      return {'gap', top.seq}
    end
    skip = math.min(top.seq + 1 - first, count)
    if skip > 0 and not stored_already(keys.out_log, first, skip, at) then
      return {'conflict', top.seq}
    end
  end
  if count > skip then
    if out_max == '' then
      out_max = redis.call('HGET', keys.rec, 'out_max')
      if not out_max then return {'unknown', 0} end
    end
    local payloads = {}
    for i = at + skip, at + count - 1 do
      local id = (first + i - at) .. '-0'
      if not redis.call('XADD', keys.out_log, 'NOMKSTREAM', 'MAXLEN', '~', out_max, id,
                        'd', ARGV[i]) then
        return {'unknown', 0}  -- the log is gone: the session ended and expired
      end
      payloads[#payloads + 1] = ARGV[i]
    end
    -- Only what is in the log is pushed.
    redis.call('SPUBLISH', keys.out_channel, cmsgpack.pack({'e', first + skip, payloads}))
  end
  -- The worker applied the commands before this entry; only a gap fill could still read them.
  -- The entry itself stays: the log's last entry tells the next append its index and fence.
  if trim_to ~= '' then redis.call('XTRIM', keys.in_log, 'MINID', trim_to) end
  if session ~= '' or terminal ~= '' or checkpoint ~= 0 then
    local state, refused = record_state(keys.rec)
    if not state then return {refused, 0} end
    if session ~= '' then store_session(sid, keys.rec, session) end
    if checkpoint ~= 0 then
      redis.call('HSET', keys.rec, 'ck_epoch', owner_epoch, 'ck_in', ARGV[checkpoint],
                 'ck_keep', ARGV[checkpoint + 1], 'ck_seq', first + count - 1,
                 'ck_ms', now_ms(), 'ck_core', ARGV[checkpoint + 2])
    end
    if terminal ~= '' then terminate(sid, keys, wk, terminal, reason) end
  end
  if count == 0 then first = 0 end
  return {'ok', first}
end

local answers = {}
local at = 2
for k = 9, #KEYS, 4 do
  local count = tonumber(ARGV[at + 11])
  local keys = session_keys(KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3])
  -- The checkpoint's arguments' position, 0 for none (its arguments are binary: not copied).
  local checkpoint = 0
  if ARGV[at + 8] ~= '' then checkpoint = at + 8 end
  answers[#answers + 1] = append_one(ARGV[at], keys, ARGV[at + 1], tonumber(ARGV[at + 2]),
                                     ARGV[at + 3], ARGV[at + 4], ARGV[at + 5], ARGV[at + 6],
                                     ARGV[at + 7], checkpoint, at + 12, count)
  at = at + 12 + count
end
return answers
