//! A store double for the faults a process cannot give on cue: any rein store, answering
//! late, never, or with a broken connection for some keys only, and counting the refunds it
//! passes on. One double for every crate's tests (rein-resilient's leases, rein-tower's
//! layer, rein-server's all-or-nothing step).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use rein_core::limiter::SourceError;
use rein_core::rate_share::{RateAnswer, RateOp};
use rein_core::{
    DecideError, Decision, Held, Leasable, Limiter, Micros, NamedPolicy, PrepareError, StoreError,
    Timestamp,
};

/// What a [`Faulty`] store does to every call that decides or reads (`acquire`, `peek`,
/// `acquire_held`, `share_rate`); refunds are passed on at once, and counted.
#[derive(Clone, Copy, Debug)]
pub enum Fault {
    /// Answers this much later (a slow store, or one slower than a deadline).
    Late(Duration),
    /// Decides at once, and holds the answer this long (a reply slow on its way back: a
    /// caller that gives up meanwhile leaves the call done).
    LateReply(Duration),
    /// Never answers (a frozen store that states no deadline of its own).
    Hang,
    /// Fails as a broken connection for a key holding these bytes (every key, for none),
    /// and answers the rest.
    DownFor(&'static [u8]),
    /// Fails as an optimistic store's lost race (`StoreError::Contended`) for a key holding
    /// these bytes, and answers the rest: a hot key in a healthy store.
    ContendedFor(&'static [u8]),
}

/// `inner` with a [`Fault`]. Clones share the counts and the freeze.
#[derive(Clone, Debug)]
pub struct Faulty<S> {
    inner: S,
    fault: Fault,
    shares: bool,
    refunds: Arc<AtomicU64>,
    /// How long each refund waits before its answer ([`late_refunds`](Faulty::late_refunds)).
    refund_delay: Duration,
    /// Refunds awaited now, and the most ever awaited at once.
    refunds_in_flight: Arc<AtomicU64>,
    refunds_at_once: Arc<AtomicU64>,
    /// Calls that decide or read, counted as they arrive (before the fault).
    calls: Arc<AtomicU64>,
    /// Set by [`freeze`](Faulty::freeze): every call from then on never answers.
    frozen: Arc<AtomicBool>,
}

impl<S> Faulty<S> {
    /// `inner`, with `fault`; rate shares as `inner` has them.
    pub fn new(inner: S, fault: Fault) -> Self {
        Self {
            inner,
            fault,
            shares: true,
            refunds: Arc::default(),
            refund_delay: Duration::ZERO,
            refunds_in_flight: Arc::default(),
            refunds_at_once: Arc::default(),
            calls: Arc::default(),
            frozen: Arc::default(),
        }
    }

    /// Without rate shares, said explicitly (`DecideError::Unsupported`), as a store that
    /// cannot run them says it.
    pub fn without_rate_shares(mut self) -> Self {
        self.shares = false;
        self
    }

    /// Each refund (`refund`, `refund_held`) passed on at once, as always, but answered
    /// `delay` later: a store far away, for seeing how many a caller awaits at once
    /// ([`refunds_at_once`](Self::refunds_at_once)).
    pub fn late_refunds(mut self, delay: Duration) -> Self {
        self.refund_delay = delay;
        self
    }

    /// The most refunds awaited at the same time so far, by every clone.
    pub fn refunds_at_once(&self) -> u64 {
        self.refunds_at_once.load(Ordering::Relaxed)
    }

    /// The refunds (`refund` and `refund_held`) passed on so far, by every clone.
    pub fn refunds(&self) -> u64 {
        self.refunds.load(Ordering::Relaxed)
    }

    /// The calls that decide or read (`acquire`, `peek`, `acquire_held`, `share_rate`)
    /// made so far, by every clone, whatever the fault did to them.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// From now on every call that decides or reads never answers, whatever the fault: a
    /// store frozen mid-run (a paused process, a partition that drops packets), for every
    /// clone.
    pub fn freeze(&self) {
        self.frozen.store(true, Ordering::Relaxed);
    }

    /// The fault, before a call on `key` is passed on.
    async fn strike(&self, key: &[u8]) -> Result<(), DecideError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if self.frozen.load(Ordering::Relaxed) {
            std::future::pending::<()>().await;
        }
        match self.fault {
            Fault::Late(delay) => {
                tokio::time::sleep(delay).await;
                Ok(())
            }
            Fault::LateReply(_) => Ok(()),
            Fault::Hang => std::future::pending().await,
            Fault::DownFor(part)
                if part.is_empty() || key.windows(part.len()).any(|w| w == part) =>
            {
                let gone = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
                Err(StoreError::Connection(SourceError::new(gone)).into())
            }
            Fault::DownFor(_) => Ok(()),
            Fault::ContendedFor(part) if key.windows(part.len()).any(|w| w == part) => {
                Err(StoreError::Contended { attempts: 3 }.into())
            }
            Fault::ContendedFor(_) => Ok(()),
        }
    }

    /// `answer`, held as [`Fault::LateReply`] says.
    async fn reply<T>(&self, answer: T) -> T {
        if let Fault::LateReply(delay) = self.fault {
            tokio::time::sleep(delay).await;
        }
        answer
    }

    /// A refund passed on (`refund`, already made: a store may run it as it is called),
    /// counted, and answered as [`late_refunds`](Self::late_refunds) says.
    async fn returning<T>(&self, refund: impl Future<Output = T>) -> T {
        let at_once = self.refunds_in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        self.refunds_at_once.fetch_max(at_once, Ordering::Relaxed);
        if !self.refund_delay.is_zero() {
            tokio::time::sleep(self.refund_delay).await;
        }
        let answer = refund.await;
        self.refunds_in_flight.fetch_sub(1, Ordering::Relaxed);
        answer
    }
}

impl<S: Limiter> Limiter for Faulty<S> {
    type Prepared = S::Prepared;

