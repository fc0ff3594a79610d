//! The command table and the commands: plain functions from arguments to a [`Reply`] over a
//! [`Context`] (the keyspace and the time of this command), with no I/O, so a script's
//! `redis.call` and a client's request go through the same code. What differs between the
//! two callers is only what Redis 7.0 says when a command is unknown, has the wrong number
//! of arguments or may not run inside a script; [`resolve`] produces those errors for each.
//!
//! Only what rein's scripts (the rate-lease script's `HSET` and `PEXPIRE` included, and the
//! overrides' `HGET`, `HEXISTS`, `HLEN`, `HDEL` and `PUBLISH` in `admin.lua`), its
//! store, the naive baseline and the simulator's tests send is here; options those never use (`SET NX`, `EX`, ...) are a syntax error.

use bytes::Bytes;
use rein_core::Timestamp;

use super::hash::Hash;
use super::keyspace::{Keyspace, Value, WrongType};
use super::number::parse_i64;
use super::reply::Reply;

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
    fn now_ms(&self) -> i64 {
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

/// How a command is carried out: over the keyspace, or (`EVAL`, `EVALSHA`, `SCRIPT`) by the
/// script engine.
pub type Kind = Option<fn(&mut Context<'_>, &[Bytes]) -> Reply>;

/// One row of the command table.
pub struct Spec {
    /// Lower-case name, as Redis 7.0 prints it in arity errors.
    name: &'static str,
    /// Redis's arity: `n` means exactly `n` arguments (name included), `-n` at least `n`.
    arity: i32,
    /// The implementation; `None` for the scripting commands.
    pub kind: Kind,
    /// For a container command (`SCRIPT`, `CLIENT`): its subcommands and their arities.
    /// Containers and scripting commands are refused to scripts (Redis's `noscript`).
    subcommands: &'static [(&'static str, i32)],
}

/// Finds the command for `args` and checks what Redis checks before running it, returning
/// the error reply Redis would send to this caller otherwise. `args` is not empty.
pub fn resolve(args: &[Bytes], caller: Caller) -> Result<&'static Spec, Reply> {
    let from_script = caller == Caller::Script;
    let unknown = || Reply::error("ERR Unknown Redis command called from script");
    let Some(spec) = TABLE.iter().find(|spec| is(&args[0], spec.name)) else {
        return Err(if from_script {
            unknown()
        } else {
            unknown_command(args)
        });
    };
    let (name, arity) = match (spec.subcommands, args.get(1)) {
        ([], _) | (_, None) => (spec.name.to_string(), spec.arity),
        (subcommands, Some(sub)) => match subcommands.iter().find(|(name, _)| is(sub, name)) {
            Some((sub_name, arity)) => (format!("{}|{sub_name}", spec.name), *arity),
            None if from_script => return Err(unknown()),
            None => {
                let (sub, name) = (String::from_utf8_lossy(sub), spec.name.to_uppercase());
                let message = format!("ERR unknown subcommand '{sub}'. Try {name} HELP.");
                return Err(Reply::error(message));
            }
        },
    };
    let argc = args.len();
    let arity_ok = match usize::try_from(arity) {
        Ok(exact) => argc == exact,
        Err(_) => argc >= arity.unsigned_abs() as usize,
    };
    if !arity_ok && from_script {
        return Err(Reply::error(
            "ERR Wrong number of args calling Redis command from script",
        ));
    } else if !arity_ok {
        return Err(arity_error(&name));
    }
    if from_script && (spec.kind.is_none() || !spec.subcommands.is_empty()) {
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
            kind: Some(run), ..
        }) => run(ctx, args),
        Ok(_) => Reply::error("ERR This Redis command is not allowed from script"),
        Err(reply) => reply,
    }
}

/// `ERR wrong number of arguments for '<name>' command`.
fn arity_error(name: &str) -> Reply {
    Reply::error(format!(
        "ERR wrong number of arguments for '{name}' command"
    ))
}

/// Redis's reply to an unknown command: the name as sent and up to 128 bytes of arguments.
fn unknown_command(args: &[Bytes]) -> Reply {
    let name = String::from_utf8_lossy(&args[0][..args[0].len().min(128)]);
    let mut listed = String::new();
    for arg in &args[1..] {
        if listed.len() >= 128 {
            break;
        }
        let room = 128 - listed.len();
        listed.push_str(&format!(
            "'{}' ",
            String::from_utf8_lossy(&arg[..arg.len().min(room)])
        ));
    }
    Reply::error(format!(
        "ERR unknown command '{name}', with args beginning with: {listed}"
    ))
}

