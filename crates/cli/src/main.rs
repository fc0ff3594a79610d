//! `rein`: the operator's command line. It checks config files (rein-tower's TOML,
//! rein-server's rules), looks at and changes what Redis counts for one key of a policy
//! (inspect, reset, penalize, reward, set, block, unblock), keeps per-key overrides, and
//! watches what a policy admits and denies per second, with the policies and the Redis
//! connection a rein-tower config file names. `rein --help`
//! and each subcommand's `--help` teach it; docs/operations.md is the guide.
//!
//! Exit codes: 0 done; 1 invalid input (a config error, an unknown policy, an empty key or
//! one over 1 KiB, a Redis URL that does not parse, credentials Redis refuses, a command the
//! Redis user may not run) or a change that cannot apply; 2 a wrong command line (clap's);
//! 3 Redis unavailable.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use rein_core::admin::{AdminError, KeyAdmin, KeyState, Until};
use rein_core::overrides::{KeyMatch, Override};
use rein_core::{
    DecideError, Decision, Limit, Limiter, Micros, NamedPolicy, Policy, PolicyState, Timestamp,
};
use rein_redis::{ConnectError, RedisPolicy};
use rein_tower::{Config, ConfiguredStore, RedisEndpoint};
use serde_json::{Value, json};

/// rein's command line: check config files, look at and change what Redis counts for one
/// key of a policy, give keys other limits (overrides) while the servers run, and watch
/// what a policy admits and denies.
///
/// The policies and the Redis they are counted in come from a rein-tower config file
/// (--config, or REIN_CONFIG), the one the servers load.
///
/// Examples:
///
///     rein config check rein.toml
///     rein config check ratelimit-rules/
///     rein --config rein.toml policy list
///     rein --config rein.toml key inspect api 203.0.113.7
///     rein --config rein.toml key reset login user-42
///     rein --config rein.toml key block login user-42 --for 10m --reason "ticket 77"
///     rein --config rein.toml override set api --key tenant-7 --limit fw:10000/1h
///     rein --config rein.toml override list
///     rein --config rein.toml watch api
///
/// Exit codes: 0 done; 1 invalid input (a config error, an unknown policy, an empty key or
/// one over 1 KiB, an override or reason rein refuses, a Redis URL that does not parse,
/// credentials Redis refuses, a command the Redis user may not run) or a change that cannot
/// apply; 2 a wrong command line; 3 Redis unavailable (cannot connect, no answer in time,
/// or a key too busy to change).
#[derive(Debug, Parser)]
#[command(name = "rein", version, verbatim_doc_comment)]
struct Cli {
    /// The rein-tower config file (TOML) that names the policies and their Redis.
    #[arg(long, short, env = "REIN_CONFIG", global = true)]
    config: Option<PathBuf>,
    /// Ask this Redis instead of the config's [redis] (the same key prefix),
    /// e.g. a port-forward: redis://host:port/ or rediss://... .
    #[arg(
        long,
        env = "REIN_REDIS_URL",
        global = true,
        conflicts_with = "redis_cluster"
    )]
    redis_url: Option<String>,
    /// Ask this Redis Cluster instead of the config's [redis]: one or more of its nodes'
    /// URLs, comma-separated (the same key prefix).
    #[arg(long, env = "REIN_REDIS_CLUSTER", global = true, value_delimiter = ',')]
    redis_cluster: Vec<String>,
    /// How long one Redis call may take before the command gives up (exit 3), and the
    /// connect at least as long: the config's `deadline` is the servers' hot path (50 ms by
    /// default) and its `connect_timeout` theirs (1 s), too short for a port-forward or a
    /// tunnel, over which a change would be made and reported failed. A change that timed
    /// out may have been made: see `key penalize --help`.
    #[arg(long, env = "REIN_TIMEOUT", global = true, default_value = "2s", value_parser = parse_timeout)]
    timeout: Duration,
    /// Print one JSON document instead of text, for scripts (errors too, with "error").
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Config files.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// The config's policies.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// One key of a policy, in Redis.
    #[command(subcommand)]
    Key(KeyCommand),
    /// Per-key overrides: another limit (or none) for one key or key prefix of a policy,
    /// kept in Redis and applied by every server within its `overrides_staleness`.
    #[command(subcommand)]
    Override(OverrideCommand),
    /// What POLICY admits and denies per second, summed over every server that reports
    /// (rein-tower's `report_counts`, on by default), refreshed in place each second
    /// until Ctrl-C (or --count refreshes). Each line shows the latest complete second (2 s
    /// ago by Redis's clock: every server has reported it by then) and the totals of the
    /// last --window. With --json, one JSON object per line. Reads only.
    ///
    /// The counts are the servers' decisions through Redis: answers a failure policy gave
    /// locally while Redis was away are not in them, and a report that failed is dropped,
    /// so a second may read low while Redis is slow, never high. A refresh Redis does not
    /// answer within --timeout shows as a line saying so (with --json, an object with
    /// "error"), and the watch goes on; it exits 3 only if no refresh was answered.
    #[command(
        after_help = "Examples:\n  rein --config rein.toml watch api\n  rein --config rein.toml --json watch login --window 1m --count 5"
    )]
    Watch {
        /// The policy's name, as in the config (`rein policy list`).
        policy: String,
        /// How many seconds the totals cover, from 1s to 117s: Redis keeps each second's
        /// counts for two minutes, the newest shown is two seconds old, and a server's clock
        /// may be a second off.
        #[arg(long, default_value = "10s", value_parser = parse_window)]
        window: u64,
        /// Stop after this many refreshes (default: until Ctrl-C).
        #[arg(long)]
        count: Option<u64>,
    },
}

/// A duration argument (`90s`, `10m`, `1h 30m`), its error naming the text.
fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|e| format!("{text:?}: {e}"))
}

/// `--timeout`: from 1 ms to a minute.
fn parse_timeout(text: &str) -> Result<Duration, String> {
    let span = parse_duration(text)?;
    if (Duration::from_millis(1)..=Duration::from_secs(60)).contains(&span) {
        Ok(span)
    } else {
        Err(format!("{text:?}: from 1ms to 1m"))
    }
}

/// `--for` of a block: at least 1 µs, the unit rein counts in (a block of no time would
/// block nothing, and a script reading only the exit code would think the key blocked).
fn parse_block(text: &str) -> Result<Duration, String> {
    let span = parse_duration(text)?;
    if span.as_micros() == 0 {
        return Err(format!("{text:?}: a block lasts at least 1us"));
    }
    Ok(span)
}

/// `--window`: whole seconds, from 1 s to as many as Redis still holds once complete.
fn parse_window(text: &str) -> Result<u64, String> {
    let span = parse_duration(text)?;
    let max = rein_redis::watch::MAX_SECONDS_READ;
    match span.as_secs() {
        secs @ 1.. if secs <= max && span.subsec_nanos() == 0 => Ok(secs),
        _ => Err(format!(
            "{text:?}: whole seconds, from 1s to {max}s (each second's counts are kept two \
             minutes)"
        )),
    }
}

