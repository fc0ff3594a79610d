//! The scripts are callable by anyone with the ACL, so each must refuse, with a `REIN` error
//! (or, for an argument that is not a number at all, Lua's own arithmetic error) and without
//! writing, every argument and every stored state that rein-core would not
//! accept: non-integers, negatives, values past 2^52 − 1, zero divisors, a cost above the
//! capacity, missing or extra arguments, and corrupt or foreign state (including a version 1
//! hash under the key).

use redis::{Commands, Connection, RedisResult, Value};
use rein_redis::SCRIPTS;
use rein_redis_harness::RedisServer;

/// Per script: its valid ARGV (op, now, cost, min_ttl, parameters), the indexes of ARGV that
/// are numbers, and stored states that must be refused.
struct Case {
    name: &'static str,
    keys: &'static [&'static str],
    argv: &'static [&'static str],
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
        argv: &["acquire", NOW, "1", "0", "5", "200000", "1", "1000000", "0"],
        numbers: &[1, 2, 3, 4, 5, 6, 7, 8],
        corrupt: &["abc", "1:2:3", "-5", "1.5", "99999999999999999999", "1:", ":1", "nan", "inf"],
        // A zero divisor, a remainder not below its divisor, a cost above the capacity.
        invalid: &[(6, "0"), (5, "0"), (8, "1"), (2, "6")],
    },
    Case {
        name: "fixed_window",
        keys: &["k:{t}:fw"],
        argv: &["acquire", NOW, "1", "0", "5", "60000000"],
        numbers: &[1, 2, 3, 4, 5],
        corrupt: &["abc", "5", "1:2:3", "-1:2", "1.5:2", "99999999999999999999:1"],
        invalid: &[(5, "0"), (2, "6")],
    },
    Case {
        name: "sliding_log",
        keys: &["k:{t}:sl"],
        argv: &["acquire", NOW, "1", "0", "5", "60000000"],
        numbers: &[1, 2, 3, 4, 5],
        corrupt: &["abc", "5", "2:1,1:1", "1:1,1:1", "1:0", "1:1;2:1", "1:1,,2:1", "-1:1"],
        invalid: &[(5, "0"), (2, "6")],
    },
    Case {
        name: "policy",
        keys: &["k:{t}:p0", "k:{t}:p1"],
        argv: &["acquire", NOW, "1", "0", "tb", "5", "200000", "1", "1000000", "0",
                "sc", "5", "60000000"],
        numbers: &[1, 2, 3, 5, 6, 7, 8, 9, 11, 12],
        corrupt: &["abc", "1:2:3:4", "-1", "1.5", "99999999999999999999"],
        invalid: &[(7, "0"), (12, "0"), (2, "6"), (4, "xx"), (10, "tb")],
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
                        argv.get(i)
                            .is_some_and(|a| a.parse::<f64>().is_err() && !(i == 1 && a.is_empty()))
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
                if index == 1 && bad.is_empty() {
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
        argv[0] = "take";
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
                argv[0] = op;
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
