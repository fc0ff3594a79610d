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


-- A key an operator blocked (rein_core::Block): its value is 'B<until>:<reason>', `until` in
-- µs since the Unix epoch, and its TTL ends with the block. Every stored state starts with a
-- digit, which sorts before 'B', so a script tests `stored >= 'B'` only where its state did
-- not parse, and the common path pays nothing. Returns the µs the block still holds at
-- `now` (0 once it has ended, when the key is as one never seen), or nil for a value that
-- is no block.
local function block_left(stored, now)
  local until_us = string.match(stored, '^B(%d+):')
  if until_us == nil then
    return nil
  end
  until_us = until_us + 0
  if until_us > MAX then
    return nil
  end
  if until_us > now then
    return until_us - now
  end
  return 0
end

-- A lean script's answer for a value `block_left` read: the block's denial (denied, nothing
-- left, retry and reset when it ends: rein_core::Block::decide), or for a value that is no
-- block the corrupt-state error, written nothing in either case.
local function blocked(left)
  if left == nil then
    return { err = 'REIN corrupt block' }
  end
  return 0, 0, left, left
end