fn syntax_error() -> Reply {
    Reply::error("ERR syntax error")
}

impl From<WrongType> for Reply {
    fn from(_: WrongType) -> Self {
        Reply::error("WRONGTYPE Operation against a key holding the wrong kind of value")
    }
}

/// Whether `arg` spells `word`, ignoring ASCII case (Redis's `strcasecmp`).
pub fn is(arg: &[u8], word: &str) -> bool {
    arg.eq_ignore_ascii_case(word.as_bytes())
}

fn ping(_: &mut Context<'_>, args: &[Bytes]) -> Reply {
    match args {
        [_] => Reply::status("PONG"),
        [_, message] => Reply::Bulk(message.clone()),
        _ => arity_error("ping"),
    }
}

/// The injected clock, as Redis's `[unix seconds, microseconds]`.
fn time(ctx: &mut Context<'_>, _: &[Bytes]) -> Reply {
    let micros = ctx.now.as_micros();
    let part = |n: u64| Reply::Bulk(Bytes::from(n.to_string()));
    Reply::Array(vec![part(micros / 1_000_000), part(micros % 1_000_000)])
}

fn dbsize(ctx: &mut Context<'_>, _: &[Bytes]) -> Reply {
    let now_ms = ctx.now_ms();
    Reply::Integer(ctx.keyspace.len(now_ms) as i64)
}

/// `FLUSHALL [ASYNC|SYNC]`.
fn flushall(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    match &args[1..] {
        [] => {}
        [mode] if is(mode, "async") || is(mode, "sync") => {}
        _ => return syntax_error(),
    }
    ctx.keyspace.flush();
    Reply::ok()
}

/// `CLIENT SETNAME name` (checked, not kept) and `CLIENT SETINFO` (OK, as Redis 7.2 answers).
fn client(_: &mut Context<'_>, args: &[Bytes]) -> Reply {
    if is(&args[1], "setname") && args[2].iter().any(|&b| !(b'!'..=b'~').contains(&b)) {
        return Reply::error(
            "ERR Client names cannot contain spaces, newlines or special characters.",
        );
    }
    Reply::ok()
}

fn get(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    let now_ms = ctx.now_ms();
    match ctx.keyspace.value(&args[1], now_ms) {
        None => Reply::Nil,
        Some(Value::String(s)) => Reply::Bulk(s.clone()),
        Some(_) => WrongType.into(),
    }
}

/// `SET key value [PX ms]`, with Redis's `getExpireMillisecondsOrReply` checks.
fn set(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    let now_ms = ctx.now_ms();
    let expires_at_ms = match &args[3..] {
        [] => None,
        [px, ms] if is(px, "px") => match parse_i64(ms) {
            None => return Reply::error("ERR value is not an integer or out of range"),
            Some(ms) => match ms.checked_add(now_ms).filter(|_| ms > 0) {
                None => return Reply::error("ERR invalid expire time in 'set' command"),
                at => at,
            },
        },
        _ => return syntax_error(),
    };
    let value = Value::String(args[2].clone());
    ctx.keyspace.insert(args[1].clone(), value, expires_at_ms);
    Reply::ok()
}

/// `INCRBY key increment`: the new value. A missing key counts from 0 and gets no TTL; an
/// existing key keeps its TTL, as in Redis.
fn incrby(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    let now_ms = ctx.now_ms();
    let Some(increment) = parse_i64(&args[2]) else {
        return Reply::error("ERR value is not an integer or out of range");
    };
    match ctx.keyspace.value(&args[1], now_ms) {
        None => {
            let value = Value::String(Bytes::from(increment.to_string()));
            ctx.keyspace.insert(args[1].clone(), value, None);
            Reply::Integer(increment)
        }
        Some(Value::String(s)) => {
            let Some(current) = parse_i64(s) else {
                return Reply::error("ERR value is not an integer or out of range");
            };
            let Some(new) = current.checked_add(increment) else {
                return Reply::error("ERR increment or decrement would overflow");
            };
            *s = Bytes::from(new.to_string());
            Reply::Integer(new)
        }
        Some(_) => WrongType.into(),
    }
}

fn del(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    let now_ms = ctx.now_ms();
    let deleted = args[1..]
        .iter()
        .filter(|key| ctx.keyspace.remove(key, now_ms))
        .count();
    Reply::Integer(deleted as i64)
}

