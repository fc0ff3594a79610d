//! Runs every demo program and compares what it prints with the expected output in its
//! own doc comment (the ```text block under "Expected output"), so the documented output
//! is the real one. The Redis demos run against a private server, twice: a second run
//! against the same server must print the same (each demo deletes its keys first).

use std::process::Command;

use rein_redis_harness::RedisServer;

/// Each demo: its name, its source, and whether it needs Redis.
const DEMOS: &[(&str, &str, bool)] = &[
    (
        "sliding_window",
        include_str!("../src/bin/sliding_window.rs"),
        true,
    ),
    (
        "token_bucket_burst",
        include_str!("../src/bin/token_bucket_burst.rs"),
        true,
    ),
    (
        "one_store_interface",
        include_str!("../src/bin/one_store_interface.rs"),
        true,
    ),
    (
        "fixed_window_boundary",
        include_str!("../src/bin/fixed_window_boundary.rs"),
        false,
    ),
    (
        "three_methods",
        include_str!("../src/bin/three_methods.rs"),
        true,
    ),
];

#[test]
fn every_demo_prints_its_documented_output() {
    let server = RedisServer::start().expect("start redis-server");
    for &(name, source, needs_redis) in DEMOS {
        let expected = expected_output(source)
            .unwrap_or_else(|| panic!("{name}: no ```text block under \"Expected output\""));
        for run in 1..=(1 + usize::from(needs_redis)) {
            let mut command = Command::new(binary(name));
            // Never the shared Redis on 6379: the demo's default when nothing is given.
            command.env("REIN_REDIS_URL", server.url());
            let output = command.output().expect("run the demo");
            assert!(
                output.status.success(),
                "{name} (run {run}) failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            let printed = String::from_utf8_lossy(&output.stdout);
            let printed: Vec<&str> = printed.lines().map(str::trim_end).collect();
            assert_eq!(
                printed, expected,
                "{name} (run {run}): output differs from its doc"
            );
        }
    }
}

#[test]
fn the_list_of_demos_is_complete() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/bin");
    let mut on_disk: Vec<String> = std::fs::read_dir(dir)
        .expect("src/bin")
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_suffix(".rs")
                .map(str::to_owned)
        })
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = DEMOS.iter().map(|d| d.0.to_owned()).collect();
    listed.sort();
    assert_eq!(on_disk, listed, "a demo is missing from DEMOS");
}

/// The path of a demo binary built for this test.
fn binary(name: &str) -> std::path::PathBuf {
    // Cargo builds a package's binaries for its integration tests and names each in
    // `CARGO_BIN_EXE_<name>`; only known at compile time, hence the match.
    let path = match name {
        "sliding_window" => env!("CARGO_BIN_EXE_sliding_window"),
        "token_bucket_burst" => env!("CARGO_BIN_EXE_token_bucket_burst"),
        "one_store_interface" => env!("CARGO_BIN_EXE_one_store_interface"),
        "fixed_window_boundary" => env!("CARGO_BIN_EXE_fixed_window_boundary"),
        "three_methods" => env!("CARGO_BIN_EXE_three_methods"),
        other => panic!("unknown demo {other}"),
    };
    path.into()
}

/// The lines of the ```text block that follows "Expected output" in the `//!` doc.
fn expected_output(source: &str) -> Option<Vec<&str>> {
    let doc: Vec<&str> = source
        .lines()
        .filter_map(|l| l.strip_prefix("//!"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l).trim_end())
        .collect();
    let heading = doc.iter().position(|l| l.starts_with("Expected output"))?;
    let start = heading + doc[heading..].iter().position(|l| *l == "```text")? + 1;
    let len = doc[start..].iter().position(|l| *l == "```")?;
    Some(doc[start..start + len].to_vec())
}
