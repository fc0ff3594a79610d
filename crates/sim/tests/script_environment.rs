//! The script environment, pinned to what redis-server 7.0.15 answered.
//!
//! Every expected reply below was captured from a real server with the same script. The
//! differential test covers these shapes at random; this table keeps the exact texts
//! readable in one place.

use rein_core::Timestamp;
use sim::redis::{ManualClock, Shared};

struct Row {
    label: &'static str,
    script: &'static str,
    reply: &'static str,
}

#[rustfmt::skip]
const ROWS: &[Row] = &[
    // Globals are read-only, and a missing one is an error, not nil.
    Row { label: "missing global", script: "return x",
          reply: "-ERR user_script:1: Script attempted to access nonexistent global variable 'x' script: 03c387736bb5cc009ff35151572cee04677aa374, on @user_script:1.\r\n" },
    Row { label: "global write", script: "x = 1",
          reply: "-ERR user_script:1: Attempt to modify a readonly table script: 34bce5f775de97f557a34088509c8bfe1ea17e52, on @user_script:1.\r\n" },
    Row { label: "library write", script: "math.x = 1",
          reply: "-ERR user_script:1: Attempt to modify a readonly table script: 7cb3a59f2a9c350c2b383e445632547b9072c3e8, on @user_script:1.\r\n" },
    Row { label: "no os library", script: "return type(os)",
          reply: "-ERR user_script:1: Script attempted to access nonexistent global variable 'os' script: 88bfcb2247db0b6fa4925f3cddc3fd0651459f99, on @user_script:1.\r\n" },

    // Errors carry the script's SHA-1 and the line that raised them.
    Row { label: "error string", script: "error('boom')",
          reply: "-ERR user_script:1: boom script: 82903a0434f1503e152f89c03c9acd881a0e8150, on @user_script:1.\r\n" },
    Row { label: "error table", script: "error({err='FOO bar'})",
          reply: "-FOO bar script: 629984d72109c43bebb2bb1377e52b82d7c6079a, on @user_script:1.\r\n" },
    Row { label: "runtime error on line 3", script: "\nlocal x = nil\nreturn x + 1",
          reply: "-ERR user_script:3: attempt to perform arithmetic on local 'x' (a nil value) script: 4b55c008e9ebb30b2dcc1d76dbd09c33bc87a795, on @user_script:3.\r\n" },
    Row { label: "redis.call error inside a function", script: "local function f() redis.call('nosuch') end\n f()",
          reply: "-ERR Unknown Redis command called from script script: a5f9d69ccd95b7d69bbdfb77c6f3de115b11973b, on @user_script:1.\r\n" },
    Row { label: "compile error", script: "return (",
          reply: "-ERR Error compiling script (new function): user_script:1: unexpected symbol near '<eof>'\r\n" },

    // redis.pcall returns the error; Lua's pcall turns it into its message.
    Row { label: "pcall returns the error", script: "return redis.pcall('GET','zz','x')",
          reply: "-ERR Wrong number of args calling Redis command from script\r\n" },
    Row { label: "pcall of redis.call", script: "local ok, e = pcall(redis.call, 'nosuch') return e",
          reply: "$44\r\nERR Unknown Redis command called from script\r\n" },
    Row { label: "nested error reply", script: "return {1, redis.pcall('nosuch')}",
          reply: "*2\r\n:1\r\n-ERR Unknown Redis command called from script\r\n" },

    // Lua values become replies by Redis's rules.
    Row { label: "array stops at nil", script: "return {1,2,nil,4}", reply: "*2\r\n:1\r\n:2\r\n" },
    Row { label: "infinity", script: "return 1/0", reply: ":-9223372036854775808\r\n" },
    Row { label: "truncation", script: "return -3.9", reply: ":-3\r\n" },
    Row { label: "booleans and nesting", script: "return {true,false,'x',{1}}",
          reply: "*4\r\n:1\r\n$-1\r\n$1\r\nx\r\n*1\r\n:1\r\n" },
    Row { label: "ok must be a string", script: "return {ok=5}", reply: "*0\r\n" },
    Row { label: "status with line break", script: "return {ok='a\\r\\nb'}", reply: "+a  b\r\n" },
    Row { label: "error_reply without code", script: "return redis.error_reply('-FOO')", reply: "-ERR FOO\r\n" },
    Row { label: "numbers as arguments", script: "redis.call('SET','k',0.1) return redis.call('GET','k')",
          reply: "$19\r\n0.10000000000000001\r\n" },
    Row { label: "tostring keeps 14 digits", script: "return tostring(1e15)..' '..tostring(123456789012345)..' '..tostring(0.1)",
          reply: "$29\r\n1e+15 1.2345678901234e+14 0.1\r\n" },
    Row { label: "nil reply becomes false", script: "return type(redis.call('GET', 'nokey'))",
          reply: "$7\r\nboolean\r\n" },

];

#[test]
fn scripts_answer_exactly_as_redis_7_0_did() {
    let redis = Shared::new(ManualClock::new(Timestamp::from_micros(0)).clock());
    for row in ROWS {
        let reply = redis.execute(["EVAL", row.script, "0"]).to_resp();
        assert_eq!(
            reply.escape_ascii().to_string(),
            row.reply.as_bytes().escape_ascii().to_string(),
            "{}: {}",
            row.label,
            row.script
        );
    }
}
