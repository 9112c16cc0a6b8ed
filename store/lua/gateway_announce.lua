-- List one gateway among the live ones until now + ttl, drop those whose listing ended, and
-- answer who is listed: the reapers share the workers out among them (each worker to a few of
-- them, by rendezvous hash), so the reaping grows with the workers, not gateways x workers.
-- Safe to run twice: a second run lists the gateway until the same moment, give or take.
-- KEYS[1] gateway directory
-- ARGV[1] gateway id  ARGV[2] ttl ms
-- returns the ids of the gateways listed live now
local directory, gid, ttl = KEYS[1], ARGV[1], tonumber(ARGV[2])
local now = now_ms()
redis.call('ZADD', directory, now + ttl, gid)
redis.call('ZREMRANGEBYSCORE', directory, '-inf', '(' .. now)
return redis.call('ZRANGE', directory, 0, -1)
