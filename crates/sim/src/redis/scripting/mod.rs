//! `EVAL`, `EVALSHA` and `SCRIPT`: real Lua 5.1 (through mlua) running Redis 7.0's script
//! environment, so the simulator runs the very Lua files rein-redis ships.
//!
//! # Design
//!
//! One Lua state per node, created at start and kept until a restart, like Redis's. Compiled
//! scripts are cached by the SHA-1 of their text; `SCRIPT FLUSH` and a restart forget them,
//! which is what sends redis-rs down its `NOSCRIPT` → `SCRIPT LOAD` path.
//!
//! While a script runs, the node's [`Keyspace`] is moved into the Lua state's app data so that
//! `redis.call` (a Rust function) can reach it without a lock or a borrow across the Lua
//! boundary, and moved back when the script returns. A script therefore runs atomically
//! against the data, and sees one frozen `now` for expiry and `TIME`.
//!
//! Errors reproduce Redis's texts, including the ` script: <sha>, on @user_script:<line>.`
//! suffix: a message handler written in Rust finds the script's frame on the Lua stack the
//! way Redis's `__redis__err__handler` does, skipping C functions and the prelude's frames.
//!
//! # Not reproduced
//!
//! Redis's `cjson`, `cmsgpack`, `struct` and `bit` libraries, `math.random`'s rand48,
//! `redis.sha1hex`, `redis.status_reply`, `redis.log` and the other `redis` functions rein's
//! scripts do not use are absent (a script using them fails with "nonexistent global
//! variable" or "attempt to call a nil value"). Writes into library tables are refused only
//! for new names, not for existing ones. There is no script time limit: a script that loops
//! forever hangs the simulation. Redis 7.0.15 crashes on `error({})` (a table without
//! `err`); the simulator answers with an error instead.

mod convert;

use std::collections::BTreeMap;

use bytes::Bytes;
use mlua::chunk::ChunkMode;
use mlua::{Function, Lua, LuaOptions, LuaString, MultiValue, StdLib, Table, Value};
use rein_core::Timestamp;

use super::commands::{self, Context, is};
use super::keyspace::Keyspace;
use super::number::parse_i64;
use super::reply::Reply;

/// A node's script engine: the Lua state and the script cache.
pub struct Scripting {
    lua: Lua,
    /// The read-only global environment every script function runs in.
    script_env: Table,
    /// Lua's `xpcall`, used to run a script under [`Scripting::handler`].
    xpcall: Function,
    /// The message handler that records where an error was raised.
    handler: Function,
    /// Compiled scripts by lower-case hex SHA-1 of their source.
    cache: BTreeMap<String, Function>,
}

/// What `redis.call` reaches while a script runs; lives in the Lua state's app data.
struct Running {
    keyspace: Keyspace,
    now: Timestamp,
}

impl Scripting {
    /// A fresh Lua state with Redis's script environment, and an empty cache.
    pub fn new() -> mlua::Result<Self> {
        // Base (always loaded), table, string and math are what Redis opens; os, io,
        // package and debug would let scripts see the real machine.
        let lua = Lua::new_with(
            StdLib::TABLE | StdLib::STRING | StdLib::MATH,
            LuaOptions::new(),
        )?;

        let raw_call = lua.create_function(|lua, args: MultiValue| {
            let reply = match convert::command_args(&args) {
                Ok(args) => {
                    let mut running = lua
                        .app_data_mut::<Running>()
                        .ok_or_else(|| mlua::Error::runtime("redis.call outside a script"))?;
                    let Running { keyspace, now } = &mut *running;
                    commands::execute_from_script(
                        &mut Context {
                            keyspace,
                            now: *now,
                        },
                        &args,
                    )
                }
                Err(message) => Reply::error(format!("ERR {message}")),
            };
            let failed = reply.is_error();
            Ok((convert::reply_to_lua(lua, reply)?, failed))
        })?;
        let xpcall: Function = lua.globals().raw_get("xpcall")?;
        let tostring: Function = lua.globals().raw_get("tostring")?;
        let handler =
            lua.create_function(move |lua, error: Value| error_info(lua, &tostring, error))?;
        let script_env: Table = lua
            .load(PRELUDE)
            .set_name(PRELUDE_NAME)
            .set_mode(ChunkMode::Text)
            .call(raw_call)?;
        Ok(Self {
            lua,
            script_env,
            xpcall,
            handler,
            cache: BTreeMap::new(),
        })
    }

