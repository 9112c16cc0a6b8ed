-- A worker appends events to the output logs of one or more of its sessions (one hash slot),
-- so a busy worker writes all its sessions' output in one call per flush. Fenced at the
-- resource: a worker that was declared lost is refused whole, a session that is closed or
-- unknown is refused alone (§2.3, §2.9). With a terminal payload a session ends after its
-- events, exactly once. A session object (the newest session.updated among the events) is
-- stored in the record with them, so a resume through any gateway announces it; its
-- 'idle_timeout_s' (the seed's session setting, which the worker checked) becomes the
-- session's idle TTL, its deadline moved to match.
-- KEYS[1] worker record  KEYS[2] worker session set  KEYS[3] worker deadlines
-- KEYS[4] worker channel  KEYS[5] worker ended list  KEYS[6] worker gateways
-- KEYS[7] worker held set (see attach_to)
-- KEYS[4i+4] .. KEYS[4i+7] (i = 1..n): session record, input log, output log, output channel
-- ARGV per session: session id, terminal payload ('' for none), terminal reason,
--   input applied up to (0: leave the input log alone; recorded as 'in_done', the entries
--   before it trimmed per TRIM_EVERY below), that entry's ID ('<fence>-<index>'; '' with
--   0), the server_event_seq of the first
--   event (0: whatever comes next), the session object (JSON; '' none), event count c,
--   then c encoded events
-- returns {'fenced'} if the worker was declared lost, else per session in order
--   {status, first seq (0 if no events) or, for gap, the log's last seq}:
--   status ok | closed | unknown | gap | conflict | other_format
-- Numbered events make a resend exactly-once: a call whose reply was lost (the client library
-- resends it) or a flush retried with more events finds its first events stored already and
-- appends only the rest. A first seq past the log's end (gap), or a resent event that differs
-- from the stored one (conflict), means the worker and the store disagree (a bug, or a
-- failover that lost writes): nothing is written, and the worker ends the session loudly. An
-- input log that lost commands the worker applied is the worker's to find (it reads the log
-- after what it applied, and compares what it finds under an index it applied).
local worker = KEYS[1]
local wk = worker_keys(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7])

local worker_state = redis.call('HGET', worker, 'state')
if not worker_state or worker_state == 'lost' then return {'fenced'} end
-- Applied input is trimmed once the position crosses a multiple of TRIM_EVERY, and always on a
-- report without events (the worker sends those to trim): XTRIM per event would be one command
-- per audio chunk.

local function append_one(sid, keys, terminal, reason, applied, applied_id, first, session, at,
                          count)
  local rec, out_log, out_channel = keys.rec, keys.out_log, keys.out_channel
  local f = redis.call('HMGET', rec, 'state', 'out_seq', 'in_done', 'out_max', FORMAT_FIELD)
  if not f[1] then return {'unknown', 0} end
  if f[5] ~= SESSION_FORMAT then return {'other_format', 0} end
  if f[1] == 'closed' then return {'closed', 0} end
  local stored = tonumber(f[2])
  local done = tonumber(f[3])
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
  -- The worker applied these commands; only a gap fill could still read them. Dropping them
  -- keeps an attached session's Redis memory to what is in flight (DESIGN §5). The last one
  -- applied stays: the log's last entry tells the next append its index and fence.
  if applied > 0 and (count == 0
      or math.floor(applied / TRIM_EVERY) > math.floor(done / TRIM_EVERY)) then
    redis.call('XTRIM', keys.in_log, 'MINID', applied_id)
  end
  if applied > done then changes[#changes + 1], changes[#changes + 2] = 'in_done', applied end
  if count > skip then
    local payloads = {}
    for i = at + skip, at + count - 1 do payloads[#payloads + 1] = ARGV[i] end
    -- The model's output is no activity: the idle TTL counts the client's alone.
    local appended, last = add_events(out_log, out_channel, payloads, f[4], stored)
    changes[#changes + 1], changes[#changes + 2] = 'out_seq', last
    if first == 0 then first = appended end
  end
  -- Stored again by a resend: the same object, so nothing changes.
  local idle_moved = false
  if session ~= '' then
    changes[#changes + 1], changes[#changes + 2] = 'session', session
    local idle_s = cjson.decode(session)['idle_timeout_s']
    if type(idle_s) == 'number' and idle_s > 0 then
      changes[#changes + 1], changes[#changes + 2] = 'idle_ms', math.floor(idle_s * 1000)
      idle_moved = true
    end
  end
  if #changes > 0 then redis.call('HSET', rec, unpack(changes)) end
  if idle_moved then redis.call('ZADD', wk.deadlines, next_deadline(rec), sid) end
  if terminal ~= '' then
    terminate(sid, keys, wk, terminal, reason)
  end
  if count == 0 then first = 0 end
  return {'ok', first}
end

local answers = {}
local at = 1
for k = 8, #KEYS, 4 do
  local count = tonumber(ARGV[at + 7])
  local keys = session_keys(KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3])
  answers[#answers + 1] = append_one(ARGV[at], keys, ARGV[at + 1],
                                     ARGV[at + 2], tonumber(ARGV[at + 3]), ARGV[at + 4],
                                     tonumber(ARGV[at + 5]), ARGV[at + 6], at + 8, count)
  at = at + 8 + count
end
return answers
