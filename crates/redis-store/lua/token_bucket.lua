-- rein-redis: rein_core::TokenBucket::{decide, refund, is_full, remaining} and
-- `reset_after` (crates/core/src/token_bucket.rs), line for line, with the same names.
--
-- Parameters `p`: capacity, units_per_token, units_per_micro, tolerance.
-- State: the string '<tat>:<tat_units>' (whole µs, and the fraction in units), as
-- `single_token_bucket.lua` writes it.
--
-- Built only when a policy uses it: Redis runs the whole script body on every call, and
-- each function defined is an allocation.
local function token_bucket()
  local function params(a, i)
    return {
      capacity = int(a[i], 'capacity'),
      units_per_token = int(a[i + 1], 'units_per_token'),
      units_per_micro = int(a[i + 2], 'units_per_micro'),
      tolerance = int(a[i + 3], 'tolerance'),
    }, i + 4
  end

  local function load(key)
    local tat, tat_units = fields(redis.call('GET', key), '^(%d+):(%d+)$', 'token bucket')
    return { tat = tat, tat_units = tat_units }
  end

  local function encode(s)
    return string.format('%d:%d', s.tat, s.tat_units)
  end

  local function is_full(now, s)
    return s.tat < now or (s.tat == now and s.tat_units == 0)
  end

  -- Time until `tat` (relative to now) is reached, rounded up to a whole µs.
  local function reset_after(ahead_us, ahead_units)
    if ahead_units > 0 then
      return clamp(ahead_us + 1)
    end
    return clamp(ahead_us)
  end

  -- Whole tokens available when `tat` is `ahead_us` µs and `ahead_units` units past now.
  local function remaining(p, ahead_us, ahead_units)
    local tol_us = idiv(p.tolerance, p.units_per_micro)
    if ahead_us > tol_us then
      return 0
    end
    local used = ahead_us * p.units_per_micro + ahead_units
    return (idiv(sat_sub(p.tolerance, used), p.units_per_token))
  end

  -- Returns the decision and, when it consumes anything, the state to store.
  local function decide(p, now, s, cost)
    local ahead_us, ahead_units = 0, 0
    if not is_full(now, s) then
      ahead_us = s.tat - now
      ahead_units = math.min(s.tat_units, p.units_per_micro - 1)
    end
    local sum = ahead_units + cost * p.units_per_token
    local q, next_units = idiv(sum, p.units_per_micro)
    local next_us = ahead_us + q
    local tol_us, tol_units = idiv(p.tolerance, p.units_per_micro)
    if next_us < tol_us or (next_us == tol_us and next_units <= tol_units) then
      if cost == 0 then
        return allowed(p.capacity, remaining(p, ahead_us, ahead_units),
          reset_after(ahead_us, ahead_units)), nil
      end
      if next_us > MAX_MICROS - now then
        -- The end of time: a `tat` past MAX_MICROS cannot be stored, and clamping it would
        -- refill the bucket early. Denied for good (rein_core: issue 9).
        return denied(p.capacity, remaining(p, ahead_us, ahead_units), MAX_MICROS,
          reset_after(ahead_us, ahead_units)), nil
      end
      local next = { tat = now + next_us, tat_units = next_units }
      return allowed(p.capacity, remaining(p, next_us, next_units),
        reset_after(next_us, next_units)), next
    end
    local retry_after = next_us - tol_us
    if next_units > tol_units then
      retry_after = retry_after + 1
    end
    return denied(p.capacity, remaining(p, ahead_us, ahead_units), clamp(retry_after),
      reset_after(ahead_us, ahead_units)), nil
  end

  -- The write half of `TokenBucket::acquire`: the encoding of the state `decide` returned.
  local function apply(p, now, s, cost, next)
    return encode(next)
  end

  -- Gives back up to `amount` tokens; returns the new state, or nil when nothing changed.
  local function refund(p, now, s, amount)
    if is_full(now, s) then
      return nil
    end
    local units = math.min(amount, p.capacity) * p.units_per_token
    local us, rem = s.tat, s.tat_units
    local back_us, back_rem = idiv(units, p.units_per_micro)
    if rem < back_rem then
      rem = rem + p.units_per_micro
      us = sat_sub(us, 1)
    end
    rem = rem - back_rem
    us = sat_sub(us, back_us)
    local next
    if us < now or (us == now and rem == 0) then
      next = { tat = 0, tat_units = 0 }
    else
      next = { tat = us, tat_units = rem }
    end
    return next
  end

  return { params = params, load = load, decide = decide, apply = apply, refund = refund,
    encode = encode }
end
