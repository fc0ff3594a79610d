-- rein-redis: what every script opens with, written once. script.rs puts this file before
-- each script's own text, so each algorithm is still one script, sent with one EVALSHA.

-- rein_core::MAX_MICROS: 2^52 - 1. Every quantity stays at or below it, so a sum of two is
-- an exact double. Remainders use `%`, which Lua 5.1 computes as `a - floor(a / b) * b`:
-- for integers a, b >= 1 with a + b < 2^53 the rounded quotient never crosses an integer,
-- so `floor` gives the true quotient and the remainder is exact (a script whose operands
-- may not be within that bound uses `math.fmod`, which is exact); a quotient is then taken
-- as `(a - a % b) / b`, an exact division. No `math.*` call on the common path: in Redis a
-- call to a C function costs more than the arithmetic around it (measured in
-- docs/performance.md).
local MAX = 4503599627370495

-- `now` in µs since the Unix epoch: the caller's `arg` as a number (each script checks it
-- with its other arguments), or for '' the server's TIME, at most MAX. A text that is not a
-- number stops the script here with Lua's arithmetic error, before any write.
local function clock(arg)
  if arg ~= '' then
    return arg + 0
  end
  -- Redis 5 and 6 replicate scripts verbatim unless told otherwise, and then refuse writes
  -- after TIME; Redis 7 (which has REDIS_VERSION_NUM) replicates effects only.
  if redis.REDIS_VERSION_NUM == nil then
    redis.replicate_commands()
  end
  local t = redis.call('TIME')
  local now = t[1] * 1000000 + t[2]
  if now > MAX then
    return MAX
  end
  return now
end