/// `HMSET key field value [field value ...]`; an odd pair count is its own arity error.
fn hmset(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    set_fields(ctx, args, "hmset").map_or_else(|error| error, |_| Reply::ok())
}

/// `HSET key field value [field value ...]`: the number of fields that are new.
fn hset(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    set_fields(ctx, args, "hset").map_or_else(|error| error, |added| Reply::Integer(added as i64))
}

/// Sets the field-value pairs after `args[1]` in the hash at `args[1]` (created if
/// missing), for `command` (`HSET`, `HMSET`): how many fields were new, or the error reply
/// (an odd pair count is its arity error).
fn set_fields(ctx: &mut Context<'_>, args: &[Bytes], command: &str) -> Result<usize, Reply> {
    if args.len() % 2 == 1 {
        return Err(arity_error(command));
    }
    let now_ms = ctx.now_ms();
    let hash = ctx.keyspace.hash_or_create(&args[1], now_ms)?;
    Ok(args[2..]
        .chunks_exact(2)
        .filter(|p| hash.set(&p[0], &p[1]))
        .count())
}

/// `PEXPIRE key ms`: 1 if the key exists (deleted at once for a time not in the future),
/// else 0. The `NX`/`XX`/`GT`/`LT` options are not kept.
fn pexpire(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    if let Some(option) = args.get(3) {
        let option = String::from_utf8_lossy(option);
        return Reply::error(format!("ERR Unsupported option {option}"));
    }
    let now_ms = ctx.now_ms();
    let Some(ms) = parse_i64(&args[2]) else {
        return Reply::error("ERR value is not an integer or out of range");
    };
    let Some(at_ms) = ms.checked_add(now_ms) else {
        return Reply::error("ERR invalid expire time in 'pexpire' command");
    };
    Reply::Integer(i64::from(ctx.keyspace.expire_at(&args[1], at_ms, now_ms)))
}

/// `HGETALL key`: fields and values in insertion order.
fn hgetall(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    let now_ms = ctx.now_ms();
    match ctx.keyspace.value(&args[1], now_ms) {
        None => Reply::Array(Vec::new()),
        Some(Value::Hash(hash)) => Reply::Array(
            hash.iter()
                .flat_map(|(f, v)| [Reply::Bulk(f.clone()), Reply::Bulk(v.clone())])
                .collect(),
        ),
        Some(_) => WrongType.into(),
    }
}

/// The hash at `key` for a command that only reads it: `Ok(None)` for no key.
fn read_hash<'a>(ctx: &'a mut Context<'_>, key: &[u8]) -> Result<Option<&'a Hash>, WrongType> {
    let now_ms = ctx.now_ms();
    match ctx.keyspace.value(key, now_ms) {
        None => Ok(None),
        Some(Value::Hash(hash)) => Ok(Some(hash)),
        Some(_) => Err(WrongType),
    }
}

/// `HGET key field`: the value, or nil for no such field or key.
fn hget(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    match read_hash(ctx, &args[1]) {
        Ok(hash) => hash
            .and_then(|h| h.get(&args[2]))
            .map_or(Reply::Nil, |v| Reply::Bulk(v.clone())),
        Err(wrong) => wrong.into(),
    }
}

/// `HEXISTS key field`: 1 if the hash has the field, else 0.
fn hexists(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    match read_hash(ctx, &args[1]) {
        Ok(hash) => Reply::Integer(i64::from(hash.is_some_and(|h| h.get(&args[2]).is_some()))),
        Err(wrong) => wrong.into(),
    }
}

/// `HLEN key`: how many fields, 0 for no key.
fn hlen(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    match read_hash(ctx, &args[1]) {
        Ok(hash) => Reply::Integer(hash.map_or(0, Hash::len) as i64),
        Err(wrong) => wrong.into(),
    }
}

/// `HDEL key field [field ...]`: how many of the fields were there. A hash left empty is
/// deleted, as Redis deletes it.
fn hdel(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    let now_ms = ctx.now_ms();
    let (deleted, empty) = match ctx.keyspace.value(&args[1], now_ms) {
        None => return Reply::Integer(0),
        Some(Value::Hash(hash)) => {
            let deleted = args[2..].iter().filter(|f| hash.remove(f)).count();
            (deleted, hash.is_empty())
        }
        Some(_) => return WrongType.into(),
    };
    if empty {
        ctx.keyspace.remove(&args[1], now_ms);
    }
    Reply::Integer(deleted as i64)
}

