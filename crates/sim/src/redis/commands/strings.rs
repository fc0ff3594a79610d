//! String commands: `GET`, `SET` and the integer counters.
//!
//! The order of checks follows Redis 7.0's `t_string.c` (options, then expire value, then
//! the key's type, then NX/XX), because which error wins is visible to a client.

use bytes::Bytes;

use super::super::keyspace::Value;
use super::super::number::parse_i64;
use super::{Context, Reply, is, not_an_integer, syntax_error};

pub fn get(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    let now_ms = ctx.now_ms();
    match ctx.keyspace.string(&args[1], now_ms) {
        Ok(Some(value)) => Reply::Bulk(value.clone()),
        Ok(None) => Reply::Nil,
        Err(wrong) => wrong.into(),
    }
}

/// `SET key value [NX|XX] [GET] [EX s|PX ms|EXAT s|PXAT ms|KEEPTTL]`.
pub fn set(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    let options = match SetOptions::parse(&args[3..]) {
        Ok(options) => options,
        Err(reply) => return reply,
    };
    let now_ms = ctx.now_ms();
    let expires_at_ms = match options.expire {
        None => None,
        Some((unit, ref value)) => match expire_at(unit, value, now_ms) {
            Ok(at) => Some(at),
            Err(reply) => return reply,
        },
    };
    let key = &args[1];
    let old = match ctx.keyspace.value(key, now_ms) {
        None => None,
        Some(Value::String(s)) => Some(Some(s.clone())),
        Some(_) if options.get => return super::wrong_type(),
        Some(_) => Some(None),
    };
    let found = old.is_some();
    let get_reply = || match &old {
        Some(Some(s)) => Reply::Bulk(s.clone()),
        _ => Reply::Nil,
    };
    if (options.nx && found) || (options.xx && !found) {
        return if options.get { get_reply() } else { Reply::Nil };
    }
    let value = Value::String(args[2].clone());
    if options.keep_ttl {
        ctx.keyspace.replace_value(key, value, now_ms);
    } else {
        ctx.keyspace.insert(key.clone(), value);
    }
    if let Some(at) = expires_at_ms {
        ctx.keyspace.set_expiry(key, Some(at), now_ms);
    }
    if options.get {
        get_reply()
    } else {
        Reply::ok()
    }
}

pub fn incr(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    add_to_counter(ctx, &args[1], 1)
}

pub fn decr(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    add_to_counter(ctx, &args[1], -1)
}

pub fn incrby(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    match parse_i64(&args[2]) {
        Some(by) => add_to_counter(ctx, &args[1], by),
        None => not_an_integer(),
    }
}

pub fn decrby(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    match parse_i64(&args[2]) {
        Some(i64::MIN) => Reply::error("ERR decrement would overflow"),
        Some(by) => add_to_counter(ctx, &args[1], -by),
        None => not_an_integer(),
    }
}

/// Redis's `incrDecrCommand`: a missing key counts as 0, and the key keeps its expiry.
fn add_to_counter(ctx: &mut Context<'_>, key: &Bytes, by: i64) -> Reply {
    let now_ms = ctx.now_ms();
    let current = match ctx.keyspace.string(key, now_ms) {
        Ok(None) => 0,
        Ok(Some(text)) => match parse_i64(text) {
            Some(n) => n,
            None => return not_an_integer(),
        },
        Err(wrong) => return wrong.into(),
    };
    let Some(next) = current.checked_add(by) else {
        return Reply::error("ERR increment or decrement would overflow");
    };
    ctx.keyspace
        .replace_value(key, Value::String(Bytes::from(next.to_string())), now_ms);
    Reply::Integer(next)
}

/// The unit of a `SET` expiry option.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ExpireUnit {
    /// `EX`: seconds from now.
    Seconds,
    /// `PX`: milliseconds from now.
    Millis,
    /// `EXAT`: Unix seconds.
    UnixSeconds,
    /// `PXAT`: Unix milliseconds.
    UnixMillis,
}

#[derive(Default)]
struct SetOptions {
    nx: bool,
    xx: bool,
    get: bool,
    keep_ttl: bool,
    expire: Option<(ExpireUnit, Bytes)>,
}

