//! Hash commands, following Redis 7.0's `t_hash.c`.

use bytes::Bytes;

use super::super::number::parse_i64;
use super::{Context, Reply, arity_error, not_an_integer};

pub fn hget(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    let now_ms = ctx.now_ms();
    match ctx.keyspace.hash(&args[1], now_ms) {
        Ok(hash) => hash
            .and_then(|h| h.get(&args[2]))
            .map_or(Reply::Nil, |v| Reply::Bulk(v.clone())),
        Err(wrong) => wrong.into(),
    }
}

pub fn hmget(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    let now_ms = ctx.now_ms();
    match ctx.keyspace.hash(&args[1], now_ms) {
        Ok(hash) => Reply::Array(
            args[2..]
                .iter()
                .map(|field| {
                    hash.as_ref()
                        .and_then(|h| h.get(field))
                        .map_or(Reply::Nil, |v| Reply::Bulk(v.clone()))
                })
                .collect(),
        ),
        Err(wrong) => wrong.into(),
    }
}

/// `HSET key field value [field value ...]`: the number of new fields.
pub fn hset(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    match set_fields(ctx, args, "hset") {
        Ok(created) => Reply::Integer(created),
        Err(reply) => reply,
    }
}

/// `HMSET`: `HSET` answering OK.
pub fn hmset(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    match set_fields(ctx, args, "hmset") {
        Ok(_) => Reply::ok(),
        Err(reply) => reply,
    }
}

pub fn hgetall(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    let now_ms = ctx.now_ms();
    match ctx.keyspace.hash(&args[1], now_ms) {
        Ok(None) => Reply::Array(Vec::new()),
        Ok(Some(hash)) => Reply::Array(
            hash.iter()
                .flat_map(|(f, v)| [Reply::Bulk(f.clone()), Reply::Bulk(v.clone())])
                .collect(),
        ),
        Err(wrong) => wrong.into(),
    }
}

pub fn hdel(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    let now_ms = ctx.now_ms();
    let deleted = match ctx.keyspace.hash(&args[1], now_ms) {
        Ok(None) => return Reply::Integer(0),
        Ok(Some(hash)) => args[2..].iter().filter(|field| hash.remove(field)).count(),
        Err(wrong) => return wrong.into(),
    };
    ctx.keyspace.remove_if_empty(&args[1]);
    Reply::Integer(deleted as i64)
}

/// `HINCRBY key field increment`: a missing field counts as 0.
pub fn hincrby(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    let Some(by) = parse_i64(&args[3]) else {
        return not_an_integer();
    };
    let now_ms = ctx.now_ms();
    let hash = match ctx.keyspace.hash_or_create(&args[1], now_ms) {
        Ok(hash) => hash,
        Err(wrong) => return wrong.into(),
    };
    // Both errors below need the field to exist already, so a hash created just above is
    // never left empty.
    let current = match hash.get(&args[2]) {
        None => 0,
        Some(text) => match parse_i64(text) {
            Some(n) => n,
            None => return Reply::error("ERR hash value is not an integer"),
        },
    };
    let Some(next) = current.checked_add(by) else {
        return Reply::error("ERR increment or decrement would overflow");
    };
    hash.set(&args[2], Bytes::from(next.to_string()));
    Reply::Integer(next)
}

pub fn hlen(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    let now_ms = ctx.now_ms();
    match ctx.keyspace.hash(&args[1], now_ms) {
        Ok(hash) => Reply::Integer(hash.map_or(0, |h| h.len() as i64)),
        Err(wrong) => wrong.into(),
    }
}

pub fn hexists(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    let now_ms = ctx.now_ms();
    match ctx.keyspace.hash(&args[1], now_ms) {
        Ok(hash) => Reply::Integer(i64::from(hash.is_some_and(|h| h.get(&args[2]).is_some()))),
        Err(wrong) => wrong.into(),
    }
}

/// Sets field/value pairs; the number of new fields. An odd pair count is the command's own
/// arity error (Redis reports it with the client's wording even inside a script).
fn set_fields(ctx: &mut Context<'_>, args: &[Bytes], name: &str) -> Result<i64, Reply> {
    if args.len() % 2 == 1 {
        return Err(arity_error(name));
    }
    let now_ms = ctx.now_ms();
    let hash = ctx.keyspace.hash_or_create(&args[1], now_ms)?;
    let created = args[2..]
        .chunks_exact(2)
        .filter(|pair| hash.set(&pair[0], pair[1].clone()))
        .count();
    Ok(created as i64)
}

#[cfg(test)]
mod tests {
    use super::super::super::keyspace::Keyspace;
    use super::super::tests::run;
    use super::*;

    #[test]
    fn hash_round_trip_in_insertion_order() {
        let mut ks = Keyspace::default();
        assert_eq!(
            run(&mut ks, 0, &["HSET", "h", "b", "1", "a", "2"]),
            Reply::Integer(2)
        );
        assert_eq!(run(&mut ks, 0, &["HSET", "h", "b", "3"]), Reply::Integer(0));
        assert_eq!(
            run(&mut ks, 0, &["HGETALL", "h"]),
            Reply::Array(vec![
                Reply::bulk("b"),
                Reply::bulk("3"),
                Reply::bulk("a"),
                Reply::bulk("2")
            ])
        );
        assert_eq!(
            run(&mut ks, 0, &["HMGET", "h", "a", "zz"]),
            Reply::Array(vec![Reply::bulk("2"), Reply::Nil])
        );
        assert_eq!(
            run(&mut ks, 0, &["HDEL", "h", "a", "b", "c"]),
            Reply::Integer(2)
        );
        assert_eq!(run(&mut ks, 0, &["EXISTS", "h"]), Reply::Integer(0));
    }

    #[test]
    fn hincrby_checks_the_increment_then_the_stored_value() {
        let mut ks = Keyspace::default();
        assert_eq!(
            run(&mut ks, 0, &["HINCRBY", "h", "n", "x"]),
            not_an_integer()
        );
        assert_eq!(run(&mut ks, 0, &["EXISTS", "h"]), Reply::Integer(0));
        assert_eq!(
            run(&mut ks, 0, &["HINCRBY", "h", "n", "-3"]),
            Reply::Integer(-3)
        );
        run(&mut ks, 0, &["HSET", "h", "s", "abc"]);
        assert_eq!(
            run(&mut ks, 0, &["HINCRBY", "h", "s", "1"]),
            Reply::error("ERR hash value is not an integer")
        );
        assert_eq!(run(&mut ks, 0, &["HSET", "h", "odd"]), arity_error("hset"));
        run(&mut ks, 0, &["SET", "s", "v"]);
        assert!(run(&mut ks, 0, &["HGET", "s", "f"]).error_code() == Some(b"WRONGTYPE"));
    }
}
