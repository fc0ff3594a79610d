//! [`KeyAdmin`]: an operator's changes to what a store counts for one key.

use thiserror::Error;

use crate::{Block, Decision, KeyError, Limiter, Micros, PolicyState, StoreError, Timestamp};

/// What a store holds for one key of a policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyState {
    /// Its limits' states, in the policy's order (a key never seen: every limit full).
    Counting(PolicyState),
    /// An operator's block, which replaced the limits' states: every decision is denied
    /// until it ends ([`Block::decide`]), and the key is then as one never seen. Read just
    /// after its end (before the store forgets it), it no longer holds.
    Blocked {
        /// When it ends.
        block: Block,
        /// What the operator gave as the reason.
        reason: String,
    },
}

/// When a block ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Until {
    /// At this instant, on the store's clock.
    At(Timestamp),
    /// This long after the store's clock at the change.
    For(Micros),
}

/// The longest reason a block may carry, in bytes.
pub const MAX_REASON_LEN: usize = 200;

/// Why an operator's change to a key was not made. Like every error that follows a call to
/// a store, a [`StoreError`] after the change was sent leaves it unknown: it may have been
/// made. It is never sent again by the store; making it again is harmless for a reset, a
/// set, a block and an unblock, and takes a penalty twice if the first one was made.
#[derive(Clone, Debug, Error)]
#[non_exhaustive]
pub enum AdminError {
    /// See [`KeyError`].
    #[error(transparent)]
    InvalidKey(#[from] KeyError),
    /// A block's reason: at most [`MAX_REASON_LEN`] bytes, no control characters.
    #[error("invalid block reason: {0}")]
    InvalidReason(String),
    /// An override the store cannot keep: a policy name rein refuses, or one too many.
    #[error("invalid override: {0}")]
    InvalidOverride(String),
    /// A request the store refuses before asking anything: a policy name rein refuses, a
    /// range of seconds out of bounds.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The change cannot apply to the key as it is, so nothing was changed: a block of a
    /// key whose override makes it unlimited (its decisions read no state, so they would
    /// never see the block: remove the override first), or a
    /// block, penalty or set of a token bucket leased as rate (its state is the servers'
    /// rate shares: a reset forgets them, a lowered limit in the config reaches them).
    #[error("not changed: {0}")]
    NotApplicable(String),
    /// The key changed between the read and the write (decisions on it) on every attempt.
    /// Nothing was changed; try again.
    #[error("the key changed under {attempts} attempts to change it; nothing was changed")]
    Contended {
        /// How many read-and-write attempts were made.
        attempts: u32,
    },
    /// The store gave no usable answer; see [`StoreError`]. Also a stored value that does
    /// not decode (another program wrote under rein's prefix).
    #[error(transparent)]
    Unavailable(#[from] StoreError),
}

impl AdminError {
    /// The refusal of a block of a key whose override makes it unlimited: its decisions
    /// read no state, so they would never see the block. Every store gives it.
    pub fn unlimited_block() -> Self {
        Self::NotApplicable(
            "the key's override makes it unlimited, and its decisions read no state, so they \
             would never see a block: remove the override, then block the key"
                .to_owned(),
        )
    }

    /// The refusal of a block, a penalty, a set or a reward of a token bucket leased as
    /// rate: its state is the servers' rate shares, which these cannot change. Every store
    /// gives it (a reward, a refund, as [`DecideError::Unsupported`](crate::DecideError)).
    pub fn rate_shared() -> Self {
        Self::NotApplicable(
            "the key is a token bucket leased as rate: its state is the servers' rate shares, \
             which a block, a penalty, a set or a reward cannot change; a reset forgets them, \
             and a lowered limit in the config reaches them at their next renewal (an \
             override does not: leases keep the policy's own limits)"
                .to_owned(),
        )
    }
}

/// Checks a block's reason: at most [`MAX_REASON_LEN`] bytes, no control characters.
pub fn check_reason(reason: &str) -> Result<(), AdminError> {
    if reason.len() > MAX_REASON_LEN {
        return Err(AdminError::InvalidReason(format!(
            "{} bytes, at most {MAX_REASON_LEN}",
            reason.len()
        )));
    }
    if let Some(c) = reason.chars().find(|c| c.is_control()) {
        return Err(AdminError::InvalidReason(format!(
            "a control character ({c:?}) in {reason:?}"
        )));
    }
    Ok(())
}

/// An operator's changes to what a store counts for one key of a policy: read it, reset
/// it, take from it, set what it has left, block and unblock it. Each is atomic against the
/// decisions other clients make meanwhile, and computed by rein-core
/// ([`Policy::penalize`](crate::Policy::penalize),
/// [`Policy::with_remaining`](crate::Policy::with_remaining), [`Block`]) at the store's
/// clock. The stores implement it (rein-redis's `RedisStore`, rein-memory's `MemoryStore`),
/// and `rein::ResilientLimiter` over any store that does.
pub trait KeyAdmin: Limiter {
    /// What the store holds for `key` under `policy`.
    fn inspect(
        &self,
        policy: &Self::Prepared,
        key: &[u8],
    ) -> impl Future<Output = Result<KeyState, AdminError>> + Send;

    /// Forgets everything counted for `key` under `policy`, every limit at once, and a
    /// block: the key is then as one never seen. `true` if there was something to forget.
    fn reset(
        &self,
        policy: &Self::Prepared,
        key: &[u8],
    ) -> impl Future<Output = Result<bool, AdminError>> + Send;

    /// Takes up to `amount` from every limit, whatever they would admit, each never past
    /// empty ([`Policy::penalize`](crate::Policy::penalize)). Returns the figures after it;
    /// a blocked key stays blocked and answers its block's denial.
    fn penalize(
        &self,
        policy: &Self::Prepared,
        key: &[u8],
        amount: u64,
    ) -> impl Future<Output = Result<Decision, AdminError>> + Send;

    /// Every limit as if reset now and then charged its capacity less `remaining`
    /// ([`Policy::with_remaining`](crate::Policy::with_remaining)), replacing what was
    /// counted or a block. Returns the figures after it.
    fn set_remaining(
        &self,
        policy: &Self::Prepared,
        key: &[u8],
        remaining: u64,
    ) -> impl Future<Output = Result<Decision, AdminError>> + Send;

    /// Blocks `key` until `until` ([`Block`]): every decision is denied until then, whatever
    /// is left, and the key is then as one never seen. `reason` (see [`check_reason`]) is
    /// kept for [`inspect`](Self::inspect). Replaces what was counted, or an earlier block.
    /// `false` if `until` is not after the store's clock (nothing blocked).
    fn block(
        &self,
        policy: &Self::Prepared,
        key: &[u8],
        until: Until,
        reason: &str,
    ) -> impl Future<Output = Result<bool, AdminError>> + Send;

    /// Lifts a block that holds: the key is then as one never seen. `false` if it held
    /// none; what it counts is then left alone.
    fn unblock(
        &self,
        policy: &Self::Prepared,
        key: &[u8],
    ) -> impl Future<Output = Result<bool, AdminError>> + Send;
}
