-- Count one new session against its tenant's rate: at most a number of opens in any sliding
-- window (a log of the window's opens, so the bound is exact, not a fixed-window estimate).
-- The call id makes a resend (lost reply) count once.
-- KEYS[1] tenant open log (sorted set: call id -> open time ms)
-- ARGV[1] opens allowed per window  ARGV[2] window ms  ARGV[3] call id
-- returns 0 when the open may go ahead (and is counted), else ms until one would be allowed
local opens = KEYS[1]
local limit, window, call_id = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]

local now = now_ms()
redis.call('ZREMRANGEBYSCORE', opens, '-inf', now - window)
if redis.call('ZSCORE', opens, call_id) then return 0 end
if redis.call('ZCARD', opens) >= limit then
  local oldest = redis.call('ZRANGE', opens, 0, 0, 'WITHSCORES')
  return math.max(1, tonumber(oldest[2]) + window - now)
end
redis.call('ZADD', opens, now, call_id)
redis.call('PEXPIRE', opens, window)
return 0
