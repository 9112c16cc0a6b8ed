-- How long a worker's ended list outlives its last push, and a lost worker's record its loss.
local WORKER_KEPT_MS = 86400000

-- The input log's write fence (docs/design/store.md, "The input log"): every entry's ID is
-- '<fence>-<index>'. The holder of generation g writes under fence 2g; a detachment of g
-- raises it to 2g + 1. A control script raises it by a marker entry '<fence>-<last index>'
-- (fields f <fence>, h <highest client seq>, 'e:<store epoch>' 0, b <largest command>), so
-- Redis refuses every later XADD under an older fence as "equal or smaller" than the log's
-- top: no stale writer can append. Every entry names the store epoch it was written under.
local function attached_fence(gen) return 2 * tonumber(gen) end
local function detached_fence(gen) return 2 * tonumber(gen) + 1 end

-- The last entry of an input log: its fence, index, store epoch, highest client seq ('h'),
-- the largest command appended so far ('b'), and the call id ('c') when it ended an append;
-- nil for a log that does not exist.
local function input_top(in_log)
  local top = redis.call('XREVRANGE', in_log, '+', '-', 'COUNT', 1)
  if #top == 0 then return nil end
  local fence, index = string.match(top[1][1], '^(%d+)-(%d+)$')
  local fields, found, epoch = top[1][2], {h = '0'}, nil
  for i = 1, #fields, 2 do
    local name = fields[i]
    if string.sub(name, 1, 2) == 'e:' then epoch = string.sub(name, 3) end
    found[name] = fields[i + 1]
  end
  return {id = top[1][1], fence = tonumber(fence), index = tonumber(index), epoch = epoch,
          h = tonumber(found.h), call = found.c, count = tonumber(found.n or '0'),
          biggest = tonumber(found.b or '0'), marker = found.d == nil}
end

-- Raise the input log's fence to `fence` (a marker at the log's last index); nothing for a
-- log that does not exist (the session is over). A marker that is still the log's last entry
-- is replaced, so resumes that append nothing (a client refused for backpressure, resuming
-- until its worker caught up) leave one marker, not one each, in what the backlog counts.
-- The session's worker is told ({'f', sid, fence} on its channel): a plain input append
-- publishes its push whatever its XADD met (store/input_appends.py), so a push under an older
-- fence that comes after this notice is one whose entries Redis refused.
-- Returns the log's top after it (or nil).
local function raise_fence(in_log, fence, epoch, worker_channel, sid)
  local top = input_top(in_log)
  if top == nil or top.fence >= fence then return top end
  if top.marker then redis.call('XDEL', in_log, top.id) end
  redis.call('XADD', in_log, fence .. '-' .. top.index, 'f', fence, 'h', top.h,
             'e:' .. epoch, 0, 'b', top.biggest)
  redis.call('SPUBLISH', worker_channel, cmsgpack.pack({'f', sid, fence}))
  top.fence, top.epoch = fence, epoch
  return top
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The last entry of an output log: its server_event_seq (0 for a log with no entry, or none)
-- and whether it is the session's terminal event (the one entry with a 't' field). Trims keep
-- the last entry, so its seq is the number of the last event the session ever had.
local function output_top(out_log)
  local top = redis.call('XREVRANGE', out_log, '+', '-', 'COUNT', 1)
  if #top == 0 then return {seq = 0, closed = false} end
  local fields, closed = top[1][2], false
  for i = 1, #fields, 2 do
    if fields[i] == 't' then closed = true end
  end
  return {seq = tonumber(string.match(top[1][1], '^(%d+)')), closed = closed}
end

-- A worker's keys, as the scripts that end sessions receive them (all in the worker's slot;
-- WorkerKeys.ending in store/keys.py).
local function worker_keys(record, sessions, deadlines, channel, ended, gateways, held, moved)
  return {record = record, sessions = sessions, deadlines = deadlines, channel = channel,
          ended = ended, gateways = gateways, held = held, moved = moved}
end

-- Attachment leases (DESIGN §2.6). A gateway holds the sessions it serves on a worker under one
-- lease per (gateway, worker): its score in the worker's gateways set, renewed in bulk, so the
-- cost of renewal grows with gateways x workers, never with sessions. The sessions each gateway
-- holds there are the members '<gateway id> <session id>' of the worker's held set (score 0),
-- so one key, passed in KEYS, holds them all and a gateway's sessions are one lexicographic
-- range of it; a record's 'gw' names its holder.
local function attach_to(rec, sid, gateways, held, gid, lease_ms, now)
  if gid == '' then return end  -- a caller that serves no connection holds no lease
  local old = redis.call('HGET', rec, 'gw')
  if old and old ~= '' and old ~= gid then redis.call('ZREM', held, old .. ' ' .. sid) end
  redis.call('HSET', rec, 'gw', gid)
  redis.call('ZADD', held, 0, gid .. ' ' .. sid)
  if tonumber(redis.call('ZSCORE', gateways, gid) or '0') < now + lease_ms then
    redis.call('ZADD', gateways, now + lease_ms, gid)
  end
