//! The Lua rein-redis ships, run by the simulated Redis.
//!
//! Every file in `crates/redis-store/lua/` must compile in the simulator, and so must the
//! script rein-redis actually sends (`rein_redis::SCRIPT_SOURCE`, the files concatenated).
//! A smoke differential then drives that script through each algorithm with explicit
//! times and compares every reply with a real `redis-server`'s. The full differential of
//! the store's decisions belongs to the simulation proper; this catches a script that uses
//! something the simulator lacks or renders differently.

mod support;

use std::path::PathBuf;
use std::sync::MutexGuard;

use rein_core::Timestamp;
use sim::redis::{ManualClock, Reply, Shared};
use support::{RealRedis, escape, real_server};

fn node() -> Shared {
    Shared::new(ManualClock::new(Timestamp::from_micros(NOW_MICROS)).clock())
}

/// The real server, flushed and held for the whole test, and a fresh simulated node.
fn servers() -> (MutexGuard<'static, RealRedis>, Shared) {
    let mut real = real_server().lock().unwrap_or_else(|p| p.into_inner());
    real.request(&["FLUSHALL"]);
    (real, node())
}

/// Sends `request` to both servers and checks that they reply alike, byte for byte (the
/// assertion message names `what`): the real server's reply.
fn same_reply(sim: &Shared, real: &mut RealRedis, request: &[&str], what: &str) -> Vec<u8> {
    let expected = real.request(request);
    let actual = sim.execute(request).to_resp();
    assert_eq!(escape(&actual), escape(&expected), "{what}");
    expected
}

fn sha1_hex(text: &[u8]) -> String {
    sha1_smol::Sha1::from(text).digest().to_string()
}

#[test]
fn every_shipped_lua_file_compiles_in_the_simulator() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../redis-store/lua");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "lua"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no .lua files in {}", dir.display());
    let redis = node();
    for file in &files {
        let source = std::fs::read(file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
        let reply = redis.execute([&b"SCRIPT"[..], b"LOAD", &source]);
        assert_eq!(reply, Reply::bulk(sha1_hex(&source)), "{}", file.display());
    }
    let shipped = rein_redis::SCRIPT_SOURCE.as_bytes();
    let reply = redis.execute([&b"SCRIPT"[..], b"LOAD", shipped]);
    assert_eq!(
        reply,
        Reply::bulk(sha1_hex(shipped)),
        "rein_redis::SCRIPT_SOURCE"
    );
}

#[test]
fn the_shipped_script_answers_like_redis_for_every_algorithm() {
    let (mut real, sim) = servers();
    let script = rein_redis::SCRIPT_SOURCE;
    let sha = sha1_hex(script.as_bytes());
    same_reply(&sim, &mut real, &["SCRIPT", "LOAD", script], "SCRIPT LOAD");

    // Per policy: its one key and the ARGV tail naming each limit and its parameters.
    // Windows are hours long so no key written here can expire on the real server's wall
    // clock. The policies of several limits keep them in one key (format v4, parts joined
    // by ';'), which both servers must split and join alike.
    let policies: [(&[&str], &[&str]); 6] = [
        (
            &["{t}:tb"],
            &["tb", "5", "3600000000", "1", "18000000000", "0"],
        ),
        (&["{t}:fw"], &["fw", "5", "3600000000"]),
        (&["{t}:sl"], &["sl", "5", "3600000000"]),
        (&["{t}:sc"], &["sc", "5", "3600000000"]),
        (
            &["{t}:tb+fw"],
            &[
                "tb",
                "4",
                "3600000000",
                "1",
                "14400000000",
                "0",
                "fw",
                "3",
                "7200000000",
            ],
        ),
        (
            &["{t}:sl+tb+sc"],
            &[
                "sl",
                "4",
                "3600000000",
                "tb",
                "6",
                "3600000000",
                "1",
                "21600000000",
                "0",
                "sc",
                "3",
                "7200000000",
            ],
        ),
    ];
    // (operation, µs after the start, cost): bursts past the limit, waits, refunds, a zero
    // cost, a cost above capacity (an error), and a clock that steps back.
    let steps: &[(&str, u64, &str)] = &[
        ("acquire", 0, "1"),
        ("acquire", 1, "2"),
        ("peek", 2, "1"),
        ("acquire", 3, "2"),
        ("acquire", 4, "1"),
        ("acquire", 5, "1"),
        ("refund", 6, "2"),
        ("acquire", 7, "0"),
        ("acquire", 8, "9"),
        ("acquire", 1_800_000_000, "1"),
        ("acquire", 3_700_000_000, "3"),
        ("acquire", 3_600_000_000, "1"),
        ("peek", 9_000_000_000, "0"),
        ("refund", 9_000_000_001, "7"),
        ("acquire", 9_000_000_002, "5"),
    ];
    for (keys, limits) in policies {
        for &(operation, offset, cost) in steps {
            let now = (NOW_MICROS + offset).to_string();
            let mut request = vec!["EVALSHA", sha.as_str()];
            let numkeys = keys.len().to_string();
            request.push(&numkeys);
            request.extend_from_slice(keys);
            request.extend_from_slice(&[operation, &now, cost, "0"]);
            request.extend_from_slice(limits);
            let expected = same_reply(&sim, &mut real, &request, &format!("{request:?}"));
            // The first admission is decided, not refused (a script error would match too).
            if offset == 0 {
                assert!(
                    expected.starts_with(b"*"),
                    "{request:?}: {:?}",
                    escape(&expected)
                );
            }
            // The stored value too, byte for byte.
            let stored = format!("stored after {request:?}");
            same_reply(&sim, &mut real, &["GET", keys[0]], &stored);
        }
    }
}

