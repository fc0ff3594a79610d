//! [`Breaker`]: a circuit breaker as a pure state machine, in quinn's sans-IO shape.
//!
//! It reads no clock, spawns nothing and sleeps nowhere: the caller passes `now`, asks
//! whether a call may go out ([`Breaker::poll_admit`]), reports how it went
//! ([`Breaker::handle_success`], [`Breaker::handle_failure`], [`Breaker::handle_abandoned`]),
//! and drains the transitions it caused ([`Breaker::poll_event`]). The timers are plain
//! data, so a test walks it along a number line and a simulator drives it in virtual time.

use std::collections::VecDeque;
use std::num::NonZeroU32;
use std::time::Duration;

use rein_core::rng::SplitMix64;
use rein_core::{Micros, Timestamp};

/// Stops calls to a Redis that keeps failing, and lets one probe through now and then until
/// one succeeds.
///
/// # States
/// - **Closed**: every call goes out. `failure_threshold` consecutive failures trip it.
/// - **Open** until an instant: no call goes out. The open period of the `n`-th consecutive
///   trip is `min(base_backoff × 2^(n−1), max_backoff)`, shortened by at most
///   `jitter_permille`‰ drawn from the seeded RNG (never lengthened).
/// - **Half-open**: the first call after the open period is the single probe; every other
///   call is refused until it ends. A successful probe closes the breaker (and resets `n`);
///   a failed, or timed-out, probe opens it again for the next, longer period.
///
/// So the longest a breaker stays open after Redis has recovered, with traffic arriving, is
/// `max_backoff` plus the probe that was in flight when Redis came back (`probe_timeout`)
/// plus the successful probe's round trip (docs/failure.md, "Circuit breaker").
///
/// # Call order and time
/// 1. `poll_admit(now)` before each call: `Some(ticket)` means send it, `None` means don't
///    (the driver answers with its failure policy). It applies due timers first, so a
///    driver without a timer of its own never needs [`handle_timeout`](Self::handle_timeout).
/// 2. Exactly one of `handle_success`, `handle_failure` or `handle_abandoned` per ticket,
///    when the call ends. Outcomes of tickets issued before the last transition are stale
///    and ignored: a success that left before the breaker tripped says nothing about now.
/// 3. `poll_event()` until `None`, to log and count the transitions.
///
/// `poll_timeout()` says when the state changes with no input (the end of an open period,
/// or the deadline of the probe in flight), and `handle_timeout(now)` applies it.
///
/// `now` need not be monotonic: an input whose `now` is earlier than one seen before is taken
/// at the latest instant seen, so a clock that steps back neither ends an open period early
/// nor stretches one. Nothing panics or overflows, and nothing is sticky: every state is
/// left by the inputs above.
///
/// ```
/// use std::num::NonZeroU32;
/// use std::time::Duration;
/// use rein::core::Timestamp;
/// use rein::BreakerConfig;
/// use rein::breaker::{Breaker, BreakerState};
///
/// let config = BreakerConfig::new()
///     .with_failure_threshold(NonZeroU32::new(2).unwrap())
///     .with_backoff(Duration::from_millis(100), Duration::from_secs(1));
/// let mut breaker = Breaker::new(config);
/// let at = |ms: u64| Timestamp::from_micros(ms * 1_000);
/// for ms in [0, 1] {
///     let ticket = breaker.poll_admit(at(ms)).expect("closed: calls go out");
///     breaker.handle_failure(at(ms), ticket);
/// }
/// assert_eq!(breaker.state(), BreakerState::Open);
/// assert_eq!(breaker.poll_timeout(), Some(at(101)));
/// assert!(breaker.poll_admit(at(100)).is_none());
/// let probe = breaker.poll_admit(at(101)).expect("the single probe");
/// assert!(breaker.poll_admit(at(101)).is_none(), "one probe at a time");
/// breaker.handle_success(at(102), probe);
/// assert_eq!(breaker.state(), BreakerState::Closed);
/// ```
#[derive(Clone, Debug)]
pub struct Breaker {
    config: BreakerConfig,
    phase: Phase,
    /// Bumped on every transition; a ticket carries the value it was issued under.
    generation: u64,
    /// Consecutive trips without a successful probe: the `n` of the backoff.
    trips: u32,
    /// The latest `now` seen: the breaker's own clock never goes back.
    latest: Timestamp,
    rng: SplitMix64,
    events: VecDeque<BreakerEvent>,
}