    /// Runs `EVAL`, `EVALSHA` or `SCRIPT` (subcommand and arity already checked) against `keyspace` at `now`.
    pub fn command(&mut self, keyspace: &mut Keyspace, now: Timestamp, args: &[Bytes]) -> Reply {
        let name = &args[0];
        if is(name, "script") {
            self.script_command(args)
        } else {
            self.eval(keyspace, now, args, is(name, "evalsha"))
        }
    }

    /// Compiles and caches `source`; its SHA-1 in hex.
    pub fn load(&mut self, source: &[u8]) -> Result<String, Reply> {
        let sha = sha1_smol::Sha1::from(source).digest().to_string();
        if !self.cache.contains_key(&sha) {
            let function = self
                .lua
                .load(source)
                .set_name(SCRIPT_NAME)
                .set_mode(ChunkMode::Text)
                .into_function()
                .map_err(|e| {
                    let message = match e {
                        mlua::Error::SyntaxError { message, .. } => message,
                        other => other.to_string(),
                    };
                    Reply::error(format!(
                        "ERR Error compiling script (new function): {message}"
                    ))
                })?;
            function
                .set_environment(self.script_env.clone())
                .map_err(|e| Reply::error(format!("ERR {e}")))?;
            self.cache.insert(sha.clone(), function);
        }
        Ok(sha)
    }

    fn script_command(&mut self, args: &[Bytes]) -> Reply {
        if is(&args[1], "load") {
            return self
                .load(&args[2])
                .map_or_else(|e| e, |sha| Reply::Bulk(sha.into()));
        } else if is(&args[1], "exists") {
            let cached = |sha: &Bytes| {
                let sha = String::from_utf8_lossy(sha).to_ascii_lowercase();
                Reply::Integer(i64::from(self.cache.contains_key(&sha)))
            };
            return Reply::Array(args[2..].iter().map(cached).collect());
        }
        match &args[2..] {
            [] => {}
            [mode] if is(mode, "sync") || is(mode, "async") => {}
            _ => return Reply::error("ERR SCRIPT FLUSH only support SYNC|ASYNC option"),
        }
        self.cache.clear();
        Reply::ok()
    }

    /// `EVAL script numkeys key... arg...` and `EVALSHA sha1 numkeys key... arg...`.
    fn eval(
        &mut self,
        keyspace: &mut Keyspace,
        now: Timestamp,
        args: &[Bytes],
        by_sha: bool,
    ) -> Reply {
        let Some(numkeys) = parse_i64(&args[2]) else {
            return Reply::error("ERR value is not an integer or out of range");
        };
        let rest = &args[3..];
        if numkeys > rest.len() as i64 {
            return Reply::error("ERR Number of keys can't be greater than number of args");
        }
        let Ok(numkeys) = usize::try_from(numkeys) else {
            return Reply::error("ERR Number of keys can't be negative");
        };
        let sha = if by_sha {
            String::from_utf8_lossy(&args[1]).to_ascii_lowercase()
        } else {
            match self.load(&args[1]) {
                Ok(sha) => sha,
                Err(reply) => return reply,
            }
        };
        let Some(function) = self.cache.get(&sha).cloned() else {
            return Reply::error("NOSCRIPT No matching script. Please use EVAL.");
        };
        let (keys, argv) = rest.split_at(numkeys);
        self.run(&function, &sha, keyspace, now, keys, argv)
    }

