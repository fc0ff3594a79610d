-- rein-redis: an operator's change to one key of a policy (RedisStore::{penalize,
-- set_remaining, block, unblock}), as a compare-and-set in two calls; and below, the
-- per-key overrides of a deployment. 'read' answers the
-- key's value and the server's clock; the store computes the new value with rein-core
-- itself (Policy::penalize, Policy::with_remaining, Block), so no algorithm is written
-- twice; 'swap' writes it only if the key still holds what was read. A decision that ran
-- in between makes the swap answer 0 and write nothing, and the store reads again. Both
-- touch one key, so they run on a Cluster like the decision scripts.
--
-- KEYS[1]  the policy's one state key.
-- ARGV     'read'; or 'swap', then whether the key was there ('1' or '0'), the value read
--          ('' if it was not), the new value ('' to delete the key) and its TTL in ms (at
--          least 1 for a value).
-- Reply    'read': { now_us, value } (value nil when there is no key). 'swap': 1 if it
--          wrote, 0 if the key had changed.

-- `MAX` and `clock`: preamble.lua, which script.rs puts before this file.
-- 'del' (RedisStore::reset): forgets every key given, a policy's own and an override's of
-- another shape (one slot: the key's hash tag), through the script so that a Cluster's
-- redirects are followed as a decision's are. Answers how many there were.
if ARGV[1] == 'del' and #ARGV == 1 and #KEYS >= 1 then
  return redis.call('DEL', unpack(KEYS))
end
if #KEYS ~= 1 then
  error({ err = 'REIN a policy has one key' })
end
local op = ARGV[1]
if op == 'read' and #ARGV == 1 then
  return { clock(''), redis.call('GET', KEYS[1]) }
end
-- Per-key overrides (overrides.rs) keep one hash per deployment: KEYS[1] is that hash.
-- 'ovread', then the version last read ('' for none): { version } while it is unchanged,
-- else { version, the hash's fields and values } (version nil for no hash). 'ovset', then a
-- field, its value ('' to remove it), the most overrides the hash may hold and a channel:
-- sets it and the version in one step, publishes the version on the channel (so that the
-- stores subscribed to it re-read at once), and answers { version, 1 if the field was
-- there else 0 }.
if op == 'ovread' and #ARGV == 2 then
  local version = redis.call('HGET', KEYS[1], '#v')
  if version and version == ARGV[2] then
    return { version }
  end
  return { version, redis.call('HGETALL', KEYS[1]) }
end
if op == 'ovset' and #ARGV == 5 then
  local field, value, most = ARGV[2], ARGV[3], ARGV[4] + 0
  if field == '#v' or most % 1 ~= 0 or most < 0 then
    error({ err = 'REIN arguments: a field that is not the version, a whole maximum' })
  end
  -- Each write's version is the larger of the last one plus one and Redis's clock (µs):
  -- a hash lost (a restart without persistence, FLUSHALL, an eviction) or rolled back (a
  -- replica promoted, a backup restored) and written again gets a version no store has
  -- read, since each write takes a microsecond at least, so every earlier version stays
  -- below the clock. (Counted from the old version, a rolled-back hash's next write took
  -- the version a store already held, with other contents.) Still an integer that HINCRBY
  -- counts on, as earlier versions of rein write it. The clock is read before any write
  -- (Redis 5 and 6 refuse a write before TIME in a verbatim script).
  local now = clock('')
  local last = tonumber(redis.call('HGET', KEYS[1], '#v') or '0') or 0
  local had = redis.call('HEXISTS', KEYS[1], field)
  if value == '' then
    redis.call('HDEL', KEYS[1], field)
  else
    local held = redis.call('HLEN', KEYS[1]) - redis.call('HEXISTS', KEYS[1], '#v')
    if had == 0 and held >= most then
      error({ err = 'REIN too many overrides' })
    end
    redis.call('HSET', KEYS[1], field, value)
  end
  -- '%d': the version has 16 digits, which `tostring` (14 significant) would round.
  local version = string.format('%d', math.max(last + 1, now))
  redis.call('HSET', KEYS[1], '#v', version)
  redis.call('PUBLISH', ARGV[5], version)
  return { version, had }
end
if op ~= 'swap' or #ARGV ~= 5 then
  error({ err = 'REIN expected read, ovread, ovset with 4 arguments, or swap with 4' })
end
local was, expected, value, ttl = ARGV[2], ARGV[3], ARGV[4], ARGV[5] + 0
if (was ~= '0' and was ~= '1') or ttl % 1 ~= 0 or ttl < 0 or ttl > MAX
    or (value ~= '' and ttl < 1) then
  error({ err = 'REIN arguments must be integers from 0 to 2^52 - 1 (a TTL from 1)' })
end
local current = redis.call('GET', KEYS[1])
if (was == '0' and current) or (was == '1' and current ~= expected) then
  return 0
end
if value == '' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], value, 'PX', ttl)
end
return 1