end

local function let_go(rec, sid, held)
  local gid = redis.call('HGET', rec, 'gw')
  if gid and gid ~= '' then
    redis.call('ZREM', held, gid .. ' ' .. sid)
    redis.call('HSET', rec, 'gw', '')
  end
end

-- A session's checkpoint (docs/design/hand-over.md): fields of its record, written by
-- write_checkpoint.lua, read by adopt_session.lua, dropped by terminate. ck_epoch: the owner
-- epoch that wrote it; ck_in: the ID of the last input entry it reflects; ck_keep: the ID of
-- the oldest input entry an adopter reads back (the input buffer's audio); ck_seq: the last
-- output event it reflects; ck_ms: when (Redis clock); ck_core: the conversation core's state.
local CHECKPOINT_FIELDS = {'ck_epoch', 'ck_in', 'ck_keep', 'ck_seq', 'ck_ms', 'ck_core'}

-- The owner epoch of a session's record: 1 for a record written before owners were (the
-- worker that opened it has served it since).
local function owner_epoch_of(rec)
  return redis.call('HGET', rec, 'owner_epoch') or '1'
end

-- Whether input entry ID a is older than b (both '<fence>-<index>').
local function entry_before(a, b)
  local fa, ia = string.match(a, '^(%d+)-(%d+)$')
  local fb, ib = string.match(b, '^(%d+)-(%d+)$')
  fa, ia, fb, ib = tonumber(fa), tonumber(ia), tonumber(fb), tonumber(ib)
  return fa < fb or (fa == fb and ia < ib)
end

-- The highest stream ID there is: an output log whose last ID is set to it takes no entry more.
local LAST_STREAM_ID = '18446744073709551615-18446744073709551615'

-- The one place a session ends: the terminal event goes last into the output log, marked by a
-- 't' field (its reason), and Redis keeps it last: the log's last ID is set to the highest
-- there is, so any later XADD, a lost worker's or a resend's, is refused. The slot is
-- released, the worker is told, the session is queued on its worker's ended list (a reaper hands
-- its tenant place back: that key lives in another hash slot), and the keys get a retention TTL
-- so a late resume can still replay up to the terminal event. Callers check that the session is
-- not closed already and that its record is of this format (it has every field read here), so
-- each session is queued exactly once.
local function terminate(sid, keys, wk, terminal, reason)
  local rec, out_log = keys.rec, keys.out_log
  local f = redis.call('HMGET', rec, 'retention_ms', 'out_max', 'tenant')
  local retention = tonumber(f[1])
  local seq = output_top(out_log).seq + 1
  redis.call('XADD', out_log, 'MAXLEN', '~', tonumber(f[2]) + 1, seq .. '-0', 'd', terminal,
             't', reason)
  redis.call('SPUBLISH', keys.out_channel, cmsgpack.pack({'e', seq, {terminal}}))
  redis.call('XSETID', out_log, LAST_STREAM_ID)
  let_go(rec, sid, wk.held)
  redis.call('HSET', rec, 'state', 'closed', 'reason', reason)
  -- A session another worker serves counts against that worker's slots, not its home's: that
  -- worker lets its slot go when told of the end (the 'c' notice below).
  if redis.call('SREM', wk.sessions, sid) == 1 then
    redis.call('HINCRBY', wk.record, 'used', -1)
  elseif redis.call('SREM', wk.moved, sid) == 1 then
    redis.call('HINCRBY', wk.record, 'moved', -1)
  end
  local tenant = f[3]
  if tenant then
    redis.call('RPUSH', wk.ended, tenant .. ' ' .. sid)
    redis.call('PEXPIRE', wk.ended, WORKER_KEPT_MS)
  end
  redis.call('ZREM', wk.deadlines, sid)
  redis.call('SPUBLISH', wk.channel, cmsgpack.pack({'c', sid}))
  redis.call('PEXPIRE', rec, retention)
  redis.call('PEXPIRE', out_log, retention)
  -- A resume of the ended session still answers the highest client seq it took.
  local top = input_top(keys.in_log)
  if top ~= nil then redis.call('HSET', rec, 'cseq_end', top.h) end
  redis.call('DEL', keys.in_log)
  -- An ended session moves nowhere: its checkpoint goes with its input log.
  redis.call('HDEL', rec, unpack(CHECKPOINT_FIELDS))
end

-- A session's keys, as the scripts that end sessions receive them.
local function session_keys(rec, in_log, out_log, out_channel)
  return {rec = rec, in_log = in_log, out_log = out_log, out_channel = out_channel}
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
