//! The command table: names, arities, where each command may run, and its implementation.
//!
//! Commands are plain functions from arguments to a [`Reply`] over a [`Context`] (the
//! keyspace and the time of this command), with no I/O, so a script's `redis.call` and a
//! client's request go through the same code. What differs between the two callers is only
//! what Redis 7.0 says when a command is unknown, has the wrong number of arguments or may
//! not run inside a script; [`resolve`] produces those errors for each.

mod client;
mod hashes;
mod keys;
mod server;
mod strings;

use bytes::Bytes;
use rein_core::Timestamp;

use super::keyspace::{Keyspace, WrongType};
use super::reply::Reply;

pub use client::Session;

/// What a data command sees.
pub struct Context<'a> {
    /// The database.
    pub keyspace: &'a mut Keyspace,
    /// The time of this command (for a script: of the whole script, as Redis freezes key
    /// expiry while a script runs).
    pub now: Timestamp,
}

impl Context<'_> {
    /// `now` in Unix milliseconds, the unit of Redis expiry times.
    pub fn now_ms(&self) -> i64 {
        i64::try_from(self.now.as_micros() / 1000).unwrap_or(i64::MAX)
    }
}

/// Who sent a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caller {
    /// A client connection (or an in-process [`super::Node::execute`]).
    Client,
    /// `redis.call` / `redis.pcall` inside a script.
    Script,
}

/// How a command is carried out.
#[derive(Clone, Copy)]
pub enum Kind {
    /// Reads or writes the keyspace only.
    Data(fn(&mut Context<'_>, &[Bytes]) -> Reply),
    /// `EVAL`, `EVALSHA`, `SCRIPT`: needs the script engine.
    Scripting,
    /// `CLIENT`: needs the connection's session.
    Client,
}

/// One row of the command table.
pub struct Spec {
    /// Lower-case name, as Redis 7.0 prints it in arity errors.
    pub name: &'static str,
    /// Redis's arity: `n` means exactly `n` arguments (name included), `-n` at least `n`.
    pub arity: i32,
    /// Whether scripts are refused this command (Redis's `noscript` flag).
    pub noscript: bool,
    /// The implementation.
    pub kind: Kind,
    /// For a container command (`SCRIPT`, `CLIENT`): its subcommands and their arities,
    /// which replace the container's once a subcommand is named.
    pub subcommands: &'static [(&'static str, i32)],
}

/// Finds the command for `args` and checks what Redis checks before running it, returning
/// the error reply Redis would send to this caller otherwise. `args` is not empty.
pub fn resolve(args: &[Bytes], caller: Caller) -> Result<&'static Spec, Reply> {
    let name = args.first().map(|a| &a[..]).unwrap_or_default();
    let Some(spec) = TABLE.iter().find(|spec| is(name, spec.name)) else {
        return Err(match caller {
            Caller::Client => unknown_command(args),
            Caller::Script => Reply::error("ERR Unknown Redis command called from script"),
        });
    };
    let (full_name, arity) = match (spec.subcommands, args.get(1)) {
        ([], _) | (_, None) => (spec.name.to_string(), spec.arity),
        (subcommands, Some(sub)) => match subcommands.iter().find(|(name, _)| is(sub, name)) {
            Some((sub_name, arity)) => (format!("{}|{sub_name}", spec.name), *arity),
            None => {
                return Err(match caller {
                    Caller::Client => Reply::error(format!(
                        "ERR unknown subcommand '{}'. Try {} HELP.",
                        String::from_utf8_lossy(sub),
                        spec.name.to_ascii_uppercase()
                    )),
                    Caller::Script => Reply::error("ERR Unknown Redis command called from script"),
                });
            }
        },
    };
    let argc = args.len();
    let arity_ok = match usize::try_from(arity) {
        Ok(exact) => argc == exact,
        Err(_) => argc >= arity.unsigned_abs() as usize,
    };
    if !arity_ok {
        return Err(match caller {
            Caller::Client => arity_error(&full_name),
            Caller::Script => {
                Reply::error("ERR Wrong number of args calling Redis command from script")
            }
        });
    }
    if caller == Caller::Script && spec.noscript {
        return Err(Reply::error(
            "ERR This Redis command is not allowed from script",
        ));
    }
    Ok(spec)
}

/// Runs a `redis.call` from a script: only data commands can pass [`resolve`] there.
pub fn execute_from_script(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    match resolve(args, Caller::Script) {
        Ok(Spec {
            kind: Kind::Data(run),
            ..
        }) => run(ctx, args),
        Ok(_) => Reply::error("ERR This Redis command is not allowed from script"),
        Err(reply) => reply,
    }
}

/// `ERR wrong number of arguments for '<name>' command`.
pub fn arity_error(name: &str) -> Reply {
    Reply::error(format!(
        "ERR wrong number of arguments for '{name}' command"
    ))
}

