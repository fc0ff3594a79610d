-- rein-redis: a policy of one fixed window. rein_core::FixedWindow::{decide, refund,
-- refund_in_window, current} (crates/core/src/fixed_window.rs), with the same names, as
-- straight-line code: no closures, no tables, GET then SET ... PX only when something
-- changed.
--
-- KEYS[1]  the limit's state key.
-- ARGV     op ('acquire', 'peek', 'refund', 'settle'), now (µs, or '' for the server's TIME),
--          cost (or refund amount), min_ttl (ms), then limit and window (µs); for 'settle'
--          (refund_in_window) a 7th: the stamp (µs) whose window the units were counted in.
-- State    a string '<window_start>:<count>', written with its TTL in the same SET.
-- Reply    { allowed (1 or 0), limit, remaining, retry_after_us, reset_after_us, now_us }.

-- rein_core::MAX_MICROS (see single_token_bucket.lua).
local MAX = 4503599627370495

local op = ARGV[1]
local settle = op == 'settle'
local refund = op == 'refund' or settle
if op ~= 'acquire' and op ~= 'peek' and not refund then
  error({ err = 'REIN unknown operation' })
end
local stamp = 0
if settle then
  if #ARGV ~= 7 then
    error({ err = 'REIN expected 7 arguments' })
  end
  stamp = ARGV[7] + 0
elseif #ARGV ~= 6 then
  error({ err = 'REIN expected 6 arguments' })
end
local now
if ARGV[2] == '' then
  -- Redis 5 and 6 replicate scripts verbatim unless told otherwise, and then refuse writes
  -- after TIME; Redis 7 (which has REDIS_VERSION_NUM) replicates effects only.
  if redis.REDIS_VERSION_NUM == nil then
    redis.replicate_commands()
  end
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
  if now > MAX then
    now = MAX
  end
else
  now = ARGV[2] + 0
end
-- `+ 0` rather than `tonumber` (see single_token_bucket.lua): a string that is not a number
-- stops the script here with Lua's arithmetic error, before any write.
local cost, min_ttl = ARGV[3] + 0, ARGV[4] + 0
local limit, window = ARGV[5] + 0, ARGV[6] + 0
-- Every argument an integer from 0 to MAX (the window from 1), checked at once: the script
-- is callable by anyone with the ACL, and must never store what rein-core would not.
-- `x % 1` is 0 only for an integer (NaN and infinities give NaN), so the sum is 0 only if
-- each term is.
if now % 1 + cost % 1 + min_ttl % 1 + limit % 1 + window % 1 + stamp % 1 ~= 0
    or now < 0 or now > MAX or cost < 0 or cost > MAX or min_ttl < 0 or min_ttl > MAX
    or limit < 0 or limit > MAX or window < 1 or window > MAX or stamp < 0
    or stamp > MAX then
  error({ err = 'REIN arguments must be integers from 0 to 2^52 - 1 (the window from 1)' })
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
  window_start, count = a + 0, b + 0
  if window_start > MAX or count > MAX then
    error({ err = 'REIN corrupt fixed window state' })
  end
end

-- FixedWindow::current: the window that counts at `now`. A clock that went back to an
-- earlier window keeps counting in the stored one.
-- Exact `%`: both below 2^52 (see single_token_bucket.lua).
local n = now
if window_start > n then
  n = window_start
end
local start = n - n % window
if start ~= window_start then
  count = 0
end

local write = false
-- FixedWindow::refund_in_window: only into the window that counted the units, while it
-- counts.
if settle and stamp - stamp % window ~= start then
  refund = false
  cost = 0
end
if refund then
  write = count > 0
  count = count - cost
  if count < 0 then
    count = 0
  end
  cost = 0
end

-- `start` is never before `now`'s window, so this is at least 1 µs.
local window_end = start + window - now
if window_end > MAX then
  window_end = MAX
end
local remaining = limit - count
if remaining < 0 then
  remaining = 0
end
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
  ttl = (ttl - ttl % 1000) / 1000
  if ttl < min_ttl then
    ttl = min_ttl
  end
  if ttl > 0 then
    redis.call('SET', key, string.format('%d:%d', start, count), 'PX', ttl)
  else
    redis.call('DEL', key)
  end
end
return { allowed, limit, remaining, retry_after, reset_after, now }
