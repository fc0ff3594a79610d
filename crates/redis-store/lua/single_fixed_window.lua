-- rein-redis: a policy of one fixed window. rein_core::FixedWindow::{decide, refund,
-- current} (crates/core/src/fixed_window.rs), with the same names, as straight-line code:
-- no closures, no tables, GET then SET ... PX only when something changed.
--
-- KEYS[1]  the limit's state key.
-- ARGV     op ('acquire', 'peek', 'refund'), now (µs, or '' for the server's TIME), cost
--          (or refund amount), min_ttl (ms), then limit and window (µs).
-- State    a string '<window_start>:<count>', written with its TTL in the same SET.
-- Reply    { allowed (1 or 0), limit, remaining, retry_after_us, reset_after_us, now_us }.

-- rein_core::MAX_MICROS (see single_token_bucket.lua).
local MAX = 4503599627370495

local op = ARGV[1]
local refund = op == 'refund'
if op ~= 'acquire' and op ~= 'peek' and not refund then
  error({ err = 'REIN unknown operation' })
end
if #ARGV ~= 6 then
  error({ err = 'REIN expected 6 arguments' })
end
local now = tonumber(ARGV[2])
if ARGV[2] == '' then
  -- Redis 5 and 6 replicate scripts verbatim unless told otherwise, and then refuse writes
  -- after TIME; Redis 7 (which has REDIS_VERSION_NUM) replicates effects only.
  if redis.REDIS_VERSION_NUM == nil then
    redis.replicate_commands()
  end
  local t = redis.call('TIME')
  now = math.min(tonumber(t[1]) * 1000000 + tonumber(t[2]), MAX)
end
local cost, min_ttl = tonumber(ARGV[3]), tonumber(ARGV[4])
local limit, window = tonumber(ARGV[5]), tonumber(ARGV[6])
-- Every argument an integer from 0 to MAX, checked at once: the script is callable by
-- anyone with the ACL, and must never store what rein-core would not. `x % 1` is 0 only
-- for an integer (NaN and infinities give NaN), so the sum is 0 only if each term is.
if not (now and cost and min_ttl and limit and window)
    or now % 1 + cost % 1 + min_ttl % 1 + limit % 1 + window % 1 ~= 0
    or math.min(now, cost, min_ttl, limit, window) < 0
    or math.max(now, cost, min_ttl, limit, window) > MAX then
  error({ err = 'REIN arguments must be integers from 0 to 2^52 - 1' })
end
if window == 0 then
  error({ err = 'REIN bad fixed window parameters' })
end
if not refund and cost > limit then
  error({ err = 'REIN cost exceeds capacity' })
end

local key = KEYS[1]
local window_start, count = 0, 0
local stored = redis.call('GET', key)
if stored then
  local a, b = string.match(stored, '^(%d+):(%d+)$')
  if a == nil then
    error({ err = 'REIN corrupt fixed window state' })
  end
  window_start, count = tonumber(a), tonumber(b)
  if window_start > MAX or count > MAX then
    error({ err = 'REIN corrupt fixed window state' })
  end
end

-- FixedWindow::current: the window that counts at `now`. A clock that went back to an
-- earlier window keeps counting in the stored one.
local n = math.max(now, window_start)
local start = n - math.fmod(n, window)
if start ~= window_start then
  count = 0
end

local write = false
if refund then
  write = count > 0
  count = math.max(count - cost, 0)
  cost = 0
end

-- `start` is never before `now`'s window, so this is at least 1 µs.
local window_end = math.min(start + window - now, MAX)
local remaining = math.max(limit - count, 0)
local allowed, retry_after = 0, 0
if cost <= remaining then
  allowed = 1
  remaining = remaining - cost
  count = count + cost
  write = write or (cost > 0 and op == 'acquire')
else
  -- `cost <= limit`, so the next window admits it.
  retry_after = window_end
end
local reset_after = 0
if count > 0 then
  reset_after = window_end
end

if write then
  -- The key lives until its window ends (rounded up to ms), or min_ttl if longer.
  local ttl = reset_after + 999
  ttl = math.max((ttl - math.fmod(ttl, 1000)) / 1000, min_ttl)
  if ttl > 0 then
    redis.call('SET', key, string.format('%d:%d', start, count), 'PX', ttl)
  else
    redis.call('DEL', key)
  end
end
return { allowed, limit, remaining, retry_after, reset_after, now }
