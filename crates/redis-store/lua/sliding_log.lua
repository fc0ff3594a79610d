-- rein-redis: rein_core::SlidingLog::{decide, acquire, refund, judged_at}
-- (crates/core/src/sliding_log.rs), line for line, with the same names.
--
-- Parameters `p`: limit, window (µs).
-- State: the string of entries oldest first, '<at>:<cost>' joined by ',', as
-- `single_sliding_log.lua` writes it; an empty log is no key. In memory the state is
-- `{ entries, total }` as in the core.
--
-- Built only when a policy uses it: Redis runs the whole script body on every call, and
-- each function defined is an allocation.
local function sliding_log()
  local function params(a, i)
    return { limit = int(a[i], 'limit'), window = int(a[i + 1], 'window') }, i + 2
  end

  local function load(key)
    local stored = redis.call('GET', key)
    local entries, total = {}, 0
    if stored then
      local i, len = 1, #stored
      while i <= len do
        local _, e, at, cost = string.find(stored, '^(%d+):(%d+),?', i)
        if e == nil then
          fail('corrupt state: sliding log')
        end
        at, cost = int(at, 'at'), int(cost, 'cost')
        -- As SlidingLogState::from_entries: increasing instants, non-zero costs.
        local last = entries[#entries]
        if cost == 0 or (last and at <= last.at) then
          fail('corrupt state: sliding log')
        end
        entries[#entries + 1] = { at = at, cost = cost }
        total = total + cost
        i = e + 1
      end
      if total > MAX_MICROS then
        fail('corrupt state: sliding log')
      end
    end
    return { entries = entries, total = total }
  end

  -- The stored string, or nil for an empty log (the key is deleted).
  local function encode(s)
    if #s.entries == 0 then
      return nil
    end
    local parts = {}
    for i = 1, #s.entries do
      parts[i] = string.format('%d:%d', s.entries[i].at, s.entries[i].cost)
    end
    return table.concat(parts, ',')
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
  -- the judged instant, merging with an entry at the same microsecond; returns the encoding.
  local function apply(p, now, s, cost, expired)
    local at = judged_at(now, s)
    local entries = {}
    for i = expired + 1, #s.entries do
      entries[#entries + 1] = { at = s.entries[i].at, cost = s.entries[i].cost }
    end
    local last = entries[#entries]
    if last and last.at == at then
      last.cost = last.cost + cost
    else
      entries[#entries + 1] = { at = at, cost = cost }
    end
    return encode({ entries = entries })
  end

  -- Removes up to `amount` of the most recent admissions still in the window; returns the
  -- new state, or nil when nothing changed.
  local function refund(p, now, s, amount)
    local horizon = judged_at(now, s)
    local entries, total = s.entries, s.total
    local changed = false
    while amount > 0 do
      local last = entries[#entries]
      if last == nil or last.at + p.window <= horizon then
        break
      end
      local taken = math.min(amount, last.cost)
      changed = true
      last.cost = last.cost - taken
      total = total - taken
      amount = amount - taken
      if last.cost == 0 then
        entries[#entries] = nil
      end
    end
    if not changed then
      return nil
    end
    return { entries = entries, total = total }
  end

  return { params = params, load = load, decide = decide, apply = apply, refund = refund,
    encode = encode }
end
