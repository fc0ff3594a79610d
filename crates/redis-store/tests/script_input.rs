//! The scripts are callable by anyone with the ACL, so each must refuse, with a `REIN` error
//! (or, for an argument that is not a number at all, Lua's own arithmetic error) and without
//! writing, every argument and every stored state that rein-core would not
//! accept: non-integers, negatives, values past 2^52 − 1, zero divisors, a cost above the
//! capacity, missing or extra arguments, and corrupt or foreign state (including a version 1
//! hash under the key).

use redis::{Commands, Connection, RedisResult, Value};
use rein_redis::SCRIPTS;
use rein_redis_harness::RedisServer;

/// Per script: its valid ARGV, where its operation and `now` are, the indexes of ARGV that
/// are numbers, and stored states that must be refused. The lean scripts take `now`,
/// `min_ttl` and the parameters first, then an operation and a cost per key; the policy
/// script the operation, `now`, the cost, `min_ttl`, then the parameters.
struct Case {
    name: &'static str,
    keys: &'static [&'static str],
    argv: &'static [&'static str],
    op: usize,
    now: usize,
    numbers: &'static [usize],
    corrupt: &'static [&'static str],
    /// Arguments that are integers in range but still invalid (index, value).
    invalid: &'static [(usize, &'static str)],
}

const NOW: &str = "1764000000000000";

#[rustfmt::skip]
const CASES: &[Case] = &[
    Case {
        name: "token_bucket",
        keys: &["k:{t}:tb"],
        argv: &[NOW, "0", "5", "200000", "1", "1000000", "0", "acquire", "1"],
        op: 7,
        now: 0,
        numbers: &[0, 1, 2, 3, 4, 5, 6, 8],
        corrupt: &["abc", "1:2:3", "-5", "1.5", "99999999999999999999", "1:", ":1", "nan", "inf"],
        // A zero divisor, a remainder not below its divisor, a cost above the capacity.
        invalid: &[(4, "0"), (3, "0"), (6, "1"), (8, "6")],
    },
    // A limit small enough for its window is one integer, `index × 2^26 + count` here
    // (integer_window.rs): refused are what is not an integer, what is past 2^53 (where an
    // admission's INCRBY also succeeds, and is taken back), a count of half the modulus or
    // more, an index past the last window.
    Case {
        name: "fixed_window",
        keys: &["k:{t}:fw60000000"],
        argv: &[NOW, "0", "5", "60000000", "acquire", "1"],
        op: 4,
        now: 0,
        numbers: &[0, 1, 2, 3, 5],
        corrupt: &["abc", "1:2", "-1", "1.5", " 5", "99999999999999999999",
                   "9223372036854775807", "9007199254740992", "9007199254740993",
                   "33554432", "5037190929186816"],
        invalid: &[(3, "0"), (5, "6")],
    },
    // A limit too large for the integer keeps the string `<window_start>:<count>`.
    Case {
        name: "fixed_window",
        keys: &["k:{t}:fw"],
        argv: &[NOW, "0", "100000000", "60000000", "acquire", "1"],
        op: 4,
        now: 0,
        numbers: &[0, 1, 2, 3, 5],
        corrupt: &["abc", "5", "1:2:3", "-1:2", "1.5:2", "99999999999999999999:1"],
        invalid: &[(3, "0"), (5, "100000001")],
    },
    Case {
        name: "sliding_log",
        keys: &["k:{t}:sl"],
        argv: &[NOW, "0", "5", "60000000", "acquire", "1"],
        op: 4,
        now: 0,
        numbers: &[0, 1, 2, 3, 5],
        // Entries out of order, repeated, of cost 0 or malformed; no header (the v2 format),
        // a header without entries, or one the entries contradict (its total, its newest
        // entry, a trailing ','). These entries are all long expired at NOW, so even the
        // admission's fast path, which reads only the entries leaving the window, reads them.
        corrupt: &["abc", "5", "2:1,1:1", "2:2:1|2:1,1:1", "2:1:1|1:1,1:1", "1:1:1|1:0",
                   "2:2:1|1:1;2:1", "2:2:1|1:1,,2:1", "1:1:1|-1:1", "1:1:1|", "5:2:1|1:1,2:1",
                   "2:3:1|1:1,2:1", "1:2:1|1:1,2:1", "2:2:1|1:1,2:1,", "2:2:2|1:1,2:1",
                   // Live entries (at NOW - 10 µs and NOW), which an admission copies unread
                   // after checking that the header's newest entry is the string's last.
                   "2:1763999999999995:1|1763999999999990:1,1764000000000000:1",
                   "2:1764000000000000:2|1763999999999990:1,1764000000000000:1",
                   "2:1763999999999990:1|1763999999999990:1,1764000000000000:1"],
        invalid: &[(3, "0"), (5, "6")],
    },
    // A policy of several limits keeps them in one key (format v4), their states joined by
    // ';': refused are a value of another number of parts, one corrupt part (first or
    // last), and a part of another algorithm's shape.
    Case {
        name: "policy",
        keys: &["k:{t}:tb+sc"],
        argv: &["acquire", NOW, "1", "0", "tb", "5", "200000", "1", "1000000", "0",
                "sc", "5", "60000000"],
        op: 0,
        now: 1,
        numbers: &[1, 2, 3, 5, 6, 7, 8, 9, 11, 12],
        corrupt: &["abc", "1:2:3:4", "-1", "1.5", "99999999999999999999",
                   // Too few parts, too many, a trailing ';'.
                   "1764000000000000", "", "1:2:3", "5;1:2:3;1:2:3", ";;", "5;1:2:3;",
                   // One part corrupt, the other valid (or empty).
                   "abc;1:2:3", "5;abc", "1:2:3;1:2:3", "5;1:2", "-1;", ";1.5:2:3",
                   "99999999999999999999;1:2:3", "5;1:2:3:4", "5:1:1;1:2:3", "5;1:2:3 ",
                   // Another separator, or the parts' own separators misused.
                   "5,1:2:3", "5|1:2:3", "5\n1:2:3"],
        invalid: &[(7, "0"), (12, "0"), (2, "6"), (4, "xx"), (10, "tb")],
    },
    // A lone sliding counter also runs the policy script, on its v3 key: the value is its
    // state alone, so a ';' (or nothing) is refused.
    Case {
        name: "policy",
        keys: &["k:{t}:sc"],
        argv: &["acquire", NOW, "1", "0", "sc", "5", "60000000"],
        op: 0,
        now: 1,
        numbers: &[1, 2, 3, 5, 6],
        corrupt: &["abc", "", ";", "1:2:3;", ";1:2:3", "1:2", "1:2:3:4", "-1:2:3"],
        invalid: &[(6, "0"), (2, "6"), (4, "xx")],
    },
];

