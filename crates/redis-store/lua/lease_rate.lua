-- rein-redis: rate shares of one token bucket, leased as sub-buckets. rein_core::RateShares
-- (crates/core/src/rate_share.rs: take, give_back, direct, advance, clamp, ttl), with the same
-- names and the same integers. docs/leases.md, "Token bucket: lease rate".
--
-- KEYS[1]  the bucket's share state: a hash.
-- ARGV     op ('take', 'return', 'direct'), now (µs, or '' for the server's TIME), min_ttl
--          (ms), capacity, token_units, part_rate (RateShares's parameters), then per op:
--            take    node, held, seq, applied, demand, validity (µs)
--            return  node, id, seq, units
--            direct  cost
-- State    field 's' = '<drawn>:<at>:<next_id>'; per share, field 'n<node>' =
--          '<id>:<burst>:<parts>:<until>:<demand>:<seq>:<hold_burst>:<hold_parts>:<hold_until>'.
--          The key expires when every share has ended and the direct share is full again
--          (RateShares::ttl), or after min_ttl, whichever is later. A plain bucket's
--          '<tat>[:<tat_units>]' under the key (an operator's change of a key not yet
--          shared) is adopted as the direct share (RateShares::adopt) and replaced by the
--          hash; a block, 'B<until>:<reason>', answers as the block.
-- Reply    take    { kind (0 granted, 1 full, 2 stale), id, continued, burst, parts, moved,
--                    now }
--          return  { applied (1 or 0), now }
--          direct  { allowed, limit, remaining, retry_after, reset_after, now }, as the
--                  decision scripts answer. A denial, or a cost of 0, writes nothing.

-- rein_core::RATE_PARTS, MAX_SHARES, MAX_DEMAND, MAX_VALIDITY (µs); MAX_MICROS is the
-- preamble's `MAX`.
local PARTS = 1000
local MAX_SHARES = 64
local MAX_DEMAND = 4294967295
local MAX_VALIDITY = 3600000000

local op = ARGV[1]
local nargs = ({ take = 12, ['return'] = 10, direct = 7 })[op]
if nargs == nil then
  error({ err = 'REIN unknown operation' })
end
if #ARGV ~= nargs then
  error({ err = 'REIN wrong number of arguments' })
end
-- Every number argument an integer from 0 to MAX (`x % 1` is 0 only for an integer).
local args = {}
for i = 3, nargs do
  local x = tonumber(ARGV[i])
  if x == nil or x % 1 ~= 0 or x < 0 or x > MAX then
    error({ err = 'REIN arguments must be integers from 0 to 2^52 - 1' })
  end
  args[i] = x
end
-- `MAX` and `clock`: preamble.lua, which script.rs puts before this file.
local now = tonumber(ARGV[2])
if ARGV[2] == '' then
  now = clock('')
elseif now == nil or now % 1 ~= 0 or now < 0 or now > MAX then
  error({ err = 'REIN arguments must be integers from 0 to 2^52 - 1' })
end
local min_ttl, capacity, token_units, part_rate = args[3], args[4], args[5], args[6]
if capacity == 0 or token_units == 0 or part_rate == 0
    or capacity * token_units > MAX or PARTS * part_rate > MAX then
  error({ err = 'REIN bad rate share parameters' })
end
local full = capacity * token_units

-- Exact integer division of integers below 2^53: `math.fmod` is exact.
local function div(a, b)
  return (a - math.fmod(a, b)) / b
end
local function div_ceil(a, b)
  local r = math.fmod(a, b)
  if r == 0 then
    return (a - r) / b
  end
  return (a - r) / b + 1
end

local key = KEYS[1]
local drawn, at, next_id = 0, 0, 0
-- shares[node] = { id, burst, parts, until, demand, seq, hold_burst, hold_parts, hold_until }
local shares = {}
local count = 0
local function corrupt()
  error({ err = 'REIN corrupt rate share state' })
end
local function exact(s)
  local x = tonumber(s)
  if x == nil or x > MAX then
    corrupt()
  end
  return x
end
-- Whether the state is a plain bucket's, adopted below: written whatever the operation
-- answers, so that the key holds one state, and a later call at an earlier instant reads
-- the adopted one, as the core's store keeps it.
local adopted = false
local stored = redis.pcall('HGETALL', key)
if stored.err then
  -- Not a hash: a key an operator blocked, 'B<until>:<reason>' (a block of a bucket holding
  -- shares is refused, so it holds none), or a plain bucket's '<tat>[:<tat_units>]'.
  local value = redis.pcall('GET', key)
  local left = type(value) == 'string' and block_left(value, now) or nil
  local tat, tat_units
  if left == nil and type(value) == 'string' then
    tat, tat_units = string.match(value, '^(%d+):(%d+)$')
    if tat == nil then
      tat, tat_units = string.match(value, '^(%d+)$'), '0'
    end
  end
  if tat ~= nil then
    -- RateShares::adopt: no share, the direct share as full as the bucket (an operator's
    -- penalty of a key not yet shared, or a node deciding with leases off). The bucket's
    -- used units, `max(tat, now) - now` as whole µs and a remainder, in share units.
    -- A remainder beyond this bucket's µs (a state its rate, since changed, wrote) counts
    -- as the bucket script reads it: at most one unit short of a whole µs.
    tat, tat_units = exact(tat), math.min(exact(tat_units), part_rate - 1)
    local used_us, used_units = 0, 0
    if tat > now or (tat == now and tat_units > 0) then
      used_us, used_units = tat - now, tat_units
    end
    -- Checked before multiplying: below the bound both terms are at most `full`.
    if used_us > div(full, PARTS * part_rate) then
      drawn = full
    else
      drawn = math.min(used_us * part_rate * PARTS + used_units * PARTS, full)
    end
    at, adopted, stored = now, true, {}
  elseif left == nil then
    return stored
  elseif left > 0 and op == 'direct' then
    return { 0, capacity, 0, left, left, now }
  elseif left > 0 and op == 'take' then
    return { 1, 0, 0, 0, 0, 0, now }
  elseif left > 0 then
    return { 0, now }
  else
    -- A block that ended this microsecond, its key not yet expired: as one never seen.
    redis.call('DEL', key)
    stored = {}
  end
end
for i = 1, #stored, 2 do
  local field, value = stored[i], stored[i + 1]
  if field == 's' then
    local a, b, c = string.match(value, '^(%d+):(%d+):(%d+)$')
    if a == nil then
      corrupt()
    end
    drawn, at, next_id = exact(a), exact(b), exact(c)
    if drawn > full then
      corrupt()
    end
  else
    local node = string.match(field, '^n(%d+)$')
    local f = { string.match(value,
      '^(%d+):(%d+):(%d+):(%d+):(%d+):(%d+):(%d+):(%d+):(%d+)$') }
    if node == nil or #f ~= 9 then
      corrupt()
    end
    node = exact(node)
    for j = 1, 9 do
      f[j] = exact(f[j])
    end
    if node == 0 or f[2] > capacity or f[3] > PARTS or f[5] > MAX_DEMAND
        or f[7] > capacity or f[8] > PARTS or shares[node] ~= nil then
      corrupt()
    end
    shares[node] = f
    count = count + 1
  end
end
if count > MAX_SHARES then
  corrupt()
end

-- Share::reserved and Share::end.
local function reserved(s, t)
  local b, p = 0, 0
  if t < s[4] then
    b, p = s[2], s[3]
  end
  if t < s[9] then
    b, p = math.max(b, s[7]), math.max(p, s[8])
  end
  return b, p
end
local function share_end(s)
  return math.max(s[4], s[9])
end
local function reserved_all(t)
  local b, p = 0, 0
  for _, s in pairs(shares) do
    local sb, sp = reserved(s, t)
    b, p = b + sb, p + sp
  end
  return b, p
end

-- RateShares::advance: refill the direct share piece by piece between the instants where a
-- reservation ends (each piece at the rate the reservations live in it leave), then drop
-- the shares that ended.
local eff = math.max(now, at)
do
  local ends = {}
  for _, s in pairs(shares) do
    for _, e in ipairs({ s[4], s[9] }) do
      if at < e and e < eff then
        ends[#ends + 1] = e
      end
    end
  end
  ends[#ends + 1] = eff
  table.sort(ends)
  local cursor = at
  for _, e in ipairs(ends) do
    local burst, parts = reserved_all(cursor)
    local floor = math.min(burst, capacity) * token_units
    local rate = math.max(PARTS - parts, 0) * part_rate
    if drawn > floor and rate > 0 then
      local excess = drawn - floor
      local dt = e - cursor
      if dt >= div_ceil(excess, rate) then
        drawn = floor
      else
        drawn = drawn - dt * rate
      end
    end
    cursor = e
  end
  at = eff
  for node, s in pairs(shares) do
    if eff >= share_end(s) then
      shares[node] = nil
      count = count - 1
    end
  end
end

local function clamp()
  local burst = reserved_all(eff)
  drawn = math.max(drawn, math.min(burst, capacity) * token_units)
end

-- RateShares::ttl, µs after `at` (= eff).
local function ttl()
  local last = 0
  for _, s in pairs(shares) do
    last = math.max(last, share_end(s) - at)
  end
  return last + div_ceil(drawn, PARTS * part_rate)
end

local function write()
  redis.call('DEL', key)
  -- RateShares::ttl counts from `at`, which a clock behind the state's (a failover to a
  -- replica whose clock is behind, a node's own clock with `LocalClock`) leaves after
  -- `now`; PEXPIRE counts from now: the difference is added, or the key, and the rate its
  -- shares still hold, would go that much early.
  local ms = math.max(div_ceil(ttl() + (at - now), 1000), min_ttl)
  if count == 0 and drawn == 0 and min_ttl == 0 then
    return
  end
  local fields = { 's', string.format('%d:%d:%d', drawn, at, next_id) }
  for node, s in pairs(shares) do
    fields[#fields + 1] = string.format('n%d', node)
    fields[#fields + 1] = string.format('%d:%d:%d:%d:%d:%d:%d:%d:%d',
      s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8], s[9])
  end
  redis.call('HSET', key, unpack(fields))
  redis.call('PEXPIRE', key, math.max(ms, 1))
end

if op == 'direct' then
  local cost = args[7]
  if cost > capacity then
    error({ err = 'REIN cost exceeds capacity' })
  end
  local level = math.max(full - drawn, 0)
  local need = cost * token_units
  if level >= need then
    drawn = drawn + need
    local reply = { 1, capacity, div(level - need, token_units), 0, ttl(), now }
    if cost > 0 or adopted then
      write()
    end
    return reply
  end
  local burst, parts = reserved_all(eff)
  local rate = math.max(PARTS - parts, 0) * part_rate
  local retry_after
  if rate > 0 and cost <= math.max(capacity - burst, 0) then
    retry_after = div_ceil(need - level, rate)
  else
    retry_after = nil
    for _, s in pairs(shares) do
      local left = math.max(share_end(s) - eff, 0)
      if retry_after == nil or left < retry_after then
        retry_after = left
      end
    end
    retry_after = math.max(retry_after or 1, 1)
  end
  if adopted then
    write()
  end
  return { 0, capacity, div(level, token_units), retry_after, ttl(), now }
end

local node = args[7]
if node == 0 then
  error({ err = 'REIN node must be from 1 to 2^52 - 1' })
end

if op == 'return' then
  local id, seq, units = args[8], args[9], args[10]
  local s = shares[node]
  local applied = 0
  if s ~= nil and s[1] == id and seq > s[6] and eff < s[4] then
    local burst = reserved(s, eff)
    drawn = math.max(drawn - math.min(units, burst * token_units), 0)
    shares[node] = nil
    count = count - 1
    clamp()
    applied = 1
  end
  write()
  return { applied, now }
end

-- take
local held, seq, applied, demand, validity = args[8], args[9], args[10], args[11], args[12]
if demand > MAX_DEMAND then
  error({ err = 'REIN demand too large' })
end
if validity == 0 or validity > MAX_VALIDITY then
  error({ err = 'REIN validity out of range' })
end
local old = shares[node]
if old ~= nil and seq <= old[6] then
  write()
  return { 2, 0, 0, 0, 0, 0, now }
end
if old == nil and count >= MAX_SHARES then
  write()
  return { 1, 0, 0, 0, 0, 0, now }
end
local others_burst, others_parts, others_demand = 0, 0, 0
for other, s in pairs(shares) do
  if other ~= node then
    local b, p = reserved(s, eff)
    others_burst, others_parts = others_burst + b, others_parts + p
    others_demand = others_demand + s[5]
  end
end
local n = count
if old == nil then
  n = n + 1
end
local total_demand = others_demand + demand
-- Parts in proportion to demand (an equal split when there is none), at least a floor.
local target
if total_demand == 0 then
  target = div(PARTS, n)
else
  target = div(PARTS * demand, total_demand)
end
target = math.max(target, math.max(div(PARTS, 4 * n), 1))
local parts = math.min(target, math.max(PARTS - others_parts, 0))
local burst = math.min(math.max(div(capacity * target, PARTS), 1),
  math.max(capacity - others_burst, 0))
local level = math.max(full - drawn, 0)
local continued = old ~= nil and held ~= 0 and old[1] == held and eff < old[4]
local until_ = math.min(eff + validity, MAX)
-- The earlier grants stay reserved until they end, continued or not: the latest alone if
-- the node spends it, otherwise all of them, merged.
local hold_burst, hold_parts, hold_until = 0, 0, 0
if old ~= nil and continued and applied ~= 0 and applied == old[6] then
  hold_burst, hold_parts, hold_until = old[2], old[3], old[4]
elseif old ~= nil then
  hold_burst, hold_parts = reserved(old, eff)
  hold_until = share_end(old)
end
local id, moved
if continued then
  id = old[1]
  moved = math.min(math.max(burst - hold_burst, 0) * token_units, level)
else
  id = math.max(eff, next_id, 1)
  next_id = math.min(id + 1, MAX)
  moved = math.min(burst * token_units, level)
end
if old == nil then
  count = count + 1
end
shares[node] = { id, burst, parts, until_, demand, seq, hold_burst, hold_parts, hold_until }
drawn = drawn + moved
clamp()
write()
local c = 0
if continued then
  c = 1
end
return { 0, id, c, burst, parts, moved, now }