#[derive(Debug, Subcommand)]
enum OverrideCommand {
    /// Give the keys of POLICY that --key or --prefix selects other limits (--limit, one or
    /// more, all applying) or none (--unlimited). Replaces their earlier override. With
    /// the policy's shape (its algorithms in its order; a lone fixed window's length) and
    /// its windows, what the key has counted is kept: a raised limit goes on from it, a
    /// lowered one applies to it at once. A new window counts afresh, a token bucket keeps
    /// the time until it is full, not a count (docs/operations.md, "What a key keeps when
    /// its numbers change"). Another shape counts afresh, and leaves a block of the key
    /// behind (docs/operations.md, "Overrides: one tenant's limit").
    ///
    /// A limit is tb:CAPACITY:REFILL/PERIOD (a token bucket: bursts of CAPACITY, REFILL
    /// tokens every PERIOD), fw:LIMIT/WINDOW (fixed window), sl:LIMIT/WINDOW (sliding log)
    /// or sc:LIMIT/WINDOW (sliding counter); PERIOD and WINDOW as 1s, 10m, 1h, 1day.
    #[command(
        after_help = "Examples:\n  rein --config rein.toml override set api --key tenant-7 --limit fw:10000/1h\n  rein --config rein.toml override set api --prefix internal: --unlimited\n  rein --config rein.toml override set api --key tenant-9 --limit tb:200:100/1s --limit fw:50000/1day"
    )]
    Set {
        /// The policy's name, as in the config (`rein policy list`).
        policy: String,
        #[command(flatten)]
        keys: Keys,
        /// A limit of the override (repeat for several; all apply).
        #[arg(long = "limit", value_name = "LIMIT", required_unless_present = "unlimited", value_parser = parse_limit)]
        limits: Vec<Limit>,
        /// No limit at all: every request admitted, Redis not asked.
        #[arg(long, conflicts_with = "limits")]
        unlimited: bool,
    },
    /// Which override applies to KEY under POLICY (its own, or its longest prefix's), or
    /// none.
    #[command(after_help = "Example:\n  rein --config rein.toml override get api tenant-7")]
    Get {
        /// The policy's name, as in the config (`rein policy list`).
        policy: String,
        /// The key, as the layer extracts it.
        key: String,
    },
    /// Every override kept in Redis, or those of one policy.
    #[command(after_help = "Example:\n  rein --config rein.toml override list api")]
    List {
        /// Only this policy's.
        policy: Option<String>,
    },
    /// Remove the override of the keys --key or --prefix selects: they get their policy's
    /// own limits again.
    #[command(after_help = "Example:\n  rein --config rein.toml override rm api --key tenant-7")]
    Rm {
        /// The policy's name: one of the config's (`rein policy list`), or one it no longer
        /// has whose overrides `override list` still shows.
        policy: String,
        #[command(flatten)]
        keys: Keys,
    },
}

/// One key or a key prefix.
#[derive(Debug, clap::Args)]
#[group(required = true, multiple = false)]
struct Keys {
    /// This key only, as the layer extracts it.
    #[arg(long)]
    key: Option<String>,
    /// Every key starting with this, unless its own override or a longer prefix's applies.
    #[arg(long)]
    prefix: Option<String>,
}

impl Keys {
    fn to_match(&self) -> (KeyMatch, &str) {
        match (&self.key, &self.prefix) {
            (Some(key), _) => (KeyMatch::Key(key.as_bytes().into()), key),
            (None, Some(prefix)) => (KeyMatch::Prefix(prefix.as_bytes().into()), prefix),
            // clap's group makes one of them required.
            (None, None) => (KeyMatch::Key(Box::default()), ""),
        }
    }
}

