-- The output flush's fast path: a worker appends events to the output logs of sessions whose
-- logs end where its own last write left them, as it knows (OutputAppend.top_known_at, store/answers.py), so nothing
-- is read per session: an XADD per event under the number the worker gave it, and one push of
-- what landed. Redis refuses what may not be written: a session that ended (its terminal event
-- set the log's last ID to the highest there is, so every later XADD is "equal or smaller"),
-- an event stored already (a resend), and a log that is gone (NOMKSTREAM). A session so
-- refused is answered 'r' or 'g' and nothing of it is pushed: the worker sends it again through
-- append_output.lua, which reads the log's end and says why. A worker declared lost is refused
-- whole, as there (one read of its state per call), and a session another worker took over
-- (its record's owner epoch is past the writer's: docs/design/hand-over.md) is refused alone
-- ('m'). The owner epoch is read per session only where it can differ: in a call of the
-- home's own worker once the home counts a session taken over from it (its record's
-- 'moved', read with its state), and always in a call of a worker that took sessions over.
-- Runs without the prelude: nothing here reads or ends a session.
-- KEYS[1] worker record; KEYS[4i-2] .. KEYS[4i+1] (i = 1..n): output log, output channel,
--   input log, record of session i
-- ARGV[1] '1': the writer is the worker of KEYS[1] (the sessions' home), refused whole once
--   lost; '0': it writes sessions of this home it took over, which their owner epochs alone
--   fence (the home's worker may be long gone)
-- then per session: the owner epoch the worker serves it under, the server_event_seq of its
--   first event, the output log's entry bound (MAXLEN ~), the ID of the input entry to trim
--   the input log to ('' leaves it alone), event count c, then c encoded events
-- returns 'fenced', or one letter per session in order: o (every event written and pushed,
--   and the trim done), r (the first event's ID was refused, or a later one failed: what
--   landed is pushed), g (the output log is gone), m (another worker serves it: nothing
--   written)
local check_owners = true
if ARGV[1] == '1' then
  local w = redis.call('HMGET', KEYS[1], 'state', 'moved')
  if not w[1] or w[1] == 'lost' then return 'fenced' end
  check_owners = tonumber(w[2] or '0') > 0
end

local answers = {}
local at = 2
for k = 2, #KEYS, 4 do
  local out_log, owner_epoch = KEYS[k], ARGV[at]
  local first, bound, trim_to = tonumber(ARGV[at + 1]), ARGV[at + 2], ARGV[at + 3]
  local count = tonumber(ARGV[at + 4])
  local events = at + 5
  local landed, status = {}, 'o'
  -- A record written before owners were has none: its opener serves it (epoch 1).
  if check_owners and (redis.call('HGET', KEYS[k + 3], 'owner_epoch') or '1') ~= owner_epoch
  then
    status, count = 'm', 0
  end
  for i = 0, count - 1 do
    local payload = ARGV[events + i]
    local id = redis.pcall('XADD', out_log, 'NOMKSTREAM', 'MAXLEN', '~', bound,
                           (first + i) .. '-0', 'd', payload)
    if type(id) ~= 'string' then
      if id == false and i == 0 then status = 'g' else status = 'r' end
      break
    end
    landed[i + 1] = payload
  end
  -- Only what is in the log is pushed.
  if #landed > 0 then redis.call('SPUBLISH', KEYS[k + 1], cmsgpack.pack({'e', first, landed})) end
  -- The worker applied the commands before this entry (see append_output.lua).
  if status == 'o' and trim_to ~= '' then redis.call('XTRIM', KEYS[k + 2], 'MINID', trim_to) end
  answers[#answers + 1] = status
  at = events + tonumber(ARGV[at + 4])
end
return table.concat(answers)
