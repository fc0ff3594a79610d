-- rein-redis: policies of one fixed window. rein_core::FixedWindow::{decide, refund,
-- refund_in_window, current} (crates/core/src/fixed_window.rs), with the same names, as
-- straight-line code: GET then SET ... PX only when something changed; or, for a window
-- kept as one integer, an admission's INCRBY alone.
--
-- One call decides one or more requests of the same policy, at the same `now`, in KEYS'
-- order (single_token_bucket.lua says how).
--
-- KEYS     one state key per decision (a key may repeat).
-- ARGV     now (µs, or '' for the server's TIME), min_ttl (ms), limit, window (µs); then per
--          key, in order: op ('acquire', 'peek', 'refund', 'settle') and cost (or refund
--          amount), and for 'settle' (refund_in_window) a third: the stamp (µs) whose
--          window the units were counted in.
-- State    one integer 'index * modulus + count' when the limit fits beside the window's
--          index (crates/redis-store/src/integer_window.rs has the rule and chooses the
--          key), else a string '<window_start>:<count>'; written with its TTL.
-- Reply    { now_us, then per decision: allowed (1 or 0), remaining, retry_after_us,
--          reset_after_us }, with per-decision errors as in single_token_bucket.lua.

-- `MAX` and `clock`: preamble.lua; `keep` and `answer`: lean.lua; script.rs puts both
-- before this file.
local now = clock(ARGV[1])
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

-- The integer form (integer_window.rs): `windows` window starts up to MAX, the modulus the
-- largest power of two with windows * modulus <= 2^53, so every value is exact here and
-- splits into index and count by exact division. A count fits when it is below half the
-- modulus, so an admission's cost (at most the limit) never carries into the index.
-- Exact `%`: both below 2^52.
local EXACT = 9007199254740992
local windows = (MAX - MAX % window) / window + 1
local mantissa, bits = math.frexp(windows)
if mantissa == 0.5 then
  bits = bits - 1
end
local modulus = math.ldexp(1, 53 - bits)
local integer = 2 * limit < modulus
-- The TTL an admission sets is the window's end, the same at every admission of a window on
-- the server's clock: INCRBY keeps it. A caller's `now` or a longer min_ttl moves it.
local refresh = ARGV[1] ~= ''

-- A stored integer: the window's start and count, or nil if it is not one this script
-- writes. Exact: below 2^53, and the modulus a power of two.
local function split(value)
  if value < 0 or value >= EXACT or value % 1 ~= 0 then
    return nil
  end
  local count = value % modulus
  local index = (value - count) / modulus
  if 2 * count >= modulus or index >= windows then
    return nil
  end
  return index * window, count
end

-- The TTL of a key whose window ends `window_end` µs from now: that, rounded up to ms, or
-- min_ttl if longer.
local function ttl_ms(window_end)
  local ttl = window_end + 999
  ttl = (ttl - ttl % 1000) / 1000
  if ttl < min_ttl then
    return min_ttl, true
  end
  return ttl, false
end

-- The start of now's window. Exact `%`: both below 2^52.
local current = now - now % window

-- Takes an admission's INCRBY back, so that the key is as it was: a value that was 0 (or no
-- key, which INCRBY created without a TTL) is deleted, the same state.
local function take_back(key, cost, stored)
  if stored == 0 then
    redis.pcall('DEL', key)
  else
    redis.pcall('INCRBY', key, -cost)
  end
end

-- An admission of the integer form: INCRBY of the cost (its argument's text, which Redis
-- takes as is), then the decision on the result. Returns nil, having written nothing, when
-- the stored value is not an integer this script writes; the caller's GET path then
-- reports it. Any other error is returned with the INCRBY taken back.
local function admit(key, cost, text)
  local added = redis.pcall('INCRBY', key, text)
  if type(added) == 'table' then
    return nil
  end
  local stored = added - cost
  local start, count = split(stored)
  if start == nil then
    take_back(key, cost, stored)
    return nil
  end
  if start < current then
    -- An earlier window (or no key, read as 0): a new window holding this cost alone.
    local window_end = current + window - now
    local ttl = ttl_ms(window_end)
    -- '%d' (exact below 2^53) is cheaper than the '%.17g' Redis gives a number argument.
    local value = string.format('%d', current / window * modulus + cost)
    local done = redis.pcall('SET', key, value, 'PX', ttl)
    if done.err then
      take_back(key, cost, stored)
      return done
    end
    return 1, limit - cost, 0, window_end
  end
  -- The stored window: now's, or a later one a clock that went back keeps counting in.
  local window_end = start + window - now
  if window_end > MAX then
    window_end = MAX
  end
  if count + cost <= limit then
    -- A count of 0 before: a key INCRBY just made (no TTL), or an empty window kept by
    -- min_ttl. min_ttl can be the longer only if set: without it, and on the server's
    -- clock, the common admission computes no TTL at all.
    if count == 0 or refresh or min_ttl > 0 then
      local ttl, longer = ttl_ms(window_end)
      if count == 0 or refresh or longer then
        local done = redis.pcall('PEXPIRE', key, ttl)
        if type(done) == 'table' then
          take_back(key, cost, stored)
          return done
        end
      end
    end
    return 1, limit - count - cost, 0, window_end
  end
  -- Denied: take the cost back.
  local done = redis.pcall('INCRBY', key, -cost)
  if type(done) == 'table' then
    return done
  end
  local remaining = limit - count
  if remaining < 0 then
    remaining = 0
  end
  return 0, remaining, window_end, window_end
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
  if stored and stored >= 'B' then
    -- A block (preamble.lua): denied while it holds, then a window never seen. Only reached
    -- when the integer form's INCRBY refused the value, or on the string form.
    local left = block_left(stored, now)
    if left ~= 0 then
      return blocked(left)
    end
    stored = false
  end
  if stored and integer then
    local start, n
    if string.match(stored, '^%d+$') then
      start, n = split(stored + 0)
    end
    if start == nil then
      return { err = 'REIN corrupt fixed window state' }
    end
    window_start, count = start, n
  elseif stored then
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
    local ttl = ttl_ms(reset_after)
    local value = ''
    if ttl > 0 and integer then
      value = string.format('%d', start / window * modulus + count)
    elseif ttl > 0 then
      value = string.format('%d:%d', start, count)
    end
    return keep(key, value, ttl, allowed, remaining, retry_after, reset_after)
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
  local text = ARGV[i + 1]
  local cost = text + 0
  local allowed, remaining, retry_after, reset_after
  if integer and cost > 0 and op == 'acquire' then
    allowed, remaining, retry_after, reset_after = admit(KEYS[k], cost, text)
  end
  if allowed == nil then
    allowed, remaining, retry_after, reset_after = decide(KEYS[k], op, cost, stamp)
  end
  if op == 'settle' then
    i = i + 3
  else
    i = i + 2
  end
  o = answer(out, o, allowed, remaining, retry_after, reset_after)
end
return out