    fn prepare(&self, policy: &NamedPolicy) -> Result<S::Prepared, PrepareError> {
        self.inner.prepare(policy)
    }

    async fn acquire(
        &self,
        now: Option<Timestamp>,
        policy: &S::Prepared,
        key: &[u8],
        cost: u64,
    ) -> Result<Decision, DecideError> {
        self.strike(key).await?;
        self.reply(self.inner.acquire(now, policy, key, cost).await)
            .await
    }

    async fn peek(
        &self,
        now: Option<Timestamp>,
        policy: &S::Prepared,
        key: &[u8],
        cost: u64,
    ) -> Result<Decision, DecideError> {
        self.strike(key).await?;
        self.reply(self.inner.peek(now, policy, key, cost).await)
            .await
    }

    fn refund(
        &self,
        now: Option<Timestamp>,
        policy: &S::Prepared,
        key: &[u8],
        amount: u64,
    ) -> impl Future<Output = Result<(), DecideError>> + Send {
        self.refunds.fetch_add(1, Ordering::Relaxed);
        self.returning(self.inner.refund(now, policy, key, amount))
    }

    fn deadline(&self) -> Option<Duration> {
        self.inner.deadline()
    }
}

impl<S: Leasable> Leasable for Faulty<S> {
    async fn acquire_held(
        &self,
        now: Option<Timestamp>,
        policy: &S::Prepared,
        key: &[u8],
        cost: u64,
        hold: Micros,
    ) -> Result<Held, DecideError> {
        self.strike(key).await?;
        self.reply(self.inner.acquire_held(now, policy, key, cost, hold).await)
            .await
    }

    fn refund_held(
        &self,
        now: Option<Timestamp>,
        policy: &S::Prepared,
        key: &[u8],
        amount: u64,
        stamp: Timestamp,
    ) -> impl Future<Output = Result<(), DecideError>> + Send {
        self.refunds.fetch_add(1, Ordering::Relaxed);
        self.returning(self.inner.refund_held(now, policy, key, amount, stamp))
    }

    async fn share_rate(
        &self,
        now: Option<Timestamp>,
        policy: &S::Prepared,
        key: &[u8],
        op: RateOp,
    ) -> Result<RateAnswer, DecideError> {
        if !self.shares {
            return Err(DecideError::Unsupported {
                operation: "share_rate",
            });
        }
        self.strike(key).await?;
        self.reply(self.inner.share_rate(now, policy, key, op).await)
            .await
    }
}