/// A limit as the command line writes it: `tb:200:100/1s`, `fw:1000/1h`, `sl:`, `sc:`.
fn parse_limit(text: &str) -> Result<Limit, String> {
    let usage = "tb:CAPACITY:REFILL/PERIOD, fw:LIMIT/WINDOW, sl:LIMIT/WINDOW or sc:LIMIT/WINDOW";
    let (tag, rest) = text
        .split_once(':')
        .ok_or_else(|| format!("expected {usage}"))?;
    let (numbers, span) = rest
        .split_once('/')
        .ok_or_else(|| format!("expected {usage}"))?;
    let span = micros(humantime::parse_duration(span).map_err(|e| format!("{span:?}: {e}"))?);
    let number = |n: &str| {
        n.parse::<u64>()
            .map_err(|_| format!("{n:?} is not a whole number; expected {usage}"))
    };
    let limit = match (tag, numbers.split_once(':')) {
        ("tb", Some((capacity, refill))) => {
            Limit::token_bucket(number(capacity)?, number(refill)?, span)
        }
        ("fw", None) => Limit::fixed_window(number(numbers)?, span),
        ("sl", None) => Limit::sliding_log(number(numbers)?, span),
        ("sc", None) => Limit::sliding_counter(number(numbers)?, span),
        _ => return Err(format!("expected {usage}")),
    };
    limit.map_err(|e| e.to_string())
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Check config files: every error with its file, line and field. A `.toml` file is
    /// rein-tower's; a directory, or a `.yaml`/`.yml` file, holds rein-server's rules.
    #[command(after_help = "Example:\n  rein config check rein.toml ratelimit-rules/")]
    Check {
        /// The files or rule directories.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
enum PolicyCommand {
    /// Each policy of the config, with its limits.
    #[command(after_help = "Example:\n  rein --config rein.toml policy list")]
    List,
}

#[derive(Debug, Subcommand)]
enum KeyCommand {
    /// What Redis holds for KEY under POLICY: each limit's remaining and reset, at Redis's
    /// clock. Reads only.
    #[command(after_help = "Example:\n  rein --config rein.toml key inspect api 203.0.113.7")]
    Inspect {
        /// The policy's name, as in the config (`rein policy list`).
        policy: String,
        /// The key, as the layer extracts it: a peer IP, a header's value, a user id.
        key: String,
    },
    /// Forget what Redis counted for KEY under POLICY, every limit at once: the key is then
    /// as full as one never seen. What other servers counted for it until then is
    /// forgotten too.
    #[command(after_help = "Example:\n  rein --config rein.toml key reset login user-42")]
    Reset {
        /// The policy's name, as in the config (`rein policy list`).
        policy: String,
        /// The key, as the layer extracts it.
        key: String,
    },
    /// Take AMOUNT from every limit of KEY, whatever they would admit, never past empty (a
    /// bad login costs 5). Atomic: no decision made meanwhile by any server is lost.
    /// Running it again after a failure may take it twice.
    #[command(after_help = "Example:\n  rein --config rein.toml key penalize login user-42 5")]
    Penalize {
        /// The policy's name, as in the config (`rein policy list`).
        policy: String,
        /// The key, as the layer extracts it.
        key: String,
        /// How much to take from each limit.
        amount: u64,
    },
    /// Give AMOUNT back to every limit of KEY, never beyond full (a request charged by
    /// mistake). Refused (exit 1) where it would change nothing: a key a block holds, or
    /// one an override makes unlimited. Running it again after a failure may give it twice.
    #[command(after_help = "Example:\n  rein --config rein.toml key reward api 203.0.113.7 1")]
    Reward {
        /// The policy's name, as in the config (`rein policy list`).
        policy: String,
        /// The key, as the layer extracts it.
        key: String,
        /// How much to give back to each limit.
        amount: u64,
    },
    /// Set what KEY has left: every limit as if reset now and then charged its capacity
    /// less REMAINING (a limit of capacity at most REMAINING is full). Replaces a block.
    #[command(after_help = "Example:\n  rein --config rein.toml key set api 203.0.113.7 20")]
    Set {
        /// The policy's name, as in the config (`rein policy list`).
        policy: String,
        /// The key, as the layer extracts it.
        key: String,
        /// What every limit has left afterwards (at most its capacity).
        remaining: u64,
    },
    /// Block KEY: every decision on it, by every server, is denied until the block ends,
    /// with Retry-After the time left; what it had counted is replaced, and at the end it
    /// is as a key never seen. A new block replaces an earlier one.
    #[command(
        after_help = "Example:\n  rein --config rein.toml key block login user-42 --for 10m --reason \"credential stuffing\""
    )]
    Block {
        /// The policy's name, as in the config (`rein policy list`).
        policy: String,
        /// The key, as the layer extracts it.
        key: String,
        /// How long, from Redis's clock: 90s, 10m, 1h 30m, 2d.
        #[arg(long = "for", value_name = "DURATION", value_parser = parse_block)]
        duration: Duration,
        /// Why, kept with the block and shown by `key inspect` (at most 200 bytes of text).
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Lift KEY's block: it is then as a key never seen. A key that was not blocked is left
    /// as it is.
    #[command(after_help = "Example:\n  rein --config rein.toml key unblock login user-42")]
    Unblock {
        /// The policy's name, as in the config (`rein policy list`).
        policy: String,
        /// The key, as the layer extracts it.
        key: String,
    },
}

/// Why a command did not do its job, and so its exit code.
#[derive(Debug)]
enum Failure {
    /// Bad input, or a change that cannot apply: exit 1.
    Input(String),
    /// Redis gave no answer (exit 3), or refused the user a command (exit 1).
    Redis(String),
}

impl Failure {
    fn code(&self) -> u8 {
        match self {
            Failure::Input(_) => 1,
            // Redis answered, refusing the user a command: no retry helps (before, exit 3,
            // "Redis unavailable").
            Failure::Redis(m) if refused_by_acl(m) => 1,
            Failure::Redis(_) => 3,
        }
    }

    fn message(&self) -> String {
        match self {
            Failure::Redis(m) if refused_by_acl(m) => format!(
                "{m}\n  the Redis user may not run a command this needs: docs/redis.md, \
                 \"TLS, AUTH and a least-privilege user\", lists what each command needs \
                 (every `rein key` change reads the overrides: +hget +hgetall on \
                 <prefix>:overrides)"
            ),
            Failure::Input(m) | Failure::Redis(m) => m.clone(),
        }
    }
}

/// Whether Redis refused a command for its user's permissions: `NOPERM` when called
/// directly, which redis-rs shows as `NoPerm` (rein's own refused `ASKING` as
/// `Server(NoPerm)`); when a script called it, Redis's own words, which have changed (7.0:
/// "The user executing the script can't run this command", 7.2: "ACL failure in script").
fn refused_by_acl(message: &str) -> bool {
    [
        "NoPerm",
        "The user executing the script can't",
        "ACL failure in script",
    ]
    .iter()
    .any(|words| message.contains(words))
}

/// What a command prints: text for people, a JSON document for scripts.
struct Output {
    text: String,
    json: Value,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // A wrong command line is exit 2 either way; with `--json` its message is the
        // document's "error", as every other failure's (help and version print as asked).
        Err(error)
            if std::env::args_os().any(|a| a == "--json")
                && !matches!(
                    error.kind(),
                    clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
                ) =>
        {
            let message = error.render().to_string();
            shown(&format!("{}\n", json!({ "error": message.trim_end() })));
            return ExitCode::from(2);
        }
        Err(error) => error.exit(),
    };
    let json = cli.json;
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("rein: cannot start: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(output) => {
            if json && !output.json.is_null() {
                shown(&format!("{}\n", output.json));
            } else {
                shown(&output.text);
            }
            ExitCode::SUCCESS
        }
        Err((output, failure)) => {
            if json {
                let mut document = output.map_or_else(|| json!({}), |o| o.json);
                document["error"] = json!(failure.message());
                shown(&format!("{document}\n"));
            } else {
                if let Some(output) = output {
                    shown(&output.text);
                }
                eprintln!("rein: {}", failure.message());
            }
            ExitCode::from(failure.code())
        }
    }
}