/// `PUBLISH channel message`: how many clients received it, always 0 here, since the
/// simulated Redis has no `SUBSCRIBE` (a simulated node never subscribes: it re-reads what
/// it caches at its staleness instead).
fn publish(_: &mut Context<'_>, _: &[Bytes]) -> Reply {
    Reply::Integer(0)
}

/// Redis 7.0's table for the commands the simulator implements.
static TABLE: &[Spec] = &[
    data("ping", -1, ping),
    data("time", 1, time),
    data("dbsize", 1, dbsize),
    data("flushall", -1, flushall),
    data("get", 2, get),
    data("set", -3, set),
    data("del", -2, del),
    data("incrby", 3, incrby),
    data("hmset", -4, hmset),
    data("hset", -4, hset),
    data("hgetall", 2, hgetall),
    data("hget", 3, hget),
    data("hexists", 3, hexists),
    data("hlen", 2, hlen),
    data("hdel", -3, hdel),
    data("publish", 3, publish),
    data("pexpire", -3, pexpire),
    scripting("eval", -3, &[]),
    scripting("evalsha", -3, &[]),
    scripting("script", -2, &[("load", 3), ("exists", -3), ("flush", -2)]),
    Spec {
        name: "client",
        arity: -2,
        kind: Some(client),
        subcommands: &[("setname", 3), ("setinfo", 4)],
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
        kind: Some(run),
        subcommands: &[],
    }
}

