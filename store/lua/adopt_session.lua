-- A worker takes a session over from its owner (docs/design/hand-over.md): by compare-and-set
-- on the owner epoch it names, so of two adopters one wins, and from the checkpoint the
-- record holds, so what it continues from is what the old owner last recorded. From here on
-- the old owner's writes are refused (both output scripts and write_checkpoint.lua compare
-- the epoch they are sent under with the record's). The adopter's slot is reserved first, in
-- its own worker's hash slot (reserve_slot.lua: a session's keys never leave its home slot).
-- The first adoption moves the session from its home's session set (its home's slot freed) to
-- its moved set, so the reapers keep reaping the home for it whatever becomes of its worker.
-- KEYS[1] session record  KEYS[2] input log  KEYS[3] output log
-- KEYS[4] home worker record  KEYS[5] home session set  KEYS[6] home moved set
-- ARGV[1] the owner epoch this adoption replaces  ARGV[2] the adopting worker's id
-- ARGV[3] the server_event_seq of the checkpoint it adopts from ('' whichever is there)
-- ARGV[4] session id
-- returns {status, owner epoch now, and for ok: checkpoint input ID, kept input ID,
--   checkpoint seq, core state, the output log's last seq}: status ok | closed | unknown |
--   other_format | moved (the epoch is not the one named) | no_checkpoint | other_checkpoint
--   (not the one named) | input_gone (the input log no longer holds what the checkpoint
--   needs read back: the session cannot be continued)
-- A resend after a lost reply finds the epoch moved with the adopter as owner, and answers
-- ok again.
local rec, in_log, out_log = KEYS[1], KEYS[2], KEYS[3]
local replaced, adopter, named_seq = ARGV[1], ARGV[2], ARGV[3]

local f = redis.call('HMGET', rec, 'state', FORMAT_FIELD, 'owner_epoch', 'owner', 'ck_in',
                     'ck_keep', 'ck_seq', 'ck_core')
if not f[1] then return {'unknown', 0} end
if f[2] ~= SESSION_FORMAT then return {'other_format', 0} end
local epoch = tonumber(f[3] or '1')
if f[1] == 'closed' then return {'closed', epoch} end
local resent = epoch == tonumber(replaced) + 1 and f[4] == adopter
if epoch ~= tonumber(replaced) and not resent then return {'moved', epoch} end
if not f[5] then return {'no_checkpoint', epoch} end
if named_seq ~= '' and f[7] ~= named_seq then return {'other_checkpoint', epoch} end
-- '0-0': a checkpoint taken before any input was applied, with nothing to read back.
local first = redis.call('XRANGE', in_log, '-', '+', 'COUNT', 1)
if #first == 0 or (f[6] ~= '0-0' and entry_before(f[6], first[1][1])) then
  return {'input_gone', epoch}
end
if not resent then
  epoch = epoch + 1
  redis.call('HSET', rec, 'owner', adopter, 'owner_epoch', epoch)
  if redis.call('SREM', KEYS[5], ARGV[4]) == 1 then
    -- The home's 'moved' counts them: its own worker's flushes read owner epochs only then.
    redis.call('HINCRBY', KEYS[4], 'used', -1)
    redis.call('HINCRBY', KEYS[4], 'moved', 1)
    redis.call('SADD', KEYS[6], ARGV[4])
  end
end
return {'ok', epoch, f[5], f[6], tonumber(f[7]), f[8], output_top(out_log).seq}
