-- Run by any gateway, for one worker: declare the worker lost if its heartbeat lapsed (closing
-- all its sessions with worker_lost); else detach the sessions of gateways whose attachment
-- lease lapsed (their grace starts), then expire due sessions. The state checks make exactly
-- one reaper win and write exactly one terminal event (DESIGN §2.6, §2.8, §2.9).
-- KEYS[1] worker record  KEYS[2] worker session set  KEYS[3] worker deadlines
-- KEYS[4] worker channel  KEYS[5] worker ended list  KEYS[6] worker gateways
-- KEYS[7] worker held set (see attach_to)
-- ARGV[1] key prefix of this worker's sessions ('dg:{w...}:s:'), ARGV[9] .. ARGV[12] the
--         suffixes of a session's record, input log, output log and output channel keys
--         (both from store/keys.py)
-- ARGV[2] terminal payload: worker lost  ARGV[3] terminal: grace expired
-- ARGV[4] terminal: idle expired         ARGV[5] max sessions to expire in this call
-- ARGV[6] outage ms: a longer gap since any reaper last reached this worker's slot means the
--         slot was out of reach (its master failed over, Redis restarted, no gateway ran)
-- ARGV[7] most ended sessions to hand back for tenant release in this call
-- ARGV[8] attachment lease ms (a lapsed lease counts only a full lease after an outage)
-- returns {worker state, sessions ended, {'<tenant> <session id>', ...}, sessions detached,
--          outage ms (the gap this call ended, 0 if none)}; the state is other_format for a
--          worker record of another format (nothing of it is read or written):
--   the list holds sessions that ended since any reaper last asked (wherever they ended),
--   each handed to exactly one reaper, which releases their tenant places
-- A worker cannot heartbeat while its slot is out of reach, so after an outage a lapsed
-- heartbeat is only a loss once the worker had a full TTL to beat again; and a client could
-- neither resume nor show activity, so grace and idle time count from then too. The outage is
-- seen here, per slot, from the gap between reaps (the record's reaped_ms and reached_ms travel
-- with the slot to a promoted replica), not by a reaper: on a Cluster one master may fail over
-- while every reaper reaches the others, and a reaper's call may wait out the failover inside
-- the client and succeed.
-- The keys of the sessions it ends are the one exception to "every key in KEYS": the session ids
-- are known only here (read from the worker's session set, deadlines and held set), and a
-- reaper cannot name them in advance without a read of its own before every call. They are
-- built from the prefix and suffixes store/keys.py passes, from ids of this worker's own sets,
-- so every such key carries this worker's hash tag and is in this call's slot.
local worker, sessions, deadlines, worker_channel = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local ended_list, gateways, held = KEYS[5], KEYS[6], KEYS[7]
local wk = worker_keys(worker, sessions, deadlines, worker_channel, ended_list, gateways,
                      held)
local prefix, lost_event, grace_event, idle_event = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local budget, outage_ms, release_budget = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
local lease_ms = tonumber(ARGV[8])
local rec_suffix, in_suffix, out_suffix, channel_suffix = ARGV[9], ARGV[10], ARGV[11], ARGV[12]

local function record_of(sid)
  return prefix .. string.match(sid, '%.(%x+)$') .. rec_suffix
end
local function finish(sid, terminal, reason)
  local base = prefix .. string.match(sid, '%.(%x+)$')
  terminate(sid, session_keys(base .. rec_suffix, base .. in_suffix, base .. out_suffix,
                              base .. channel_suffix), wk, terminal, reason)
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
    -- Its members '<gid> <session id>': from '<gid> ' up to, not including, '<gid>!'.
    local from, to = '[' .. gid .. ' ', '(' .. gid .. '!'
    for _, member in ipairs(redis.call('ZRANGEBYLEX', held, from, to)) do
      local sid = string.sub(member, #gid + 2)
      local rec = record_of(sid)
      local f = redis.call('HMGET', rec, 'state', 'gw', FORMAT_FIELD)
      if f[1] == 'attached' and f[2] == gid and f[3] == SESSION_FORMAT then
        redis.call('HSET', rec, 'state', 'detached', 'detached_ms', now, 'gw', '', 'dgrace', 0)
        redis.call('ZADD', deadlines, next_deadline(rec), sid)
        detached = detached + 1
      end
    end
    redis.call('ZREMRANGEBYLEX', held, from, to)
    redis.call('ZREM', gateways, gid)
  end
  return detached
end

local now = now_ms()
local w = redis.call('HMGET', worker, 'state', 'alive_until', 'ttl_ms', 'reaped_ms',
                     'reached_ms', FORMAT_FIELD)
if w[1] and w[6] ~= WORKER_FORMAT then return {'other_format', 0, {}, 0, 0} end
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
  redis.call('PEXPIRE', worker, WORKER_KEPT_MS)
  for _, sid in ipairs(redis.call('SMEMBERS', sessions)) do
    local f = redis.call('HMGET', record_of(sid), 'state', FORMAT_FIELD)
    -- A record of another format is not this code's to end.
    if f[1] and f[1] ~= 'closed' and f[2] == SESSION_FORMAT then
      finish(sid, lost_event, REASON.worker_lost)
      ended = ended + 1
    end
  end
  redis.call('DEL', sessions, deadlines, gateways, held)
  -- No reaper visits a lost worker again: hand back every ended session now.
  return {'lost', ended, take_ended(redis.call('LLEN', ended_list) + 1), 0, outage}
end

local detached = detach_lapsed(now, recovered)

for _, sid in ipairs(redis.call('ZRANGEBYSCORE', deadlines, '-inf', now, 'LIMIT', 0, budget)) do
  local f = redis.call('HMGET', record_of(sid), 'state', 'active_ms', 'idle_ms', 'detached_ms',
                       'grace_ms', 'dgrace', FORMAT_FIELD)
  local grace = f[1] and grace_of(f[5], f[6])
  if not f[1] or f[1] == 'closed' or f[7] ~= SESSION_FORMAT then
    redis.call('ZREM', deadlines, sid)
  elseif f[1] == 'detached' and now >= math.max(tonumber(f[4]), recovered) + grace
  then
    -- A client could not resume while Redis was away: its grace counts from Redis's return.
    finish(sid, grace_event, REASON.disconnect_grace_expired)
    ended = ended + 1
  elseif now >= math.max(tonumber(f[2]), recovered) + tonumber(f[3]) then
    finish(sid, idle_event, REASON.idle_ttl_expired)
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
