-- rein-redis: a policy of several limits (or of one sliding counter) decided in one atomic
-- call, all-or-nothing: rein_core::Policy::{acquire, peek, refund} and `combine`
-- (crates/core/src/policy.rs). Each algorithm's branch below renders rein-core's
-- `decide`/`refund` with the same names, like the single-limit scripts (single_*.lua),
-- which it repeats for the token bucket, fixed window and sliding log; the differential
-- test pins both to rein-core. Straight-line code in one loop (no closures, no tables
-- but the limits' parts and values and a sliding log's entries), one GET and at most one
-- SET of the policy's one key, so a policy of three limits costs Redis less than three
-- single-limit calls.
--
-- KEYS[1]  the policy's one state key (key format v4 for several limits, v3 for one).
-- ARGV[1]  operation: 'acquire', 'peek', 'refund', or for leases 'hold' (an acquire whose
--           units a sliding log stamps at now + hold) and 'settle' (a refund a sliding log
--           takes from one stamp only, and a fixed window or sliding counter only into the
--           window containing the stamp, while it counts); a token bucket treats them as
--           acquire and refund. rein_core::Policy::{acquire_held, refund_held}.
-- ARGV[2]  now in µs since the Unix epoch, or '' to read the server's TIME.
-- ARGV[3]  cost (acquire, peek) or amount (refund).
-- ARGV[4]  min_ttl in ms: the shortest TTL a written key gets (normally 0).
-- ARGV[5..] per limit, in the policy's order, an algorithm tag and the parameters NamedPolicy
--           computed once: 'tb' capacity units_per_token units_per_micro tol_us tol_units,
--           'fw' limit window, 'sl' limit window, 'sc' limit window (windows in µs).
-- ARGV[#ARGV]  for 'hold' and 'settle' only: the hold (µs) or the stamp.
--
-- State: one string per policy (issue 22: a slot migration then moves a decision's whole
-- state at once, never splitting it between two nodes). Each limit's part has its integers
-- joined by ':': 'tat:tat_units' (or 'tat' when tat_units is 0), 'window_start:count',
-- 'window_start:current:previous', and for a sliding log a header
-- 'total:newest_at:newest_cost|' then its entries oldest first, 'at:cost' joined by ','.
-- The parts are joined by ';' in the policy's order (key format v4), an empty part for a
-- limit at its empty state; with one limit, its part alone (v3). ';' because no part uses
-- it (digits, ':', '|', ','): one plain string.find per limit splits the value, no escaping.
-- Read with one GET, written with one `SET ... PX`.
--
-- Reply: { allowed (1 or 0), limit, remaining, retry_after_us, reset_after_us, now_us,
-- limit_index } where limit_index (0-based) is the limit whose limit and remaining are
-- reported (Decision::limit_index). The single-limit scripts omit it: it is 0.
-- For 'refund' the figures are those of a zero-cost peek after the refund.
--
-- The key's TTL is the longest of the limits' reset_after rounded up to whole ms (or min_ttl
-- if longer), so it expires once every limit is full again; a written limit whose own TTL
-- would be 0, or an empty log, becomes an empty part (as its own key was deleted when each
-- limit had one), and a key whose parts are all empty, or whose TTL would be 0, is deleted.
-- A denial or a peek writes nothing and leaves the TTL as it was. Every state is read and
-- checked before anything is written: Redis does not roll back a script's writes when it
-- fails half-way.

-- Integers from 0 to MAX, or a script error: the script is callable by anyone with the
-- ACL, and must never store what rein-core would not. `x % 1` is 0 only for an integer
-- (NaN and infinities give NaN), so a sum of them is 0 only if each term is. Checked in
-- batches, not one function call per argument: this runs on every call.
local function fail_arguments()
  error({ err = 'REIN arguments must be integers from 0 to 2^52 - 1' })
end

local op = ARGV[1]
local settle = op == 'settle'
local refund = op == 'refund' or settle
if op ~= 'acquire' and op ~= 'peek' and op ~= 'hold' and not refund then
  error({ err = 'REIN unknown operation' })
end
local argc = #ARGV
-- The hold or the stamp, for 'hold' and 'settle': the last argument.
local extra = 0
if op == 'hold' or settle then
  extra = ARGV[argc] + 0
  argc = argc - 1
  if extra % 1 ~= 0 or extra < 0 or extra > MAX then
    fail_arguments()
  end
end
-- `MAX` and `clock`: preamble.lua, which script.rs puts before this file.
local now = clock(ARGV[2])
-- Numbers are read with `+ 0`, not `tonumber` (see single_token_bucket.lua): a string that
-- is no number stops the script with Lua's arithmetic error, before any write.
local amount, min_ttl = ARGV[3] + 0, ARGV[4] + 0
if now % 1 + amount % 1 + min_ttl % 1 ~= 0 or now < 0 or now > MAX or amount < 0
    or amount > MAX or min_ttl < 0 or min_ttl > MAX then
  fail_arguments()
end
-- What each limit decides: a zero-cost peek after a refund.
local cost = amount
if refund then
  cost = 0
end
local acquire = (op == 'acquire' or op == 'hold') and cost > 0

if #KEYS ~= 1 then
  error({ err = 'REIN a policy has one key' })
end

-- Policy::combine, folded as the limits are decided: denied if any denies, the fewest
-- remaining (with that limit's size and index; on a tie one that denies, then the first),
-- the longest wait and reset.
local all_allowed, c_limit, c_remaining, c_retry, c_reset, c_index = true, 0, -1, 0, 0, 0
local c_denied = false
-- Per limit: the state to write if the call writes (a string, or a token bucket's `tat` as
-- a number; false: keep its stored part; '': its empty state), its stored part, and the
-- reset_after that sets its TTL.
local values, parts, resets = {}, {}, {}
local whole = redis.call('GET', KEYS[1])
-- A block (preamble.lua): the limits are then read as never seen, so that the arguments are
-- checked as on any call, and while it holds the call answers the block's denial below and
-- writes nothing; once it has ended, the call decides on a key never seen.
local blocked_for = 0
if whole and whole >= 'B' then
  blocked_for = block_left(whole, now)
  if blocked_for == nil then
    error({ err = 'REIN corrupt block' })
  end
  whole = false
end
local first_limit = 0
-- Where the next limit's part starts in `whole`; past its end once the last part is read.
local p, len = 1, 0
if whole then
  len = #whole
end
-- The limits, one per tag and its parameters, counted as they are read.
local n = 0
local i = 5
while i <= argc do
  n = n + 1
  local k = n
  local tag = ARGV[i]
  -- Limit k's part: up to the next ';', the last one to the end. A value with fewer parts
  -- than the policy has limits is refused here, one with more after the loop, both before
  -- anything is written.
  local stored = false
  if whole then
    if p > len + 1 then
      error({ err = 'REIN corrupt policy state' })
    end
    local q = string.find(whole, ';', p, true)
    if q ~= nil then
      stored = string.sub(whole, p, q - 1)
      p = q + 1
    else
      if p == 1 then
        stored = whole
      else
        stored = string.sub(whole, p)
      end
      p = len + 2
    end
    -- An empty part of a value of several parts is the limit's empty state; a value of
    -- one part that is empty is no state at all, and is refused by the limit's reader.
    if stored == '' and (q ~= nil or k > 1) then
      stored = false
    end
  end
  parts[k] = stored or ''
  local limit, remaining, retry_after, reset_after, value = 0, 0, 0, 0, false
  local allowed = false
  -- A window algorithm's limit and window (µs): integers from 0 to MAX, a window from 1,
  -- and a limit the cost fits in. Read here once for the three, inline: this runs for
  -- every limit of every call.
  local window
  if tag == 'fw' or tag == 'sc' or tag == 'sl' then
    if i + 2 > argc then
      error({ err = 'REIN missing window parameters' })
    end
    limit, window = ARGV[i + 1] + 0, ARGV[i + 2] + 0
    i = i + 3
    if limit % 1 + window % 1 ~= 0 or limit < 0 or limit > MAX or window < 0
        or window > MAX then
      fail_arguments()
    end
    if window == 0 and tag == 'sl' then
      error({ err = 'REIN bad sliding log parameters' })
    elseif window == 0 then
      error({ err = 'REIN bad window parameters' })
    end
    if not refund and amount > limit then
      error({ err = 'REIN cost exceeds capacity' })
    end
  end

  if tag == 'tb' then
    -- rein_core::TokenBucket (see single_token_bucket.lua).
    if i + 5 > argc then
      error({ err = 'REIN missing token bucket parameters' })
    end
    local capacity, units_per_token, units_per_micro, tol_us, tol_units = ARGV[i + 1] + 0,
      ARGV[i + 2] + 0, ARGV[i + 3] + 0, ARGV[i + 4] + 0, ARGV[i + 5] + 0
    i = i + 6
    if capacity % 1 + units_per_token % 1 + units_per_micro % 1 + tol_us % 1
          + tol_units % 1 ~= 0
        or capacity < 0 or capacity > MAX or units_per_token < 0 or units_per_token > MAX
        or units_per_micro < 0 or units_per_micro > MAX or tol_us < 0 or tol_us > MAX
        or tol_units < 0 or tol_units > MAX then
      fail_arguments()
    end
    if units_per_token == 0 or units_per_micro == 0 or tol_units >= units_per_micro then
      error({ err = 'REIN bad token bucket parameters' })
    end
    if not refund and amount > capacity then
      error({ err = 'REIN cost exceeds capacity' })
    end
    limit = capacity
    local tat, tat_units = 0, 0
    if stored then
      tat = tonumber(stored)
      if tat == nil then
        local a, b = string.match(stored, '^(%d+):(%d+)$')
        if a == nil then
          error({ err = 'REIN corrupt token bucket state' })
        end
        tat, tat_units = a + 0, b + 0
      end
      if tat < 0 or tat > MAX or tat % 1 ~= 0 or tat_units > MAX then
        error({ err = 'REIN corrupt token bucket state' })
      end
    end
    if refund and (tat > now or (tat == now and tat_units > 0)) then
      local units = math.min(amount, capacity) * units_per_token
      local back_rem = math.fmod(units, units_per_micro)
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
      value = tat
      if tat_units > 0 then
        value = string.format('%d:%d', tat, tat_units)
      end
    end
    local ahead_us, ahead_units = 0, 0
    if tat > now or (tat == now and tat_units > 0) then
      ahead_us = tat - now
      ahead_units = math.min(tat_units, units_per_micro - 1)
    end
    local fig_us, fig_units = ahead_us, ahead_units
    local sum = ahead_units + cost * units_per_token
    local next_us, next_units = ahead_us + sum, 0
    if units_per_micro > 1 then
      next_units = math.fmod(sum, units_per_micro)
      next_us = ahead_us + (sum - next_units) / units_per_micro
    end
    if next_us < tol_us or (next_us == tol_us and next_units <= tol_units) then
      if cost == 0 then
        allowed = true
      elseif next_us > MAX - now then
        -- The end of time: a `tat` past MAX cannot be stored (issue 9).
        retry_after = MAX
      else
        allowed = true
        fig_us, fig_units = next_us, next_units
        if acquire then
          value = now + next_us
          if next_units > 0 then
            value = string.format('%d:%d', value, next_units)
          end
        end
      end
    else
      retry_after = next_us - tol_us
      if next_units > tol_units then
        retry_after = retry_after + 1
      end
      retry_after = math.min(retry_after, MAX)
    end
    if fig_us <= tol_us then
      local free = (tol_us - fig_us) * units_per_micro + tol_units - fig_units
      if free > 0 then
        -- Exact `%`: free + units_per_token <= 2 × MAX < 2^53 (single_token_bucket.lua).
        remaining = (free - free % units_per_token) / units_per_token
      end
    end
    reset_after = fig_us
    if fig_units > 0 then
      reset_after = math.min(fig_us + 1, MAX)
    end

  elseif tag == 'fw' or tag == 'sc' then
    -- Both count in windows aligned to the epoch: rein_core::FixedWindow
    -- (single_fixed_window.lua) and rein_core::SlidingCounter.
    local window_start, count, previous = 0, 0, 0
    if stored then
      local a, b, c
      if tag == 'fw' then
        a, b = string.match(stored, '^(%d+):(%d+)$')
        c = '0'
      else
        a, b, c = string.match(stored, '^(%d+):(%d+):(%d+)$')
      end
      if a == nil then
        error({ err = 'REIN corrupt window state' })
      end
      window_start, count, previous = a + 0, b + 0, c + 0
      if window_start > MAX or count > MAX or previous > MAX then
        error({ err = 'REIN corrupt window state' })
      end
    end
    -- The window that counts at `now`: a clock that went back before the stored window is
    -- read at the stored window's start, so regressions never reopen or uncount a window.
    local at = now
    if window_start > at then
      at = window_start
    end
    local start = at - at % window

    if tag == 'fw' then
      if start ~= window_start then
        count = 0
      end
      -- FixedWindow::refund_in_window for 'settle': only into the stamp's window, while it
      -- counts (`extra` is the stamp here).
      if refund and count > 0 and (not settle or extra - extra % window == start) then
        count = math.max(count - amount, 0)
        value = string.format('%d:%d', start, count)
      end
      -- `start` is never before `now`'s window, so this is at least 1 µs.
      local window_end = start + window - now
      if window_end > MAX then
        window_end = MAX
      end
      remaining = limit - count
      if remaining < 0 then
        remaining = 0
      end
      if cost <= remaining then
        allowed = true
        remaining = remaining - cost
        count = count + cost
        if acquire then
          value = string.format('%d:%d', start, count)
        end
      else
        retry_after = window_end
      end
      if count > 0 then
        reset_after = window_end
      end
    else
      -- SlidingCounter::view: counts beyond the limit are read as the limit, which keeps
      -- every product below 2^53 and changes no decision.
      local current = math.min(count, limit)
      previous = math.min(previous, limit)
      if start == window_start then
        -- unchanged
      elseif start == window_start + window then
        previous, current = current, 0
      else
        previous, current = 0, 0
      end
      if refund and not settle and current > 0 then
        current = math.max(current - amount, 0)
        value = string.format('%d:%d:%d', start, current, previous)
      elseif settle and amount > 0 then
        -- SlidingCounter::refund_in_window: into the stamp's window if it is the current
        -- one or the one just before, else nowhere (`extra` is the stamp here).
        local stamped = extra - extra % window
        if stamped == start and current > 0 then
          current = math.max(current - amount, 0)
          value = string.format('%d:%d:%d', start, current, previous)
        elseif stamped + window == start and previous > 0 then
          previous = math.max(previous - amount, 0)
          value = string.format('%d:%d:%d', start, current, previous)
        end
      end
      local w = window
      local elapsed = at - start
      local budget = limit * w
      local weighted_previous = previous * (w - elapsed)
      local used = weighted_previous + current * w
      -- `used + cost × w <= budget`, rearranged: the sum could pass 2^53.
      if used <= budget - cost * w then
        allowed = true
        current = current + cost
        local room = budget - weighted_previous
        remaining = (room - math.fmod(room, w)) / w - current
        if acquire then
          value = string.format('%d:%d:%d', start, current, previous)
        end
      else
        local room = math.max(budget - weighted_previous, 0)
        remaining = math.max((room - math.fmod(room, w)) / w - current, 0)
        -- SlidingCounter::admitted_at, as `start + extra`: later in this window, once the
        -- previous window's weight has fallen enough; else in the next one.
        local extra = nil
        if current + cost <= limit then
          local spare = (limit - current - cost) * w
          local per = math.max(previous, 1)
          local fits = math.min((spare - math.fmod(spare, per)) / per, w)
          if fits > 0 then
            extra = w - fits
          end
        end
        if extra == nil then
          local fits = w
          if current > 0 then
            local spare = (limit - cost) * w
            fits = math.min((spare - math.fmod(spare, current)) / current, w)
          end
          extra = w + (w - fits)
        end
        -- A span from now to `start + extra`, computed so that no intermediate reaches
        -- 2^53: `start + 2 × window` may.
        retry_after = math.min(math.max((start - now) + extra, 0), MAX)
      end
      -- SlidingCounter::reset_at: both counters decayed to nothing.
      if current > 0 then
        reset_after = math.min(math.max((start - now) + 2 * w, 0), MAX)
      elseif previous > 0 then
        reset_after = math.min(math.max((start - now) + w, 0), MAX)
      end
    end

  elseif tag == 'sl' then
    -- rein_core::SlidingLog (see single_sliding_log.lua, which this repeats).
    local ats, costs, starts = {}, {}, {}
    local m, total = 0, 0
    if stored then
      -- The header '<total>:<newest_at>:<newest_cost>|' (single_sliding_log.lua reads
      -- only it and the entries leaving the window; here every entry is read and the
      -- header checked against them).
      local _, e, h_total, h_at, h_cost = string.find(stored, '^(%d+):(%d+):(%d+)|')
      local len = #stored
      if e == nil or e == len or string.byte(stored, len) == 44 then
        error({ err = 'REIN corrupt sliding log state' })
      end
      local p = e + 1
      while p <= len do
        local _, e, a, c = string.find(stored, '^(%d+):(%d+),?', p)
        if e == nil then
          error({ err = 'REIN corrupt sliding log state' })
        end
        a, c = a + 0, c + 0
        if a > MAX or c > MAX or c == 0 or (m > 0 and a <= ats[m]) then
          error({ err = 'REIN corrupt sliding log state' })
        end
        m = m + 1
        ats[m], costs[m], starts[m] = a, c, p
        total = total + c
        p = e + 1
      end
      if total > MAX or total ~= h_total + 0 or ats[m] ~= h_at + 0 or costs[m] ~= h_cost + 0 then
        error({ err = 'REIN corrupt sliding log state' })
      end
    end
    -- Counted from now - window, future stamps included; stamped as SlidingLog::stamp_at
    -- (plain) or at now + hold (held), in order.
    local stamp = now
    if op == 'hold' then
      stamp = math.min(now + extra, MAX)
    elseif m > 0 and ats[m] > now then
      stamp = ats[m]
    end
    local rebuild = false
    if settle then
      for j = 1, m do
        if ats[j] == extra then
          local taken = math.min(amount, costs[j])
          costs[j] = costs[j] - taken
          total = total - taken
          rebuild = taken > 0
          if costs[j] == 0 then
            table.remove(ats, j)
            table.remove(costs, j)
            m = m - 1
          end
          break
        end
      end
    elseif refund then
      local left = amount
      while left > 0 and m > 0 and ats[m] + window > now do
        local taken = math.min(left, costs[m])
        costs[m] = costs[m] - taken
        total = total - taken
        left = left - taken
        rebuild = true
        if costs[m] == 0 then
          m = m - 1
        end
      end
    end
    if rebuild then
      local parts = {}
      for j = 1, m do
        parts[j] = string.format('%d:%d', ats[j], costs[j])
      end
      value = ''
      if m > 0 then
        value = string.format('%d:%d:%d|', total, ats[m], costs[m]) .. table.concat(parts, ',')
      end
    end
    local expired, live = 0, total
    while expired < m and ats[expired + 1] + window <= now do
      expired = expired + 1
      live = live - costs[expired]
    end
    remaining = math.max(limit - live, 0)
    local newest = nil
    if m > 0 then
      newest = ats[m]
    end
    if cost <= remaining then
      allowed = true
      remaining = remaining - cost
      if cost > 0 and (newest == nil or stamp > newest) then
        newest = stamp
      end
      if acquire then
        if expired < m and ats[m] < stamp then
          value = string.format('%d:%d:%d|%s,%d:%d', live + cost, stamp, cost,
            string.sub(stored, starts[expired + 1]), stamp, cost)
        elseif expired == m then
          value = string.format('%d:%d:%d|%d:%d', cost, stamp, cost, stamp, cost)
        else
          local parts, placed = {}, false
          for j = expired + 1, m do
            if not placed and ats[j] >= stamp then
              placed = true
              if ats[j] == stamp then
                costs[j] = costs[j] + cost
              else
                parts[#parts + 1] = string.format('%d:%d', stamp, cost)
              end
            end
            parts[#parts + 1] = string.format('%d:%d', ats[j], costs[j])
          end
          -- The stamp is at or before the newest entry, which stays last.
          value = string.format('%d:%d:%d|', live + cost, ats[m], costs[m])
            .. table.concat(parts, ',')
        end
      end
    else
      local still_in = live
      for j = expired + 1, m do
        still_in = still_in - costs[j]
        if still_in + cost <= limit then
          retry_after = math.min(ats[j] + window - now, MAX)
          break
        end
      end
    end
    if newest ~= nil and newest + window > now then
      reset_after = math.min(newest + window - now, MAX)
    end

  else
    error({ err = 'REIN unknown algorithm' })
  end

  all_allowed = all_allowed and allowed
  -- A denying limit is named before any admitting one (whose remaining counts the
  -- request as taken, which a denied policy does not take), then the fewest remaining.
  if c_remaining < 0 or (not allowed and not c_denied)
    or ((not allowed) == c_denied and remaining < c_remaining) then
    c_limit, c_remaining, c_index, c_denied = limit, remaining, k - 1, not allowed
  end
  if retry_after > c_retry then
    c_retry = retry_after
  end
  if reset_after > c_reset then
    c_reset = reset_after
  end
  values[k], resets[k] = value, reset_after
  if k == 1 then
    first_limit = limit
  end
end
if n == 0 or n > 8 then
  error({ err = 'REIN a policy has 1 to 8 limits' })
end
if whole and p <= len + 1 then
  error({ err = 'REIN corrupt policy state' })
end

if blocked_for > 0 then
  return { 0, first_limit, 0, blocked_for, blocked_for, now, 0 }
end

if refund or (acquire and all_allowed) then
  -- One SET of every part (the unwritten ones as stored), with the longest TTL; nothing if
  -- no limit has a value to write.
  local written, ttl, empty = false, 0, true
  for k = 1, n do
    local value = values[k]
    local limit_ttl = resets[k] + 999
    limit_ttl = (limit_ttl - limit_ttl % 1000) / 1000
    if limit_ttl < min_ttl then
      limit_ttl = min_ttl
    end
    if limit_ttl > ttl then
      ttl = limit_ttl
    end
    if value then
      written = true
      if limit_ttl == 0 or value == '' then
        parts[k] = ''
      elseif type(value) == 'number' then
        -- A token bucket's `tat`, written exactly (tostring keeps 14 digits).
        parts[k] = string.format('%d', value)
      else
        parts[k] = value
      end
    end
    if parts[k] ~= '' then
      empty = false
    end
  end
  if written then
    if ttl > 0 and not empty then
      redis.call('SET', KEYS[1], table.concat(parts, ';'), 'PX', ttl)
    else
      redis.call('DEL', KEYS[1])
    end
  end
end

local allowed_flag = 0
if all_allowed then
  allowed_flag = 1
end
return { allowed_flag, c_limit, c_remaining, c_retry, c_reset, now, c_index }
