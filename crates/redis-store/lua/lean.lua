-- rein-redis: the steps the lean scripts of the fixed window and the sliding log share,
-- after the preamble (script.rs puts this file between the preamble and each of them).
-- Not in the preamble: every script creates the preamble's functions at each call, and the
-- others need none of these. The token bucket's script writes them out (the cheapest
-- script, where the two calls measured slower: docs/performance.md).

-- A decision's new state for `key`: `value` kept for `ttl` ms, or the key deleted when
-- there is nothing to keep (`ttl` 0, or an empty `value`). Returns the decision's figures
-- once written, or the error of a write Redis refuses (`OOM`, `READONLY`) as its answer.
local function keep(key, value, ttl, allowed, remaining, retry_after, reset_after)
  local done
  if ttl > 0 and value ~= '' then
    done = redis.pcall('SET', key, value, 'PX', ttl)
    if done.err then
      return done
    end
  else
    done = redis.pcall('DEL', key)
    if type(done) == 'table' then
      return done
    end
  end
  return allowed, remaining, retry_after, reset_after
end

-- A lean script's reply: after `now`, four figures per decision. A decision that failed
-- (`allowed` its error, the rest nil) has zeros. Returns the position of the last one set.
local function answer(out, o, allowed, remaining, retry_after, reset_after)
  if remaining == nil then
    remaining, retry_after, reset_after = 0, 0, 0
  end
  out[o + 1], out[o + 2], out[o + 3], out[o + 4] = allowed, remaining, retry_after, reset_after
  return o + 4
end