/// Settings of a [`Breaker`].
///
/// Defaults: trip after 5 consecutive failures; open for 100 ms, doubling per consecutive
/// trip up to 800 ms; no jitter; a probe that has not ended after 50 ms counts as failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Consecutive failures that trip a closed breaker (`K`).
    failure_threshold: NonZeroU32,
    /// The first open period (`b`).
    base_backoff: Micros,
    /// The longest open period (`B`).
    max_backoff: Micros,
    /// The most an open period is shortened by jitter, in thousandths of it.
    jitter_permille: u16,
    /// Seeds the jitter RNG.
    rng_seed: u64,
    /// How long a probe may run before it counts as failed.
    probe_timeout: Micros,
}

/// What a [`Breaker`] is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BreakerState {
    /// Calls go out.
    Closed,
    /// No call goes out until the open period ends.
    Open,
    /// One probe may go out (or is out); other calls are refused.
    HalfOpen,
}

/// Permission for one call, from [`Breaker::poll_admit`]; hand it back with the outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "report the call's outcome with the ticket"]
pub struct Ticket {
    generation: u64,
    probe: bool,
}

/// A state change, from [`Breaker::poll_event`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreakerEvent {
    /// Calls stop until `until`: `failure_threshold` failures in a row while closed, or a
    /// failed probe.
    Opened {
        /// When it tripped.
        at: Timestamp,
        /// Where it came from: [`BreakerState::Closed`] or [`BreakerState::HalfOpen`].
        from: BreakerState,
        /// The end of the open period.
        until: Timestamp,
        /// Consecutive trips so far, this one included (the `n` of the backoff).
        trips: u32,
    },
    /// The open period ended; the next call is the probe.
    HalfOpened {
        /// When the open period's end was observed.
        at: Timestamp,
    },
    /// A probe succeeded; calls flow again.
    Closed {
        /// When the probe's success was reported.
        at: Timestamp,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Closed {
        /// Consecutive failures so far.
        failures: u32,
    },
    Open {
        until: Timestamp,
    },
    HalfOpen {
        /// The deadline of the probe in flight, if one is.
        probe_deadline: Option<Timestamp>,
    },
}

impl Breaker {
    /// A closed breaker.
    pub fn new(config: BreakerConfig) -> Self {
        Self {
            config,
            phase: Phase::Closed { failures: 0 },
            generation: 0,
            trips: 0,
            latest: Timestamp::EPOCH,
            rng: SplitMix64::new(config.rng_seed),
            events: VecDeque::new(),
        }
    }

    /// The settings.
    pub fn config(&self) -> &BreakerConfig {
        &self.config
    }

