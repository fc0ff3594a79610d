//! Shared inputs for rein's criterion benches: seeded key sequences, short settings, and a
//! CPU-time measurement for machines shared with other work.
//!
//! The benches live in `benches/benches/`; run them with `cargo bench -p rein-benches`.
//! Everything random here comes from a fixed seed, so every run (and every store within a
//! run) sees the same keys in the same order.

use std::time::Duration;

use criterion::measurement::{Measurement, ValueFormatter};
use criterion::{Criterion, Throughput};
use rein_core::rng::SplitMix64;

/// Criterion settings short enough for 2 shared cores: 1 s warm-up, 3 s of measurement,
/// 30 samples. A whole bench target then takes a minute or two.
pub fn quick() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30)
        .configure_from_args()
}

/// [`quick`] measuring [`ThreadCpuTime`] instead of wall time.
pub fn quick_cpu() -> Criterion<ThreadCpuTime> {
    quick().with_measurement(ThreadCpuTime)
}

/// `criterion_main!` for a bench of two targets: `$wall` measuring wall time with the
/// [`quick`] settings, then `$cpu` measuring [`ThreadCpuTime`] with [`quick_cpu`].
#[macro_export]
macro_rules! quick_main {
    ($wall:path, $cpu:path) => {
        criterion::criterion_group! {
            name = wall;
            config = $crate::quick();
            targets = $wall
        }
        criterion::criterion_group! {
            name = cpu;
            config = $crate::quick_cpu();
            targets = $cpu
        }
        criterion::criterion_main!(wall, cpu);
    };
}

/// Whether to run the CPU-time variants of the benches: set `REIN_BENCH_CPU_TIME=1`.
pub fn cpu_time_requested() -> bool {
    std::env::var_os("REIN_BENCH_CPU_TIME").is_some_and(|v| v != "0")
}

/// Whether `cargo bench` started this binary, for the benches with a `main` of their own
/// that run for minutes: `cargo bench` passes `--bench`, a plain `cargo test --benches`
/// passes nothing and must not wait for them. When not, says how to run bench `name`.
pub fn bench_requested(name: &str) -> bool {
    let requested = std::env::args().any(|a| a == "--bench");
    if !requested {
        println!("{name} bench: run with `cargo bench -p rein-benches --bench {name}`");
    }
    requested
}

/// How long each run of bench `name` measures: `REIN_BENCH_SECS` seconds, or
/// `default_secs` where it is unset; `None`, having said how to run it, when `name` was not
/// asked for ([`bench_requested`]).
pub fn bench_run(name: &str, default_secs: u64) -> Option<Duration> {
    bench_requested(name).then(|| Duration::from_secs(env_number("REIN_BENCH_SECS", default_secs)))
}

/// The number in environment variable `var` (`REIN_BENCH_SECS`, ...), or `default` where it
/// is unset or not a number.
pub fn env_number<T: std::str::FromStr>(var: &str, default: T) -> T {
    std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// The CPU time of the measuring thread (`CLOCK_THREAD_CPUTIME_ID`), in nanoseconds.
///
/// On a machine whose cores other processes also use, wall time counts the slices in which
/// the bench was not running at all; this counts only the ones in which it was. What it
/// cannot remove is the cache and TLB state those other processes leave behind, so it
/// is still slower than an idle machine. Only for single-threaded benches.
pub struct ThreadCpuTime;

impl Measurement for ThreadCpuTime {
    type Intermediate = u64;
    type Value = u64;

    fn start(&self) -> u64 {
        thread_cpu_nanos()
    }

    fn end(&self, start: u64) -> u64 {
        thread_cpu_nanos().saturating_sub(start)
    }

    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }

    fn zero(&self) -> u64 {
        0
    }

    fn to_f64(&self, value: &u64) -> f64 {
        *value as f64
    }

    fn formatter(&self) -> &dyn ValueFormatter {
        &CpuNanos
    }
}

/// Formats [`ThreadCpuTime`] values: always nanoseconds, throughput in elements per second.
struct CpuNanos;

impl ValueFormatter for CpuNanos {
    fn scale_values(&self, _typical: f64, _values: &mut [f64]) -> &'static str {
        "ns (cpu)"
    }

    fn scale_throughputs(
        &self,
        _typical: f64,
        throughput: &Throughput,
        values: &mut [f64],
    ) -> &'static str {
        let per_iteration = match *throughput {
            Throughput::Elements(n) | Throughput::ElementsAndBytes { elements: n, .. } => n,
            Throughput::Bytes(n) | Throughput::BytesDecimal(n) | Throughput::Bits(n) => n,
        };
        for value in values {
            // Nanoseconds per iteration to millions of elements per CPU-second.
            *value = per_iteration as f64 * 1e3 / *value;
        }
        "Melem/s (cpu)"
    }

    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        "ns"
    }
}

