-- The Lua half of the simulated Redis's scripting API, run once per Lua state.
--
-- It rebuilds the environment Redis 7.0 gives EVAL scripts: the `redis` table, Redis's
-- `pcall` (which turns error tables into their message), no `print`/`loadfile`/`os`/`io`/
-- `debug`, and read-only globals whose misses are errors. Of the `redis` table it keeps what
-- rein's scripts use: `call`, `pcall`, `error_reply`, `REDIS_VERSION_NUM` (and
-- `replicate_commands`, which they call only when that is nil). The Rust half passes in
-- `raw_call`, which runs a command against the keyspace (see mod.rs).
-- Its chunk name marks its frames so error positions skip them, as they skip Redis's C.

local raw_call = ...

local G = _G
local error, select, setmetatable, tostring, type = error, select, setmetatable, tostring, type
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

redis.REDIS_VERSION, redis.REDIS_VERSION_NUM = '7.0.15', 0x07000f
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
math.random, math.randomseed = nil, nil
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
