-- rein-redis: the integer arithmetic of rein-core (`u64`, `Timestamp::from_micros`,
-- `Micros::from_micros`, `saturating_sub`) rendered in the doubles of Redis's Lua 5.1.
--
-- rein-core keeps every quantity and every product below 2^52, so sums of two stay below
-- 2^53 and are exact doubles. The algorithm files below rely on that and on `idiv`, never
-- on `/` or `%` of doubles, which round. They are concatenated into one script with
-- `policy.lua` (Redis Lua has no `require`); file-level locals are shared that way. This is
-- the script for policies of several limits (and of one sliding counter); a policy of one
-- token bucket, fixed window or sliding log runs its lean `single_*.lua` script instead.
--
-- State: one string per limit, its integers joined by ':' (see each algorithm file), read
-- with GET and written with `SET ... PX`, so the TTL is set in the same command.

-- rein_core::MAX_MICROS: 2^52 - 1. `Timestamp` and `Micros` clamp to it.
local MAX_MICROS = 4503599627370495

-- `(a / b, a % b)` of non-negative integers below 2^53, exactly. `math.floor(a / b)` can be
-- one too high when the rounded quotient reaches the next integer; `math.fmod` is exact (C
-- fmod), so `a - r` is an exact multiple of `b` and the final division is exact too.
local function idiv(a, b)
  local r = math.fmod(a, b)
  return (a - r) / b, r
end

-- `a.saturating_sub(b)`.
local function sat_sub(a, b)
  if a > b then
    return a - b
  end
  return 0
end

-- `Micros::from_micros(x)` / `Timestamp::from_micros(x)`: clamps to `MAX_MICROS`. Values
-- at or above 2^53 may have been rounded by one, but they clamp all the same.
local function clamp(x)
  if x > MAX_MICROS then
    return MAX_MICROS
  end
  return x
end

-- `Micros::from_micros(offset.saturating_sub(now))` for an instant given as `base + extra`
-- with `base <= MAX_MICROS`: computed as `(base - now) + extra` so that no intermediate
-- reaches 2^53 unless the result clamps anyway.
local function span_until(base, extra, now)
  local d = (base - now) + extra
  if d <= 0 then
    return 0
  end
  return clamp(d)
end

-- Raises a script error with the `REIN` code: the caller reports it as a server error.
local function fail(what)
  error({ err = 'REIN ' .. what })
end

-- A string holding an integer from 0 to `MAX_MICROS`, as a number; otherwise an error
-- naming `what`. (`tonumber` also reads '1e3' or '0x10'; harmless, as the value is checked.)
local function int(s, what)
  local n = tonumber(s)
  if n == nil or n < 0 or n > MAX_MICROS or n ~= math.floor(n) then
    fail('not an integer from 0 to 2^52 - 1: ' .. what)
  end
  return n
end

-- The integers of a stored state string, '<a>:<b>' or '<a>:<b>:<c>' (`pattern` captures
-- them), each checked like an argument; all zero when the key is missing (`false` from GET),
-- as in the core's defaults.
local function fields(stored, pattern, what)
  if stored == false then
    return 0, 0, 0
  end
  local a, b, c = string.match(stored, pattern)
  if a == nil then
    fail('corrupt state: ' .. what)
  end
  return int(a, what), int(b, what), int(c or '0', what)
end

-- Writes a limit's state with its TTL in the same command: the limit's reset_after
-- rounded up to ms, or min_ttl if longer. A state with no TTL left, or `value` nil (an
-- empty log), is deleted instead: nothing in it outlives the decision.
local function store(key, value, reset_after, min_ttl)
  local ttl = (idiv(reset_after + 999, 1000))
  if ttl < min_ttl then
    ttl = min_ttl
  end
  if ttl > 0 and value ~= nil then
    redis.call('SET', key, value, 'PX', ttl)
  else
    redis.call('DEL', key)
  end
end

-- rein_core::Decision. `retry_after` and `reset_after` in µs.
local function allowed(limit, remaining, reset_after)
  return { allowed = true, limit = limit, remaining = remaining, retry_after = 0,
    reset_after = reset_after }
end

local function denied(limit, remaining, retry_after, reset_after)
  return { allowed = false, limit = limit, remaining = remaining, retry_after = retry_after,
    reset_after = reset_after }
end
