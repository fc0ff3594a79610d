-- The Lua half of the simulated Redis's scripting API, run once per Lua state.
--
-- It rebuilds the environment Redis 7.0 gives EVAL scripts: the `redis` table, Redis's
-- `pcall` (which turns error tables into their message), a deterministic `math.random`, no
-- `print`/`loadfile`/`os`/`io`/`debug`, and read-only globals whose misses are errors. The
-- Rust half passes in the functions that touch the keyspace or need Rust (see mod.rs).
-- Its chunk name marks its frames so error positions skip them, as they skip Redis's C.

local raw_call, raw_sha1hex, lrand48, srand48 = ...

local G = _G
local error, select, setmetatable, tonumber, tostring, type = error, select, setmetatable,
  tonumber, tostring, type
local floor = math.floor
local raw_pcall = pcall

local function readonly()
  error('Attempt to modify a readonly table', 2)
end

-- Redis's luaPushErrorBuff: "-CODE message" or "message" (code ERR) become "CODE message",
-- without line breaks at either end.
local function error_table(message)
  if message:sub(1, 1) ~= '-' then
    message = '-' .. message
  end
  local space = message:find(' ', 1, true)
  local code, text
  if space then
    code, text = message:sub(2, space - 1), message:sub(space + 1)
  else
    code, text = 'ERR', message:sub(2)
  end
  text = (text:gsub('^[\r\n]+', ''):gsub('[\r\n]+$', ''))
  return { err = code .. ' ' .. text }
end

local redis = {}

function redis.call(...)
  local reply, failed = raw_call(...)
  if failed then
    error(reply)
  end
  return reply
end

function redis.pcall(...)
  return (raw_call(...))
end

function redis.error_reply(...)
  local message = ...
  if select('#', ...) ~= 1 or type(message) ~= 'string' then
    return { err = 'ERR wrong number or type of arguments' }
  end
  return error_table(message)
end

function redis.status_reply(...)
  local message = ...
  if select('#', ...) ~= 1 or type(message) ~= 'string' then
    return { err = 'ERR wrong number or type of arguments' }
  end
  return { ok = message }
end

function redis.sha1hex(...)
  if select('#', ...) ~= 1 then
    error({ err = 'ERR wrong number of arguments' })
  end
  return raw_sha1hex(tostring((...)))
end

-- Logging, replication and debugging have nothing to act on in the simulator.
function redis.log() end
function redis.set_repl() end
function redis.replicate_commands() return true end
function redis.breakpoint() return false end
function redis.debug() end
function redis.setresp(version)
  if version ~= 2 then
    error({ err = 'ERR the simulated Redis speaks RESP2 only' })
  end
end
redis.LOG_DEBUG, redis.LOG_VERBOSE, redis.LOG_NOTICE, redis.LOG_WARNING = 0, 1, 2, 3
redis.REPL_NONE, redis.REPL_AOF, redis.REPL_SLAVE, redis.REPL_REPLICA, redis.REPL_ALL =
  0, 1, 2, 2, 3
redis.REDIS_VERSION, redis.REDIS_VERSION_NUM = '7.0.15', 0x07000f

-- Redis replaces math.random with its own rand48 so that scripts are replayable.
local RAND_MAX = 2147483647

local function checkint(value, position)
  local number = tonumber(value)
  if number == nil then
    local got = value == nil and 'no value' or type(value)
    error(('bad argument #%d to \'random\' (number expected, got %s)'):format(position, got), 3)
  end
  -- C's (int) cast truncates toward zero.
  if number >= 0 then
    return floor(number)
  end
  return -floor(-number)
end

function math.random(...)
  local r = (lrand48() % RAND_MAX) / RAND_MAX
  local count = select('#', ...)
  if count == 0 then
    return r
  elseif count == 1 then
    local upper = checkint((...), 1)
    if upper < 1 then
      error('bad argument #1 to \'random\' (interval is empty)', 2)
    end
    return floor(r * upper) + 1
  elseif count == 2 then
    local lower, upper = ...
    lower, upper = checkint(lower, 1), checkint(upper, 2)
    if lower > upper then
      error('bad argument #2 to \'random\' (interval is empty)', 2)
    end
    return floor(r * (upper - lower + 1)) + lower
  end
  error('wrong number of arguments', 0)
end

function math.randomseed(seed)
  srand48(checkint(seed, 1))
end

-- Redis's pcall: an error table caught from redis.call is returned as its message.
local function pcall_result(ok, ...)
  if ok then
    return true, ...
  end
  local caught = ...
  if type(caught) == 'table' then
    local message = caught.err
    if type(message) == 'string' or type(message) == 'number' then
      return false, message
    end
  end
  return false, caught
end

function G.pcall(...)
  return pcall_result(raw_pcall(...))
end

G.redis = redis
G.print, G.dofile, G.loadfile, G.getfenv, G.setfenv, G.newproxy, G.module, G.require =
  nil, nil, nil, nil, nil, nil, nil, nil

-- Read-only globals. Scripts run with `script_env` as their environment, so every global
-- write they make is refused, not just writes of new names; reads fall through to G, whose
-- own metatable turns a missing name into Redis's error.
local readonly_meta = { __newindex = readonly }
for _, library in ipairs({ redis, math, string, table, coroutine }) do
  setmetatable(library, readonly_meta)
end
setmetatable(G, {
  __index = function(_, name)
    error('Script attempted to access nonexistent global variable \'' .. tostring(name) .. '\'', 2)
  end,
  __newindex = readonly,
})
local script_env = setmetatable({}, { __index = G, __newindex = readonly })

return script_env
