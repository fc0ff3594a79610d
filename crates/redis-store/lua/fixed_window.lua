-- rein-redis: rein_core::FixedWindow::{decide, refund, current}
-- (crates/core/src/fixed_window.rs), line for line, with the same names.
--
-- Parameters `p`: limit, window (µs).
-- State: the string '<window_start>:<count>', as `single_fixed_window.lua` writes it.
--
-- Built only when a policy uses it: Redis runs the whole script body on every call, and
-- each function defined is an allocation.
local function fixed_window()
  local function params(a, i)
    return { limit = int(a[i], 'limit'), window = int(a[i + 1], 'window') }, i + 2
  end

  local function load(key)
    local start, count = fields(redis.call('GET', key), '^(%d+):(%d+)$', 'fixed window')
    return { window_start = start, count = count }
  end

  local function encode(s)
    return string.format('%d:%d', s.window_start, s.count)
  end

  -- The window that counts at `now`, and what it holds. A clock that went back to an earlier
  -- window keeps counting in the stored one.
  local function current(p, now, s)
    local n = math.max(now, s.window_start)
    local _, r = idiv(n, p.window)
    local start = n - r
    if start == s.window_start then
      return start, s.count
    end
    return start, 0
  end

  local function decide(p, now, s, cost)
    local start, count = current(p, now, s)
    -- `start` is never before `now`'s window, so this is at least 1 µs.
    local window_end = start + p.window - now
    local function reset(c)
      if c > 0 then
        return clamp(window_end)
      end
      return 0
    end
    local remaining = sat_sub(p.limit, count)
    if cost <= remaining then
      local next = nil
      if cost > 0 then
        next = { window_start = start, count = count + cost }
      end
      return allowed(p.limit, remaining - cost, reset(count + cost)), next
    end
    return denied(p.limit, remaining, clamp(window_end), reset(count)), nil
  end

  -- The write half of `FixedWindow::acquire`: the encoding of the state `decide` returned.
  local function apply(p, now, s, cost, next)
    return encode(next)
  end

  -- Uncounts up to `amount` from the current window; returns the new state, or nil.
  local function refund(p, now, s, amount)
    local start, count = current(p, now, s)
    if count == 0 then
      return nil
    end
    return { window_start = start, count = sat_sub(count, amount) }
  end

  return { params = params, load = load, decide = decide, apply = apply, refund = refund,
    encode = encode }
end