    /// The current state, as of the last input (timers due since are not applied).
    pub fn state(&self) -> BreakerState {
        match self.phase {
            Phase::Closed { .. } => BreakerState::Closed,
            Phase::Open { .. } => BreakerState::Open,
            Phase::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    /// Whether a call may go out at `now`, after applying due timers. `Some` when closed,
    /// and for the single probe when half-open; `None` otherwise.
    pub fn poll_admit(&mut self, now: Timestamp) -> Option<Ticket> {
        self.handle_timeout(now);
        let now = self.observe(now);
        match self.phase {
            Phase::Closed { .. } => Some(self.ticket(false)),
            Phase::Open { .. }
            | Phase::HalfOpen {
                probe_deadline: Some(_),
            } => None,
            Phase::HalfOpen {
                probe_deadline: None,
            } => {
                let deadline = now.saturating_add(self.config.probe_timeout);
                self.phase = Phase::HalfOpen {
                    probe_deadline: Some(deadline),
                };
                Some(self.ticket(true))
            }
        }
    }

    /// The call of `ticket` got an answer from Redis (a decision, allowed or denied).
    pub fn handle_success(&mut self, now: Timestamp, ticket: Ticket) {
        let now = self.observe(now);
        if ticket.generation != self.generation {
            return;
        }
        match self.phase {
            Phase::Closed { .. } => self.phase = Phase::Closed { failures: 0 },
            Phase::HalfOpen {
                probe_deadline: Some(_),
            } if ticket.probe => {
                self.trips = 0;
                self.transition(Phase::Closed { failures: 0 }, now);
            }
            _ => {}
        }
    }

    /// The call of `ticket` failed: timed out, lost its connection, or Redis returned an
    /// error.
    pub fn handle_failure(&mut self, now: Timestamp, ticket: Ticket) {
        let now = self.observe(now);
        if ticket.generation != self.generation {
            return;
        }
        match self.phase {
            Phase::Closed { failures } => {
                let failures = failures.saturating_add(1);
                if failures >= self.config.failure_threshold.get() {
                    self.trip(now);
                } else {
                    self.phase = Phase::Closed { failures };
                }
            }
            Phase::HalfOpen {
                probe_deadline: Some(_),
            } if ticket.probe => self.trip(now),
            _ => {}
        }
    }

    /// The call of `ticket` ended with no outcome (its caller went away). For the probe,
    /// the breaker returns to waiting for one, so the next call probes; otherwise nothing
    /// changes.
    pub fn handle_abandoned(&mut self, now: Timestamp, ticket: Ticket) {
        self.observe(now);
        if ticket.generation == self.generation
            && ticket.probe
            && matches!(
                self.phase,
                Phase::HalfOpen {
                    probe_deadline: Some(_)
                }
            )
        {
            self.phase = Phase::HalfOpen {
                probe_deadline: None,
            };
        }
    }

    /// When the state changes with no input: the end of the open period, or the deadline of
    /// the probe in flight. `None` when closed or waiting for a probe.
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        match self.phase {
            Phase::Open { until } => Some(until),
            Phase::HalfOpen { probe_deadline } => probe_deadline,
            Phase::Closed { .. } => None,
        }
    }

    /// Applies the timer of [`poll_timeout`](Self::poll_timeout) if it is due at `now`: an
    /// open period ends (half-open), or a probe that ran out of time counts as failed.
    pub fn handle_timeout(&mut self, now: Timestamp) {
        let now = self.observe(now);
        match self.phase {
            Phase::Open { until } if now >= until => self.transition(
                Phase::HalfOpen {
                    probe_deadline: None,
                },
                now,
            ),
            Phase::HalfOpen {
                probe_deadline: Some(deadline),
            } if now >= deadline => self.trip(now),
            _ => {}
        }
    }

    /// The next transition not yet drained, oldest first.
    pub fn poll_event(&mut self) -> Option<BreakerEvent> {
        self.events.pop_front()
    }

    /// `now`, or the latest instant seen if that is later.
    fn observe(&mut self, now: Timestamp) -> Timestamp {
        self.latest = self.latest.max(now);
        self.latest
    }

    fn ticket(&self, probe: bool) -> Ticket {
        Ticket {
            generation: self.generation,
            probe,
        }
    }

    fn trip(&mut self, now: Timestamp) {
        self.trips = self.trips.saturating_add(1);
        let backoff = self.backoff(self.trips);
        let until = now.saturating_add(backoff);
        let from = self.state();
        self.transition(Phase::Open { until }, now);
        self.events.push_back(BreakerEvent::Opened {
            at: now,
            from,
            until,
            trips: self.trips,
        });
    }

    /// The open period of the `trips`-th consecutive trip, jitter applied.
    fn backoff(&mut self, trips: u32) -> Micros {
        let base = self.config.base_backoff.as_micros();
        let doubled = 1u64
            .checked_shl(trips.saturating_sub(1))
            .map_or(u64::MAX, |factor| base.saturating_mul(factor));
        let period = doubled.min(self.config.max_backoff.as_micros());
        let spread = period / 1_000 * u64::from(self.config.jitter_permille)
            + period % 1_000 * u64::from(self.config.jitter_permille) / 1_000;
        let cut = if spread == 0 {
            0
        } else {
            self.rng.below_inclusive(spread)
        };
        Micros::from_micros(period - cut)
    }

    /// Moves to `to` and starts a new generation. Opening records its own, richer event.
    fn transition(&mut self, to: Phase, now: Timestamp) {
        self.generation = self.generation.wrapping_add(1);
        self.phase = to;
        match to {
            Phase::Closed { .. } => self.events.push_back(BreakerEvent::Closed { at: now }),
            Phase::HalfOpen { .. } => self.events.push_back(BreakerEvent::HalfOpened { at: now }),
            Phase::Open { .. } => {}
        }
    }
}

impl Ticket {
    /// Whether this call is the half-open breaker's single probe.
    pub fn is_probe(&self) -> bool {
        self.probe
    }
}

impl BreakerConfig {
    /// The defaults (see the type's doc).
    pub const fn new() -> Self {
        Self {
            failure_threshold: match NonZeroU32::new(DEFAULT_FAILURE_THRESHOLD) {
                Some(k) => k,
                None => NonZeroU32::MIN,
            },
            base_backoff: Micros::from_millis(DEFAULT_BASE_BACKOFF_MS),
            max_backoff: Micros::from_millis(DEFAULT_MAX_BACKOFF_MS),
            jitter_permille: 0,
            rng_seed: 0,
            probe_timeout: DEFAULT_PROBE_TIMEOUT,
        }
    }