/// Writes `text` to stdout. Written, not printed: a reader that went away
/// (`rein ... | head`) is no panic.
fn shown(text: &str) {
    use std::io::Write;
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

/// The command's output, or why it failed (with what it printed before failing).
async fn run(cli: Cli) -> Result<Output, (Option<Output>, Failure)> {
    match &cli.command {
        Command::Config(ConfigCommand::Check { files }) => check(files),
        Command::Policy(PolicyCommand::List) => {
            let config = config(&cli).map_err(|f| (None, f))?;
            Ok(list(&config))
        }
        Command::Key(command) => key_command(&cli, command).await.map_err(|f| (None, f)),
        Command::Override(command) => override_command(&cli, command).await.map_err(|f| (None, f)),
        Command::Watch {
            policy,
            window,
            count,
        } => watch(&cli, policy, *window, *count)
            .await
            .map_err(|f| (None, f)),
    }
}

/// `watch`: a line per refresh, printed as it goes (in place on a terminal); the output
/// returned is empty.
async fn watch(cli: &Cli, name: &str, window: u64, count: Option<u64>) -> Result<Output, Failure> {
    use std::io::{IsTerminal, Write};

    let (policy, store) = policy_and_store(cli, name).await?;
    let in_place = !cli.json && std::io::stdout().is_terminal();
    let complete = rein_redis::watch::COMPLETE_AFTER.as_secs();
    let mut every = tokio::time::interval(Duration::from_secs(1));
    let mut shown = 0;
    let (mut answered, mut missed) = (false, None);
    while count.is_none_or(|count| shown < count) {
        every.tick().await;
        let read = async {
            let now = store
                .server_time()
                .await
                .map_err(|e| Failure::Redis(format!("reading Redis's clock: {e}")))?;
            let last = (now.as_micros() / 1_000_000).saturating_sub(complete);
            let first = last.saturating_sub(window - 1);
            store
                .counts(policy.name(), first, last)
                .await
                .map_err(admin_failed)
        };
        let line = match read.await {
            Ok(seconds) => {
                answered = true;
                counts_line(cli.json, name, window, &seconds)
            }
            // Redis slow or away is what a watch is for: say so, and go on.
            Err(Failure::Redis(why)) => {
                let line = if cli.json {
                    json!({ "policy": name, "error": why }).to_string()
                } else {
                    format!(
                        "{}  {name}: no answer from Redis ({why}); still watching",
                        humantime::format_rfc3339_seconds(std::time::SystemTime::now()),
                    )
                };
                missed = Some(why);
                line
            }
            Err(input) => return Err(input),
        };
        let mut out = std::io::stdout().lock();
        let written = if in_place {
            write!(out, "\r\x1b[2K{line}").and_then(|()| out.flush())
        } else {
            writeln!(out, "{line}")
        };
        if written.is_err() {
            // The reader went away (a closed pipe): nothing more to show.
            break;
        }
        shown += 1;
    }
    if in_place {
        println!();
    }
    match missed {
        Some(why) if !answered => Err(Failure::Redis(format!(
            "Redis answered no refresh; the last: {why}"
        ))),
        _ => Ok(Output {
            text: String::new(),
            json: Value::Null,
        }),
    }
}

/// One refresh of `watch`: the latest complete second of `seconds` and their totals.
fn counts_line(
    json: bool,
    name: &str,
    window: u64,
    seconds: &[rein_redis::watch::Counted],
) -> String {
    let latest = seconds.last().copied().unwrap_or_default();
    let admitted: u64 = seconds.iter().map(|c| c.admitted).sum();
    let denied: u64 = seconds.iter().map(|c| c.denied).sum();
    if json {
        json!({
            "policy": name,
            "second": latest.second,
            "admitted": latest.admitted,
            "denied": latest.denied,
            "window_s": window,
            "window_admitted": admitted,
            "window_denied": denied,
        })
        .to_string()
    } else {
        let at = std::time::UNIX_EPOCH + Duration::from_secs(latest.second);
        format!(
            "{}  {name}: {} admitted/s, {} denied/s; last {}: {admitted} admitted, {denied} denied",
            humantime::format_rfc3339_seconds(at),
            latest.admitted,
            latest.denied,
            span(Micros::from_secs(window)),
        )
    }
}

/// `config check`: every file, then a failure if any was bad.
fn check(files: &[PathBuf]) -> Result<Output, (Option<Output>, Failure)> {
    let mut text = String::new();
    let mut results = Vec::new();
    let mut bad = 0;
    for file in files {
        let shown = file.display();
        match check_one(file) {
            Ok((kind, summary)) => {
                text.push_str(&format!("{shown}: ok ({kind}: {summary})\n"));
                results.push(json!({"file": shown.to_string(), "ok": true, "kind": kind, "summary": summary}));
            }
            // Each error names its file (a rules directory's: the file in it), and where.
            Err(error) => {
                bad += 1;
                text.push_str(&format!("{error}\n"));
                results.push(json!({"file": shown.to_string(), "ok": false, "error": error}));
            }
        }
    }
    let output = Output {
        text,
        json: json!({ "files": results }),
    };
    if bad == 0 {
        Ok(output)
    } else {
        let failure = Failure::Input(format!("{bad} of {} config files are invalid", files.len()));
        Err((Some(output), failure))
    }
}

/// One file or rules directory: its kind and a summary, or the error (with line and field).
fn check_one(path: &Path) -> Result<(&'static str, String), String> {
    let rules = path.is_dir()
        || path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("yaml") || e.eq_ignore_ascii_case("yml"));
    if rules {
        let rules = rein_server::RulesConfig::load(path).map_err(|e| e.to_string())?;
        let domains = rules.domain_names().count();
        let mut summary = format!("{domains} domains, {} rules", rules.rule_count());
        for warning in rules.warnings() {
            summary.push_str(&format!("; warning: {warning}"));
        }
        Ok(("rein-server rules", summary))
    } else {
        let config = Config::load(path).map_err(|e| e.to_string())?;
        let mut summary = format!(
            "{} policies, {} routes",
            config.policies.len(),
            config.routes.len()
        );
        if let Some(leases) = &config.leases {
            summary.push_str(&format!(", leases for {} servers", leases.expected_nodes));
        }
        Ok(("rein-tower config", summary))
    }
}

/// The config file the command names.
fn config(cli: &Cli) -> Result<Config, Failure> {
    let Some(path) = &cli.config else {
        return Err(Failure::Input(
            "no config file: pass --config rein.toml (or set REIN_CONFIG)".into(),
        ));
    };
    Config::load(path).map_err(|e| Failure::Input(e.to_string()))
}

/// `policy list`.
fn list(config: &Config) -> Output {
    let mut text = String::new();
    let mut policies = Vec::new();
    for policy in &config.policies {
        let shadow = config.shadow.iter().any(|s| s == policy.name());
        text.push_str(policy.name());
        if shadow {
            text.push_str(" (shadow mode)");
        }
        text.push('\n');
        let mut limits = Vec::new();
        for (index, limit) in policy.policy().limits().iter().enumerate() {
            text.push_str(&format!("  limit {index}: {}\n", describe(limit)));
            limits.push(limit_json(limit));
        }
        policies.push(json!({"name": policy.name(), "shadow": shadow, "limits": limits}));
    }
    Output {
        text,
        json: json!({ "policies": policies }),
    }
}

/// The policy `name` of the config, prepared for Redis, and the store to ask about `key`
/// (which must be one a limiter takes: 1 byte to 1 KiB).
async fn target(
    cli: &Cli,
    name: &str,
    key: &str,
) -> Result<(RedisPolicy, ConfiguredStore), Failure> {
    check_key(key)?;
    policy_and_store(cli, name).await
}

/// Refuses a key no request has (empty, or longer than a limiter takes), and warns of an
/// address spelled otherwise than the HTTP layer keys it.
fn check_key(key: &str) -> Result<(), Failure> {
    match rein_core::KeyError::check(key.as_bytes()) {
        Err(rein_core::KeyError::Empty) => {
            return Err(Failure::Input(
                "the key is empty; no request has an empty key".into(),
            ));
        }
        Err(error) => {
            return Err(Failure::Input(format!(
                "{error}; no request has such a key"
            )));
        }
        Ok(()) => {}
    }
    // rein-tower keys a client by its address's canonical text: another spelling of the
    // same address (an IPv4-mapped `::ffff:203.0.113.7`, upper case, a zero run written
    // out) is a key no request uses, and a change to it would do nothing.
    if let Ok(ip) = key.parse::<std::net::IpAddr>() {
        let canonical = ip.to_canonical().to_string();
        if canonical != key {
            eprintln!(
                "rein: warning: the HTTP layer keys this client as {canonical:?}, not {key:?}: \
                 a request keyed by its address never uses this key"
            );
        }
    }
    Ok(())
}

