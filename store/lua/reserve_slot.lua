-- A worker about to take a session over from another (docs/design/hand-over.md) reserves a
-- slot on itself first, in its own hash slot: the session's keys stay in their home's, so
-- the capacity check and the adoption are two scripts. As an open checks a worker, it checks
-- liveness, the model and capacity; the slot is counted in 'used' at once, and the session
-- listed in the adopter's adopted set (scored by when) until the adopter lets it go
-- (release_slot.lua): at the session's end, a failed adoption, or its own loss.
-- KEYS[1] adopter's worker record  KEYS[2] adopter's adopted set
-- ARGV[1] session id  ARGV[2] the model name the session is served as ('' any)
-- returns status: ok (also for a resend: the session is listed already) | unavailable |
--   full | other_model
local worker, adopted = KEYS[1], KEYS[2]
local sid, model = ARGV[1], ARGV[2]

if redis.call('ZSCORE', adopted, sid) then return 'ok' end
local now = now_ms()
local w = redis.call('HMGET', worker, 'state', 'alive_until', 'slots', 'used', 'models',
                     FORMAT_FIELD)
if w[1] ~= 'live' or w[6] ~= WORKER_FORMAT or tonumber(w[2]) < now then
  return 'unavailable'
end
if model ~= '' then
  local serves = false
  for _, name in ipairs(cjson.decode(w[5] or '[]')) do
    if name == model then serves = true end
  end
  if not serves then return 'other_model' end
end
if tonumber(w[4]) >= tonumber(w[3]) then return 'full' end
redis.call('HINCRBY', worker, 'used', 1)
redis.call('ZADD', adopted, now, sid)
return 'ok'
