//! The simulated Redis against a real one: random commands and random Lua scripts go to a
//! private `redis-server` and to an in-process [`Shared`] node, and their replies must be
//! identical byte for byte.
//!
//! The commands are those the simulated Redis keeps (see its module docs); the scripts call
//! them with Lua literals, numbers, `KEYS` and `ARGV`, and return the shapes whose conversion
//! rules matter. The grammar stays away from what legitimately differs between the two:
//! wall-clock time (`TIME`'s values and expiries that could lapse during the test; only
//! far-future ones are used), `tostring` of tables (it prints an address), and `error({})`,
//! which crashes Redis 7.0. Hash values stay short so Redis keeps hashes in insertion order
//! (see `hash.rs`).

mod support;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use rein_core::Timestamp;
use sim::redis::{ManualClock, Shared};
use support::{escape, real_server};

/// One call made to both servers.
#[derive(Clone, Debug)]
enum Call {
    /// A command, as its arguments.
    Command(Vec<String>),
    /// A script run by `EVAL`, or by `SCRIPT LOAD` then `EVALSHA`.
    Script {
        body: String,
        keys: Vec<String>,
        args: Vec<String>,
        by_sha: bool,
    },
}

proptest! {
    #![proptest_config(Config {
        cases: 96,
        rng_seed: RngSeed::Fixed(0x5EED_0001),
        ..Config::default()
    })]

    #[test]
    fn simulated_redis_replies_like_redis_7(calls in prop::collection::vec(call(), 1..14)) {
        let mut real = real_server().lock().unwrap_or_else(|p| p.into_inner());
        let sim = Shared::new(ManualClock::new(Timestamp::from_micros(SIM_NOW_MICROS)).clock());
        real.request(&["FLUSHALL"]);
        for call in &calls {
            for request in requests(call) {
                let expected = real.request(&request);
                let actual = sim.execute(&request).to_resp();
                prop_assert_eq!(
                    escape(&actual), escape(&expected), "request {:?} in {:#?}", request, calls
                );
            }
        }
    }
}

/// The requests one call makes, in order.
fn requests(call: &Call) -> Vec<Vec<String>> {
    match call {
        Call::Command(args) => vec![args.clone()],
        Call::Script {
            body,
            keys,
            args,
            by_sha,
        } => {
            let mut tail = vec![keys.len().to_string()];
            tail.extend(keys.iter().cloned());
            tail.extend(args.iter().cloned());
            if *by_sha {
                let sha = sha1_smol::Sha1::from(body.as_bytes()).digest().to_string();
                let mut evalsha = vec!["EVALSHA".to_string(), sha];
                evalsha.extend(tail);
                vec![vec!["SCRIPT".into(), "LOAD".into(), body.clone()], evalsha]
            } else {
                let mut eval = vec!["EVAL".to_string(), body.clone()];
                eval.extend(tail);
                vec![eval]
            }
        }
    }
}

// ---- the grammar ----

fn call() -> impl Strategy<Value = Call> {
    prop_oneof![
        6 => command().prop_map(Call::Command),
        6 => script(),
        1 => (pick(BROKEN_SCRIPTS), any::<bool>()).prop_map(|(body, by_sha)| Call::Script {
            body: body.to_string(),
            keys: vec![],
            args: vec![],
            by_sha,
        }),
    ]
}

fn pick(items: &'static [&'static str]) -> impl Strategy<Value = &'static str> + Clone {
    prop::sample::select(items)
}

fn strings(
    items: &'static [&'static str],
    len: std::ops::Range<usize>,
) -> impl Strategy<Value = Vec<&'static str>> {
    prop::collection::vec(pick(items), len)
}

fn args(parts: &[&[&str]]) -> Vec<String> {
    parts
        .iter()
        .flat_map(|p| p.iter().map(|s| s.to_string()))
        .collect()
}