#[test]
fn every_script_refuses_input_that_would_corrupt_state() {
    let server = RedisServer::start().expect("start redis-server");
    let client = redis::Client::open(server.url()).expect("client");
    let mut con = client.get_connection().expect("connect");
    for case in CASES {
        let (_, source) = SCRIPTS
            .iter()
            .find(|(name, _)| *name == case.name)
            .unwrap_or_else(|| panic!("no script {}", case.name));
        let script = redis::Script::new(source);
        let run = |con: &mut Connection, argv: &[&str]| -> RedisResult<Value> {
            let mut invocation = script.prepare_invoke();
            for key in case.keys {
                invocation.key(*key);
            }
            for arg in argv {
                invocation.arg(*arg);
            }
            invocation.invoke(con)
        };
        let refused = |con: &mut Connection, argv: &[&str], what: &str| {
            let before = snapshot(con, case.keys);
            match run(con, argv) {
                Err(e) if e.code() == Some("REIN") => {}
                // The lean scripts convert numbers with `+ 0` (cheaper than `tonumber`), so
                // a string that is no number at all stops them with Lua's own error.
                Err(e)
                    if case.numbers.iter().chain([&(argv.len() - 1)]).any(|&i| {
                        argv.get(i).is_some_and(|a| {
                            a.parse::<f64>().is_err() && !(i == case.now && a.is_empty())
                        })
                    }) =>
                {
                    assert!(
                        e.to_string().contains("arithmetic"),
                        "{}: {what}: {e}",
                        case.name
                    )
                }
                Err(e) => panic!("{}: {what}: not a REIN error: {e}", case.name),
                Ok(reply) => panic!("{}: {what} accepted: {reply:?}", case.name),
            }
            assert_eq!(
                snapshot(con, case.keys),
                before,
                "{}: {what} wrote",
                case.name
            );
        };

        // The valid call decides, and leaves a state to protect.
        run(&mut con, case.argv).unwrap_or_else(|e| panic!("{}: valid call: {e}", case.name));

        for &index in case.numbers {
            for bad in [
                "1.5",
                "-1",
                "4503599627370496",
                "1e300",
                "nan",
                "inf",
                "abc",
                "",
                "0.1",
            ] {
                // '' is a valid `now` (the server's clock).
                if index == case.now && bad.is_empty() {
                    continue;
                }
                let mut argv = case.argv.to_vec();
                argv[index] = bad;
                refused(&mut con, &argv, &format!("ARGV[{}] = {bad:?}", index + 1));
            }
        }
        for &(index, bad) in case.invalid {
            let mut argv = case.argv.to_vec();
            argv[index] = bad;
            refused(&mut con, &argv, &format!("ARGV[{}] = {bad:?}", index + 1));
        }
        let mut argv = case.argv.to_vec();
        argv[case.op] = "take";
        refused(&mut con, &argv, "an unknown operation");
        argv = case.argv.to_vec();
        argv.push("1");
        refused(&mut con, &argv, "an extra argument");
        argv = case.argv.to_vec();
        argv.pop();
        refused(&mut con, &argv, "a missing argument");

        // 'hold' and 'settle' (a sliding log's leases) take one more number: the hold or
        // the stamp, last.
        if matches!(case.name, "sliding_log" | "policy") {
            for op in ["hold", "settle"] {
                let mut argv = case.argv.to_vec();
                argv[case.op] = op;
                argv.push("1000");
                run(&mut con, &argv).unwrap_or_else(|e| panic!("{}: valid {op}: {e}", case.name));
                for bad in ["1.5", "-1", "4503599627370496", "nan", "inf", "abc", ""] {
                    *argv.last_mut().expect("pushed") = bad;
                    refused(&mut con, &argv, &format!("{op} {bad:?}"));
                }
            }
        }
        for state in case.corrupt {
            let () = con.set(case.keys[0], *state).expect("SET");
            refused(&mut con, case.argv, &format!("stored {state:?}"));
        }
        if case.name == "sliding_log" {
            // The positive control: the same entries with a true header are read.
            let () = con.set(case.keys[0], "2:2:1|1:1,2:1").expect("SET");
            run(&mut con, case.argv).expect("a valid v3 log");
        }
        if case.keys[0].ends_with("tb+sc") {
            // The positive controls: empty parts are full limits, and valid parts are read.
            for valid in [";", "5;", ";1:2:3", "5:1;1:2:3"] {
                let () = con.set(case.keys[0], valid).expect("SET");
                run(&mut con, case.argv).unwrap_or_else(|e| panic!("{valid:?} refused: {e}"));
            }
        }

        // A version 1 state (a hash) under the key is a Redis type error, not a misreading.
        let () = con.del(case.keys[0]).expect("DEL");
        let () = con.hset(case.keys[0], "tat", "5").expect("HSET");
        let before = snapshot(&mut con, case.keys);
        assert!(
            run(&mut con, case.argv).is_err(),
            "{}: a hash was read",
            case.name
        );
        assert_eq!(
            snapshot(&mut con, case.keys),
            before,
            "{}: wrote",
            case.name
        );
        let () = con.del(case.keys).expect("DEL");
    }
}

