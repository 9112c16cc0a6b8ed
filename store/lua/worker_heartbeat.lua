-- Register (first call) or renew a worker. A worker once declared lost is fenced for good: it
-- must stop writing and come back under a new id (DESIGN §2.9). Draining is sticky; 'busy'
-- (not admitting: no spare tick budget) is decided anew on every beat.
-- KEYS[1] worker record
-- ARGV[1] slots  ARGV[2] ttl ms  ARGV[3] register (1 on the first call, else 0)
-- ARGV[4] drain (1 to stop admitting new sessions for good)
-- ARGV[5] admit (1 while the worker takes new sessions, 0 while it is busy)
-- ARGV[6] profile: the JSON default session and capabilities of the worker's new sessions,
--         stored on registration ('' none; renewals send none: it never changes)
-- ARGV[7] backend: the name of the backend it serves, stored on registration as 'backend'
--         ('': none)
-- ARGV[8] tick p99, stored on every beat as 'tick_p99_ms': the engine's rolling p99 tick time
--         in ms, 'idle' (an engine with too few recent ticks), '' (no engine)
-- ARGV[9] models: the JSON array of the model names it serves (store/models.py), stored on
--         registration as 'models' ('': none), with the registration time as 'since_ms'
-- A registration writes the record's format; a renewal of a record of another format is
-- answered lost, as the worker cannot tell what the record says.
-- returns {status, alive_until}: status live | busy | draining | lost
local worker = KEYS[1]
local slots, ttl, register, drain, admit = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[5]
local profile, backend, tick_p99, models = ARGV[6], ARGV[7], ARGV[8], ARGV[9]

local f = redis.call('HMGET', worker, 'state', FORMAT_FIELD)
local state = f[1]
if state == 'lost' or (not state and register ~= '1') then return {'lost', 0} end
if state and f[2] ~= WORKER_FORMAT then return {'lost', 0} end
local now = now_ms()
if not state then
  -- The registration counts as a reaper's visit (reaped_ms): a first reap after an outage
  -- can then tell the gap (see REAP).
  redis.call('HSET', worker, FORMAT_FIELD, WORKER_FORMAT, 'used', 0, 'reaped_ms', now)
end
if drain == '1' or state == 'draining' then
  state = 'draining'
elseif admit == '0' then
  state = 'busy'
else
  state = 'live'
end
local alive_until = now + ttl
-- One HSET per beat, whatever it carries: a beat is a fixed cost of every worker.
local fields = {'state', state, 'slots', slots, 'alive_until', alive_until, 'ttl_ms', ttl}
local function also(name, value) fields[#fields + 1], fields[#fields + 2] = name, value end
if register == '1' and profile ~= '' then also('profile', profile) end
if register == '1' and backend ~= '' then also('backend', backend) end
if register == '1' and models ~= '' then also('models', models) end
if register == '1' then also('since_ms', now) end
also('tick_p99_ms', tick_p99)
redis.call('HSET', worker, unpack(fields))
return {state, alive_until}