/// A command with arguments drawn from small pools, so that keys collide across types
/// (WRONGTYPE), fields repeat (updates) and numbers hit the parsers' edges. Only the
/// commands the simulated Redis keeps: what rein's scripts, its store, the naive baseline
/// and the tests send.
fn command() -> impl Strategy<Value = Vec<String>> {
    prop_oneof![
        (pick(KEYS), pick(VALUES), pick(SET_OPTIONS), pick(PX_TIMES)).prop_map(|(k, v, o, t)| {
            match o {
                "" => args(&[&["SET", k, v]]),
                "PX" | "px" => args(&[&["SET", k, v, o, t]]),
                other => args(&[&["SET", k, v], &other.split(' ').collect::<Vec<_>>()]),
            }
        }),
        (pick(&["GET", "HGETALL"]), pick(KEYS)).prop_map(|(c, k)| args(&[&[c, k]])),
        strings(KEYS, 0..4).prop_map(|k| args(&[&["DEL"], &k])),
        (pick(KEYS), strings(FIELDS_AND_VALUES, 0..5))
            .prop_map(|(k, fv)| args(&[&["HMSET", k], &fv])),
        (pick(KEYS), strings(FIELDS_AND_VALUES, 0..5))
            .prop_map(|(k, fv)| args(&[&["HSET", k], &fv])),
        (pick(KEYS), pick(PX_TIMES)).prop_map(|(k, t)| args(&[&["PEXPIRE", k, t]])),
        // The overrides' commands (admin.lua): a field read, its count, its deletion, and
        // the publication of a write.
        (
            pick(&["HGET", "HEXISTS"]),
            pick(KEYS),
            pick(FIELDS_AND_VALUES)
        )
            .prop_map(|(c, k, f)| args(&[&[c, k, f]])),
        pick(KEYS).prop_map(|k| args(&[&["HLEN", k]])),
        (pick(KEYS), strings(FIELDS_AND_VALUES, 1..4)).prop_map(|(k, f)| args(&[&["HDEL", k], &f])),
        pick(VALUES).prop_map(|m| args(&[&["PUBLISH", "c", m]])),
        pick(ODD_COMMANDS).prop_map(|line| line.split(' ').map(str::to_string).collect()),
    ]
}

/// A small script: some `redis.call`/`redis.pcall` statements whose arguments are Lua
/// literals, `KEYS[i]` or `ARGV[i]`, then a return of one of the shapes whose conversion
/// rules matter.
fn script() -> impl Strategy<Value = Call> {
    let statement = (any::<bool>(), command(), prop::collection::vec(0u8..4, 8));
    (
        prop::collection::vec(statement, 0..5),
        ending(),
        any::<bool>(),
    )
        .prop_map(|(statements, ending, by_sha)| {
            let keys: Vec<String> = ["s", "h", "z"].map(String::from).to_vec();
            let argv: Vec<String> = ["1", "2.5", "m1"].map(String::from).to_vec();
            let mut body = String::new();
            for (i, (protected, command, styles)) in statements.iter().enumerate() {
                let call = if *protected {
                    "redis.pcall"
                } else {
                    "redis.call"
                };
                let rendered: Vec<String> = command
                    .iter()
                    .enumerate()
                    .map(|(j, arg)| lua_argument(arg, styles[j % styles.len()], &keys, &argv))
                    .collect();
                body.push_str(&format!("local v{i} = {call}({})\n", rendered.join(", ")));
            }
            let vars = statements.len();
            body.push_str(&ending.render(vars));
            Call::Script {
                body,
                keys,
                args: argv,
                by_sha,
            }
        })
}

/// An argument as Lua source: a string literal, a number literal, or a KEYS/ARGV lookup.
fn lua_argument(arg: &str, style: u8, keys: &[String], argv: &[String]) -> String {
    if style == 1 {
        if let Some(i) = keys.iter().position(|k| k == arg) {
            return format!("KEYS[{}]", i + 1);
        }
        if let Some(i) = argv.iter().position(|a| a == arg) {
            return format!("ARGV[{}]", i + 1);
        }
    }
    let is_number = arg.parse::<f64>().is_ok_and(f64::is_finite)
        && arg
            .bytes()
            .all(|b| b.is_ascii_digit() || b == b'.' || b == b'-' || b == b'e');
    if style == 2 && is_number && !arg.is_empty() {
        return arg.to_string();
    }
    format!("{arg:?}")
}