impl SetOptions {
    /// Redis's `parseExtendedStringArgumentsOrReply` for `SET`: each option is refused once
    /// a conflicting one was seen, and a repeated expiry option replaces the earlier one.
    fn parse(options: &[Bytes]) -> Result<Self, Reply> {
        let mut parsed = SetOptions::default();
        let mut i = 0;
        while i < options.len() {
            let opt = &options[i][..];
            let next = options.get(i + 1);
            let unit = parsed.expire.as_ref().map(|(unit, _)| *unit);
            let expire_allowed = |this: ExpireUnit| {
                !parsed.keep_ttl && unit.is_none_or(|u| u == this) && next.is_some()
            };
            if is(opt, "nx") && !parsed.xx {
                parsed.nx = true;
            } else if is(opt, "xx") && !parsed.nx {
                parsed.xx = true;
            } else if is(opt, "get") {
                parsed.get = true;
            } else if is(opt, "keepttl") && unit.is_none() {
                parsed.keep_ttl = true;
            } else if let Some(this) = expire_option(opt).filter(|&u| expire_allowed(u)) {
                parsed.expire = next.map(|value| (this, value.clone()));
                i += 1;
            } else {
                return Err(syntax_error());
            }
            i += 1;
        }
        Ok(parsed)
    }
}

fn expire_option(opt: &[u8]) -> Option<ExpireUnit> {
    if is(opt, "ex") {
        Some(ExpireUnit::Seconds)
    } else if is(opt, "px") {
        Some(ExpireUnit::Millis)
    } else if is(opt, "exat") {
        Some(ExpireUnit::UnixSeconds)
    } else if is(opt, "pxat") {
        Some(ExpireUnit::UnixMillis)
    } else {
        None
    }
}

/// Redis's `getExpireMillisecondsOrReply`: positive values only, absolute Unix ms out.
fn expire_at(unit: ExpireUnit, value: &[u8], now_ms: i64) -> Result<i64, Reply> {
    let invalid = || Reply::error("ERR invalid expire time in 'set' command");
    let value = parse_i64(value).ok_or_else(not_an_integer)?;
    if value <= 0 {
        return Err(invalid());
    }
    let millis = match unit {
        ExpireUnit::Seconds | ExpireUnit::UnixSeconds => value.checked_mul(1000),
        ExpireUnit::Millis | ExpireUnit::UnixMillis => Some(value),
    }
    .ok_or_else(invalid)?;
    match unit {
        ExpireUnit::Seconds | ExpireUnit::Millis => millis.checked_add(now_ms).ok_or_else(invalid),
        ExpireUnit::UnixSeconds | ExpireUnit::UnixMillis => Ok(millis),
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::keyspace::Keyspace;
    use super::super::tests::run;
    use super::*;

    #[test]
    fn set_with_px_expires_and_nx_xx_gate_the_write() {
        let mut ks = Keyspace::default();
        assert_eq!(
            run(&mut ks, 1_000, &["SET", "k", "v", "PX", "100"]),
            Reply::ok()
        );
        assert_eq!(run(&mut ks, 1_100, &["GET", "k"]), Reply::bulk("v"));
        assert_eq!(run(&mut ks, 1_101, &["GET", "k"]), Reply::Nil);
        assert_eq!(run(&mut ks, 0, &["SET", "k", "v", "XX"]), Reply::Nil);
        assert_eq!(run(&mut ks, 0, &["SET", "k", "v", "NX"]), Reply::ok());
        assert_eq!(
            run(&mut ks, 0, &["SET", "k", "w", "NX", "GET"]),
            Reply::bulk("v")
        );
        assert_eq!(
            run(&mut ks, 0, &["SET", "k", "w", "NX", "XX"]),
            syntax_error()
        );
        assert_eq!(
            run(&mut ks, 0, &["SET", "k", "w", "PX", "0"]),
            Reply::error("ERR invalid expire time in 'set' command")
        );
    }

    #[test]
    fn counters_reject_non_integers_and_overflow() {
        let mut ks = Keyspace::default();
        assert_eq!(run(&mut ks, 0, &["INCRBY", "n", "5"]), Reply::Integer(5));
        assert_eq!(run(&mut ks, 0, &["DECR", "n"]), Reply::Integer(4));
        assert_eq!(run(&mut ks, 0, &["INCRBY", "n", "+1"]), not_an_integer());
        assert_eq!(
            run(&mut ks, 0, &["SET", "n", "9223372036854775807"]),
            Reply::ok()
        );
        assert_eq!(
            run(&mut ks, 0, &["INCR", "n"]),
            Reply::error("ERR increment or decrement would overflow")
        );
        assert_eq!(
            run(&mut ks, 0, &["DECRBY", "n", "-9223372036854775808"]),
            Reply::error("ERR decrement would overflow")
        );
        assert_eq!(run(&mut ks, 0, &["HSET", "h", "f", "1"]), Reply::Integer(1));
        assert_eq!(run(&mut ks, 0, &["INCR", "h"]), super::super::wrong_type());
    }

    #[test]
    fn incr_keeps_the_expiry() {
        let mut ks = Keyspace::default();
        run(&mut ks, 0, &["SET", "n", "1", "PX", "50"]);
        assert_eq!(run(&mut ks, 10, &["INCR", "n"]), Reply::Integer(2));
        assert_eq!(run(&mut ks, 10, &["PTTL", "n"]), Reply::Integer(40));
    }
}