/// The policy `name` of the config, prepared for Redis, and the store to ask.
async fn policy_and_store(
    cli: &Cli,
    name: &str,
) -> Result<(RedisPolicy, ConfiguredStore), Failure> {
    let config = config(cli)?;
    let Some(named) = config.policies.iter().find(|p| p.name() == name).cloned() else {
        let known: Vec<&str> = config.policies.iter().map(NamedPolicy::name).collect();
        return Err(Failure::Input(format!(
            "no policy named {name:?} in the config; its policies: {}",
            known.join(", ")
        )));
    };
    let store = connect(cli, config).await?;
    Ok((RedisPolicy::prepare(&named), store))
}

/// The config's Redis, or the one `--redis-url` or `--redis-cluster` names.
async fn connect(cli: &Cli, mut config: Config) -> Result<ConfiguredStore, Failure> {
    if let Some(url) = &cli.redis_url {
        config.redis.endpoint = RedisEndpoint::Url(url.clone());
    }
    if !cli.redis_cluster.is_empty() {
        config.redis.endpoint = RedisEndpoint::Cluster(cli.redis_cluster.clone());
    }
    config.redis.deadline = cli.timeout;
    // The connect too: the config's is sized for the servers (1 s by default), and a tunnel's
    // connect with its script loads may take longer.
    config.redis.connect_timeout = config.redis.connect_timeout.max(cli.timeout);
    config.connect_store().await.map_err(|e| {
        let message = format!("cannot connect to Redis ({}): {e}", config.redis.endpoint);
        match e {
            // What the command line or the file said is wrong (a URL, a password): a retry
            // cannot help.
            ConnectError::Config(_) | ConnectError::InvalidUrl(_) | ConnectError::Auth(_) => {
                Failure::Input(message)
            }
            _ => Failure::Redis(message),
        }
    })
}

/// `key inspect`: by the limits that decide the key, its override's if it has one.
async fn inspect(
    name: &str,
    key: &str,
    policy: &RedisPolicy,
    store: &ConfiguredStore,
) -> Result<Output, Failure> {
    let applied = applicable_override(store, name, key).await?;
    let (overridden, note) = match &applied {
        Some(entry) => {
            let shown = format!(
                "  override: {} (the override of {})\n",
                show_override(&entry.value),
                show_match(&entry.keys)
            );
            let json = entry_json(name, &entry.keys, Some(&entry.value));
            match &entry.value {
                Override::Limits(limits) => {
                    let named = NamedPolicy::new(name, limits.clone())
                        .map_err(|e| Failure::Input(e.to_string()))?;
                    (Some(RedisPolicy::prepare(&named)), Some((shown, json)))
                }
                Override::Unlimited => {
                    let shown = format!(
                        "{shown}  decisions are admitted and not counted; below, what the policy's own limits counted before\n"
                    );
                    (None, Some((shown, json)))
                }
            }
        }
        None => (None, None),
    };
    let policy = overridden.as_ref().unwrap_or(policy);
    let shares = match policy.policy().limits() {
        [Limit::TokenBucket(_)] => store
            .rate_state(policy, key.as_bytes())
            .await
            .map_err(|e| Failure::Redis(format!("reading the rate shares: {e}")))?,
        _ => None,
    };
    let mut output = match shares {
        Some(state) => inspect_shares(name, key, policy, store, &state).await?,
        None => inspect_limits(name, key, policy, store).await?,
    };
    if let Some((text, json)) = note {
        let first_line = output.text.find('\n').map_or(output.text.len(), |i| i + 1);
        output.text.insert_str(first_line, &text);
        output.json["override"] = json;
    }
    Ok(output)
}

/// A token bucket leased as rate: who holds which part of its rate, as Redis keeps it (the
/// store-side view of the rate shares, docs/leases.md).
async fn inspect_shares(
    name: &str,
    key: &str,
    policy: &RedisPolicy,
    store: &ConfiguredStore,
    state: &rein_core::rate_share::RateState,
) -> Result<Output, Failure> {
    use rein_core::rate_share::RATE_PARTS;

    let redis_keys = store
        .keys(policy, key.as_bytes())
        .map_err(|e| Failure::Input(format!("the key {key:?}: {e}")))?;
    let now = store
        .server_time()
        .await
        .map_err(|e| Failure::Redis(format!("reading Redis's clock: {e}")))?;
    let percent = |parts: u64| format!("{}.{}%", parts / 10, parts % 10);
    let mut text = format!(
        "policy {name}, key {key:?} (Redis key {}), at Redis's clock {}: a token bucket leased as rate, split between servers\n",
        redis_keys.join(", "),
        humantime::format_rfc3339_micros(
            std::time::UNIX_EPOCH + Duration::from_micros(now.as_micros())
        ),
    );
    let (mut held, mut stranded) = (0, 0);
    let mut rows = Vec::new();
    for share in &state.shares {
        let lapsed = share.until <= now;
        held += share.parts;
        let validity = if lapsed {
            stranded += share.parts;
            format!(
                "lapsed {} ago: its server stopped renewing (killed or cut off); the rate is stranded until another server's take reclaims it",
                span(now.saturating_since(share.until))
            )
        } else {
            format!("valid for {}", span(share.until.saturating_since(now)))
        };
        text.push_str(&format!(
            "  server {}: {} of the rate, bursts of {}, demand {}/s, {validity}\n",
            share.node,
            percent(share.parts),
            share.burst,
            share.demand,
        ));
        rows.push(json!({
            "node": share.node,
            "rate_parts": share.parts,
            "burst": share.burst,
            "demand": share.demand,
            "until_us": share.until.as_micros(),
            "lapsed": lapsed,
        }));
    }
    if state.shares.is_empty() {
        text.push_str("  no server holds a share: the whole rate is decided directly\n");
    }
    text.push_str(&format!(
        "  held by shares: {} of the rate ({} lapsed); decided directly: the rest\n",
        percent(held),
        percent(stranded),
    ));
    Ok(Output {
        text,
        json: json!({
            "policy": name,
            "key": key,
            "redis_keys": redis_keys,
            "now_us": now.as_micros(),
            "rate_shares": {
                "parts_of_rate": RATE_PARTS,
                "shares": rows,
                "held_parts": held,
                "lapsed_parts": stranded,
            },
        }),
    })
}

