-- A worker records where some of its sessions stand, so that another worker can continue
-- them (docs/design/hand-over.md, "Checkpoints"): fields of each session's record, replacing
-- the checkpoint before. A checkpoint is written only by the session's owner, only while the
-- session is open, and only when the output log ends at the event it names: the state, the
-- input it applied and the output it wrote then describe one moment, whatever was written
-- between the worker taking the state and this call.
-- KEYS[2i-1], KEYS[2i] (i = 1..n): session record, output log (sessions of one hash slot)
-- ARGV per session: the owner epoch the worker serves it under, the ID of the last input entry
--   the state reflects, the ID of the oldest input entry an adopter reads back, the
--   server_event_seq of the last event it reflects, the conversation core's state
-- returns one status per session in order: ok | closed | unknown | other_format | moved
--   (another worker serves it) | behind (its output log does not end at that event)
local now = now_ms()
local answers = {}
for k = 1, #KEYS, 2 do
  local rec, out_log = KEYS[k], KEYS[k + 1]
  local at = (k - 1) / 2 * 5 + 1
  local owner_epoch, applied, keep, seq, core = ARGV[at], ARGV[at + 1], ARGV[at + 2],
                                                tonumber(ARGV[at + 3]), ARGV[at + 4]
  local f = redis.call('HMGET', rec, 'state', FORMAT_FIELD, 'owner_epoch')
  local status = 'ok'
  if not f[1] then status = 'unknown'
  elseif f[2] ~= SESSION_FORMAT then status = 'other_format'
  elseif f[1] == 'closed' then status = 'closed'
  elseif (f[3] or '1') ~= owner_epoch then status = 'moved'
  else
    local top = output_top(out_log)
    if top.closed then status = 'closed'
    elseif top.seq ~= seq then status = 'behind'
    else
      redis.call('HSET', rec, 'ck_epoch', owner_epoch, 'ck_in', applied, 'ck_keep', keep,
                 'ck_seq', seq, 'ck_ms', now, 'ck_core', core)
    end
  end
  answers[#answers + 1] = status
end
return answers
