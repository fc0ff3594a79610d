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
-- State    a string of `LogEntry`s oldest first, '<at>:<cost>' joined by ',', written with
--          its TTL in the same SET; an empty log is no key. One string is one GET and
--          one SET, where a sorted set of timestamps costs a ZRANGE (or ZREMRANGEBYSCORE
--          and ZCARD), a ZADD and a PEXPIRE, and more memory per entry.
-- Reply    { now_us, then per decision: allowed (1 or 0), remaining, retry_after_us,
--          reset_after_us }, with per-decision errors as in single_token_bucket.lua.

-- rein_core::MAX_MICROS (see single_token_bucket.lua).
local MAX = 4503599627370495

local now
if ARGV[1] == '' then
  -- Redis 5 and 6 replicate scripts verbatim unless told otherwise, and then refuse writes
  -- after TIME; Redis 7 (which has REDIS_VERSION_NUM) replicates effects only.
  if redis.REDIS_VERSION_NUM == nil then
    redis.replicate_commands()
  end
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
  if now > MAX then
    now = MAX
  end
else
  now = ARGV[1] + 0
end
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

-- One decision: the figures, or an error table (nothing written).
local function decide(key, op, cost, extra)
  local settle = op == 'settle'
  local refund = op == 'refund' or settle
  -- The entries: `at` and `cost` of each, and where each starts in the stored string, so an
  -- admission that expires a prefix keeps the rest with one `string.sub`.
  local stored = redis.pcall('GET', key)
  if type(stored) == 'table' then
    return stored
  end
  local ats, costs, starts = {}, {}, {}
  local n, total = 0, 0
  if stored then
    local i, len = 1, #stored
    while i <= len do
      local _, e, a, c = string.find(stored, '^(%d+):(%d+),?', i)
      if e == nil then
        return { err = 'REIN corrupt sliding log state' }
      end
      a, c = a + 0, c + 0
      -- As SlidingLogState::from_entries: increasing instants, non-zero costs.
      if a > MAX or c > MAX or c == 0 or (n > 0 and a <= ats[n]) then
        return { err = 'REIN corrupt sliding log state' }
      end
      n = n + 1
      ats[n], costs[n], starts[n] = a, c, i
      total = total + c
      i = e + 1
    end
    if total > MAX then
      return { err = 'REIN corrupt sliding log state' }
    end
  end

  -- Decisions count every entry stamped after now - window, future stamps (leases)
  -- included. stamp_at: a plain admission is stamped never before the newest entry; a held
  -- one at now + hold, in order among the entries.
  local stamp = now
  if op == 'hold' then
    stamp = math.min(now + extra, MAX)
  elseif n > 0 and ats[n] > now then
    stamp = ats[n]
  end

  local write = false
  -- Set when the entries change other than by appending: the value is rebuilt from them.
  local rebuild = false
  if refund then
    local amount = cost
    if settle then
      -- SlidingLog::refund_held: up to `amount` from the entry at the stamp, nothing else.
      for j = 1, n do
        if ats[j] == extra then
          local taken = math.min(amount, costs[j])
          costs[j] = costs[j] - taken
          total = total - taken
          write = taken > 0
          if costs[j] == 0 then
            table.remove(ats, j)
            table.remove(costs, j)
            n = n - 1
          end
          break
        end
      end
    else
      -- SlidingLog::refund: removes up to `amount` of the newest admissions in the window.
      while amount > 0 and n > 0 and ats[n] + window > now do
        local taken = math.min(amount, costs[n])
        costs[n] = costs[n] - taken
        total = total - taken
        amount = amount - taken
        write = true
        if costs[n] == 0 then
          n = n - 1
        end
      end
    end
    rebuild = write
    -- The figures are those of a zero-cost peek after the refund.
    cost = 0
  end

  -- SlidingLog::decide: expired entries lead the log.
  local expired, live = 0, total
  while expired < n and ats[expired + 1] + window <= now do
    expired = expired + 1
    live = live - costs[expired]
  end
  local remaining = math.max(limit - live, 0)
  local allowed, retry_after = 0, 0
  -- newest_end: the newest entry (or this admission, if later) leaves the window.
  local newest = nil
  if n > 0 then
    newest = ats[n]
  end
  if cost <= remaining then
    allowed = 1
    remaining = remaining - cost
    if cost > 0 and (newest == nil or stamp > newest) then
      newest = stamp
    end
  else
    -- Walk the live entries oldest first until enough cost has left the window.
    local still_in = live
    for i = expired + 1, n do
      still_in = still_in - costs[i]
      if still_in + cost <= limit then
        retry_after = math.min(ats[i] + window - now, MAX)
        break
      end
    end
  end
  local reset_after = 0
  if newest ~= nil and newest + window > now then
    reset_after = math.min(newest + window - now, MAX)
  end

  local value = nil
  if allowed == 1 and cost > 0 and (op == 'acquire' or op == 'hold') then
    write = true
    if expired < n and ats[n] < stamp then
      -- The live suffix as stored, then the new entry: every plain admission's case.
      value = string.sub(stored, starts[expired + 1])
      if string.sub(value, -1) ~= ',' then
        value = value .. ','
      end
      value = value .. string.format('%d:%d', stamp, cost)
    elseif expired == n then
      value = string.format('%d:%d', stamp, cost)
    else
      -- Merged with an entry at the same microsecond, or placed before a later stamp.
      local parts, placed = {}, false
      for i = expired + 1, n do
        if not placed and ats[i] >= stamp then
          placed = true
          if ats[i] == stamp then
            costs[i] = costs[i] + cost
          else
            parts[#parts + 1] = string.format('%d:%d', stamp, cost)
          end
        end
        parts[#parts + 1] = string.format('%d:%d', ats[i], costs[i])
      end
      value = table.concat(parts, ',')
    end
  elseif rebuild then
    local parts = {}
    for i = 1, n do
      parts[i] = string.format('%d:%d', ats[i], costs[i])
    end
    value = table.concat(parts, ',')
  end

  if write then
    -- The key lives until its newest entry leaves the window (rounded up to ms), or min_ttl
    -- if longer; an empty log, or one with no TTL left, is deleted.
    local ttl = reset_after + 999
    ttl = math.max((ttl - math.fmod(ttl, 1000)) / 1000, min_ttl)
    if ttl > 0 and value ~= '' then
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
  if remaining == nil then
    remaining, retry_after, reset_after = 0, 0, 0
  end
  out[o + 1], out[o + 2], out[o + 3], out[o + 4] = allowed, remaining, retry_after, reset_after
  o = o + 4
end
return out