/// What Redis holds for `key` under `policy`'s limits.
async fn inspect_limits(
    name: &str,
    key: &str,
    policy: &RedisPolicy,
    store: &ConfiguredStore,
) -> Result<Output, Failure> {
    let redis_keys = store
        .keys(policy, key.as_bytes())
        .map_err(|e| Failure::Input(format!("the key {key:?}: {e}")))?;
    let stored = store
        .inspect(policy, key.as_bytes())
        .await
        .map_err(admin_failed)?;
    let now = store
        .server_time()
        .await
        .map_err(|e| Failure::Redis(format!("reading Redis's clock: {e}")))?;
    let limits = policy.policy().limits();
    let mut document = json!({
        "policy": name,
        "key": key,
        "redis_keys": redis_keys,
        "now_us": now.as_micros(),
    });
    let state = match stored {
        KeyState::Blocked { block, reason } if block.holds_at(now) => {
            let left = block.ends_at().saturating_since(now);
            let until = std::time::UNIX_EPOCH + Duration::from_micros(block.ends_at().as_micros());
            let text = format!(
                "policy {name}, key {key:?} (Redis key {}): blocked until {} (for {}){}\n  every decision is denied until then; `rein key unblock` lifts it\n",
                redis_keys.join(", "),
                humantime::format_rfc3339_micros(until),
                span(left),
                if reason.is_empty() {
                    String::new()
                } else {
                    format!(": {reason}")
                },
            );
            document["blocked"] = json!({
                "until_us": block.ends_at().as_micros(),
                "for_us": left.as_micros(),
                "reason": reason,
            });
            return Ok(Output {
                text,
                json: document,
            });
        }
        // A block read just after its end: the key is as one never seen.
        KeyState::Blocked { .. } => policy.policy().new_state(),
        KeyState::Counting(state) => state,
    };
    let mut text = format!(
        "policy {name}, key {key:?} (Redis key {}), at Redis's clock {}\n",
        redis_keys.join(", "),
        humantime::format_rfc3339_micros(
            std::time::UNIX_EPOCH + Duration::from_micros(now.as_micros())
        ),
    );
    let mut rows = Vec::new();
    let untouched = policy.policy().is_full(now, &state);
    for (index, (limit, part)) in limits.iter().zip(state.iter()).enumerate() {
        let Some(view) = view(now, limit, part) else {
            continue;
        };
        text.push_str(&format!(
            "  limit {index}: {}: {} of {} left, full again in {}\n",
            describe(limit),
            view.remaining,
            view.limit,
            span(view.reset_after),
        ));
        let mut row = limit_json(limit);
        row["remaining"] = json!(view.remaining);
        row["reset_after_us"] = json!(view.reset_after.as_micros());
        rows.push(row);
    }
    if untouched {
        text.push_str("  (nothing counted: every limit is full)\n");
    }
    document["full"] = json!(untouched);
    document["limits"] = json!(rows);
    Ok(Output {
        text,
        json: document,
    })
}

/// One limit's figures at `now`: a zero-cost peek of it alone.
fn view(now: Timestamp, limit: &Limit, part: &rein_core::LimitState) -> Option<Decision> {
    let alone = Policy::single(*limit);
    let state = PolicyState::from_states([part.clone()])?;
    alone.peek(now, &state, 0).ok()
}

/// `key reset`.
async fn reset(
    name: &str,
    key: &str,
    policy: &RedisPolicy,
    store: &ConfiguredStore,
) -> Result<Output, Failure> {
    let existed = store
        .reset(policy, key.as_bytes())
        .await
        .map_err(admin_failed)?;
    let text = if existed {
        format!("policy {name}, key {key:?}: reset; every limit is full again\n")
    } else {
        format!("policy {name}, key {key:?}: nothing was counted; nothing to reset\n")
    };
    Ok(Output {
        text,
        json: json!({"policy": name, "key": key, "reset": existed}),
    })
}

/// `key ...`: the policy and key it names, then the command on them.
async fn key_command(cli: &Cli, command: &KeyCommand) -> Result<Output, Failure> {
    let (name, key) = match command {
        KeyCommand::Inspect { policy, key }
        | KeyCommand::Reset { policy, key }
        | KeyCommand::Penalize { policy, key, .. }
        | KeyCommand::Reward { policy, key, .. }
        | KeyCommand::Set { policy, key, .. }
        | KeyCommand::Block { policy, key, .. }
        | KeyCommand::Unblock { policy, key } => (policy.as_str(), key.as_str()),
    };
    let (policy, store) = target(cli, name, key).await?;
    // A change lands in the key the override in force decides by: read now, or fail
    // (the read as the store connected may have failed, leaving it no override).
    if !matches!(command, KeyCommand::Inspect { .. }) {
        store
            .refresh_overrides()
            .await
            .map_err(|e| Failure::Redis(format!("reading the overrides: {e}")))?;
    }
    let k = key.as_bytes();
    let head = format!("policy {name}, key {key:?}");
    // A count changed under an unlimited override is the policy's own, which decisions
    // read only once the override goes: done, and said (the figures shown are that count).
    if matches!(
        command,
        KeyCommand::Penalize { .. } | KeyCommand::Set { .. }
    ) && applicable_override(&store, name, key)
        .await?
        .is_some_and(|entry| entry.value == Override::Unlimited)
    {
        eprintln!(
            "rein: note: the key's override makes it unlimited: its decisions read no state \
             until the override goes; this changes what the policy's own limits count then"
        );
    }
    let (text, done, figures) = match command {
        KeyCommand::Penalize { amount, .. } => {
            refuse_while_blocked(&store, &policy, k, "a penalty").await?;
            let after = store
                .penalize(&policy, k, *amount)
                .await
                .map_err(admin_failed)?;
            (
                format!("{head}: penalized by {amount}"),
                json!({"penalized": amount}),
                Some(after),
            )
        }
        KeyCommand::Reward { amount, .. } => {
            // A refund changes nothing of a key whose override makes it unlimited (its
            // decisions read no state) or that a block holds: refused, not reported done.
            let unlimited = applicable_override(&store, name, key)
                .await?
                .is_some_and(|entry| entry.value == Override::Unlimited);
            if unlimited {
                return Err(admin_failed(AdminError::NotApplicable(
                    "the key's override makes it unlimited: its decisions read no state, so \
                     there is nothing to reward"
                        .into(),
                )));
            }
            refuse_while_blocked(&store, &policy, k, "a reward").await?;
            store
                .refund(None, &policy, k, *amount)
                .await
                .map_err(|e| match e {
                    // The store cannot give back to this key (a token bucket leased as rate):
                    // nothing was changed, and Redis answered.
                    DecideError::Unsupported { .. } => admin_failed(AdminError::rate_shared()),
                    e => Failure::Redis(format!("changing the key: {e}")),
                })?;
            let after = store
                .peek(None, &policy, k, 0)
                .await
                .map_err(|e| Failure::Redis(format!("reading the key: {e}")))?;
            (
                format!("{head}: rewarded {amount}"),
                json!({"rewarded": amount}),
                Some(after),
            )
        }
        KeyCommand::Set { remaining, .. } => {
            let after = store
                .set_remaining(&policy, k, *remaining)
                .await
                .map_err(admin_failed)?;
            (
                format!("{head}: set"),
                json!({"set": remaining}),
                Some(after),
            )
        }
        KeyCommand::Block {
            duration, reason, ..
        } => {
            let blocked = store
                .block(&policy, k, Until::For(micros(*duration)), reason)
                .await
                .map_err(admin_failed)?;
            let text = match blocked {
                true => format!(
                    "{head}: blocked for {}; every decision is denied until then",
                    humantime::format_duration(*duration)
                ),
                false => format!("{head}: a block of no time blocks nothing"),
            };
            let done = json!({"blocked": blocked, "for_us": micros(*duration).as_micros(), "reason": reason});
            (text, done, None)
        }
        KeyCommand::Unblock { .. } => {
            let lifted = store.unblock(&policy, k).await.map_err(admin_failed)?;
            let text = match lifted {
                true => format!("{head}: unblocked; the key is as one never seen"),
                false => format!("{head}: was not blocked; nothing changed"),
            };
            (text, json!({"unblocked": lifted}), None)
        }
        KeyCommand::Inspect { .. } => return inspect(name, key, &policy, &store).await,
        KeyCommand::Reset { .. } => return reset(name, key, &policy, &store).await,
    };
    let mut document = json!({"policy": name, "key": key});
    for (field, value) in done.as_object().into_iter().flatten() {
        document[field] = value.clone();
    }
    let text = match figures {
        Some(after) if after.is_allowed() || after.remaining > 0 => {
            document["remaining"] = json!(after.remaining);
            document["reset_after_us"] = json!(after.reset_after.as_micros());
            format!(
                "{text}; {} of {} left (limit {}), full again in {}\n",
                after.remaining,
                after.limit,
                after.limit_index,
                span(after.reset_after)
            )
        }
        Some(after) => {
            document["remaining"] = json!(0);
            document["retry_after_us"] = json!(after.retry_after.as_micros());
            format!("{text}; nothing left, for {}\n", span(after.retry_after))
        }
        None => format!("{text}\n"),
    };
    Ok(Output {
        text,
        json: document,
    })
}

