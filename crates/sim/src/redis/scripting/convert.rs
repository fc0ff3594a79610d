//! Redis's conversions between replies and Lua values, both ways.
//!
//! Reply → Lua (what `redis.call` returns): integer → number, bulk → string, nil → false,
//! array → sequence, status → `{ok=...}`, error → `{err=...}`.
//! Lua → reply (what a script returns): number → integer (truncated), string → bulk,
//! `true` → 1, `false`/`nil` → nil, a table with a string `err` → error, with a string `ok`
//! → status, otherwise an array of `t[1]`,
//! `t[2]`, ... up to the first nil. Arguments to `redis.call` must be strings or numbers,
//! and numbers travel as `%.17g` text.

use bytes::Bytes;
use mlua::{Lua, MultiValue, Table, Value};

use super::super::number::format_double;
use super::super::reply::Reply;

/// The Lua value `redis.call` / `redis.pcall` returns for `reply`.
pub fn reply_to_lua(lua: &Lua, reply: Reply) -> mlua::Result<Value> {
    Ok(match reply {
        Reply::Integer(n) => Value::Number(n as f64),
        Reply::Bulk(bytes) => Value::String(lua.create_string(&bytes)?),
        Reply::Nil => Value::Boolean(false),
        Reply::Status(text) => Value::Table(single_field(lua, "ok", &text)?),
        Reply::Error(text) => Value::Table(single_field(lua, "err", &text)?),
        Reply::Array(items) => {
            let table = lua.create_table_with_capacity(items.len(), 0)?;
            for (i, item) in items.into_iter().enumerate() {
                table.raw_set(i + 1, reply_to_lua(lua, item)?)?;
            }
            Value::Table(table)
        }
    })
}

/// `{ field = text }`, the shape of status and error values in Lua.
pub fn single_field(lua: &Lua, field: &str, text: &[u8]) -> mlua::Result<Table> {
    let table = lua.create_table_with_capacity(0, 1)?;
    table.raw_set(field, lua.create_string(text)?)?;
    Ok(table)
}

/// The reply for a script's return value.
pub fn lua_to_reply(value: Value) -> Reply {
    lua_to_reply_at(value, 0)
}

/// The arguments of a `redis.call`, or the error message (without code) Redis gives.
pub fn command_args(args: &MultiValue) -> Result<Vec<Bytes>, &'static str> {
    if args.is_empty() {
        return Err("Please specify at least one argument for this redis lib call");
    }
    args.iter()
        .map(|arg| match arg {
            Value::String(s) => Ok(Bytes::copy_from_slice(&s.as_bytes())),
            Value::Integer(n) => Ok(Bytes::from(format_double(*n as f64))),
            Value::Number(n) => Ok(Bytes::from(format_double(*n))),
            _ => Err("Lua redis lib command arguments must be strings or integers"),
        })
        .collect()
}

/// C's `(long long)` cast of a double on x86-64: truncation, and the "integer indefinite"
/// value `i64::MIN` for NaN and anything out of range, which is what Redis replies for
/// `return 1/0` (Rust's `as` would saturate instead).
pub fn truncate_like_c(n: f64) -> i64 {
    // 2^63 as a double; every double in [-2^63, 2^63) truncates into range, and NaN is in
    // no range.
    const LIMIT: f64 = 9_223_372_036_854_775_808.0;
    if (-LIMIT..LIMIT).contains(&n) {
        n.trunc() as i64
    } else {
        i64::MIN
    }
}

fn lua_to_reply_at(value: Value, depth: usize) -> Reply {
    match value {
        Value::Boolean(true) => Reply::Integer(1),
        Value::Integer(n) => Reply::Integer(n),
        Value::Number(n) => Reply::Integer(truncate_like_c(n)),
        Value::String(s) => Reply::Bulk(Bytes::copy_from_slice(&s.as_bytes())),
        Value::Table(table) => table_to_reply(table, depth),
        _ => Reply::Nil,
    }
}

fn table_to_reply(table: Table, depth: usize) -> Reply {
    if depth >= MAX_DEPTH {
        // A self-referencing table would recurse forever; Redis runs out of Lua stack.
        return Reply::error("ERR reached lua stack limit");
    }
    if let Ok(Value::String(err)) = table.raw_get::<Value>("err") {
        return Reply::Error(Bytes::copy_from_slice(&err.as_bytes()));
    }
    if let Ok(Value::String(ok)) = table.raw_get::<Value>("ok") {
        return Reply::Status(Bytes::copy_from_slice(&ok.as_bytes()));
    }
    let mut items = Vec::new();
    for i in 1.. {
        match table.raw_get::<Value>(i) {
            Ok(Value::Nil) | Err(_) => break,
            Ok(item) => items.push(lua_to_reply_at(item, depth + 1)),
        }
    }
    Reply::Array(items)
}

/// How deep nested tables may go in a reply.
const MAX_DEPTH: usize = 1000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_truncation_of_doubles() {
        assert_eq!(truncate_like_c(3.9), 3);
        assert_eq!(truncate_like_c(-3.9), -3);
        assert_eq!(truncate_like_c(f64::INFINITY), i64::MIN);
        assert_eq!(truncate_like_c(f64::NEG_INFINITY), i64::MIN);
        assert_eq!(truncate_like_c(f64::NAN), i64::MIN);
        assert_eq!(truncate_like_c(-9_223_372_036_854_775_808.0), i64::MIN);
    }

    #[test]
    fn replies_round_trip_through_lua() {
        let lua = Lua::new();
        let reply = Reply::Array(vec![
            Reply::Integer(-7),
            Reply::bulk("x"),
            Reply::Nil,
            Reply::ok(),
            Reply::error("ERR boom"),
        ]);
        let back = lua_to_reply(reply_to_lua(&lua, reply).expect("convert"));
        // nil becomes false in Lua, which converts back to nil.
        assert_eq!(
            back,
            Reply::Array(vec![
                Reply::Integer(-7),
                Reply::bulk("x"),
                Reply::Nil,
                Reply::ok(),
                Reply::error("ERR boom"),
            ])
        );
    }
}
