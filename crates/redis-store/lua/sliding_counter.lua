-- rein-redis: rein_core::SlidingCounter::{decide, refund, view, admitted_at, reset_at}
-- (crates/core/src/sliding_counter.rs), line for line, with the same names.
--
-- Parameters `p`: limit, window (µs).
-- State: the string '<window_start>:<current>:<previous>'.
--
-- `reset_at` and `admitted_at` return an instant as `start + extra`, and the caller turns
-- it into a span from `now` with `span_until`: `start + 2 × window` may pass 2^53.
--
-- Built only when a policy uses it: Redis runs the whole script body on every call, and
-- each function defined is an allocation.
local function sliding_counter()
  local function params(a, i)
    return { limit = int(a[i], 'limit'), window = int(a[i + 1], 'window') }, i + 2
  end

  local function load(key)
    local start, current, previous =
      fields(redis.call('GET', key), '^(%d+):(%d+):(%d+)$', 'sliding counter')
    return { window_start = start, current = current, previous = previous }
  end

  local function encode(s)
    return string.format('%d:%d:%d', s.window_start, s.current, s.previous)
  end

  -- The counters at `now`, rolled over to `now`'s window. Counts beyond the limit are read as
  -- the limit, which keeps every product below 2^53 and changes no decision.
  local function view(p, now, s)
    local stored = s.window_start
    local n = math.max(now, stored)
    local _, r = idiv(n, p.window)
    local start = n - r
    local current = math.min(s.current, p.limit)
    local previous = math.min(s.previous, p.limit)
    if start == stored then
      -- unchanged
    elseif start == stored + p.window then
      previous, current = current, 0
    else
      previous, current = 0, 0
    end
    return { start = start, elapsed = n - start, previous = previous, current = current }
  end

  -- The first instant at which `cost` fits, for a request denied in view `v`.
  local function admitted_at(p, v, cost)
    local w = p.window
    if v.current + cost <= p.limit then
      local room = p.limit - (v.current + cost)
      local fits = math.min((idiv(room * w, math.max(v.previous, 1))), w)
      if fits > 0 then
        return v.start, w - fits
      end
    end
    local fits = w
    if v.current > 0 then
      fits = math.min((idiv((p.limit - cost) * w, v.current)), w)
    end
    return v.start, w + (w - fits)
  end

  -- When both counters will have decayed to nothing; zero (already) when they have. Not
  -- `start`: after a clock regression `start` can be later than `now`.
  local function reset_at(p, start, previous, current)
    if current > 0 then
      return start, 2 * p.window
    elseif previous > 0 then
      return start, p.window
    end
    return 0, 0
  end

  local function decide(p, now, s, cost)
    local v = view(p, now, s)
    local w = p.window
    local budget = p.limit * w
    local weighted_previous = v.previous * (w - v.elapsed)
    local used = weighted_previous + v.current * w
    -- `used + cost × w <= budget`, rearranged: the sum could pass 2^53.
    if used <= budget - cost * w then
      local current = v.current + cost
      local next = nil
      if cost > 0 then
        next = { window_start = v.start, current = current, previous = v.previous }
      end
      local remaining = idiv(budget - weighted_previous, w) - current
      local base, extra = reset_at(p, v.start, v.previous, current)
      return allowed(p.limit, remaining, span_until(base, extra, now)), next
    end
    local remaining = sat_sub((idiv(sat_sub(budget, weighted_previous), w)), v.current)
    local at_base, at_extra = admitted_at(p, v, cost)
    local base, extra = reset_at(p, v.start, v.previous, v.current)
    return denied(p.limit, remaining, span_until(at_base, at_extra, now),
      span_until(base, extra, now)), nil
  end

  -- The write half of `SlidingCounter::acquire`: the encoding of the state `decide`
  -- returned.
  local function apply(p, now, s, cost, next)
    return encode(next)
  end

  -- Uncounts up to `amount` from the current window; returns the new state, or nil.
  local function refund(p, now, s, amount)
    local v = view(p, now, s)
    if v.current == 0 then
      return nil
    end
    return {
      window_start = v.start,
      current = sat_sub(v.current, amount),
      previous = v.previous,
    }
  end

  return { params = params, load = load, decide = decide, apply = apply, refund = refund,
    encode = encode }
end
