//! Named timelines, run in order against rein-core directly and through `MemoryLimiter`
//! (by explicit timestamp and by its clock): every backend must give the row's figures,
//! and the store's decisions must equal the core's in full, `reset_after` included.

use rein_core::{
    AcquireError, Decision, Limit, Micros, Outcome, OverCapacity, Policy, PolicyState, Timestamp,
};
use rein_memory::{FakeClock, MemoryLimiter};

/// One request and what every backend must answer.
struct Row {
    label: &'static str,
    /// µs since the epoch.
    now: u64,
    cost: u64,
    want: Want,
    remaining: u64,
    /// µs; zero when allowed.
    retry_after: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Want {
    Allowed,
    Denied,
    /// `AcquireError::InsufficientCapacity`: the cost can never fit.
    TooLarge,
}

use Want::{Allowed, Denied, TooLarge};

const S: u64 = 1_000_000;

#[test]
#[rustfmt::skip]
fn token_bucket_timeline() {
    // 3 tokens, refilled at 1 per second.
    let policy = Policy::single(Limit::token_bucket(3, 1, Micros::from_secs(1)).unwrap());
    run(&policy, &[
        // A full bucket spends its burst, then says exactly when the next token lands.
        Row { label: "first token",          now: 0,         cost: 1, want: Allowed,  remaining: 2, retry_after: 0 },
        Row { label: "rest of the burst",    now: 0,         cost: 2, want: Allowed,  remaining: 0, retry_after: 0 },
        Row { label: "empty",                now: 0,         cost: 1, want: Denied,   remaining: 0, retry_after: S },
        Row { label: "one µs early",         now: S - 1,     cost: 1, want: Denied,   remaining: 0, retry_after: 1 },
        Row { label: "token arrives",        now: S,         cost: 1, want: Allowed,  remaining: 0, retry_after: 0 },
        // Errors and regressions change nothing.
        Row { label: "never fits",           now: S,         cost: 4, want: TooLarge, remaining: 0, retry_after: 0 },
        Row { label: "clock went back",      now: S / 2,     cost: 1, want: Denied,   remaining: 0, retry_after: 3 * S / 2 },
        // Full again at tat = 4 s.
        Row { label: "refilled",             now: 4 * S,     cost: 3, want: Allowed,  remaining: 0, retry_after: 0 },
        Row { label: "half a token later",   now: 9 * S / 2, cost: 1, want: Denied,   remaining: 0, retry_after: S / 2 },
    ]);
}

#[test]
#[rustfmt::skip]
fn fixed_window_timeline() {
    // 2 per aligned 10 s window.
    let policy = Policy::single(Limit::fixed_window(2, Micros::from_secs(10)).unwrap());
    run(&policy, &[
        Row { label: "fill the window",      now: S,          cost: 2, want: Allowed,  remaining: 0, retry_after: 0 },
        Row { label: "one µs before it ends", now: 10 * S - 1, cost: 1, want: Denied,  remaining: 0, retry_after: 1 },
        Row { label: "next window",          now: 10 * S,     cost: 1, want: Allowed,  remaining: 1, retry_after: 0 },
        // Going back counts in the stored window: it never reopens the earlier one.
        Row { label: "clock went back",      now: 5 * S,      cost: 1, want: Allowed,  remaining: 0, retry_after: 0 },
        Row { label: "window spent",         now: 19 * S,     cost: 1, want: Denied,   remaining: 0, retry_after: S },
        Row { label: "never fits",           now: 20 * S,     cost: 3, want: TooLarge, remaining: 0, retry_after: 0 },
    ]);
}

#[test]
#[rustfmt::skip]
fn sliding_log_timeline() {
    // 2 in any 10 s.
    let policy = Policy::single(Limit::sliding_log(2, Micros::from_secs(10)).unwrap());
    run(&policy, &[
        Row { label: "first",                now: S,      cost: 1, want: Allowed, remaining: 1, retry_after: 0 },
        Row { label: "second",               now: 5 * S,  cost: 1, want: Allowed, remaining: 0, retry_after: 0 },
        // The admission at 1 s leaves the window at 11 s.
        Row { label: "full log",             now: 9 * S,  cost: 1, want: Denied,  remaining: 0, retry_after: 2 * S },
        Row { label: "first one left",       now: 11 * S, cost: 1, want: Allowed, remaining: 0, retry_after: 0 },
        // Judged at the newest admission (11 s); the wait is counted from the caller's now.
        Row { label: "clock went back",      now: 3 * S,  cost: 1, want: Denied,  remaining: 0, retry_after: 12 * S },
        Row { label: "second one left",      now: 15 * S, cost: 1, want: Allowed, remaining: 0, retry_after: 0 },
    ]);
}

#[test]
#[rustfmt::skip]
fn sliding_counter_timeline() {
    // About 10 per 1 s, from the previous window's count weighted by its overlap.
    let policy = Policy::single(Limit::sliding_counter(10, Micros::from_secs(1)).unwrap());
    run(&policy, &[
        Row { label: "burst late in a window", now: 9 * S / 10,  cost: 10, want: Allowed, remaining: 0, retry_after: 0 },
        // Half-way through the next window, 5 of the previous 10 still count.
        Row { label: "half of it decayed",     now: 3 * S / 2,   cost: 5,  want: Allowed, remaining: 0, retry_after: 0 },
        // The weight must fall to 4: 60% into the window.
        Row { label: "wait for the decay",     now: 3 * S / 2,   cost: 1,  want: Denied,  remaining: 0, retry_after: S / 10 },
        // Next window: previous 5 weighted by half is 2.5, so 7 fit and 10 wait for 3 s.
        Row { label: "too many for now",       now: 5 * S / 2,   cost: 10, want: Denied,  remaining: 7, retry_after: S / 2 },
        Row { label: "what fits",              now: 5 * S / 2,   cost: 7,  want: Allowed, remaining: 0, retry_after: 0 },
        Row { label: "never fits",             now: 5 * S / 2,   cost: 11, want: TooLarge, remaining: 0, retry_after: 0 },
    ]);
}

#[test]
#[rustfmt::skip]
fn two_limit_policy_timeline() {
    // 10 per second in bursts of 10, and 15 per hour.
    let policy = Policy::new([
        Limit::token_bucket(10, 10, Micros::from_secs(1)).unwrap(),
        Limit::fixed_window(15, Micros::from_secs(3_600)).unwrap(),
    ])
    .unwrap();
    run(&policy, &[
        Row { label: "burst",                now: 0,     cost: 10, want: Allowed, remaining: 0, retry_after: 0 },
        // The bucket is the tighter limit now.
        Row { label: "bucket empty",         now: 0,     cost: 1,  want: Denied,  remaining: 0, retry_after: S / 10 },
        Row { label: "bucket refilled",      now: S,     cost: 5,  want: Allowed, remaining: 0, retry_after: 0 },
        // Now the hour is: the bucket would admit, the window makes it wait to the hour.
        Row { label: "hour spent",           now: S,     cost: 1,  want: Denied,  remaining: 0, retry_after: 3_599 * S },
        Row { label: "still spent",          now: 2 * S, cost: 1,  want: Denied,  remaining: 0, retry_after: 3_598 * S },
        Row { label: "never fits",           now: 2 * S, cost: 11, want: TooLarge, remaining: 0, retry_after: 0 },
    ]);
}

/// A way to run a row: the core on one state, or the store on one key.
trait Backend {
    fn acquire(&mut self, now: Timestamp, cost: u64) -> Result<Decision, AcquireError>;
}

struct Core {
    policy: Policy,
    state: PolicyState,
}

impl Backend for Core {
    fn acquire(&mut self, now: Timestamp, cost: u64) -> Result<Decision, AcquireError> {
        self.policy.acquire(now, &mut self.state, cost)
    }
}

/// The store, deciding at explicit timestamps, with a neighbouring key that must not be
/// affected by the row's key.
struct Store {
    limiter: MemoryLimiter<String>,
}

impl Backend for Store {
    fn acquire(&mut self, now: Timestamp, cost: u64) -> Result<Decision, AcquireError> {
        let neighbour = self.limiter.peek_at(now, "neighbour", 0);
        let decision = self.limiter.acquire_at(now, "row-key", cost);
        assert_eq!(self.limiter.peek_at(now, "neighbour", 0), neighbour);
        decision
    }
}

/// The store, reading a fake clock set to the row's time.
struct StoreByClock {
    limiter: MemoryLimiter<u64, FakeClock>,
    clock: FakeClock,
}

impl Backend for StoreByClock {
    fn acquire(&mut self, now: Timestamp, cost: u64) -> Result<Decision, AcquireError> {
        self.clock.set(now);
        self.limiter.acquire(&7, cost)
    }
}

/// Runs `rows` in order against each backend; fails naming the backend and the row.
fn run(policy: &Policy, rows: &[Row]) {
    let clock = FakeClock::default();
    let mut backends: Vec<(&str, Box<dyn Backend>)> = vec![
        (
            "core",
            Box::new(Core {
                policy: policy.clone(),
                state: policy.new_state(),
            }),
        ),
        (
            "memory",
            Box::new(Store {
                limiter: MemoryLimiter::new(policy.clone()),
            }),
        ),
        (
            "memory by clock",
            Box::new(StoreByClock {
                limiter: MemoryLimiter::builder(policy.clone())
                    .clock(clock.clone())
                    .build(),
                clock,
            }),
        ),
    ];
    let mut core_answers = Vec::new();
    for (backend, runner) in &mut backends {
        for (i, row) in rows.iter().enumerate() {
            let answer = runner.acquire(Timestamp::from_micros(row.now), row.cost);
            check(backend, row, &answer);
            match core_answers.get(i) {
                None => core_answers.push(answer),
                Some(core) => assert_eq!(
                    &answer, core,
                    "[{backend}] row {:?}: differs from the core",
                    row.label
                ),
            }
        }
    }
}

fn check(backend: &str, row: &Row, answer: &Result<Decision, AcquireError>) {
    let at = format!(
        "[{backend}] row {:?} (now {} µs, cost {})",
        row.label, row.now, row.cost
    );
    match (row.want, answer) {
        (TooLarge, Err(AcquireError::InsufficientCapacity(OverCapacity { cost, .. }))) => {
            assert_eq!(*cost, row.cost, "{at}");
        }
        (TooLarge, other) => panic!("{at}: expected InsufficientCapacity, got {other:?}"),
        (_, Err(e)) => panic!("{at}: unexpected error {e:?}"),
        (want, Ok(d)) => {
            let outcome = if want == Allowed {
                Outcome::Allowed
            } else {
                Outcome::Denied
            };
            let got = (d.outcome, d.remaining, d.retry_after.as_micros());
            assert_eq!(
                got,
                (outcome, row.remaining, row.retry_after),
                "{at}: (outcome, remaining, retry_after)"
            );
        }
    }
}
