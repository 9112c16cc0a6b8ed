-- A worker lets go of the slot it reserved for a session homed elsewhere (reserve_slot.lua):
-- the session ended, moved on, or was never adopted. Safe to send twice.
-- KEYS[1] the worker's record  KEYS[2] its adopted set
-- ARGV[1] session id
-- returns 1 if the slot was held, else 0
if redis.call('ZREM', KEYS[2], ARGV[1]) == 0 then return 0 end
redis.call('HINCRBY', KEYS[1], 'used', -1)
return 1