/// Every key's type and, for strings, value.
fn snapshot(con: &mut Connection, keys: &[&str]) -> Vec<(String, Option<String>)> {
    keys.iter()
        .map(|key| {
            let kind: String = redis::cmd("TYPE").arg(*key).query(con).expect("TYPE");
            let value = if kind == "string" {
                con.get(*key).expect("GET")
            } else {
                None
            };
            (kind, value)
        })
        .collect()
}

/// One call of a lean script may carry several decisions (the store coalesces concurrent
/// ones). A decision whose state is corrupt, or of another type, answers its own error in
/// its place and leaves its key as it was; the others in the call are decided and written.
/// Bad arguments for any one decision fail the whole call before any write.
#[test]
fn in_a_call_of_several_decisions_a_bad_state_fails_only_its_own() {
    use redis::ConnectionLike;

    let server = RedisServer::start().expect("start redis-server");
    let client = redis::Client::open(server.url()).expect("client");
    let mut con = client.get_connection().expect("connect");
    for case in CASES.iter().filter(|c| c.name != "policy") {
        let (_, source) = SCRIPTS
            .iter()
            .find(|(name, _)| *name == case.name)
            .expect("a lean script");
        let keys = ["b:{t}:0", "b:{t}:corrupt", "b:{t}:hash", "b:{t}:0"];
        let () = con.set(keys[1], "abc").expect("SET");
        let () = con.hset(keys[2], "tat", "5").expect("HSET");
        let call = |ask: &[&str]| {
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(*source).arg(keys.len()).arg(&keys[..]);
            cmd.arg(&case.argv[..case.op]);
            for _ in keys {
                cmd.arg(ask);
            }
            cmd
        };
        let before = snapshot(&mut con, &keys[1..3]);
        // `req_command` keeps an element's error inside the array (redis-rs's `query`
        // would turn it into the call's error).
        let reply = con
            .req_command(&call(&["acquire", "2"]))
            .unwrap_or_else(|e| panic!("{}: the call failed as a whole: {e}", case.name));
        let redis::Value::Array(items) = reply else {
            panic!("{}: not an array: {reply:?}", case.name);
        };
        assert_eq!(items.len(), 1 + 4 * keys.len(), "{}", case.name);
        // The first and last decisions share a key: 2 of the limit, then 2 more.
        let limit: i64 = case.argv[2].parse().expect("a limit");
        assert_eq!(
            items[1..3],
            [Value::Int(1), Value::Int(limit - 2)],
            "{}",
            case.name
        );
        assert_eq!(
            items[13..15],
            [Value::Int(1), Value::Int(limit - 4)],
            "{}",
            case.name
        );
        for (index, code) in [(5, "REIN"), (9, "WRONGTYPE")] {
            match &items[index] {
                Value::ServerError(e) => assert_eq!(e.code(), code, "{}", case.name),
                other => panic!("{}: item {index} is no error: {other:?}", case.name),
            }
            assert_eq!(
                items[index + 1..index + 4],
                [Value::Int(0), Value::Int(0), Value::Int(0)],
                "{}",
                case.name
            );
        }
        assert_eq!(
            snapshot(&mut con, &keys[1..3]),
            before,
            "{}: wrote",
            case.name
        );
        assert!(
            con.exists::<_, bool>(keys[0]).expect("EXISTS"),
            "{}: the good key was not written",
            case.name
        );

        // One bad ask among good ones: the whole call is refused, nothing written.
        let () = con.del(&keys[..]).expect("DEL");
        let mut bad = call(&["acquire", "1"]);
        bad.arg("acquire").arg("1.5");
        let refused = con.req_command(&bad);
        assert!(
            matches!(refused, Err(_) | Ok(Value::ServerError(_))),
            "{}: an extra ask was accepted: {refused:?}",
            case.name
        );
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(*source)
            .arg(2)
            .arg(&keys[..2])
            .arg(&case.argv[..case.op]);
        cmd.arg(&["acquire", "1", "acquire", "1.5"][..]);
        let refused = con.req_command(&cmd);
        assert!(
            matches!(refused, Err(_) | Ok(Value::ServerError(_))),
            "{}: a bad cost in the second ask was accepted: {refused:?}",
            case.name
        );
        let cleared: Vec<Option<String>> = con.mget(&keys[..2]).expect("MGET");
        assert_eq!(
            cleared,
            [None, None],
            "{}: wrote before refusing",
            case.name
        );
        let () = con.del(&keys[..]).expect("DEL");
    }
}