const fn scripting(
    name: &'static str,
    arity: i32,
    subcommands: &'static [(&'static str, i32)],
) -> Spec {
    Spec {
        name,
        arity,
        kind: None,
        subcommands,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(ks: &mut Keyspace, now_ms: u64, args: &[&str]) -> Reply {
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
                kind: Some(run), ..
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
        assert_eq!(run(&mut ks, 0, &["get"]), arity_error("get"));
        assert_eq!(run(&mut ks, 0, &["PING", "a", "b"]), arity_error("ping"));
        // From a script: a wrong arity, and a command scripts may not call.
        let refused: [(&[&'static [u8]], &str); 2] = [
            (
                &[b"get", b"k", b"x"],
                "ERR Wrong number of args calling Redis command from script",
            ),
            (
                &[b"EVAL", b"return 1", b"0"],
                "ERR This Redis command is not allowed from script",
            ),
        ];
        for (args, error) in refused {
            let args: Vec<Bytes> = args.iter().map(|a| Bytes::from_static(a)).collect();
            assert_eq!(
                resolve(&args, Caller::Script).err(),
                Some(Reply::error(error))
            );
        }
    }

    #[test]
    fn set_with_px_expires_after_its_millisecond() {
        let mut ks = Keyspace::default();
        assert_eq!(
            run(&mut ks, 1_000, &["SET", "k", "v", "px", "100"]),
            Reply::ok()
        );
        assert_eq!(run(&mut ks, 1_100, &["GET", "k"]), Reply::bulk("v"));
        assert_eq!(run(&mut ks, 1_101, &["GET", "k"]), Reply::Nil);
        assert_eq!(run(&mut ks, 0, &["SET", "k", "v", "NX"]), syntax_error());
        assert_eq!(
            run(&mut ks, 0, &["SET", "k", "w", "PX", "0"]),
            Reply::error("ERR invalid expire time in 'set' command")
        );
        assert_eq!(run(&mut ks, 0, &["DEL", "k", "k"]), Reply::Integer(0));
    }

    #[test]
    fn incrby_counts_from_zero_and_keeps_the_ttl() {
        let mut ks = Keyspace::default();
        assert_eq!(run(&mut ks, 0, &["INCRBY", "n", "5"]), Reply::Integer(5));
        assert_eq!(
            run(&mut ks, 0, &["SET", "k", "7", "PX", "100"]),
            Reply::ok()
        );
        assert_eq!(run(&mut ks, 50, &["INCRBY", "k", "-9"]), Reply::Integer(-2));
        assert_eq!(run(&mut ks, 100, &["GET", "k"]), Reply::bulk("-2"));
        assert_eq!(run(&mut ks, 101, &["GET", "k"]), Reply::Nil);
        assert_eq!(run(&mut ks, 101, &["GET", "n"]), Reply::bulk("5"));
        let not_integer = Reply::error("ERR value is not an integer or out of range");
        assert_eq!(run(&mut ks, 0, &["SET", "s", "1:2"]), Reply::ok());
        assert_eq!(run(&mut ks, 0, &["INCRBY", "s", "1"]), not_integer);
        assert_eq!(run(&mut ks, 0, &["INCRBY", "n", "x"]), not_integer);
        let max = i64::MAX.to_string();
        assert_eq!(
            run(&mut ks, 0, &["INCRBY", "n", max.as_str()]),
            Reply::error("ERR increment or decrement would overflow")
        );
        assert_eq!(run(&mut ks, 0, &["GET", "n"]), Reply::bulk("5"));
    }

    #[test]
    fn hashes_keep_insertion_order_and_types_are_checked() {
        let mut ks = Keyspace::default();
        assert_eq!(
            run(&mut ks, 0, &["HMSET", "h", "b", "1", "a", "2"]),
            Reply::ok()
        );
        assert_eq!(run(&mut ks, 0, &["HMSET", "h", "b", "3"]), Reply::ok());
        let all = ["b", "3", "a", "2"].map(Reply::bulk).to_vec();
        assert_eq!(run(&mut ks, 0, &["HGETALL", "h"]), Reply::Array(all));
        assert_eq!(
            run(&mut ks, 0, &["HMSET", "h", "odd"]),
            arity_error("hmset")
        );
        assert!(run(&mut ks, 0, &["GET", "h"]).error_code() == Some(b"WRONGTYPE"));
        assert_eq!(
            run(&mut ks, 1_700_000_000_123, &["TIME"]),
            Reply::Array(vec![Reply::bulk("1700000000"), Reply::bulk("123000")])
        );
    }

    #[test]
    fn hash_reads_and_deletes_read_like_redis_7() {
        let mut ks = Keyspace::default();
        assert_eq!(run(&mut ks, 0, &["HGET", "h", "a"]), Reply::Nil);
        assert_eq!(run(&mut ks, 0, &["HEXISTS", "h", "a"]), Reply::Integer(0));
        assert_eq!(run(&mut ks, 0, &["HLEN", "h"]), Reply::Integer(0));
        assert_eq!(run(&mut ks, 0, &["HDEL", "h", "a"]), Reply::Integer(0));
        assert_eq!(
            run(&mut ks, 0, &["HSET", "h", "a", "1", "b", "2", "c", "3"]),
            Reply::Integer(3)
        );
        assert_eq!(run(&mut ks, 0, &["HGET", "h", "b"]), Reply::bulk("2"));
        assert_eq!(run(&mut ks, 0, &["HGET", "h", "z"]), Reply::Nil);
        assert_eq!(run(&mut ks, 0, &["HEXISTS", "h", "c"]), Reply::Integer(1));
        assert_eq!(run(&mut ks, 0, &["HLEN", "h"]), Reply::Integer(3));
        // A field named twice is deleted once.
        assert_eq!(
            run(&mut ks, 0, &["HDEL", "h", "b", "b", "z"]),
            Reply::Integer(1)
        );
        let rest = ["a", "1", "c", "3"].map(Reply::bulk).to_vec();
        assert_eq!(run(&mut ks, 0, &["HGETALL", "h"]), Reply::Array(rest));
        // The last field's deletion deletes the key.
        assert_eq!(run(&mut ks, 0, &["HDEL", "h", "a", "c"]), Reply::Integer(2));
        assert_eq!(run(&mut ks, 0, &["DBSIZE"]), Reply::Integer(0));
        assert_eq!(run(&mut ks, 0, &["SET", "s", "v"]), Reply::ok());
        for command in [
            &["HGET", "s", "a"][..],
            &["HEXISTS", "s", "a"],
            &["HLEN", "s"],
            &["HDEL", "s", "a"],
        ] {
            assert_eq!(
                run(&mut ks, 0, command).error_code(),
                Some(&b"WRONGTYPE"[..]),
                "{command:?}"
            );
        }
        assert_eq!(run(&mut ks, 0, &["HGET", "h"]), arity_error("hget"));
        assert_eq!(run(&mut ks, 0, &["HEXISTS", "h"]), arity_error("hexists"));
        assert_eq!(run(&mut ks, 0, &["HLEN", "h", "a"]), arity_error("hlen"));
        assert_eq!(run(&mut ks, 0, &["HDEL", "h"]), arity_error("hdel"));
    }

    #[test]
    fn publish_reaches_no_subscriber() {
        let mut ks = Keyspace::default();
        assert_eq!(run(&mut ks, 0, &["PUBLISH", "c", "1"]), Reply::Integer(0));
        assert_eq!(run(&mut ks, 0, &["PUBLISH", "c"]), arity_error("publish"));
        assert_eq!(run(&mut ks, 0, &["DBSIZE"]), Reply::Integer(0));
    }
}
