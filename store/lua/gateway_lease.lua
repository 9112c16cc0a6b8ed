-- Renew one gateway's attachment lease on one worker: every session it serves there at once
-- (one call per gateway and worker, whatever the number of sessions). Safe to run twice.
-- KEYS[1] worker gateways
-- ARGV[1] gateway id  ARGV[2] lease ms
-- returns the lease's end (ms, Redis clock)
local gateways, gid, lease_ms = KEYS[1], ARGV[1], tonumber(ARGV[2])
local until_ms = now_ms() + lease_ms
redis.call('ZADD', gateways, until_ms, gid)
return until_ms
