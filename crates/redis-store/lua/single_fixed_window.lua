-- rein-redis: policies of one fixed window. rein_core::FixedWindow::{decide, refund,
-- refund_in_window, current} (crates/core/src/fixed_window.rs), with the same names, as
-- straight-line code: GET then SET ... PX only when something changed.
--
-- One call decides one or more requests of the same policy, at the same `now`, in KEYS'
-- order (single_token_bucket.lua says how).
--
-- KEYS     one state key per decision (a key may repeat).
-- ARGV     now (µs, or '' for the server's TIME), min_ttl (ms), limit, window (µs); then per
--          key, in order: op ('acquire', 'peek', 'refund', 'settle') and cost (or refund
--          amount), and for 'settle' (refund_in_window) a third: the stamp (µs) whose
--          window the units were counted in.
-- State    a string '<window_start>:<count>', written with its TTL in the same SET.
-- Reply    { now_us, then per decision: allowed (1 or 0), remaining, retry_after_us,
--          reset_after_us }, with per-decision errors as in single_token_bucket.lua.

-- rein_core::MAX_MICROS (see single_token_bucket.lua).
local MAX = 4503599627370495

local now
if ARGV[1] == '' then
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
  now = ARGV[1] + 0
end
-- `+ 0` rather than `tonumber` (see single_token_bucket.lua): a string that is not a number
-- stops the script here with Lua's arithmetic error, before any write.
local min_ttl, limit, window = ARGV[2] + 0, ARGV[3] + 0, ARGV[4] + 0
-- Every argument an integer from 0 to MAX (the window from 1), checked at once: the script
-- is callable by anyone with the ACL, and must never store what rein-core would not.
-- `x % 1` is 0 only for an integer (NaN and infinities give NaN), so the sum is 0 only if
-- each term is.
if now % 1 + min_ttl % 1 + limit % 1 + window % 1 ~= 0
    or now < 0 or now > MAX or min_ttl < 0 or min_ttl > MAX
    or limit < 0 or limit > MAX or window < 1 or window > MAX then
  error({ err = 'REIN arguments must be integers from 0 to 2^52 - 1 (the window from 1)' })
end
-- Each decision's operation, cost and stamp, all checked before the first write.
local n, i = #KEYS, 5
for _ = 1, n do
  local op, cost, stamp = ARGV[i], ARGV[i + 1], 0
  if op == 'settle' then
    stamp = ARGV[i + 2]
    i = i + 3
  elseif op == 'acquire' or op == 'peek' or op == 'refund' then
    i = i + 2
  elseif op == nil then
    error({ err = 'REIN expected 4 arguments and 2 per key (3 to settle)' })
  else
    error({ err = 'REIN unknown operation' })
  end
  if cost == nil or stamp == nil then
    error({ err = 'REIN expected 4 arguments and 2 per key (3 to settle)' })
  end
  cost, stamp = cost + 0, stamp + 0
  if cost % 1 + stamp % 1 ~= 0 or cost < 0 or cost > MAX or stamp < 0 or stamp > MAX then
    error({ err = 'REIN arguments must be integers from 0 to 2^52 - 1 (the window from 1)' })
  end
  if cost > limit and (op == 'acquire' or op == 'peek') then
    error({ err = 'REIN cost exceeds capacity' })
  end
end
if n < 1 or i ~= #ARGV + 1 then
  error({ err = 'REIN expected 4 arguments and 2 per key (3 to settle)' })
end

-- One decision: the figures, or an error table (nothing written).
local function decide(key, op, cost, stamp)
  local settle = op == 'settle'
  local refund = op == 'refund' or settle
  local window_start, count = 0, 0
  local stored = redis.pcall('GET', key)
  if type(stored) == 'table' then
    return stored
  end
  if stored then
    local a, b = string.match(stored, '^(%d+):(%d+)$')
    if a == nil then
      return { err = 'REIN corrupt fixed window state' }
    end
    window_start, count = a + 0, b + 0
    if window_start > MAX or count > MAX then
      return { err = 'REIN corrupt fixed window state' }
    end
  end

  -- FixedWindow::current: the window that counts at `now`. A clock that went back to an
  -- earlier window keeps counting in the stored one.
  -- Exact `%`: both below 2^52 (see single_token_bucket.lua).
  local at = now
  if window_start > at then
    at = window_start
  end
  local start = at - at % window
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
      local done = redis.pcall('SET', key, string.format('%d:%d', start, count), 'PX', ttl)
      if done.err then
        return done
      end
    else
      local done = redis.pcall('DEL', key)
      if type(done) == 'table' then
        return done
      end
    end
  end
  return allowed, remaining, retry_after, reset_after
end

local out, o = { now }, 1
i = 5
for k = 1, n do
  local op, stamp = ARGV[i], 0
  if op == 'settle' then
    stamp = ARGV[i + 2] + 0
  end
  local allowed, remaining, retry_after, reset_after = decide(KEYS[k], op, ARGV[i + 1] + 0, stamp)
  if op == 'settle' then
    i = i + 3
  else
    i = i + 2
  end
  if remaining == nil then
    remaining, retry_after, reset_after = 0, 0, 0
  end
  out[o + 1], out[o + 2], out[o + 3], out[o + 4] = allowed, remaining, retry_after, reset_after
  o = o + 4
end
return out