/// `override ...`.
async fn override_command(cli: &Cli, command: &OverrideCommand) -> Result<Output, Failure> {
    match command {
        OverrideCommand::List { policy } => {
            let store = connect(cli, config(cli)?).await?;
            list_overrides(&store, policy.as_deref()).await
        }
        OverrideCommand::Set {
            policy,
            keys,
            limits,
            unlimited,
        } => set_override(cli, policy, keys, limits, *unlimited).await,
        OverrideCommand::Rm { policy, keys } => remove_override(cli, policy, keys).await,
        OverrideCommand::Get { policy, key } => get_override(cli, policy, key).await,
    }
}

/// An operator's read or change that failed: bad input (exit 1) or Redis (exit 3).
fn admin_failed(e: AdminError) -> Failure {
    match e {
        AdminError::InvalidKey(_)
        | AdminError::InvalidReason(_)
        | AdminError::InvalidOverride(_)
        | AdminError::InvalidRequest(_)
        | AdminError::NotApplicable(_) => Failure::Input(e.to_string()),
        e => Failure::Redis(e.to_string()),
    }
}

async fn set_override(
    cli: &Cli,
    name: &str,
    keys: &Keys,
    limits: &[Limit],
    unlimited: bool,
) -> Result<Output, Failure> {
    let (matched, shown) = keys.to_match();
    let (_, store) = target(cli, name, shown).await?;
    let value = if unlimited {
        Override::Unlimited
    } else {
        let policy = Policy::new(limits.iter().copied())
            .map_err(|e| Failure::Input(format!("--limit: {e}")))?;
        Override::Limits(policy)
    };
    let replaced = store
        .set_override(name, &matched, &value)
        .await
        .map_err(admin_failed)?;
    let text = format!(
        "policy {name}, {}: {} ({})\n",
        show_match(&matched),
        show_override(&value),
        if replaced {
            "replaced the earlier override"
        } else {
            "new"
        }
    );
    let mut json = entry_json(name, &matched, Some(&value));
    json["replaced"] = json!(replaced);
    let mut text = text;
    if config(cli)?.leases.is_some() {
        let note = "the config leases its policies ([leases]): a decision a lease answers \
                    keeps the policy's own limits, so the override reaches only the key's \
                    other decisions (docs/operations.md)";
        text.push_str(&format!("note: {note}\n"));
        json["note"] = json!(note);
    }
    Ok(Output { text, json })
}

/// Removes an override by its policy's name alone: one of a policy the config no longer
/// has still counts toward the servers' cap and revives if the name comes back.
async fn remove_override(cli: &Cli, name: &str, keys: &Keys) -> Result<Output, Failure> {
    let (matched, _) = keys.to_match();
    rein_core::overrides::check_target(name, &matched).map_err(admin_failed)?;
    let config = config(cli)?;
    if !config.policies.iter().any(|p| p.name() == name) {
        eprintln!(
            "rein: warning: the config has no policy named {name:?}: removing an override it \
             left behind (`rein override list` shows them)"
        );
    }
    let store = connect(cli, config).await?;
    let removed = store
        .remove_override(name, &matched)
        .await
        .map_err(admin_failed)?;
    let text = match removed {
        true => format!(
            "policy {name}, {}: override removed\n",
            show_match(&matched)
        ),
        false => format!("policy {name}, {}: had no override\n", show_match(&matched)),
    };
    let mut json = entry_json(name, &matched, None);
    json["removed"] = json!(removed);
    Ok(Output { text, json })
}

/// Refuses `change` (a penalty, a reward) of a key a block holds: it would change nothing
/// the block's denial does not hide, and the key is as one never seen when the block ends,
/// so reporting it done would lose it. (A state the inspection cannot read, a token bucket
/// leased as rate, is left to the change, which refuses it or applies.)
async fn refuse_while_blocked(
    store: &ConfiguredStore,
    policy: &RedisPolicy,
    key: &[u8],
    change: &str,
) -> Result<(), Failure> {
    if let (Ok(KeyState::Blocked { block, .. }), Ok(now)) =
        (store.inspect(policy, key).await, store.server_time().await)
        && block.holds_at(now)
    {
        return Err(admin_failed(AdminError::NotApplicable(format!(
            "the key is blocked: {change} changes nothing while the block holds, and the key \
             starts afresh when it ends; `rein key unblock` lifts it"
        ))));
    }
    Ok(())
}