    /// Consecutive failures that trip a closed breaker (default 5).
    pub fn with_failure_threshold(mut self, failures: NonZeroU32) -> Self {
        self.failure_threshold = failures;
        self
    }

    /// The first open period and the longest one (defaults 100 ms and 800 ms). Each
    /// consecutive trip doubles the period up to `max`; a `max` below `base` is raised to
    /// `base`. Periods are kept in whole microseconds.
    pub fn with_backoff(mut self, base: Duration, max: Duration) -> Self {
        self.base_backoff = Micros::from(base);
        self.max_backoff = Micros::from(max).max(self.base_backoff);
        self
    }

    /// Shortens each open period by a uniform random amount of at most `permille`/1000 of
    /// it (clamped to 1000), drawn from an RNG seeded with `seed`. Jitter spreads the probes
    /// of many nodes that tripped together; give each node its own seed, since equal seeds
    /// draw equal jitter. Default: no jitter.
    pub fn with_jitter(mut self, permille: u16, seed: u64) -> Self {
        self.jitter_permille = permille.min(1_000);
        self.rng_seed = seed;
        self
    }

    /// How long a probe may run before it counts as failed (default: the stores' default
    /// deadline, [`rein_core::limiter::DEFAULT_DEADLINE`]). The resilient limiter sets it to the
    /// store's own deadline plus [`DEADLINE_MARGIN`](rein_core::limiter::DEADLINE_MARGIN).
    pub fn with_probe_timeout(mut self, timeout: Duration) -> Self {
        self.probe_timeout = Micros::from(timeout);
        self
    }

    /// The failure threshold `K`.
    pub fn failure_threshold(&self) -> NonZeroU32 {
        self.failure_threshold
    }

    /// The first open period `b`.
    pub fn base_backoff(&self) -> Duration {
        self.base_backoff.into()
    }

    /// The longest open period `B`.
    pub fn max_backoff(&self) -> Duration {
        self.max_backoff.into()
    }

    /// The probe timeout.
    pub fn probe_timeout(&self) -> Duration {
        self.probe_timeout.into()
    }
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl BreakerState {
    /// `closed`, `open` or `half_open`: the name used in metrics and logs.
    pub fn as_str(&self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }
}

/// Five failures in a row: a single lost packet or a slow call does not trip it, while at
/// the default 50 ms deadline a dead Redis costs at most a quarter second of timeouts.
const DEFAULT_FAILURE_THRESHOLD: u32 = 5;

/// 100 ms: the reconnect pacing of a store built with `connect_with` (link.rs), so every
/// probe can make a fresh connect attempt rather than meet the previous attempt's backoff.
const DEFAULT_BASE_BACKOFF_MS: u64 = 100;

/// 800 ms: a dead store gets a probe a little more often than once a second, and a
/// recovered one is back in use within a second with every other default: the recovery
/// bound is `max backoff + 2 × deadline + safety net` = 0.8 + 0.1 + 0.005 s, plus the gap
/// to the next request (docs/failure.md, "Recovery"). With 1 s it measured 1.04 s.
const DEFAULT_MAX_BACKOFF_MS: u64 = 800;

/// The stores' default deadline ([`rein_core::limiter::DEFAULT_DEADLINE`]): a probe is one store
/// call, so it may take as long as any other.
const DEFAULT_PROBE_TIMEOUT: Micros =
    Micros::from_micros(rein_core::limiter::DEFAULT_DEADLINE.as_micros() as u64);

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000;

