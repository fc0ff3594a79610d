-- rein-redis: rein_core::SlidingLog::{decide, acquire, refund, judged_at}
-- (crates/core/src/sliding_log.rs), line for line, with the same names.
--
-- Parameters `p`: limit, window (µs).
-- State: a ZSET with one member per `LogEntry`, `"<at>:<cost>"`, scored by `at`, so that
-- ZRANGE lists the entries oldest first. In memory the state is `{ entries, total }` as in
-- the core; each loaded entry remembers its member so a write touches only what changed.
--
-- Built only when a policy uses it: Redis runs the whole script body on every call, and
-- each function defined is an allocation.
local function sliding_log()
  local function params(a, i)
    return { limit = int(a[i], 'limit'), window = int(a[i + 1], 'window') }, i + 2
  end

  local function member(at, cost)
    -- `tostring` keeps 14 significant digits; `%d` is exact below 2^53.
    return string.format('%d:%d', at, cost)
  end

  local function load(key)
    local members = redis.call('ZRANGE', key, 0, -1)
    local entries, total = {}, 0
    for i = 1, #members do
      local m = members[i]
      local sep = string.find(m, ':', 1, true)
      if not sep then
        fail('corrupt sliding log entry')
      end
      local at = int(string.sub(m, 1, sep - 1), 'at')
      local cost = int(string.sub(m, sep + 1), 'cost')
      entries[i] = { at = at, cost = cost, member = m }
      total = total + cost
    end
    return { entries = entries, total = total }
  end

  -- The instant a request at `now` is judged at: never before the newest admission.
  local function judged_at(now, s)
    local last = s.entries[#s.entries]
    if last then
      return math.max(now, last.at)
    end
    return now
  end

  -- Returns the decision and how many leading entries have expired.
  local function decide(p, now, s, cost)
    local at = judged_at(now, s)
    local expired, live = 0, s.total
    for i = 1, #s.entries do
      local entry = s.entries[i]
      if entry.at + p.window > at then
        break
      end
      expired = expired + 1
      live = live - entry.cost
    end
    local function newest_end(extra)
      local newest = extra
      if newest == nil and #s.entries > 0 then
        newest = s.entries[#s.entries].at
      end
      if newest ~= nil and newest + p.window > at then
        return clamp(newest + p.window - now)
      end
      return 0
    end
    local remaining = sat_sub(p.limit, live)
    if cost <= remaining then
      local extra = nil
      if cost > 0 then
        extra = at
      end
      return allowed(p.limit, remaining - cost, newest_end(extra)), expired
    end
    -- Walk the live entries oldest first until enough cost has left the window.
    local still_in, retry = live, 0
    for i = expired + 1, #s.entries do
      local entry = s.entries[i]
      still_in = still_in - entry.cost
      if still_in + cost <= p.limit then
        retry = clamp(entry.at + p.window - now)
        break
      end
    end
    return denied(p.limit, remaining, retry, newest_end(nil)), expired
  end

  -- The write half of `SlidingLog::acquire`: drops the expired entries and records `cost` at
  -- the judged instant, merging with an entry at the same microsecond.
  local function apply(key, p, now, s, cost, expired)
    local at = judged_at(now, s)
    if expired > 0 then
      redis.call('ZREMRANGEBYRANK', key, 0, expired - 1)
    end
    local last = s.entries[#s.entries]
    if #s.entries > expired and last.at == at then
      redis.call('ZREM', key, last.member)
      redis.call('ZADD', key, at, member(at, last.cost + cost))
    else
      redis.call('ZADD', key, at, member(at, cost))
    end
  end

  -- Removes up to `amount` of the most recent admissions still in the window; returns the
  -- new state, or nil when nothing changed.
  local function refund(key, p, now, s, amount)
    local horizon = judged_at(now, s)
    local entries, total = s.entries, s.total
    local changed = false
    while amount > 0 do
      local last = entries[#entries]
      if last == nil or last.at + p.window <= horizon then
        break
      end
      local taken = math.min(amount, last.cost)
      redis.call('ZREM', key, last.member)
      changed = true
      last.cost = last.cost - taken
      total = total - taken
      amount = amount - taken
      if last.cost == 0 then
        entries[#entries] = nil
      else
        last.member = member(last.at, last.cost)
        redis.call('ZADD', key, last.at, last.member)
      end
    end
    if not changed then
      return nil
    end
    return { entries = entries, total = total }
  end

  return { params = params, load = load, decide = decide, apply = apply, refund = refund }
end
