//! Commands on keys of any type: existence, deletion, type and expiry.
//!
//! Expiry follows Redis 7.0's `expireGenericCommand`: options are checked before the time,
//! overflow is an error, and a time already past deletes the key and still answers 1.

use bytes::Bytes;

use super::super::number::parse_i64;
use super::{Context, Reply, is, not_an_integer};

pub fn del(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    let now_ms = ctx.now_ms();
    let deleted = args[1..]
        .iter()
        .filter(|key| ctx.keyspace.remove(key, now_ms))
        .count();
    Reply::Integer(deleted as i64)
}

pub fn exists(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    let now_ms = ctx.now_ms();
    // A key named twice counts twice, as in Redis.
    let found = args[1..]
        .iter()
        .filter(|key| ctx.keyspace.entry(key, now_ms).is_some())
        .count();
    Reply::Integer(found as i64)
}

pub fn type_of(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    let now_ms = ctx.now_ms();
    Reply::status(
        ctx.keyspace
            .value(&args[1], now_ms)
            .map_or("none", |v| v.type_name()),
    )
}

pub fn expire(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    let now_ms = ctx.now_ms();
    set_expiry(ctx, args, "expire", Unit::Seconds, now_ms)
}

pub fn pexpire(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    let now_ms = ctx.now_ms();
    set_expiry(ctx, args, "pexpire", Unit::Millis, now_ms)
}

pub fn expireat(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    set_expiry(ctx, args, "expireat", Unit::Seconds, 0)
}

pub fn pexpireat(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    set_expiry(ctx, args, "pexpireat", Unit::Millis, 0)
}

pub fn ttl(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    match remaining_ms(ctx, &args[1]) {
        // Rounded to the nearest second, as Redis does.
        Ok(ms) => Reply::Integer((ms + 500) / 1000),
        Err(code) => Reply::Integer(code),
    }
}

pub fn pttl(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    match remaining_ms(ctx, &args[1]) {
        Ok(ms) => Reply::Integer(ms),
        Err(code) => Reply::Integer(code),
    }
}

pub fn persist(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    let now_ms = ctx.now_ms();
    match ctx.keyspace.entry(&args[1], now_ms) {
        Some(entry) if entry.expires_at_ms.is_some() => {
            entry.expires_at_ms = None;
            Reply::Integer(1)
        }
        _ => Reply::Integer(0),
    }
}

/// The time unit of an expiry argument.
#[derive(Clone, Copy)]
enum Unit {
    Seconds,
    Millis,
}

/// `[P]EXPIRE[AT] key time [NX|XX|GT|LT]`; `base_ms` is now for relative forms, 0 for
/// absolute ones.
fn set_expiry(
    ctx: &mut Context<'_>,
    args: &[Bytes],
    name: &str,
    unit: Unit,
    base_ms: i64,
) -> Reply {
    let flags = match ExpireFlags::parse(&args[3..]) {
        Ok(flags) => flags,
        Err(reply) => return reply,
    };
    let Some(when) = parse_i64(&args[2]) else {
        return not_an_integer();
    };
    let invalid = || Reply::error(format!("ERR invalid expire time in '{name}' command"));
    let when = match unit {
        Unit::Seconds => when.checked_mul(1000),
        Unit::Millis => Some(when),
    };
    let Some(when) = when.and_then(|w| w.checked_add(base_ms)) else {
        return invalid();
    };
    let now_ms = ctx.now_ms();
    let Some(entry) = ctx.keyspace.entry(&args[1], now_ms) else {
        return Reply::Integer(0);
    };
    let current = entry.expires_at_ms;
    let refused = (flags.nx && current.is_some())
        || (flags.xx && current.is_none())
        // No expiry counts as an infinite one: never less than, never exceeded.
        || (flags.gt && current.is_none_or(|c| when <= c))
        || (flags.lt && current.is_some_and(|c| when >= c));
    if refused {
        return Reply::Integer(0);
    }
    if when <= now_ms {
        ctx.keyspace.remove(&args[1], now_ms);
    } else {
        entry.expires_at_ms = Some(when);
    }
    Reply::Integer(1)
}