    fn at(ms: u64) -> Timestamp {
        Timestamp::from_micros(ms * MS)
    }

    fn config() -> BreakerConfig {
        BreakerConfig::new()
            .with_failure_threshold(NonZeroU32::new(3).unwrap())
            .with_backoff(Duration::from_millis(100), Duration::from_millis(400))
            .with_probe_timeout(Duration::from_millis(50))
    }

    /// What the test does at one instant.
    #[derive(Clone, Copy, Debug)]
    enum Input {
        /// Asks to call, then reports the outcome at the same instant.
        CallOk,
        CallFails,
        /// Asks to call and keeps the ticket in flight (the last one kept is reported by
        /// `Resolve*`).
        CallKeep,
        ResolveOk,
        ResolveFails,
        Abandon,
        Timeout,
    }

    struct Row {
        label: &'static str,
        at_ms: u64,
        input: Input,
        /// Whether `poll_admit` gave a ticket (for the `Call*` inputs).
        admitted: Option<bool>,
        state: BreakerState,
        timeout_ms: Option<u64>,
    }

    fn run(rows: &[Row]) -> Vec<BreakerEvent> {
        let mut breaker = Breaker::new(config());
        let mut kept = None;
        let mut events = Vec::new();
        for row in rows {
            let now = at(row.at_ms);
            let admitted = match row.input {
                Input::CallOk | Input::CallFails | Input::CallKeep => {
                    let ticket = breaker.poll_admit(now);
                    match (row.input, ticket) {
                        (Input::CallOk, Some(t)) => breaker.handle_success(now, t),
                        (Input::CallFails, Some(t)) => breaker.handle_failure(now, t),
                        (Input::CallKeep, Some(t)) => kept = Some(t),
                        _ => {}
                    }
                    Some(ticket.is_some())
                }
                Input::ResolveOk => {
                    breaker.handle_success(now, kept.take().expect("a kept ticket"));
                    None
                }
                Input::ResolveFails => {
                    breaker.handle_failure(now, kept.take().expect("a kept ticket"));
                    None
                }
                Input::Abandon => {
                    breaker.handle_abandoned(now, kept.take().expect("a kept ticket"));
                    None
                }
                Input::Timeout => {
                    breaker.handle_timeout(now);
                    None
                }
            };
            assert_eq!(admitted, row.admitted, "row {:?}: admitted", row.label);
            assert_eq!(breaker.state(), row.state, "row {:?}: state", row.label);
            assert_eq!(
                breaker.poll_timeout(),
                row.timeout_ms.map(at),
                "row {:?}: poll_timeout",
                row.label
            );
            while let Some(event) = breaker.poll_event() {
                events.push(event);
            }
        }
        events
    }

    use BreakerState::{Closed, HalfOpen, Open};
    use Input::*;

