-- rein-redis: rein_core::Policy::{acquire, peek, refund} and `combine`
-- (crates/core/src/policy.rs): every limit of one policy decided in one atomic call,
-- all-or-nothing. This file drives the algorithm files concatenated above it.
--
-- KEYS[i]  the state key of limit i, in the policy's order (all in one hash slot).
-- ARGV[1]  operation: 'acquire', 'peek' or 'refund'.
-- ARGV[2]  now in µs since the Unix epoch, or '' to read the server's TIME.
-- ARGV[3]  cost (acquire, peek) or amount (refund).
-- ARGV[4]  min_ttl in ms: the shortest TTL a written key gets (normally 0).
-- ARGV[5..] per limit, in KEYS order: an algorithm tag and its parameters,
--           'tb' capacity units_per_token units_per_micro tolerance,
--           'fw' limit window, 'sl' limit window, 'sc' limit window.
--
-- Reply: { allowed (1 or 0), limit, remaining, retry_after_us, reset_after_us, now_us }.
-- For 'refund' the figures are those of a zero-cost peek after the refund.
--
-- Each written key is SET with a TTL of its limit's reset_after rounded up to whole ms (or
-- min_ttl if longer), so it expires once its limit is full again; a key whose TTL would be
-- 0 is deleted. A denial or a peek writes nothing and leaves every TTL as it was.

-- Algorithm tags as in the keys and ARGV, and the constructors of the files above.
local ALGORITHMS = {
  tb = token_bucket,
  fw = fixed_window,
  sl = sliding_log,
  sc = sliding_counter,
}

-- Folds one more limit's decision into the policy's (in place: tables cost allocations):
-- denied if any denies, the fewest remaining (with that limit's size, the first on a tie),
-- the longest wait and the longest reset.
local function combine(acc, next)
  if acc == nil then
    return next
  end
  if acc.combined == nil then
    -- A copy: the first limit's own decision still sets its key's TTL.
    acc = { combined = true, allowed = acc.allowed, limit = acc.limit,
      remaining = acc.remaining, retry_after = acc.retry_after, reset_after = acc.reset_after }
  end
  acc.allowed = acc.allowed and next.allowed
  if next.remaining < acc.remaining then
    acc.limit, acc.remaining = next.limit, next.remaining
  end
  acc.retry_after = math.max(acc.retry_after, next.retry_after)
  acc.reset_after = math.max(acc.reset_after, next.reset_after)
  return acc
end

local op = ARGV[1]
if op ~= 'acquire' and op ~= 'peek' and op ~= 'refund' then
  fail('unknown operation')
end
local now
if ARGV[2] == '' then
  -- Redis 5 and 6 replicate scripts verbatim unless told otherwise, and then refuse writes
  -- after TIME; Redis 7 replicates effects only and keeps this as a no-op.
  if redis.replicate_commands then
    redis.replicate_commands()
  end
  local t = redis.call('TIME')
  now = clamp(tonumber(t[1]) * 1000000 + tonumber(t[2]))
else
  now = int(ARGV[2], 'now')
end
local cost = int(ARGV[3], 'cost')
local min_ttl = int(ARGV[4], 'min_ttl')

local n = #KEYS
if n == 0 or n > 8 then
  fail('a policy has 1 to 8 limits')
end
-- Per limit k: its algorithm, parameters and state (parallel arrays: each table is an
-- allocation, on every call).
local algorithms, params, states = {}, {}, {}
local built = {}
local i = 5
for k = 1, n do
  local tag = ARGV[i]
  local algorithm = built[tag]
  if algorithm == nil then
    local make = ALGORITHMS[tag]
    if make == nil then
      fail('unknown algorithm')
    end
    algorithm = make()
    built[tag] = algorithm
  end
  local p
  p, i = algorithm.params(ARGV, i + 1)
  -- The core rejects a cost above capacity before deciding; the products below rely on it.
  if op ~= 'refund' and cost > (p.capacity or p.limit) then
    fail('cost exceeds capacity')
  end
  algorithms[k], params[k] = algorithm, p
end
if ARGV[i] ~= nil then
  fail('too many arguments')
end

-- Every state is loaded (and validated) before anything is written: Redis does not roll
-- back a script's writes when it fails half-way.
for k = 1, n do
  states[k] = algorithms[k].load(KEYS[k])
end

local combined = nil
if op == 'refund' then
  for k = 1, n do
    local s = states[k]
    local next = algorithms[k].refund(params[k], now, s, cost)
    if next ~= nil then
      s = next
    end
    local d = algorithms[k].decide(params[k], now, s, 0)
    if next ~= nil then
      store(KEYS[k], algorithms[k].encode(next), d.reset_after, min_ttl)
    end
    combined = combine(combined, d)
  end
else
  local decisions, auxes = {}, {}
  for k = 1, n do
    decisions[k], auxes[k] = algorithms[k].decide(params[k], now, states[k], cost)
    combined = combine(combined, decisions[k])
  end
  if op == 'acquire' and combined.allowed and cost > 0 then
    for k = 1, n do
      local value = algorithms[k].apply(params[k], now, states[k], cost, auxes[k])
      store(KEYS[k], value, decisions[k].reset_after, min_ttl)
    end
  end
end

local allowed_flag = 0
if combined.allowed then
  allowed_flag = 1
end
return { allowed_flag, combined.limit, combined.remaining, combined.retry_after,
  combined.reset_after, now }