/// The milliseconds until `key` expires, or the code TTL answers instead: -2 for a missing
/// key, -1 for a key without expiry.
fn remaining_ms(ctx: &mut Context<'_>, key: &[u8]) -> Result<i64, i64> {
    let now_ms = ctx.now_ms();
    match ctx.keyspace.entry(key, now_ms) {
        None => Err(-2),
        Some(entry) => match entry.expires_at_ms {
            None => Err(-1),
            Some(at) => Ok(at.saturating_sub(now_ms).max(0)),
        },
    }
}

#[derive(Default)]
struct ExpireFlags {
    nx: bool,
    xx: bool,
    gt: bool,
    lt: bool,
}

impl ExpireFlags {
    fn parse(options: &[Bytes]) -> Result<Self, Reply> {
        let mut flags = ExpireFlags::default();
        for opt in options {
            if is(opt, "nx") {
                flags.nx = true;
            } else if is(opt, "xx") {
                flags.xx = true;
            } else if is(opt, "gt") {
                flags.gt = true;
            } else if is(opt, "lt") {
                flags.lt = true;
            } else {
                let opt = String::from_utf8_lossy(opt);
                return Err(Reply::error(format!("ERR Unsupported option {opt}")));
            }
        }
        if flags.nx && (flags.xx || flags.gt || flags.lt) {
            return Err(Reply::error(
                "ERR NX and XX, GT or LT options at the same time are not compatible",
            ));
        }
        if flags.gt && flags.lt {
            return Err(Reply::error(
                "ERR GT and LT options at the same time are not compatible",
            ));
        }
        Ok(flags)
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::keyspace::Keyspace;
    use super::super::tests::run;
    use super::*;

    #[test]
    fn ttl_codes_and_rounding() {
        let mut ks = Keyspace::default();
        assert_eq!(run(&mut ks, 0, &["PTTL", "k"]), Reply::Integer(-2));
        run(&mut ks, 0, &["SET", "k", "v"]);
        assert_eq!(run(&mut ks, 0, &["TTL", "k"]), Reply::Integer(-1));
        assert_eq!(
            run(&mut ks, 0, &["PEXPIRE", "k", "1499"]),
            Reply::Integer(1)
        );
        assert_eq!(run(&mut ks, 0, &["TTL", "k"]), Reply::Integer(1));
        assert_eq!(run(&mut ks, 0, &["PTTL", "k"]), Reply::Integer(1499));
        assert_eq!(run(&mut ks, 0, &["PERSIST", "k"]), Reply::Integer(1));
        assert_eq!(run(&mut ks, 0, &["PERSIST", "k"]), Reply::Integer(0));
    }

    #[test]
    fn an_expiry_in_the_past_deletes_the_key_and_answers_one() {
        let mut ks = Keyspace::default();
        run(&mut ks, 5_000, &["SET", "k", "v"]);
        assert_eq!(
            run(&mut ks, 5_000, &["PEXPIREAT", "k", "5000"]),
            Reply::Integer(1)
        );
        assert_eq!(run(&mut ks, 5_000, &["EXISTS", "k"]), Reply::Integer(0));
        assert_eq!(
            run(&mut ks, 5_000, &["EXPIRE", "k", "10"]),
            Reply::Integer(0)
        );
    }

    #[test]
    fn expire_flags_and_overflow() {
        let mut ks = Keyspace::default();
        run(&mut ks, 0, &["SET", "k", "v"]);
        assert_eq!(
            run(&mut ks, 0, &["EXPIRE", "k", "10", "XX"]),
            Reply::Integer(0)
        );
        assert_eq!(
            run(&mut ks, 0, &["EXPIRE", "k", "10", "GT"]),
            Reply::Integer(0)
        );
        assert_eq!(
            run(&mut ks, 0, &["EXPIRE", "k", "10", "NX"]),
            Reply::Integer(1)
        );
        assert_eq!(
            run(&mut ks, 0, &["EXPIRE", "k", "20", "LT"]),
            Reply::Integer(0)
        );
        assert_eq!(
            run(&mut ks, 0, &["EXPIRE", "k", "20", "GT"]),
            Reply::Integer(1)
        );
        assert_eq!(
            run(&mut ks, 0, &["EXPIRE", "k", "9223372036854775807"]),
            Reply::error("ERR invalid expire time in 'expire' command")
        );
        assert_eq!(
            run(&mut ks, 0, &["EXPIRE", "k", "1", "FOO"]),
            Reply::error("ERR Unsupported option FOO")
        );
    }
}