fn thread_cpu_nanos() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec, and CLOCK_THREAD_CPUTIME_ID is supported
    // on every Linux and BSD; on failure `ts` stays zero and the sample reads as zero.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs * 1_000_000_000 + nanos
}

/// A ratio measured once per round: its median and its spread over the rounds. Peers are
/// compared by this, not by the ratio of their medians: the rounds alternate peers (A B A B
/// ...), so each round's ratio compares two runs a few seconds apart, under the same load,
/// and the spread says how far one run can be trusted on a shared machine.
#[derive(Clone, Copy, Debug)]
pub struct Ratio {
    /// The median of the rounds' ratios.
    pub median: f64,
    /// The smallest.
    pub min: f64,
    /// The largest.
    pub max: f64,
}

impl Ratio {
    /// `peer[r] / base[r]` for each round `r`.
    pub fn of(peer: &[f64], base: &[f64]) -> Self {
        let ratios: Vec<f64> = peer
            .iter()
            .zip(base)
            .map(|(p, b)| if *b > 0.0 { p / b } else { 0.0 })
            .collect();
        Self {
            median: median(&ratios),
            min: ratios.iter().copied().fold(f64::INFINITY, f64::min),
            max: ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        }
    }
}

impl std::fmt::Display for Ratio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.2} ({:.2}–{:.2})", self.median, self.min, self.max)
    }
}

/// The median of `values` (the upper one of an even count); 0 for none.
pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
}

/// `len` indices below `keys`, uniformly pseudo-random from `seed` (rein-core's
/// SplitMix64).
///
/// The length should be a power of two, so a bench can wrap with a mask.
pub fn key_sequence(keys: u32, len: usize, seed: u64) -> Vec<u32> {
    let mut rng = SplitMix64::new(seed);
    (0..len)
        .map(|_| {
            let r = rng.next_u64();
            // Multiply-shift maps 32 random bits onto 0..keys without a division.
            (((r >> 32) * u64::from(keys)) >> 32) as u32
        })
        .collect()
}

/// `n` distinct string keys shaped like IPv4 addresses in 10.0.0.0/8 ("10.0.1.45"), the
/// typical key of a per-client limit.
pub fn ip_keys(n: u32) -> Vec<String> {
    (0..n)
        .map(|i| format!("10.{}.{}.{}", (i >> 16) & 0xff, (i >> 8) & 0xff, i & 0xff))
        .collect()
}

/// The naive scripts rein replaces, as they are usually published; `--bench redis_cost`
/// and `--bench redis` measure rein's against them.
pub mod naive {
    /// A script that opens as the timed ones do: `key` is KEYS[1], `now` in ms is ARGV[1],
    /// or for '' Redis's `TIME`.
    macro_rules! timed {
        ($body:literal) => {
            concat!(
                r"
local key = KEYS[1]
local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
else
  now = tonumber(ARGV[1])
end",
                $body
            )
        };
    }

    /// The common token bucket: tokens as a float refilled from the last update, a hash of two
    /// floats, `PEXPIRE` on every call. ARGV: now in ms ('' = `TIME`), tokens per second,
    /// capacity, TTL in ms.
    pub const NAIVE_TOKEN_BUCKET: &str = timed!(
        r"
local rate = tonumber(ARGV[2]) / 1000
local capacity = tonumber(ARGV[3])
local ttl = tonumber(ARGV[4])
local bucket = redis.call('HMGET', key, 'tokens', 'last_update')
local tokens = tonumber(bucket[1])
local last_update = tonumber(bucket[2])
if tokens == nil then
  tokens = capacity
  last_update = now
end
local new_tokens = (now - last_update) * rate
if new_tokens > 0 then
  tokens = math.min(capacity, tokens + new_tokens)
  last_update = now
end
local allowed = 0
if tokens >= 1 then
  tokens = tokens - 1
  allowed = 1
end
redis.call('HSET', key, 'tokens', tokens, 'last_update', last_update)
redis.call('PEXPIRE', key, ttl)
return allowed
"
    );

    /// The common fixed window: `INCRBY` then `PEXPIRE`. ARGV: window in ms, limit.
    pub const NAIVE_FIXED_WINDOW: &str = r"
local count = redis.call('INCRBY', KEYS[1], 1)
redis.call('PEXPIRE', KEYS[1], ARGV[1])
if count > tonumber(ARGV[2]) then
  return 0
end
return 1
";

    /// The common sliding log: a sorted set of request times. ARGV: now in ms ('' = `TIME`),
    /// window in ms, limit.
    pub const NAIVE_SLIDING_LOG: &str = timed!(
        r"
local window = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', key, 0, now - window)
local count = redis.call('ZCARD', key)
if count < limit then
  redis.call('ZADD', key, now, now .. '-' .. math.random())
  redis.call('PEXPIRE', key, window)
  return 1
end
return 0
"
    );
}
