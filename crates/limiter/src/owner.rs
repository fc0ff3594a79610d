//! Which limiter prepared a policy. A [`TablePolicy`](crate::TablePolicy) or a
//! [`LeasedPolicy`](crate::lease::LeasedPolicy) names its policy by a slot of the limiter
//! that prepared it; each also carries that limiter's [`Owner`], checked where it is used,
//! so that a policy prepared by another limiter is an error
//! ([`DecideError::ForeignPolicy`](rein_core::DecideError::ForeignPolicy)), never a
//! decision under another policy or an index out of bounds.

use std::sync::atomic::{AtomicU64, Ordering};

/// A limiter's identity: unique in the process (a `u64` counter does not wrap).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Owner(u64);

impl Owner {
    /// An identity no other limiter of this process has.
    pub(crate) fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        Self(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}