/// Redis's reply to an unknown command: the name as sent and up to 128 bytes of arguments.
fn unknown_command(args: &[Bytes]) -> Reply {
    let name = args.first().map(|a| &a[..]).unwrap_or_default();
    let name = String::from_utf8_lossy(&name[..name.len().min(128)]);
    let mut listed = String::new();
    for arg in args.iter().skip(1) {
        if listed.len() >= 128 {
            break;
        }
        let room = 128 - listed.len();
        let arg = String::from_utf8_lossy(&arg[..arg.len().min(room)]);
        listed.push_str(&format!("'{arg}' "));
    }
    Reply::error(format!(
        "ERR unknown command '{name}', with args beginning with: {listed}"
    ))
}

fn wrong_type() -> Reply {
    Reply::error("WRONGTYPE Operation against a key holding the wrong kind of value")
}

fn not_an_integer() -> Reply {
    Reply::error("ERR value is not an integer or out of range")
}

fn syntax_error() -> Reply {
    Reply::error("ERR syntax error")
}

impl From<WrongType> for Reply {
    fn from(_: WrongType) -> Self {
        wrong_type()
    }
}

/// Whether `arg` spells `word`, ignoring ASCII case (Redis's `strcasecmp`).
pub fn is(arg: &[u8], word: &str) -> bool {
    arg.eq_ignore_ascii_case(word.as_bytes())
}

/// Redis 7.0's table for the commands the simulator implements.
static TABLE: &[Spec] = &[
    data("ping", -1, server::ping),
    data("echo", 2, server::echo),
    data("time", 1, server::time),
    data("select", 2, server::select),
    data("dbsize", 1, server::dbsize),
    data("flushall", -1, server::flush),
    data("flushdb", -1, server::flush),
    data("get", 2, strings::get),
    data("set", -3, strings::set),
    data("incr", 2, strings::incr),
    data("decr", 2, strings::decr),
    data("incrby", 3, strings::incrby),
    data("decrby", 3, strings::decrby),
    data("del", -2, keys::del),
    data("exists", -2, keys::exists),
    data("type", 2, keys::type_of),
    data("expire", -3, keys::expire),
    data("pexpire", -3, keys::pexpire),
    data("expireat", -3, keys::expireat),
    data("pexpireat", -3, keys::pexpireat),
    data("ttl", 2, keys::ttl),
    data("pttl", 2, keys::pttl),
    data("persist", 2, keys::persist),
    data("hget", 3, hashes::hget),
    data("hmget", -3, hashes::hmget),
    data("hset", -4, hashes::hset),
    data("hmset", -4, hashes::hmset),
    data("hgetall", 2, hashes::hgetall),
    data("hdel", -3, hashes::hdel),
    data("hincrby", 4, hashes::hincrby),
    data("hlen", 2, hashes::hlen),
    data("hexists", 3, hashes::hexists),
    Spec {
        name: "eval",
        arity: -3,
        noscript: true,
        kind: Kind::Scripting,
        subcommands: &[],
    },
    Spec {
        name: "evalsha",
        arity: -3,
        noscript: true,
        kind: Kind::Scripting,
        subcommands: &[],
    },
    Spec {
        name: "script",
        arity: -2,
        noscript: true,
        kind: Kind::Scripting,
        subcommands: &[("load", 3), ("exists", -3), ("flush", -2)],
    },
    Spec {
        name: "client",
        arity: -2,
        noscript: true,
        kind: Kind::Client,
        subcommands: &[("setname", 3), ("getname", 2), ("setinfo", 4)],
    },
];

const fn data(
    name: &'static str,
    arity: i32,
    run: fn(&mut Context<'_>, &[Bytes]) -> Reply,
) -> Spec {
    Spec {
        name,
        arity,
        noscript: false,
        kind: Kind::Data(run),
        subcommands: &[],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn run(ks: &mut Keyspace, now_ms: u64, args: &[&str]) -> Reply {
        let args: Vec<Bytes> = args
            .iter()
            .map(|a| Bytes::copy_from_slice(a.as_bytes()))
            .collect();
        let mut ctx = Context {
            keyspace: ks,
            now: Timestamp::from_micros(now_ms * 1000),
        };
        match resolve(&args, Caller::Client) {
            Ok(Spec {
                kind: Kind::Data(run),
                ..
            }) => run(&mut ctx, &args),
            Ok(_) => panic!("not a data command"),
            Err(reply) => reply,
        }
    }

    #[test]
    fn unknown_commands_and_arity_errors_read_like_redis_7() {
        let mut ks = Keyspace::default();
        assert_eq!(
            run(&mut ks, 0, &["NOSUCH", "a", "b"]),
            Reply::error("ERR unknown command 'NOSUCH', with args beginning with: 'a' 'b' ")
        );
        assert_eq!(
            run(&mut ks, 0, &["get"]),
            Reply::error("ERR wrong number of arguments for 'get' command")
        );
        let args = [Bytes::from_static(b"hset"), Bytes::from_static(b"k")];
        assert_eq!(
            resolve(&args, Caller::Script).err(),
            Some(Reply::error(
                "ERR Wrong number of args calling Redis command from script"
            ))
        );
        let args = [
            Bytes::from_static(b"EVAL"),
            Bytes::from_static(b"return 1"),
            Bytes::from_static(b"0"),
        ];
        assert_eq!(
            resolve(&args, Caller::Script).err(),
            Some(Reply::error(
                "ERR This Redis command is not allowed from script"
            ))
        );
    }
}