    #[test]
    #[rustfmt::skip]
    fn trips_backs_off_probes_once_and_recovers_on_a_number_line() {
        let rows = [
            // Closed: failures below the threshold are forgiven by a success.
            Row { label: "fail 1", at_ms: 0, input: CallFails, admitted: Some(true), state: Closed, timeout_ms: None },
            Row { label: "fail 2", at_ms: 1, input: CallFails, admitted: Some(true), state: Closed, timeout_ms: None },
            Row { label: "success resets", at_ms: 2, input: CallOk, admitted: Some(true), state: Closed, timeout_ms: None },
            Row { label: "fail 1 again", at_ms: 3, input: CallFails, admitted: Some(true), state: Closed, timeout_ms: None },
            Row { label: "fail 2 again", at_ms: 4, input: CallFails, admitted: Some(true), state: Closed, timeout_ms: None },
            // The third consecutive failure trips it for the base backoff, 100 ms.
            Row { label: "fail 3 trips", at_ms: 5, input: CallFails, admitted: Some(true), state: Open, timeout_ms: Some(105) },
            Row { label: "refused while open", at_ms: 50, input: CallOk, admitted: Some(false), state: Open, timeout_ms: Some(105) },
            Row { label: "1 ms early", at_ms: 104, input: CallOk, admitted: Some(false), state: Open, timeout_ms: Some(105) },
            // At the end of the period the next call is the single probe.
            Row { label: "probe out", at_ms: 105, input: CallKeep, admitted: Some(true), state: HalfOpen, timeout_ms: Some(155) },
            Row { label: "second caller refused", at_ms: 106, input: CallOk, admitted: Some(false), state: HalfOpen, timeout_ms: Some(155) },
            // A failed probe doubles the period: 200 ms, then 400 ms, capped at 400.
            Row { label: "probe fails", at_ms: 110, input: ResolveFails, admitted: None, state: Open, timeout_ms: Some(310) },
            Row { label: "probe 2", at_ms: 310, input: CallFails, admitted: Some(true), state: Open, timeout_ms: Some(710) },
            Row { label: "probe 3", at_ms: 710, input: CallFails, admitted: Some(true), state: Open, timeout_ms: Some(1_110) },
            Row { label: "probe 4 capped", at_ms: 1_110, input: CallFails, admitted: Some(true), state: Open, timeout_ms: Some(1_510) },
            // A probe that never reports counts as failed at its deadline.
            Row { label: "probe 5 out", at_ms: 1_510, input: CallKeep, admitted: Some(true), state: HalfOpen, timeout_ms: Some(1_560) },
            Row { label: "before its deadline", at_ms: 1_559, input: Timeout, admitted: None, state: HalfOpen, timeout_ms: Some(1_560) },
            Row { label: "probe 5 timed out", at_ms: 1_560, input: Timeout, admitted: None, state: Open, timeout_ms: Some(1_960) },
            Row { label: "its late success is stale", at_ms: 1_561, input: ResolveOk, admitted: None, state: Open, timeout_ms: Some(1_960) },
            // An abandoned probe lets the next caller probe.
            Row { label: "probe 6 out", at_ms: 1_960, input: CallKeep, admitted: Some(true), state: HalfOpen, timeout_ms: Some(2_010) },
            Row { label: "probe 6 abandoned", at_ms: 1_970, input: Abandon, admitted: None, state: HalfOpen, timeout_ms: None },
            Row { label: "probe 7 out", at_ms: 1_971, input: CallKeep, admitted: Some(true), state: HalfOpen, timeout_ms: Some(2_021) },
            // A successful probe closes it and resets the backoff.
            Row { label: "probe 7 succeeds", at_ms: 1_975, input: ResolveOk, admitted: None, state: Closed, timeout_ms: None },
            Row { label: "closed again", at_ms: 1_976, input: CallFails, admitted: Some(true), state: Closed, timeout_ms: None },
            Row { label: "closed fail 2", at_ms: 1_977, input: CallFails, admitted: Some(true), state: Closed, timeout_ms: None },
            Row { label: "trips at base again", at_ms: 1_978, input: CallFails, admitted: Some(true), state: Open, timeout_ms: Some(2_078) },
        ];
        let events = run(&rows);
        let opened: Vec<(u64, u64, u32)> = events
            .iter()
            .filter_map(|e| match e {
                BreakerEvent::Opened { at, until, trips, .. } => {
                    Some((at.as_micros() / MS, until.as_micros() / MS, *trips))
                }
                _ => None,
            })
            .collect();
        assert_eq!(
            opened,
            [(5, 105, 1), (110, 310, 2), (310, 710, 3), (710, 1_110, 4), (1_110, 1_510, 5),
             (1_560, 1_960, 6), (1_978, 2_078, 1)]
        );
        let closed = events.iter().filter(|e| matches!(e, BreakerEvent::Closed { .. })).count();
        let half = events.iter().filter(|e| matches!(e, BreakerEvent::HalfOpened { .. })).count();
        assert_eq!((closed, half), (1, 6));
    }

