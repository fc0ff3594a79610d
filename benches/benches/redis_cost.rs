//! What one decision costs the Redis server: rein's scripts against the naive scripts they
//! replace, driven identically by `redis-benchmark` on one private `redis-server`.
//!
//! For each algorithm, rein's script and a naive script in the common style run in
//! alternating rounds (the median of [`ROUNDS`] is reported, and each comparison as the
//! median of the rounds' own ratios with their spread, [`Ratio`]), each round on an emptied
//! server, with `redis-benchmark -P 32 -c 50 -r 100000 -n <N> EVALSHA ...` (random keys).
//! Per round it reads:
//!
//! - `INFO commandstats`: `usec_per_call` of `EVALSHA`, the time the script itself ran
//!   (after `CONFIG RESETSTAT`): the figure the comparison is about;
//! - `INFO cpu`: the server's whole CPU (network and parsing too) per decision;
//! - decisions/s as `redis-benchmark` reports them;
//! - `MEMORY USAGE` of a key after one decision (an idle key).
//!
//! The naive scripts, in the style rein replaces:
//! - token bucket: `HMGET` tokens and last update, refill as floats, `HSET` both, `PEXPIRE`;
//! - fixed window: `INCRBY` and `PEXPIRE`;
//! - sliding log: `ZREMRANGEBYSCORE`, `ZCARD`, `ZADD` of `now-<random>`, `PEXPIRE`.
//!
//! Both sides read `now` from the server's `TIME`, so both see the same, moving clock (rein's
//! default; the naive scripts as published take the client's clock instead, and the
//! `naive, client now` rows show that variant, which spares them the `TIME` call, and rein's
//! `client now` rows pass rein the same fixed instant, to compare like with like). Every
//! limit always admits, so every call writes, except in the two `denials` rows: one key
//! allowed once a minute, so all but a round's first call are denied (a flood from one
//! client). A 3-limit rein policy (token bucket, fixed window, sliding log) is compared with
//! the sum of rein's three single-limit decisions.
//!
//! Last, the lean scripts as the store sends them under load (coalescing: `n` decisions of
//! one policy in one call, `n` = 1, 8, 32), per decision, against the naive script's one
//! decision per call, the two alternating round by round. `--bench redis` measures the same
//! end to end, with rein-redis's own client choosing the calls.
//!
//! Run: `cargo bench -p rein-benches --bench redis_cost` (`REIN_BENCH_CALLS` sets calls per
//! round, default 200 000). It prints a markdown table for docs/performance.md.

use std::collections::HashMap;
use std::time::Instant;

use rein_benches::naive::{NAIVE_FIXED_WINDOW, NAIVE_SLIDING_LOG, NAIVE_TOKEN_BUCKET};
use rein_benches::{Ratio, median};
use rein_core::{Algorithm, Limit, Micros};
use rein_redis::SCRIPTS;
use rein_redis_harness::RedisServer;

const KEYS: u64 = 100_000;
const ROUNDS: usize = 5;

