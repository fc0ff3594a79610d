//! Connection and server commands that only need the keyspace or the clock: `PING`, `ECHO`,
//! `TIME`, `SELECT`, `DBSIZE`, `FLUSHALL`/`FLUSHDB`.
//!
//! The simulator has one database. `SELECT 0` succeeds; any other valid index is refused
//! with an error of its own rather than silently aliasing database 0.

use bytes::Bytes;

use super::super::number::parse_i64;
use super::{Context, Reply, arity_error, is, not_an_integer, syntax_error};

pub fn ping(_: &mut Context<'_>, args: &[Bytes]) -> Reply {
    match args.len() {
        1 => Reply::status("PONG"),
        2 => Reply::Bulk(args[1].clone()),
        _ => arity_error("ping"),
    }
}

pub fn echo(_: &mut Context<'_>, args: &[Bytes]) -> Reply {
    Reply::Bulk(args[1].clone())
}

/// The injected clock, as Redis's `[unix seconds, microseconds]`.
pub fn time(ctx: &mut Context<'_>, _: &[Bytes]) -> Reply {
    let micros = ctx.now.as_micros();
    Reply::Array(vec![
        Reply::Bulk(Bytes::from((micros / 1_000_000).to_string())),
        Reply::Bulk(Bytes::from((micros % 1_000_000).to_string())),
    ])
}

pub fn select(_: &mut Context<'_>, args: &[Bytes]) -> Reply {
    match parse_i64(&args[1]) {
        None => not_an_integer(),
        Some(0) => Reply::ok(),
        Some(1..DATABASES) => Reply::error("ERR the simulated Redis has only database 0"),
        Some(_) => Reply::error("ERR DB index is out of range"),
    }
}

pub fn dbsize(ctx: &mut Context<'_>, _: &[Bytes]) -> Reply {
    let now_ms = ctx.now_ms();
    Reply::Integer(ctx.keyspace.len(now_ms) as i64)
}

/// `FLUSHALL` and `FLUSHDB` (the same thing with one database), with `ASYNC` or `SYNC`.
pub fn flush(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    match args.get(1..) {
        Some([]) | None => {}
        Some([mode]) if is(mode, "async") || is(mode, "sync") => {}
        Some(_) => return syntax_error(),
    }
    ctx.keyspace.flush();
    Reply::ok()
}

/// Redis's default `databases`.
const DATABASES: i64 = 16;

#[cfg(test)]
mod tests {
    use super::super::super::keyspace::Keyspace;
    use super::super::tests::run;
    use super::*;

    #[test]
    fn time_reads_the_injected_clock() {
        let mut ks = Keyspace::default();
        assert_eq!(
            run(&mut ks, 1_700_000_000_123, &["TIME"]),
            Reply::Array(vec![Reply::bulk("1700000000"), Reply::bulk("123000")])
        );
    }

    #[test]
    fn select_accepts_only_database_zero() {
        let mut ks = Keyspace::default();
        assert_eq!(run(&mut ks, 0, &["SELECT", "0"]), Reply::ok());
        assert!(run(&mut ks, 0, &["SELECT", "3"]).is_error());
        assert_eq!(
            run(&mut ks, 0, &["SELECT", "16"]),
            Reply::error("ERR DB index is out of range")
        );
        assert_eq!(run(&mut ks, 0, &["PING", "a", "b"]), arity_error("ping"));
    }
}
