-- Run by any gateway, for one worker, before REAP_SESSIONS: the worker-level half of a reap.
-- Declares the worker lost if its heartbeat lapsed; else removes lapsed gateways that hold no
-- session there, and answers which sessions need REAP_SESSIONS: every session of a lost
-- worker, the sessions held by gateways whose attachment lease lapsed, and the sessions whose
-- deadline is due. It reads and writes only the worker's keys: REAP_SESSIONS, whose KEYS name
-- those sessions' keys, re-checks each session and makes exactly one reaper win (DESIGN §2.6,
-- §2.8, §2.9).
-- KEYS[1] worker record  KEYS[2] worker session set  KEYS[3] worker deadlines
-- KEYS[4] worker channel  KEYS[5] worker ended list  KEYS[6] worker gateways
-- KEYS[7] worker held set (see attach_to)  KEYS[8] worker moved set
-- KEYS[9] worker adopted set
-- ARGV[1] most due sessions to answer in this call
-- ARGV[2] outage ms: a longer gap since any reaper last reached this worker's slot means the
--         slot was out of reach (its master failed over, Redis restarted, no gateway ran)
-- ARGV[3] most ended sessions to hand back for tenant release in this call
-- ARGV[4] attachment lease ms (a lapsed lease counts only a full lease after an outage)
-- returns {worker state, {session id, ...} to end as worker_lost, {'<tenant> <session id>',
--          ...}, {'<gateway id> <session id>', ...} to detach, {session id, ...} due,
--          outage ms (the gap this call ended, 0 if none), {session id, ...} served by this
--          lost worker but homed elsewhere, to end there}; the state is other_format for a
--          worker record of another format (nothing of it is read or written), and home for
--          a lost worker that is still the home of sessions other workers serve
--          (docs/design/hand-over.md): it is reaped on like a live one, never forgotten:
--   the third list holds sessions that ended since any reaper last asked (wherever they
--   ended), each handed to exactly one reaper, which releases their tenant places
-- A worker cannot heartbeat while its slot is out of reach, so after an outage a lapsed
-- heartbeat is only a loss once the worker had a full TTL to beat again; and a client could
-- neither resume nor show activity, so grace and idle time count from then too. The outage is
-- seen here, per slot, from the gap between reaps (the record's reaped_ms and reached_ms travel
-- with the slot to a promoted replica), not by a reaper: on a Cluster one master may fail over
-- while every reaper reaches the others, and a reaper's call may wait out the failover inside
-- the client and succeed. reached_ms is where REAP_SESSIONS reads that moment.
local worker, sessions, deadlines = KEYS[1], KEYS[2], KEYS[3]
local ended_list, gateways, held, moved, adopted = KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local budget, outage_ms, release_budget = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local lease_ms = tonumber(ARGV[4])

local function take_ended(count)
  return redis.call('LPOP', ended_list, count) or {}
end

local now = now_ms()
local w = redis.call('HMGET', worker, 'state', 'alive_until', 'ttl_ms', 'reaped_ms',
                     'reached_ms', FORMAT_FIELD)
if w[1] and w[6] ~= WORKER_FORMAT then return {'other_format', {}, {}, {}, {}, 0, {}} end
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
end
local state = w[1] or 'unknown'
if w[1] == 'lost' or lapsed then
  -- Its sessions leave the sets only as REAP_SESSIONS ends them (here, and in their homes for
  -- those it had taken over), so a reaper that stops before ending them all leaves the rest
  -- to the next one.
  local members = redis.call('SMEMBERS', sessions)
  local serving = redis.call('ZRANGE', adopted, 0, -1)
  if #members > 0 or #serving > 0 then return {'lost', members, {}, {}, {}, outage, serving} end
  if redis.call('SCARD', moved) == 0 then
    redis.call('DEL', sessions, deadlines, gateways, held)
    -- No reaper visits a lost worker again: hand back every ended session now.
    return {'lost', {}, take_ended(redis.call('LLEN', ended_list) + 1), {}, {}, outage, {}}
  end
  -- The home of sessions other workers serve: their leases, deadlines and ends are here.
  state = 'home'
  redis.call('PEXPIRE', worker, WORKER_KEPT_MS)
end

-- A gateway that stopped renewing (killed, paused, partitioned) holds its sessions no more:
-- each is detached as a lost connection would have detached it. After an outage a gateway
-- gets a full lease from Redis's return to renew first.
local to_detach = {}
if now >= recovered + lease_ms then
  for _, gid in ipairs(redis.call('ZRANGEBYSCORE', gateways, '-inf', '(' .. now)) do
    -- Its members '<gid> <session id>': from '<gid> ' up to, not including, '<gid>!'.
    local members = redis.call('ZRANGEBYLEX', held, '[' .. gid .. ' ', '(' .. gid .. '!')
    if #members == 0 then redis.call('ZREM', gateways, gid) end
    for _, member in ipairs(members) do to_detach[#to_detach + 1] = member end
  end
end
local due = redis.call('ZRANGEBYSCORE', deadlines, '-inf', now, 'LIMIT', 0, budget)
return {state, {}, take_ended(release_budget), to_detach, due, outage, {}}
