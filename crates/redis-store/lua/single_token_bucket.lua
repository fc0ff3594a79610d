-- rein-redis: policies of one token bucket, the hot path. rein_core::TokenBucket::{decide,
-- refund, is_full, remaining} and `reset_after` (crates/core/src/token_bucket.rs), with the
-- same names, written as straight-line code: no tables beyond the reply, two Redis calls
-- per decision (GET, then SET ... PX only when something changed). A policy of several
-- limits runs `policy.lua`.
--
-- One call decides one or more requests of the same policy (the store coalesces concurrent
-- decisions): each is atomic, and all are decided at the same `now`, one after the other in
-- KEYS' order, as the same calls made one by one at that instant would be.
--
-- KEYS     one state key per decision (a key may repeat).
-- ARGV     now (µs, or '' for the server's TIME), min_ttl (ms), then the parameters
--          RedisPolicy computed once: capacity, units_per_token, units_per_micro, tol_us,
--          tol_units (the tolerance `capacity × units_per_token` split as `tat` is: whole
--          µs and a remainder); then per key, in order: op ('acquire', 'peek', 'refund')
--          and cost (or refund amount).
-- State    a string '<tat>:<tat_units>', or '<tat>' when tat_units is 0, written with its
--          TTL in the same SET.
-- Reply    { now_us, then per decision: allowed (1 or 0), remaining, retry_after_us,
--          reset_after_us }. A decision whose state cannot be read or written (corrupt,
--          another type, a write Redis refused) answers an error in `allowed`'s place and
--          zeros, and leaves its key as it was; the others are decided as usual. Bad
--          arguments fail the whole call before any write.

-- `MAX` and `clock`: preamble.lua, which script.rs puts before this file.
local now = clock(ARGV[1])
-- `+ 0` converts a numeric string without a function call (`tonumber` costs more than the
-- arithmetic of a whole decision); anything not numeric stops the script right here with
-- Lua's own arithmetic error, before any write.
local min_ttl = ARGV[2] + 0
local capacity, units_per_token, units_per_micro, tol_us, tol_units =
  ARGV[3] + 0, ARGV[4] + 0, ARGV[5] + 0, ARGV[6] + 0, ARGV[7] + 0
-- Every argument an integer from 0 to MAX, checked at once: the script is callable by
-- anyone with the ACL, and must never store what rein-core would not. `x % 1` is 0 only
-- for an integer (NaN and infinities give NaN), so the sum is 0 only if each term is;
-- comparisons inline cost less than a call to math.min or math.max.
if now % 1 + min_ttl % 1 + capacity % 1 + units_per_token % 1
      + units_per_micro % 1 + tol_us % 1 + tol_units % 1 ~= 0
    or now < 0 or now > MAX or min_ttl < 0 or min_ttl > MAX
    or capacity < 0 or capacity > MAX or units_per_token < 1 or units_per_token > MAX
    or units_per_micro < 1 or units_per_micro > MAX or tol_us < 0 or tol_us > MAX
    or tol_units < 0 or tol_units >= units_per_micro then
  error({ err = 'REIN arguments must be integers from 0 to 2^52 - 1 (divisors from 1)' })
end
local n = #KEYS
if n < 1 or #ARGV ~= 7 + 2 * n then
  error({ err = 'REIN expected 7 arguments and 2 per key' })
end
-- Each decision's operation and cost, all checked before the first write.
for i = 8, 7 + 2 * n, 2 do
  local op, cost = ARGV[i], ARGV[i + 1] + 0
  if op ~= 'acquire' and op ~= 'peek' and op ~= 'refund' then
    error({ err = 'REIN unknown operation' })
  end
  if cost % 1 ~= 0 or cost < 0 or cost > MAX then
    error({ err = 'REIN arguments must be integers from 0 to 2^52 - 1 (divisors from 1)' })
  end
  -- The core rejects a cost above capacity before deciding; the products below rely on it.
  if op ~= 'refund' and cost > capacity then
    error({ err = 'REIN cost exceeds capacity' })
  end
end

-- One decision: the figures, or an error table (nothing written).
local function decide(key, op, cost)
  local refund = op == 'refund'
  local tat, tat_units = 0, 0
  local stored = redis.pcall('GET', key)
  if type(stored) == 'table' then
    return stored
  end
  if stored then
    -- '<tat>' alone when `tat_units` is 0 (always, when the emission interval is a whole
    -- number of µs): read with one `tonumber`, written as a number, no pattern or format.
    tat = tonumber(stored)
    if tat == nil and stored >= 'B' then
      -- A block (preamble.lua): denied while it holds, then a bucket never seen.
      local left = block_left(stored, now)
      if left ~= 0 then
        return blocked(left)
      end
      tat = 0
    elseif tat == nil then
      local a, b = string.match(stored, '^(%d+):(%d+)$')
      if a == nil then
        return { err = 'REIN corrupt token bucket state' }
      end
      tat, tat_units = a + 0, b + 0
    end
    if tat < 0 or tat > MAX or tat % 1 ~= 0 or tat_units > MAX then
      return { err = 'REIN corrupt token bucket state' }
    end
  end

  local write = false
  if refund then
    -- TokenBucket::refund: moves `tat` back by up to `amount` tokens, never beyond full.
    write = tat > now or (tat == now and tat_units > 0)
    if write then
      local units = math.min(cost, capacity) * units_per_token
      local back_rem = units % units_per_micro
      local back_us = (units - back_rem) / units_per_micro
      if tat_units < back_rem then
        tat_units = tat_units + units_per_micro
        tat = math.max(tat - 1, 0)
      end
      tat_units = tat_units - back_rem
      tat = math.max(tat - back_us, 0)
      if tat < now or (tat == now and tat_units == 0) then
        tat, tat_units = 0, 0
      end
    end
    -- The figures are those of a zero-cost peek after the refund.
    cost = 0
  end

  -- max(tat, now), as whole µs ahead of now plus a remainder in units.
  local ahead_us, ahead_units = 0, 0
  if tat > now or (tat == now and tat_units > 0) then
    ahead_us = tat - now
    ahead_units = math.min(tat_units, units_per_micro - 1)
  end
  -- The instant the figures describe: `tat` after the decision, relative to now.
  local fig_us, fig_units = ahead_us, ahead_units
  local allowed, retry_after = 0, 0
  local sum = ahead_units + cost * units_per_token
  local next_us, next_units = ahead_us + sum, 0
  if units_per_micro > 1 then
    -- `sum` may reach 2 × MAX here, past where `%` is exact.
    next_units = math.fmod(sum, units_per_micro)
    next_us = ahead_us + (sum - next_units) / units_per_micro
  end
  if next_us < tol_us or (next_us == tol_us and next_units <= tol_units) then
    if cost == 0 then
      allowed = 1
    elseif next_us > MAX - now then
      -- The end of time: a `tat` past MAX cannot be stored, and clamping it would refill the
      -- bucket early. Denied for good (issue 9).
      retry_after = MAX
    else
      allowed = 1
      fig_us, fig_units = next_us, next_units
      tat, tat_units = now + next_us, next_units
      write = op == 'acquire'
    end
  else
    retry_after = next_us - tol_us
    if next_units > tol_units then
      retry_after = retry_after + 1
    end
    retry_after = math.min(retry_after, MAX)
  end

  -- Whole tokens left: (tolerance - (fig_us × units_per_micro + fig_units)) / units_per_token.
  local remaining = 0
  if fig_us <= tol_us then
    local free = (tol_us - fig_us) * units_per_micro + tol_units - fig_units
    if free > 0 then
      remaining = (free - free % units_per_token) / units_per_token
    end
  end
  local reset_after = fig_us
  if fig_units > 0 then
    reset_after = math.min(fig_us + 1, MAX)
  end

  if write then
    -- The key lives until the bucket is full again (reset_after, rounded up to ms) or
    -- min_ttl, whichever is longer; a full bucket with no min_ttl is simply deleted.
    local ttl = reset_after + 999
    ttl = (ttl - ttl % 1000) / 1000
    if ttl < min_ttl then
      ttl = min_ttl
    end
    -- Written out, not through lean.lua's `keep` (nor the reply through `answer`):
    -- this is the cheapest script, and through them it read slower in 10 of 11
    -- alternating rounds (docs/performance.md, "The lean scripts' shared steps").
    if ttl > 0 then
      -- Redis writes a number argument with 17 significant digits: exact below 2^53.
      local value = tat
      if tat_units > 0 then
        value = string.format('%d:%d', tat, tat_units)
      end
      local done = redis.pcall('SET', key, value, 'PX', ttl)
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
for k = 1, n do
  local i = 6 + 2 * k
  local allowed, remaining, retry_after, reset_after = decide(KEYS[k], ARGV[i], ARGV[i + 1] + 0)
  if remaining == nil then
    remaining, retry_after, reset_after = 0, 0, 0
  end
  out[o + 1], out[o + 2], out[o + 3], out[o + 4] = allowed, remaining, retry_after, reset_after
  o = o + 4
end
return out