    #[test]
    fn outcomes_of_calls_sent_before_a_trip_are_ignored() {
        let mut breaker = Breaker::new(config());
        let early = breaker.poll_admit(at(0)).unwrap();
        for ms in 1..=3 {
            let t = breaker.poll_admit(at(ms)).unwrap();
            breaker.handle_failure(at(ms), t);
        }
        assert_eq!(breaker.state(), Open);
        // A success that left while closed says nothing about Redis now.
        breaker.handle_success(at(4), early);
        assert_eq!(breaker.state(), Open);
        // Nor does it close the breaker once a probe is out.
        let probe = breaker.poll_admit(at(103)).unwrap();
        assert!(probe.is_probe());
        breaker.handle_success(at(104), early);
        assert_eq!(breaker.state(), HalfOpen);
        breaker.handle_success(at(104), probe);
        assert_eq!(breaker.state(), Closed);
    }

    #[test]
    fn time_going_backwards_keeps_it_open_and_never_panics() {
        let mut breaker = Breaker::new(config());
        for _ in 0..3 {
            let t = breaker.poll_admit(at(1_000)).unwrap();
            breaker.handle_failure(at(1_000), t);
        }
        assert_eq!(breaker.poll_timeout(), Some(at(1_100)));
        // Earlier and equal clocks: still open, the timer unchanged.
        for ms in [0, 500, 1_000, 1_099] {
            assert!(breaker.poll_admit(at(ms)).is_none());
            assert_eq!(breaker.poll_timeout(), Some(at(1_100)));
        }
        // A probe's failure reported at an earlier instant is taken at the latest one: the
        // next period is not shortened by the clock's step back.
        let probe = breaker.poll_admit(at(1_100)).unwrap();
        breaker.handle_failure(at(0), probe);
        assert_eq!(breaker.poll_timeout(), Some(at(1_300)));
        assert!(breaker.poll_admit(at(1_299)).is_none());
        // Extremes saturate.
        let mut breaker = Breaker::new(config());
        for _ in 0..3 {
            let t = breaker.poll_admit(Timestamp::MAX).unwrap();
            breaker.handle_failure(Timestamp::MAX, t);
        }
        assert_eq!(breaker.poll_timeout(), Some(Timestamp::MAX));
        let probe = breaker.poll_admit(Timestamp::MAX).unwrap();
        breaker.handle_failure(Timestamp::MAX, probe);
        assert_eq!(breaker.state(), Open);
    }

    #[test]
    fn many_trips_saturate_at_the_maximum_backoff() {
        let mut breaker = Breaker::new(config());
        let mut now = at(0);
        for _ in 0..3 {
            let t = breaker.poll_admit(now).unwrap();
            breaker.handle_failure(now, t);
        }
        for _ in 0..200 {
            now = breaker.poll_timeout().unwrap();
            let probe = breaker.poll_admit(now).unwrap();
            breaker.handle_failure(now, probe);
        }
        assert_eq!(
            breaker.poll_timeout().unwrap().saturating_since(now),
            Micros::from_millis(400)
        );
    }

    #[test]
    fn jitter_only_shortens_and_is_reproducible_from_the_seed() {
        let jittered = |seed| {
            let config = config().with_jitter(500, seed);
            let mut breaker = Breaker::new(config);
            let mut periods = Vec::new();
            let mut now = at(0);
            for _ in 0..3 {
                let t = breaker.poll_admit(now).unwrap();
                breaker.handle_failure(now, t);
            }
            for _ in 0..20 {
                let until = breaker.poll_timeout().unwrap();
                periods.push(until.saturating_since(now).as_micros());
                now = until;
                let probe = breaker.poll_admit(now).unwrap();
                breaker.handle_failure(now, probe);
            }
            periods
        };
        let a = jittered(7);
        assert_eq!(a, jittered(7), "same seed, same periods");
        assert_ne!(a, jittered(8), "another seed, other periods");
        let nominal = [100, 200, 400].map(|ms| ms * MS);
        for (i, period) in a.iter().enumerate() {
            let full = nominal[i.min(2)];
            assert!(
                (full / 2..=full).contains(period),
                "period {i}: {period} µs outside [{}, {full}]",
                full / 2
            );
        }
    }
}
