-- Run by a reaper after REAP, for sessions of one worker that REAP named: ends each session of
-- a lost worker (worker_lost), and each session homed here that a lost worker had taken over
-- (an orphan: its owner, named, is the lost one), detaches each session held by a gateway whose attachment lease
-- lapsed (its grace starts), and expires each due session (grace or idle), or sets its next
-- deadline. Every condition is checked again here: between the two calls a session may have
-- been resumed, closed or re-attached, and another reaper may have done the work, which then
-- finds nothing left to do. So exactly one reaper wins and exactly one terminal event is
-- written (DESIGN §2.6, §2.8, §2.9); sent twice, the second run changes nothing.
-- KEYS[1] worker record  KEYS[2] worker session set  KEYS[3] worker deadlines
-- KEYS[4] worker channel  KEYS[5] worker ended list  KEYS[6] worker gateways
-- KEYS[7] worker held set (see attach_to)  KEYS[8] worker moved set
-- KEYS[4i+5] .. KEYS[4i+8] session i's record, input log, output log and output channel
-- ARGV[1] terminal payload: worker lost  ARGV[2] terminal: grace expired
-- ARGV[3] terminal: idle expired         ARGV[4] most ended sessions to hand back
-- ARGV[5] attachment lease ms (a lapsed lease counts only a full lease after an outage)
-- ARGV[3i+3] .. ARGV[3i+5] session i's action (lost | orphan | detach | due), its id, and
--         for detach the gateway id whose lease lapsed, for orphan the lost owner's id ('' else)
-- returns {sessions ended, sessions detached, {'<tenant> <session id>', ...}}: the list as
--   REAP's; once a lost worker has no session left, its sets go and the whole list comes back
local worker, sessions, deadlines, worker_channel = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local ended_list, gateways, held, moved = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local wk = worker_keys(worker, sessions, deadlines, worker_channel, ended_list, gateways,
                      held, moved)
local lost_event, grace_event, idle_event = ARGV[1], ARGV[2], ARGV[3]
local release_budget, lease_ms = ARGV[4], tonumber(ARGV[5])

local now = now_ms()
local w = redis.call('HMGET', worker, 'state', 'reached_ms', FORMAT_FIELD)
local lost = w[1] == 'lost' and w[3] == WORKER_FORMAT
-- Since when reapers reached this slot without a gap, as REAP last wrote it.
local recovered = tonumber(w[2] or '0')
local ended, detached, lapsed_gateways = 0, 0, {}

local function end_lost(sid, keys)
  -- One taken over by another worker since REAP named it lives on there.
  if not lost or redis.call('SISMEMBER', sessions, sid) == 0 then return end
  local f = redis.call('HMGET', keys.rec, 'state', FORMAT_FIELD)
  -- A record of another format is not this code's to end.
  if f[1] and f[1] ~= 'closed' and f[2] == SESSION_FORMAT then
    terminate(sid, keys, wk, lost_event, REASON.worker_lost)
    ended = ended + 1
  end
  redis.call('SREM', sessions, sid)
end

local function end_orphan(sid, keys, owner)
  local f = redis.call('HMGET', keys.rec, 'state', FORMAT_FIELD, 'owner')
  if f[1] and f[1] ~= 'closed' and f[2] == SESSION_FORMAT and f[3] == owner then
    terminate(sid, keys, wk, lost_event, REASON.worker_lost)
    ended = ended + 1
  end
end

local function detach_lapsed(sid, gid, rec, in_log)
  local lease_end = redis.call('ZSCORE', gateways, gid)
  if not lease_end or tonumber(lease_end) >= now or now < recovered + lease_ms then return end
  local f = redis.call('HMGET', rec, 'state', 'gw', FORMAT_FIELD, 'gen', 'epoch')
  if f[1] == 'attached' and f[2] == gid and f[3] == SESSION_FORMAT then
    redis.call('HSET', rec, 'state', 'detached', 'detached_ms', now, 'gw', '', 'dgrace', 0)
    -- The lapsed holder may still be alive (paused, cut off): Redis refuses its appends now.
    raise_fence(in_log, detached_fence(f[4]), f[5], worker_channel, sid)
    redis.call('ZADD', deadlines, next_deadline(rec), sid)
    detached = detached + 1
  end
  redis.call('ZREM', held, gid .. ' ' .. sid)
  lapsed_gateways[gid] = true
end

local function expire_due(sid, keys)
  local score = redis.call('ZSCORE', deadlines, sid)
  if not score or tonumber(score) > now then return end
  local f = redis.call('HMGET', keys.rec, 'state', 'active_ms', 'idle_ms', 'detached_ms',
                       'grace_ms', 'dgrace', FORMAT_FIELD)
  local grace = f[1] and grace_of(f[5], f[6])
  if not f[1] or f[1] == 'closed' or f[7] ~= SESSION_FORMAT then
    redis.call('ZREM', deadlines, sid)
  elseif f[1] == 'detached' and now >= math.max(tonumber(f[4]), recovered) + grace then
    -- A client could not resume while Redis was away: its grace counts from Redis's return.
    terminate(sid, keys, wk, grace_event, REASON.disconnect_grace_expired)
    ended = ended + 1
  elseif now >= math.max(tonumber(f[2]), recovered) + tonumber(f[3]) then
    terminate(sid, keys, wk, idle_event, REASON.idle_ttl_expired)
    ended = ended + 1
  else
    local due = math.max(tonumber(f[2]), recovered) + tonumber(f[3])
    if f[1] == 'detached' then
      due = math.min(due, math.max(tonumber(f[4]), recovered) + grace)
    end
    redis.call('ZADD', deadlines, due, sid)
  end
end

for i = 0, (#ARGV - 5) / 3 - 1 do
  local action, sid, gid = ARGV[3 * i + 6], ARGV[3 * i + 7], ARGV[3 * i + 8]
  local keys = session_keys(KEYS[4 * i + 9], KEYS[4 * i + 10], KEYS[4 * i + 11],
                            KEYS[4 * i + 12])
  if action == 'lost' then
    end_lost(sid, keys)
  elseif action == 'orphan' then
    end_orphan(sid, keys, gid)
  elseif action == 'detach' then
    detach_lapsed(sid, gid, keys.rec, keys.in_log)
  else
    expire_due(sid, keys)
  end
end
-- A lapsed gateway goes once it holds no session here (it re-enters if it renews).
for gid in pairs(lapsed_gateways) do
  if #redis.call('ZRANGEBYLEX', held, '[' .. gid .. ' ', '(' .. gid .. '!', 'LIMIT', 0, 1) == 0
  then
    redis.call('ZREM', gateways, gid)
  end
end
if lost and redis.call('SCARD', sessions) == 0 and redis.call('SCARD', moved) == 0 then
  redis.call('DEL', sessions, deadlines, gateways, held)
  -- No reaper visits a lost worker again: hand back every ended session now.
  release_budget = redis.call('LLEN', ended_list) + 1
end
return {ended, detached, redis.call('LPOP', ended_list, release_budget) or {}}