fn main() {
    if !rein_benches::bench_requested("redis_cost") {
        return;
    }
    let calls: u64 = rein_benches::env_number("REIN_BENCH_CALLS", 200_000);
    let server = RedisServer::start().expect("start redis-server");
    let client = redis::Client::open(server.url()).expect("client");
    let mut con = client.get_connection().expect("connect");
    let mut load = |source: &str| -> String {
        redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(source)
            .query(&mut con)
            .expect("SCRIPT LOAD")
    };
    let rein: HashMap<&str, String> = SCRIPTS
        .iter()
        .map(|(name, source)| (*name, load(source)))
        .collect();
    let naive_bucket = load(NAIVE_TOKEN_BUCKET);
    let naive_window = load(NAIVE_FIXED_WINDOW);
    let naive_log = load(NAIVE_SLIDING_LOG);

    // Limits that always admit under this load, so every call decides and writes.
    let Limit::TokenBucket(bucket) =
        Limit::token_bucket(1_000_000, 1_000_000, Micros::from_secs(1)).expect("valid")
    else {
        unreachable!("built as a token bucket")
    };
    let (units_per_token, units_per_micro) = bucket.emission_interval();
    let tolerance = bucket.capacity() * units_per_token;
    let capacity = bucket.capacity().to_string();
    let (upt, upm) = (units_per_token.to_string(), units_per_micro.to_string());
    let (tol_us, tol_units) = (
        (tolerance / units_per_micro).to_string(),
        (tolerance % units_per_micro).to_string(),
    );
    // Ten million a minute never denies here, and fits the integer form of a lone fixed
    // window (crates/redis-store/src/integer_window.rs), whose key names the window.
    let window_limit = "10000000";
    let window_us = "60000000";
    let log_limit = "1000";
    let log_us = "10000000";

    // rein's ARGV for a lean script: now ('' = the server's TIME), min_ttl, what RedisPolicy
    // precomputes for the script (crates/redis-store/src/policy.rs, `script_for`), then an
    // operation and a cost per key.
    let args = |key: &str, params: &[&str]| -> Vec<String> {
        let mut v = vec![
            "1".to_owned(),
            key.to_owned(),
            String::new(),
            "0".to_owned(),
        ];
        v.extend(params.iter().map(|s| s.to_string()));
        v.extend(["acquire", "1"].map(str::to_owned));
        v
    };
    let tb_key = "rein:v3:{__rand_int__}:b:0:tb";
    let fw_key = "rein:v3:{__rand_int__}:b:0:fw60000000";
    let sl_key = "rein:v3:{__rand_int__}:b:0:sl";
    // A policy of several limits keeps them in one key (key format v4).
    let policy_key = "rein:v4:{__rand_int__}:b:tb+fw+sl";
    let rein_tb = args(tb_key, &[&capacity, &upt, &upm, &tol_us, &tol_units]);
    let rein_fw = args(fw_key, &[window_limit, window_us]);
    // The same with the caller's clock (µs), as the naive "client now" rows take it.
    let client_now_us = "1764000000000000";
    let with_client_now = |v: &[String]| -> Vec<String> {
        let mut v = v.to_vec();
        v[2] = client_now_us.to_owned();
        v
    };
    let rein_tb_client = with_client_now(&rein_tb);
    let rein_fw_client = with_client_now(&rein_fw);
    // The generic policy script's ARGV: op, now, cost, min_ttl, then each limit's tag and
    // parameters.
    let head = ["acquire", "", "1", "0"];
    let generic = |keys: &[&str], params: &[&str]| -> Vec<String> {
        let mut v = vec![keys.len().to_string()];
        v.extend(
            keys.iter()
                .chain(&head)
                .chain(params)
                .map(|s| s.to_string()),
        );
        v
    };
    // The same bucket through the generic policy script, to price the lean script's gain.
    let rein_tb_generic = generic(
        &[tb_key],
        &["tb", &capacity, &upt, &upm, &tol_us, &tol_units],
    );
    let rein_sl = args(sl_key, &[log_limit, log_us]);
    let rein_sl_client = with_client_now(&rein_sl);
    let rein_policy = generic(
        &[policy_key],
        &[
            "tb",
            &capacity,
            &upt,
            &upm,
            &tol_us,
            &tol_units,
            "fw",
            window_limit,
            window_us,
            "sl",
            log_limit,
            log_us,
        ],
    );
    let naive = |key: &str, tail: &[&str]| -> Vec<String> {
        let mut v = vec!["1".to_owned(), key.to_owned()];
        v.extend(tail.iter().map(|s| s.to_string()));
        v
    };
    // Naive ARGV: now ('' = TIME) first, then the limit's numbers.
    let nb_key = "naive:{__rand_int__}:tb";
    let nw_key = "naive:{__rand_int__}:fw";
    let nl_key = "naive:{__rand_int__}:sl";
    let client_now = "1764000000000"; // ms, as the naive scripts take it
    let naive_tb = naive(nb_key, &["", "1000", "1000000", "2000"]);
    let naive_tb_client = naive(nb_key, &[client_now, "1000", "1000000", "2000"]);
    let naive_fw = naive(nw_key, &["60000", window_limit]);
    let naive_sl = naive(nl_key, &["", "10000", log_limit]);
    let naive_sl_client = naive(nl_key, &[client_now, "10000", log_limit]);
    // A flood of denials: one key, one admission a minute. rein's integer window counts each
    // denial with INCRBY and takes it back with another; the naive script counts it.
    let rein_fw_denied = args("rein:v3:{flood}:b:0:fw60000000", &["1", window_us]);
    let naive_fw_denied = naive("naive:{flood}:fw", &["60000", "1"]);

    // A row: its name, the script's SHA, and what follows the SHA: the number of keys, the
    // keys (`__rand_int__` in them is what `redis-benchmark -r` draws afresh), then ARGV.
    #[rustfmt::skip]
    let rows: Vec<(&str, &str, &[String])> = vec![
        ("token bucket", &rein["token_bucket"], &rein_tb),
        ("token bucket, client now", &rein["token_bucket"], &rein_tb_client),
        ("token bucket, generic policy script", &rein["policy"], &rein_tb_generic),
        ("naive token bucket", &naive_bucket, &naive_tb),
        ("naive token bucket, client now", &naive_bucket, &naive_tb_client),
        ("fixed window", &rein["fixed_window"], &rein_fw),
        ("fixed window, client now", &rein["fixed_window"], &rein_fw_client),
        ("naive fixed window", &naive_window, &naive_fw),
        ("fixed window, denials (one key, limit 1)", &rein["fixed_window"], &rein_fw_denied),
        ("naive fixed window, denials (one key, limit 1)", &naive_window, &naive_fw_denied),
        ("sliding log", &rein["sliding_log"], &rein_sl),
        ("sliding log, client now", &rein["sliding_log"], &rein_sl_client),
        ("naive sliding log", &naive_log, &naive_sl),
        ("naive sliding log, client now", &naive_log, &naive_sl_client),
        ("3-limit policy (tb + fw + sl)", &rein["policy"], &rein_policy),
    ];

    // Every call must decide "allowed": checked once per script before measuring.
    for (name, sha, args) in &rows {
        let () = redis::cmd("FLUSHALL").query(&mut con).expect("FLUSHALL");
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(*sha);
        for a in args.iter() {
            cmd.arg(a.replace("__rand_int__", "check"));
        }
        let reply: redis::Value = cmd.query(&mut con).expect("EVALSHA");
        // The policy script answers `allowed` first, a lean one `now` then `allowed`, a naive
        // one a single integer.
        let allowed = match &reply {
            redis::Value::Array(items) if *sha == rein["policy"].as_str() => {
                items.first() == Some(&redis::Value::Int(1))
            }
            redis::Value::Array(items) => items.get(1) == Some(&redis::Value::Int(1)),
            other => other == &redis::Value::Int(1),
        };
        assert!(allowed, "{name}: {reply:?}");
    }

    let mut results: HashMap<&str, Vec<Measure>> = HashMap::new();
    for _ in 0..ROUNDS {
        for (name, sha, args) in &rows {
            let m = measure(&server, &mut con, sha, args, calls);
            results.entry(name).or_default().push(m);
        }
    }
    // Memory of one idle key: one decision on an emptied server, then MEMORY USAGE.
    let mut memory = HashMap::new();
    for (name, sha, args) in &rows {
        let () = redis::cmd("FLUSHALL").query(&mut con).expect("FLUSHALL");
        let args: Vec<String> = args
            .iter()
            .map(|a| a.replace("__rand_int__", "1"))
            .collect();
        let _: redis::Value = redis::cmd("EVALSHA")
            .arg(*sha)
            .arg(&args)
            .query(&mut con)
            .expect("EVALSHA");
        // The call's keys: its memory is their sum.
        let keys: usize = args[0]
            .parse()
            .expect("ARGV starts with the number of keys");
        let mut bytes = 0;
        for key in &args[1..=keys] {
            let used: Option<u64> = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(key)
                .arg("SAMPLES")
                .arg(0)
                .query(&mut con)
                .expect("MEMORY USAGE");
            bytes += used.unwrap_or(0);
        }
        memory.insert(*name, bytes);
    }

    // Interference from other work only ever adds time, so the least disturbed round (the
    // minimum) estimates a script's own cost best on a busy machine; the median is shown too.
    let stat = |name: &str, f: fn(&Measure) -> f64, min: bool| {
        let mut v: Vec<f64> = results[name].iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        if min { v[0] } else { v[v.len() / 2] }
    };
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!();
    println!(
        "redis_cost: {ROUNDS} rounds of {calls} calls, `redis-benchmark -P 32 -c 50 -r {KEYS}`; \
         load average at the end: {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!();
    println!(
        "| script | script µs/call, min | median | server CPU µs/decision, median | \
         decisions/s, median | idle key, bytes |"
    );
    println!("|---|---|---|---|---|---|");
    for (name, ..) in &rows {
        println!(
            "| {name} | {:.2} | {:.2} | {:.2} | {:.0} | {} |",
            stat(name, |m| m.usec_per_call, true),
            stat(name, |m| m.usec_per_call, false),
            stat(name, |m| m.cpu_us, false),
            stat(name, |m| m.rps, false),
            memory[name]
        );
    }
    println!();
    // Each round ran every row once, so a round's ratio compares two runs seconds apart.
    let per_round =
        |name: &str, f: fn(&Measure) -> f64| -> Vec<f64> { results[name].iter().map(f).collect() };
    let ratio = |naive: &str, rein: &str, f: fn(&Measure) -> f64| {
        Ratio::of(&per_round(naive, f), &per_round(rein, f))
    };
    println!(
        "naive ÷ rein (> 1: rein is cheaper), per round: median (spread); script µs/call, \
         then server CPU per decision"
    );
    for (label, naive, rein, goal) in [
        (
            "token bucket",
            "naive token bucket",
            "token bucket",
            ">= 1.2",
        ),
        (
            "token bucket, both with client now",
            "naive token bucket, client now",
            "token bucket, client now",
            "",
        ),
        (
            "fixed window",
            "naive fixed window",
            "fixed window",
            ">= 1.0",
        ),
        (
            "fixed window, rein with client now (the naive one reads no clock)",
            "naive fixed window",
            "fixed window, client now",
            "",
        ),
        ("sliding log", "naive sliding log", "sliding log", ">= 1.0"),
        (
            "sliding log, both with client now",
            "naive sliding log, client now",
            "sliding log, client now",
            "",
        ),
    ] {
        let goal = if goal.is_empty() {
            String::new()
        } else {
            format!(" (goal {goal})")
        };
        println!(
            "- {label}: {}; {}{goal}",
            ratio(naive, rein, |m| m.usec_per_call),
            ratio(naive, rein, |m| m.cpu_us),
        );
    }
    let policy_name = "3-limit policy (tb + fw + sl)";
    let singles = |f: fn(&Measure) -> f64| -> Vec<f64> {
        (0..ROUNDS)
            .map(|r| {
                ["token bucket", "fixed window", "sliding log"]
                    .iter()
                    .map(|n| f(&results[*n][r]))
                    .sum()
            })
            .collect()
    };
    println!(
        "- 3-limit policy vs its 3 single decisions: {}; {} (goal > 1.0)",
        Ratio::of(
            &singles(|m| m.usec_per_call),
            &per_round(policy_name, |m| m.usec_per_call)
        ),
        Ratio::of(
            &singles(|m| m.cpu_us),
            &per_round(policy_name, |m| m.cpu_us)
        ),
    );

    // Coalescing: the store sends concurrent decisions of one policy as one call of the same
    // lean script, `n` keys and `n` (operation, cost) pairs, each decision still atomic (a
    // script runs alone). Here redis-benchmark drives such calls, so the server's cost per
    // decision is set beside the naive script's one decision per call; `--bench redis`
    // measures the store coalescing by itself under 64 concurrent tasks.
    println!();
    println!(
        "coalesced calls of the shipped lean scripts (n keys per call), per decision, each \
         round beside a round of the naive script (one decision per call); median of \
         {ROUNDS}; naive ÷ rein > 1: rein is cheaper"
    );
    println!();
    println!(
        "| script | decisions per call | script µs/decision | server CPU µs/decision | \
         naive server CPU µs/decision | naive ÷ rein, server CPU, per round: median (spread) |"
    );
    println!("|---|---|---|---|---|---|");
    for (name, script, single, (naive_sha, naive_args)) in [
        (
            "token bucket",
            "token_bucket",
            &rein_tb,
            (&naive_bucket, &naive_tb),
        ),
        (
            "fixed window",
            "fixed_window",
            &rein_fw,
            (&naive_window, &naive_fw),
        ),
        (
            "sliding log",
            "sliding_log",
            &rein_sl,
            (&naive_log, &naive_sl),
        ),
    ] {
        for n in [1usize, 8, 32] {
            // KEYS: the single call's key n times (redis-benchmark draws each
            // `__rand_int__` afresh); ARGV: its header, then n (operation, cost) pairs.
            let (key, header, ask) = (
                &single[1],
                &single[2..single.len() - 2],
                &single[single.len() - 2..],
            );
            let mut args = vec![n.to_string()];
            args.extend(std::iter::repeat_n(key.clone(), n));
            args.extend(header.iter().cloned());
            for _ in 0..n {
                args.extend(ask.iter().cloned());
            }
            // Per decision: rein's call carries n of them, the naive script's one.
            let (mut rein_rounds, mut naive_rounds) = (Vec::new(), Vec::new());
            for _ in 0..ROUNDS {
                let m = measure(&server, &mut con, &rein[script], &args, calls / n as u64);
                rein_rounds.push((m.usec_per_call / n as f64, m.cpu_us / n as f64));
                let m = measure(&server, &mut con, naive_sha, naive_args, calls / n as u64);
                naive_rounds.push(m.cpu_us);
            }
            let cpu: Vec<f64> = rein_rounds.iter().map(|r| r.1).collect();
            println!(
                "| {name} | {n} | {:.2} | {:.2} | {:.2} | {} |",
                median(&rein_rounds.iter().map(|r| r.0).collect::<Vec<_>>()),
                median(&cpu),
                median(&naive_rounds),
                Ratio::of(&naive_rounds, &cpu)
            );
        }
    }
}

/// One round's figures.
struct Measure {
    usec_per_call: f64,
    cpu_us: f64,
    rps: f64,
}

/// One `redis-benchmark` run on an emptied server, with the server's own counters reset.
fn measure(
    server: &RedisServer,
    con: &mut redis::Connection,
    sha: &str,
    args: &[String],
    calls: u64,
) -> Measure {
    let () = redis::cmd("FLUSHALL").query(con).expect("FLUSHALL");
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(con)
        .expect("CONFIG RESETSTAT");
    let cpu_before = server_cpu(con);
    let started = Instant::now();
    let output = std::process::Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &server.port().to_string()])
        .args(["-P", "32", "-c", "50", "-r", &KEYS.to_string()])
        .args(["-n", &calls.to_string(), "--csv", "EVALSHA", sha])
        .args(args)
        .output()
        .expect("redis-benchmark (apt-get install redis-tools)");
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = server_cpu(con) - cpu_before;
    let text = String::from_utf8_lossy(&output.stdout);
    let rps = text
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("\"evalsha"))
        .and_then(|l| l.split(',').nth(1))
        .and_then(|f| f.trim_matches('"').parse().ok())
        .unwrap_or(calls as f64 / elapsed);
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(con)
        .expect("INFO commandstats");
    let evalsha = stats
        .lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .unwrap_or_else(|| panic!("no EVALSHA in INFO commandstats: {stats}"));
    let field = |name: &str| -> f64 {
        evalsha
            .split([':', ','])
            .skip_while(|f| !f.starts_with(name))
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
            .unwrap_or(0.0)
    };
    let (count, usec) = (field("calls"), field("usec"));
    assert!(
        field("failed_calls") == 0.0 && field("rejected_calls") == 0.0,
        "script errors: {evalsha}"
    );
    Measure {
        usec_per_call: usec / count.max(1.0),
        cpu_us: cpu * 1e6 / count.max(1.0),
        rps,
    }
}

/// `used_cpu_sys + used_cpu_user` of the server, in seconds.
fn server_cpu(con: &mut redis::Connection) -> f64 {
    let info: String = redis::cmd("INFO").arg("cpu").query(con).expect("INFO cpu");
    info.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            matches!(k, "used_cpu_sys" | "used_cpu_user").then(|| v.trim().parse::<f64>().ok())?
        })
        .sum()
}