    fn run(
        &mut self,
        function: &Function,
        sha: &str,
        keyspace: &mut Keyspace,
        now: Timestamp,
        keys: &[Bytes],
        argv: &[Bytes],
    ) -> Reply {
        let set_arguments = || -> mlua::Result<()> {
            let globals = self.lua.globals();
            globals.raw_set("KEYS", self.sequence(keys)?)?;
            globals.raw_set("ARGV", self.sequence(argv)?)
        };
        if let Err(e) = set_arguments() {
            return Reply::error(format!("ERR Error running script {sha}: {e}"));
        }
        self.lua.set_app_data(Running {
            keyspace: std::mem::take(keyspace),
            now,
        });
        let outcome = self.xpcall.call::<(bool, Value)>((function, &self.handler));
        // The data always comes back: nothing else takes the app data out.
        if let Some(running) = self.lua.remove_app_data::<Running>() {
            *keyspace = running.keyspace;
        }
        match outcome {
            Ok((true, value)) => convert::lua_to_reply(value),
            Ok((false, error)) => script_error(error, sha),
            Err(e) => Reply::error(format!("ERR Error running script {sha}: {e}")),
        }
    }

    fn sequence(&self, items: &[Bytes]) -> mlua::Result<Table> {
        let table = self.lua.create_table_with_capacity(items.len(), 0)?;
        for (i, item) in items.iter().enumerate() {
            table.raw_set(i + 1, self.lua.create_string(item)?)?;
        }
        Ok(table)
    }
}

/// The message handler: turns whatever was raised into Redis's error table
/// `{err = "CODE message", source = ..., line = ...}`, locating the script frame that raised
/// it. Level 0 is this handler; C frames (`error`, library functions) and the prelude's own
/// frames (`redis.call`'s wrapper) are skipped, as Redis skips its C `redis.call`.
fn error_info(lua: &Lua, tostring: &Function, error: Value) -> mlua::Result<Table> {
    let table = match error {
        Value::Table(table) => table,
        other => {
            let text: LuaString = tostring.call(other)?;
            let mut message = b"ERR ".to_vec();
            message.extend_from_slice(&text.as_bytes());
            convert::single_field(lua, "err", &message)?
        }
    };
    for level in 1..MAX_FRAMES_SEARCHED {
        let frame = lua.inspect_stack(level, |frame| {
            let source = frame.source();
            let internal = source.what == "C" || source.source.as_deref() == Some(PRELUDE_NAME);
            (
                internal,
                source.source.map(|s| s.into_owned()),
                frame.current_line(),
            )
        });
        match frame {
            None => break,
            Some((true, _, _)) => continue,
            Some((false, source, line)) => {
                if let Some(source) = source {
                    table.raw_set("source", source)?;
                }
                if let Some(line) = line {
                    table.raw_set("line", line)?;
                }
                break;
            }
        }
    }
    Ok(table)
}

/// The reply for an error raised out of a script: its message and, when known, where.
fn script_error(error: Value, sha: &str) -> Reply {
    let Value::Table(table) = error else {
        return Reply::error(format!("ERR Error running script {sha}: non-table error"));
    };
    let mut message = match table.raw_get::<Value>("err") {
        Ok(Value::String(s)) => s.as_bytes().to_vec(),
        Ok(Value::Integer(n)) => n.to_string().into_bytes(),
        Ok(Value::Number(n)) => n.to_string().into_bytes(),
        _ => b"ERR script raised an error table without an 'err' field".to_vec(),
    };
    let source = table.raw_get::<Option<String>>("source").ok().flatten();
    let line = table.raw_get::<Option<i64>>("line").ok().flatten();
    if let (Some(source), Some(line)) = (source, line) {
        message.extend_from_slice(format!(" script: {sha}, on {source}:{line}.").as_bytes());
    }
    Reply::Error(Bytes::from(message))
}

/// Redis's chunk name for scripts: errors read `user_script:<line>: ...`.
const SCRIPT_NAME: &str = "@user_script";

/// The prelude's chunk name, which marks its frames for [`error_info`].
const PRELUDE_NAME: &str = "=rein_sim_prelude";

/// See prelude.lua.
const PRELUDE: &str = include_str!("prelude.lua");

/// How far up the stack the handler looks for the script's frame.
const MAX_FRAMES_SEARCHED: usize = 64;