/// Each lean single-limit script of `rein_redis::SCRIPTS` (precomputed parameters, state as
/// one string, `GET` and `SET ... PX`) loads in the simulator and answers like Redis,
/// including after the key's TTL was set by the script itself.
#[test]
fn every_lean_script_answers_like_redis() {
    let (mut real, sim) = servers();
    // Per script: its ARGV tail (the parameters `RedisPolicy` computes) and its key.
    let cases: [(&str, &[&str]); 3] = [
        // 5 tokens, one per 3600 s: tol_us = 5 × 3600 s, no remainder.
        (
            "token_bucket",
            &["5", "3600000000", "1", "18000000000", "0"],
        ),
        ("fixed_window", &["5", "3600000000"]),
        ("sliding_log", &["5", "3600000000"]),
    ];
    for (name, params) in cases {
        let (_, source) = rein_redis::SCRIPTS
            .iter()
            .find(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("no script {name}"));
        let sha = sha1_hex(source.as_bytes());
        same_reply(&sim, &mut real, &["SCRIPT", "LOAD", source], name);
        let key = format!("{{t}}:{name}");
        let steps: &[(&str, u64, &str)] = &[
            ("acquire", 0, "2"),
            ("acquire", 1, "2"),
            ("acquire", 1, "2"),
            ("peek", 2, "1"),
            ("refund", 3, "1"),
            ("acquire", 4, "1"),
            ("acquire", 5, "9"),
            ("acquire", 1_800_000_000, "1"),
            ("acquire", 3_700_000_000, "3"),
            ("refund", 3_700_000_001, "7"),
        ];
        for &(operation, offset, cost) in steps {
            let now = (NOW_MICROS + offset).to_string();
            let mut request = vec!["EVALSHA", sha.as_str(), "1", key.as_str(), &now, "0"];
            request.extend_from_slice(params);
            request.extend_from_slice(&[operation, cost]);
            same_reply(&sim, &mut real, &request, &format!("{request:?}"));
            let stored = format!("{request:?}: stored state");
            same_reply(&sim, &mut real, &["GET", key.as_str()], &stored);
        }
        // Several decisions in one call (the store's coalescing), one of them on a corrupt
        // state: its error is an element of the reply, the others are decided.
        let corrupt = format!("{{t}}:{name}:corrupt");
        same_reply(&sim, &mut real, &["SET", corrupt.as_str(), "abc"], "SET");
        let now = (NOW_MICROS + 7_300_000_000).to_string();
        let mut request = vec![
            "EVALSHA",
            sha.as_str(),
            "3",
            &key,
            &corrupt,
            &key,
            &now,
            "0",
        ];
        request.extend_from_slice(params);
        request.extend_from_slice(&["acquire", "1", "acquire", "1", "peek", "1"]);
        same_reply(&sim, &mut real, &request, &format!("{request:?}"));
    }
}

/// The explicit `now` of the calls: the simulated node's clock shows it too, although the
/// script never reads the server's time when given one.
const NOW_MICROS: u64 = 1_700_000_000_000_000;