/// The override that applies to `key` of the policy `name` now, as the servers look it up
/// (its own, then its longest prefix's), read from Redis.
async fn applicable_override(
    store: &ConfiguredStore,
    name: &str,
    key: &str,
) -> Result<Option<rein_core::overrides::OverrideEntry>, Failure> {
    let all = store.overrides().await.map_err(admin_failed)?;
    warn_unreadable(&all.unreadable);
    let mut of_policy = rein_core::overrides::Overrides::default();
    for entry in all.entries.into_iter().filter(|e| e.policy == name) {
        of_policy.insert(entry.keys.clone(), entry);
    }
    Ok(of_policy.get(key.as_bytes()).cloned())
}

async fn get_override(cli: &Cli, name: &str, key: &str) -> Result<Output, Failure> {
    let (_, store) = target(cli, name, key).await?;
    Ok(match applicable_override(&store, name, key).await? {
        Some(entry) => Output {
            text: format!(
                "policy {name}, key {key:?}: {} (the override of {})\n",
                show_override(&entry.value),
                show_match(&entry.keys)
            ),
            json: entry_json(name, &entry.keys, Some(&entry.value)),
        },
        None => Output {
            text: format!("policy {name}, key {key:?}: no override; the policy's own limits\n"),
            json: json!({"policy": name, "key": key, "value": Value::Null}),
        },
    })
}

/// Says which override fields no server reads (as the servers do, they are left out).
fn warn_unreadable(unreadable: &[String]) {
    for problem in unreadable {
        eprintln!(
            "rein: warning: an override no server reads, left out: {problem} (write it again \
             with `rein override set`, remove it with `rein override rm`, or, where the field \
             names no policy and key, with Redis's `HDEL` of the field)"
        );
    }
}

async fn list_overrides(store: &ConfiguredStore, policy: Option<&str>) -> Result<Output, Failure> {
    let list = store
        .overrides()
        .await
        .map_err(|e| Failure::Redis(format!("reading the overrides: {e}")))?;
    warn_unreadable(&list.unreadable);
    let unreadable = list.unreadable;
    let mut all = list.entries;
    all.retain(|e| policy.is_none_or(|p| e.policy == p));
    all.sort_by(|a, b| (&a.policy, &a.keys).cmp(&(&b.policy, &b.keys)));
    let mut text = String::new();
    for entry in &all {
        text.push_str(&format!(
            "{} {}: {}\n",
            entry.policy,
            show_match(&entry.keys),
            show_override(&entry.value)
        ));
    }
    if all.is_empty() {
        text.push_str("no overrides\n");
    }
    let rows: Vec<Value> = all
        .iter()
        .map(|e| entry_json(&e.policy, &e.keys, Some(&e.value)))
        .collect();
    Ok(Output {
        text,
        json: json!({ "overrides": rows, "unreadable": unreadable }),
    })
}

fn show_match(keys: &KeyMatch) -> String {
    match keys {
        KeyMatch::Key(key) => format!("key {:?}", String::from_utf8_lossy(key)),
        KeyMatch::Prefix(prefix) => format!("keys starting {:?}", String::from_utf8_lossy(prefix)),
    }
}

fn show_override(value: &Override) -> String {
    match value {
        Override::Unlimited => "unlimited".to_owned(),
        Override::Limits(policy) => {
            let limits: Vec<String> = policy.limits().iter().map(describe).collect();
            limits.join(" and ")
        }
    }
}

/// An override as JSON: `value` is its stored text (null for none), `limits` its limits.
fn entry_json(policy: &str, keys: &KeyMatch, value: Option<&Override>) -> Value {
    let (kind, bytes) = match keys {
        KeyMatch::Key(key) => ("key", key),
        KeyMatch::Prefix(prefix) => ("prefix", prefix),
    };
    let limits: Option<Vec<Value>> = match value {
        Some(Override::Limits(p)) => Some(p.limits().iter().map(limit_json).collect()),
        _ => None,
    };
    json!({
        "policy": policy,
        kind: String::from_utf8_lossy(bytes),
        "value": value.map(Override::encode),
        "unlimited": matches!(value, Some(Override::Unlimited)),
        "limits": limits,
    })
}

/// A limit in words: `token bucket: 100, refilling 10 per 1s`.
fn describe(limit: &Limit) -> String {
    match limit {
        Limit::TokenBucket(bucket) => {
            let (units_per_token, units_per_micro) = bucket.emission_interval();
            let per_token = Micros::from_micros(units_per_token / units_per_micro.max(1));
            format!(
                "token bucket of {}, one token every {}",
                limit.capacity(),
                span(per_token)
            )
        }
        Limit::FixedWindow(w) => format!("fixed window, {} per {}", w.limit(), span(w.window())),
        Limit::SlidingLog(w) => format!("sliding log, {} per {}", w.limit(), span(w.window())),
        Limit::SlidingCounter(w) => {
            format!("sliding counter, {} per {}", w.limit(), span(w.window()))
        }
    }
}

fn limit_json(limit: &Limit) -> Value {
    let (algorithm, window) = match limit {
        Limit::TokenBucket(_) => ("token_bucket", None),
        Limit::FixedWindow(w) => ("fixed_window", Some(w.window())),
        Limit::SlidingLog(w) => ("sliding_log", Some(w.window())),
        Limit::SlidingCounter(w) => ("sliding_counter", Some(w.window())),
    };
    json!({
        "algorithm": algorithm,
        "capacity": limit.capacity(),
        "window_us": window.map(Micros::as_micros),
    })
}

/// A duration as rein's µs, saturating (beyond every limit's span).
fn micros(duration: Duration) -> Micros {
    Micros::from_micros(u64::try_from(duration.as_micros()).unwrap_or(u64::MAX))
}

/// A span for people: `1.5s`, `3m 20s`.
fn span(span: Micros) -> String {
    let micros = span.as_micros();
    // Whole milliseconds above a second, so that the text stays short.
    let shown = if micros >= 1_000_000 {
        Duration::from_millis(micros / 1_000)
    } else {
        Duration::from_micros(micros)
    };
    humantime::format_duration(shown).to_string()
}

#[cfg(test)]
mod tests {
    /// A refusal as redis-rs shows one sent directly (before, the needle was `NOPERM`, which
    /// redis-rs never prints: such a refusal was exit 3, "Redis unavailable").
    #[test]
    fn a_direct_refusal_reads_as_one() {
        let reply = redis::parse_redis_value(b"-NOPERM User rein has no permissions\r\n")
            .expect("a RESP error");
        let error = reply.extract_error().expect_err("an error reply");
        let message = format!("reading the rate shares: {error}");
        assert!(super::refused_by_acl(&message), "{message}");
        assert!(!super::refused_by_acl("reading the rate shares: timed out"));
    }
}
