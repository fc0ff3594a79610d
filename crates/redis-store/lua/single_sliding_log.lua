-- rein-redis: policies of one sliding log. rein_core::SlidingLog::{decide, acquire, refund,
-- acquire_held, refund_held, stamp_at} (crates/core/src/sliding_log.rs), with the same
-- names, as straight-line code: GET then SET ... PX only when something changed.
--
-- One call decides one or more requests of the same policy, at the same `now`, in KEYS'
-- order (single_token_bucket.lua says how).
--
-- KEYS     one state key per decision (a key may repeat).
-- ARGV     now (µs, or '' for the server's TIME), min_ttl (ms), limit, window (µs); then per
--          key, in order: op ('acquire', 'peek', 'refund', 'hold', 'settle') and cost (or
--          refund amount), and for 'hold' and 'settle' a third: the hold (µs; the units are
--          stamped at now + hold) or the stamp to give units back from.
-- State    a header '<total>:<newest_at>:<newest_cost>|', then the `LogEntry`s oldest
--          first, '<at>:<cost>' joined by ',' (key format v3), written with its TTL in the
--          same SET; an empty log is no key. With the total and the newest entry in the
--          header, an admission reads only the entries that leave the window and appends with
--          one string.sub; only a denial (its wait), a refund, or a held stamp placed before a
--          later one reads further. One string is one GET and one SET, where a sorted set of
--          timestamps costs a ZRANGE (or ZREMRANGEBYSCORE and ZCARD), a ZADD and a PEXPIRE,
--          and more memory per entry.
-- Reply    { now_us, then per decision: allowed (1 or 0), remaining, retry_after_us,
--          reset_after_us }, with per-decision errors as in single_token_bucket.lua.

-- `MAX` and `clock`: preamble.lua; `keep` and `answer`: lean.lua; script.rs puts both
-- before this file.
local now = clock(ARGV[1])
-- `+ 0` rather than `tonumber` (see single_token_bucket.lua): a string that is not a number
-- stops the script here with Lua's arithmetic error, before any write.
local min_ttl, limit, window = ARGV[2] + 0, ARGV[3] + 0, ARGV[4] + 0
-- Every argument an integer from 0 to MAX, checked at once: the script is callable by
-- anyone with the ACL, and must never store what rein-core would not. `x % 1` is 0 only
-- for an integer (NaN and infinities give NaN), so the sum is 0 only if each term is.
if now % 1 + min_ttl % 1 + limit % 1 + window % 1 ~= 0
    or now < 0 or now > MAX or min_ttl < 0 or min_ttl > MAX
    or limit < 0 or limit > MAX or window < 0 or window > MAX then
  error({ err = 'REIN arguments must be integers from 0 to 2^52 - 1' })
end
if window == 0 then
  error({ err = 'REIN bad sliding log parameters' })
end
-- Each decision's operation, cost and extra, all checked before the first write.
local n, i = #KEYS, 5
for _ = 1, n do
  local op, cost, extra = ARGV[i], ARGV[i + 1], 0
  if op == 'hold' or op == 'settle' then
    extra = ARGV[i + 2]
    i = i + 3
  elseif op == 'acquire' or op == 'peek' or op == 'refund' then
    i = i + 2
  elseif op == nil then
    error({ err = 'REIN expected 4 arguments and 2 per key (3 to hold or settle)' })
  else
    error({ err = 'REIN unknown operation' })
  end
  if cost == nil or extra == nil then
    error({ err = 'REIN expected 4 arguments and 2 per key (3 to hold or settle)' })
  end
  cost, extra = cost + 0, extra + 0
  if cost % 1 + extra % 1 ~= 0 or cost < 0 or cost > MAX or extra < 0 or extra > MAX then
    error({ err = 'REIN arguments must be integers from 0 to 2^52 - 1' })
  end
  if cost > limit and op ~= 'refund' and op ~= 'settle' then
    error({ err = 'REIN cost exceeds capacity' })
  end
end
if n < 1 or i ~= #ARGV + 1 then
  error({ err = 'REIN expected 4 arguments and 2 per key (3 to hold or settle)' })
end

local CORRUPT = { err = 'REIN corrupt sliding log state' }

-- The entry at byte `p` of `stored`: its instant, its cost, and where the next one starts;
-- nil unless it is well formed (integers up to MAX, a cost of at least 1).
local function entry_at(stored, p)
  local _, e, a, c = string.find(stored, '^(%d+):(%d+),?', p)
  if e == nil then
    return nil
  end
  a, c = a + 0, c + 0
  if a > MAX or c == 0 or c > MAX then
    return nil
  end
  return a, c, e + 1
end

-- The entries of `stored` from byte `p` to its end: their instants and costs, their count and
-- sum, as SlidingLogState::from_entries accepts them (increasing instants after `after`);
-- nil if they are not.
local function entries(stored, p, after)
  local ats, costs, m, sum, len = {}, {}, 0, 0, #stored
  while p <= len do
    local a, c, next_p = entry_at(stored, p)
    if a == nil or a <= after then
      return nil
    end
    m = m + 1
    ats[m], costs[m], sum, after, p = a, c, sum + c, a, next_p
  end
  return ats, costs, m, sum
end

-- The stored string of entries 1 to `m`: the header, then the entries; '' for none.
local function render(ats, costs, m)
  if m == 0 then
    return ''
  end
  local parts, sum = {}, 0
  for j = 1, m do
    parts[j] = string.format('%d:%d', ats[j], costs[j])
    sum = sum + costs[j]
  end
  return string.format('%d:%d:%d|', sum, ats[m], costs[m]) .. table.concat(parts, ',')
end

-- One decision: the figures, or an error table (nothing written).
local function decide(key, op, cost, extra)
  local stored = redis.pcall('GET', key)
  if type(stored) == 'table' then
    return stored
  end
  -- The header: the log's total cost and its newest entry, so that a decision reads only the
  -- entries that leave the window (and, to deny, those it must wait for).
  local total, newest, newest_cost, first, len = 0, nil, 0, 1, 0
  if stored then
    local _, e, t, a, c = string.find(stored, '^(%d+):(%d+):(%d+)|')
    if e == nil and stored >= 'B' then
      -- A block (preamble.lua): denied while it holds, then a log never seen.
      local left = block_left(stored, now)
      if left ~= 0 then
        return blocked(left)
      end
      stored = false
    elseif e == nil then
      return CORRUPT
    else
      total, newest, newest_cost, first, len = t + 0, a + 0, c + 0, e + 1, #stored
      -- A stored log has an entry, and no trailing ','.
      if total > MAX or newest > MAX or newest_cost == 0 or newest_cost > total
          or first > len or string.byte(stored, len) == 44 then
        return CORRUPT
      end
    end
  end

  local value = nil
  local live, allowed, remaining, retry_after = 0, 1, 0, 0
  if op == 'refund' or op == 'settle' then
    -- Refunds rewrite entries anywhere in the log (expired ones are kept, as rein-core
    -- keeps them until an admission drops them): all of it is read.
    local ats, costs, m = {}, {}, 0
    if stored then
      local sum
      ats, costs, m, sum = entries(stored, first, -1)
      if ats == nil or sum ~= total or ats[m] ~= newest or costs[m] ~= newest_cost then
        return CORRUPT
      end
    end
    local changed = false
    if op == 'settle' then
      -- SlidingLog::refund_held: up to `cost` from the entry at the stamp, nothing else.
      for j = 1, m do
        if ats[j] == extra then
          local taken = math.min(cost, costs[j])
          costs[j] = costs[j] - taken
          changed = taken > 0
          if costs[j] == 0 then
            table.remove(ats, j)
            table.remove(costs, j)
            m = m - 1
          end
          break
        end
      end
    else
      -- SlidingLog::refund: removes up to `cost` of the newest admissions in the window.
      local amount = cost
      while amount > 0 and m > 0 and ats[m] + window > now do
        local taken = math.min(amount, costs[m])
        costs[m] = costs[m] - taken
        amount = amount - taken
        changed = true
        if costs[m] == 0 then
          m = m - 1
        end
      end
    end
    if changed then
      value = render(ats, costs, m)
    end
    -- The figures are those of a zero-cost peek after the refund.
    newest = ats[m]
    for j = 1, m do
      if ats[j] + window > now then
        live = live + costs[j]
      end
    end
    remaining = math.max(limit - live, 0)
  else
    -- SlidingLog::decide: expired entries lead the log. `p` ends at the oldest live entry.
    local p, prev, prev_cost, oldest = first, -1, 0, nil
    live = total
    while p <= len do
      local a, c, next_p = entry_at(stored, p)
      if a == nil or a > newest or c > live or a <= prev then
        return CORRUPT
      end
      if a + window > now then
        oldest = a
        break
      end
      live, prev, prev_cost, p = live - c, a, c, next_p
    end
    -- Every entry left: they held the whole total, the last one the newest.
    if stored and oldest == nil and (live ~= 0 or prev ~= newest or prev_cost ~= newest_cost) then
      return CORRUPT
    end

    -- Counted from now - window, future stamps (leases) included. stamp_at: a plain
    -- admission is stamped never before the newest entry; a held one at now + hold, in order
    -- among the entries.
    local stamp = now
    if op == 'hold' then
      stamp = math.min(now + extra, MAX)
    elseif newest ~= nil and newest > now then
      stamp = newest
    end
    remaining = math.max(limit - live, 0)
    if cost <= remaining then
      remaining = remaining - cost
      if cost > 0 and op ~= 'peek' then
        local sum = live + cost
        if oldest == nil then
          value = string.format('%d:%d:%d|%d:%d', sum, stamp, cost, stamp, cost)
        elseif stamp >= newest then
          -- The newest entry is the string's last: checked against the header (the entries
          -- between are copied unread), then kept, the new entry appended after it (every
          -- plain admission's case), or merged with it (the same microsecond).
          local tail = string.format('%d:%d', newest, newest_cost)
          local at = len - #tail + 1
          local before = string.byte(stored, at - 1)
          if at < p or (before ~= 44 and before ~= 124) or string.sub(stored, at) ~= tail then
            return CORRUPT
          end
          if stamp > newest then
            value = string.format('%d:%d:%d|%s,%d:%d', sum, stamp, cost, string.sub(stored, p),
              stamp, cost)
          else
            value = string.format('%d:%d:%d|%s%d:%d', sum, newest, newest_cost + cost,
              string.sub(stored, p, at - 1), newest, newest_cost + cost)
          end
        else
          -- A held stamp before a later entry: placed in order among the live entries.
          local ats, costs, m, live_sum = entries(stored, p, prev)
          if ats == nil or live_sum ~= live or ats[m] ~= newest or costs[m] ~= newest_cost then
            return CORRUPT
          end
          for j = 1, m do
            if ats[j] >= stamp then
              if ats[j] == stamp then
                costs[j] = costs[j] + cost
              else
                table.insert(ats, j, stamp)
                table.insert(costs, j, cost)
                m = m + 1
              end
              break
            end
          end
          value = render(ats, costs, m)
        end
      end
      -- The figures are those after the admission, a peek's too.
      if cost > 0 and (newest == nil or stamp > newest) then
        newest = stamp
      end
    else
      allowed = 0
      -- Walk the live entries oldest first until enough cost has left the window.
      local still_in = live
      while p <= len do
        local a, c, next_p = entry_at(stored, p)
        if a == nil then
          return CORRUPT
        end
        still_in = still_in - c
        if still_in + cost <= limit then
          retry_after = math.min(a + window - now, MAX)
          break
        end
        p = next_p
      end
    end
  end
  -- newest_end: the newest entry (or this admission, if later) leaves the window.
  local reset_after = 0
  if newest ~= nil and newest + window > now then
    reset_after = math.min(newest + window - now, MAX)
  end

  if value ~= nil then
    -- The key lives until its newest entry leaves the window (rounded up to ms), or min_ttl
    -- if longer; an empty log, or one with no TTL left, is deleted.
    local ttl = reset_after + 999
    ttl = math.max((ttl - math.fmod(ttl, 1000)) / 1000, min_ttl)
    return keep(key, value, ttl, allowed, remaining, retry_after, reset_after)
  end
  return allowed, remaining, retry_after, reset_after
end

local out, o = { now }, 1
i = 5
for k = 1, n do
  local op, extra = ARGV[i], 0
  if op == 'hold' or op == 'settle' then
    extra = ARGV[i + 2] + 0
  end
  local allowed, remaining, retry_after, reset_after = decide(KEYS[k], op, ARGV[i + 1] + 0, extra)
  if op == 'hold' or op == 'settle' then
    i = i + 3
  else
    i = i + 2
  end
  o = answer(out, o, allowed, remaining, retry_after, reset_after)
end
return out