/// How a script ends.
#[derive(Clone, Debug)]
enum Ending {
    /// `return v<i>` (or a literal when there are no variables).
    Variable(usize),
    /// `return {v0, v1, ...}`.
    AllVariables,
    /// `return <lua expression>`, no variables involved.
    Literal(&'static str),
    /// `return type(v<i>)`.
    TypeOf(usize),
    /// The message of a caught error, or the value: `pcall` turns error tables into text.
    Caught(&'static str),
    /// `error(...)` on the last line.
    Raise(&'static str),
}

impl Ending {
    fn render(&self, vars: usize) -> String {
        let var = |i: usize| {
            if vars == 0 {
                "nil".to_string()
            } else {
                format!("v{}", i % vars)
            }
        };
        match self {
            Ending::Variable(i) => format!("return {}", var(*i)),
            Ending::AllVariables => {
                let all: Vec<String> = (0..vars).map(|i| format!("v{i}")).collect();
                format!("return {{{}}}", all.join(", "))
            }
            Ending::Literal(expression) => format!("return {expression}"),
            Ending::TypeOf(i) => format!("return type({})", var(*i)),
            Ending::Caught(call) => {
                format!("local ok, e = pcall(redis.call, {call})\nreturn {{ok and 1 or 0, e}}")
            }
            Ending::Raise(value) => format!("error({value})"),
        }
    }
}

fn ending() -> impl Strategy<Value = Ending> {
    prop_oneof![
        3 => (0usize..5).prop_map(Ending::Variable),
        1 => Just(Ending::AllVariables),
        3 => pick(LITERAL_RETURNS).prop_map(Ending::Literal),
        1 => (0usize..5).prop_map(Ending::TypeOf),
        1 => pick(CAUGHT_CALLS).prop_map(Ending::Caught),
        1 => pick(RAISED).prop_map(Ending::Raise),
    ]
}

const KEYS: &[&str] = &["s", "h", "z", "n"];
const VALUES: &[&str] = &[
    "v",
    "1",
    "10",
    "-4",
    "x y",
    "",
    "0.1",
    "2.5",
    "1e3",
    "9223372036854775807",
];
/// `SET` options: the `PX` rein uses (with a time from [`PX_TIMES`]), and malformed forms.
const SET_OPTIONS: &[&str] = &["", "", "PX", "px", "PX 5 PX", "PX", "FOO"];
/// Expiry times far in the future or invalid, so no key expires while the test runs.
const PX_TIMES: &[&str] = &[
    "100000000",
    "0",
    "-5",
    "x",
    "1.5",
    "+100000000",
    "0100000000",
    "9223372036854775807",
    "-9223372036854775808",
];
const FIELDS_AND_VALUES: &[&str] = &["a", "b", "c", "1", "-2", "x"];
const ODD_COMMANDS: &[&str] = &[
    "PING",
    "PING hello",
    "PING a b",
    "DBSIZE",
    "DBSIZE x",
    "HMSET h f",
    "HMSET h",
    "HSET h f",
    "HSET h",
    "PEXPIRE",
    "PEXPIRE k",
    "GET",
    "GET a b",
    "SET k",
    "DEL",
    "HGETALL",
    "HGET h",
    "HLEN",
    "HDEL h",
    "PUBLISH c",
    "NOSUCH a b",
    "SCRIPT EXISTS e0e1f9fabfc9d4800c877a703b823ac0578ff8db",
    "SCRIPT EXISTS",
    "SCRIPT LOAD",
    "EVALSHA 0000000000000000000000000000000000000000 0",
    "EVAL x",
    "EVAL x -1",
    "EVAL x 5 a",
    "EVAL x y",
    "SCRIPT FLUSH x",
    "SCRIPT FLUSH SYNC",
    "SCRIPT NOPE",
    "CLIENT NOPE",
    "CLIENT SETNAME",
    "FLUSHALL x",
    "FLUSHALL a b",
    "CLIENT SETNAME a",
];
const LITERAL_RETURNS: &[&str] = &[
    "3.7",
    "-2.5",
    "1e20",
    "0",
    "'text'",
    "true",
    "false",
    "nil",
    "{1, 'a', {2, {ok='k'}}, nil, 5}",
    "redis.error_reply('My error')",
    "redis.error_reply('-CODE msg')",
    "redis.error_reply('-X')",
    "{err='x y'}",
    "{ok='z'}",
    "{ok=5}",
    "redis.error_reply(5)",
    "ARGV",
    "KEYS",
    "#KEYS",
    "{KEYS[1], ARGV[2]}",
    "nonexistent_global",
    "tonumber(ARGV[2]) * 2",
];
const CAUGHT_CALLS: &[&str] = &[
    "'nosuch'",
    "'HMSET', 'h'",
    "'HSET', 'h', 'f'",
    "'PEXPIRE', 'h', 'x'",
    "'GET', {}",
    "'GET', 's', 'x'",
    "'SET', 'k', true",
    "'EVAL', 'return 1', 0",
    "'HGETALL', 's'",
    "'HDEL', 's', 'a'",
    "'SET', 's', 'v', 'PX', 0",
    "'TIME', 1",
];
const RAISED: &[&str] = &["'boom'", "'lvl0', 0", "42", "{err='FOO bar'}", ""];
const BROKEN_SCRIPTS: &[&str] = &["return (", "retur 1", "x = = 1", "x = 1", "math.x = 1"];

/// The fixed time of the simulated node; the grammar's expiries are far from both clocks.
const SIM_NOW_MICROS: u64 = 1_700_000_000_000_000;
