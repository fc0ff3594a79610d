//! What the limiter answers when Redis cannot: [`FailurePolicy`], and [`local_share`], the
//! slice of a policy one node enforces on its own during an outage.

use std::num::NonZeroU32;

use rein_core::{ConfigError, Policy};

/// What a [`ResilientLimiter`](crate::ResilientLimiter) answers when Redis gives no decision
/// (timeout, lost connection, error, or an open circuit breaker). Chosen per limiter; build
/// two limiters for two choices.
///
/// docs/failure.md states, for each, what callers get during an outage and after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailurePolicy {
    /// Admit every request. The limit is not enforced while Redis is away; use it where
    /// refusing service costs more than unlimited traffic.
    FailOpen,
    /// Refuse every request. Redis's outage becomes an outage of whatever the limit guards;
    /// use it where over-admission is not acceptable (logins, payments).
    FailClosed,
    /// Decide locally, in this process, at this node's share of each policy:
    /// [`local_share`] with `expected_nodes`, the number of nodes expected to share the
    /// limit. If the outage cuts off every node alike and the load is spread evenly, the
    /// nodes together admit about what the policy allows.
    LocalFallback {
        /// The number of nodes sharing the limit, `N`.
        expected_nodes: NonZeroU32,
    },
}

/// The policy one of `expected_nodes` nodes enforces alone: every limit divided by `N`.
///
/// | limit | share |
/// |---|---|
/// | token bucket: `capacity` tokens, `refill` per `period` | `max(1, ⌊capacity / N⌋)` tokens, `refill` per `period × N` |
/// | fixed window, sliding log, sliding counter: `limit` per `window` | `max(1, ⌊limit / N⌋)` per `window` |
///
/// **Rounding**: capacities round down, so `N` shares never add up to more than the whole,
/// except that a share is never below 1 (a zero capacity would refuse everything forever):
/// when `capacity < N`, the shares sum to `N`, not `capacity`. The refill rate is divided
/// exactly, as a longer period (the bucket's emission interval times `N`), with no
/// rounding. Windows keep their length.
///
/// Errors if a divided quantity cannot be represented exactly (a period times `N` above
/// 2^52 µs).
///
/// ```
/// use std::num::NonZeroU32;
/// use rein::core::{Limit, Micros, Policy};
/// use rein::fallback::local_share;
///
/// let policy = Policy::new([
///     Limit::token_bucket(100, 10, Micros::from_secs(1))?, // 100, then 10/s
///     Limit::fixed_window(1_000, Micros::from_secs(3_600))?, // and 1000 an hour
/// ])?;
/// let share = local_share(&policy, NonZeroU32::new(4).unwrap())?;
/// assert_eq!(
///     share.limits(),
///     [
///         Limit::token_bucket(25, 10, Micros::from_secs(4))?, // 25, then 2.5/s
///         Limit::fixed_window(250, Micros::from_secs(3_600))?,
///     ]
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn local_share(policy: &Policy, expected_nodes: NonZeroU32) -> Result<Policy, ConfigError> {
    policy.try_map(|limit| limit.share(expected_nodes))
}

#[cfg(test)]
mod tests {
    use rein_core::time::MAX_MICROS;
    use rein_core::{Limit, Micros};

    use super::*;

    fn nodes(n: u32) -> NonZeroU32 {
        NonZeroU32::new(n).unwrap()
    }

    #[test]
    #[rustfmt::skip]
    fn shares_round_capacities_down_to_at_least_one_and_divide_rates_exactly() {
        let hour = Micros::from_secs(3_600);
        let rows = [
            // Exact division.
            (Limit::token_bucket(100, 1, hour), 4, Limit::token_bucket(25, 1, Micros::from_secs(4 * 3_600))),
            // Floor, and a rate that is not a whole number of µs per token (3/s → 0.75/s).
            (Limit::token_bucket(10, 3, Micros::from_secs(1)), 4, Limit::token_bucket(2, 3, Micros::from_secs(4))),
            // Never below one.
            (Limit::token_bucket(3, 1, hour), 4, Limit::token_bucket(1, 1, Micros::from_secs(4 * 3_600))),
            (Limit::fixed_window(10, hour), 3, Limit::fixed_window(3, hour)),
            (Limit::sliding_log(2, hour), 5, Limit::sliding_log(1, hour)),
            (Limit::sliding_counter(1_000, hour), 1, Limit::sliding_counter(1_000, hour)),
        ];
        for (limit, n, expected) in rows {
            let limit = limit.unwrap();
            let share = local_share(&Policy::single(limit), nodes(n)).unwrap();
            assert_eq!(share.limits(), [expected.unwrap()], "{limit:?} / {n}");
        }
    }

    #[test]
    fn a_token_bucket_share_refills_at_exactly_one_nth_of_the_rate() {
        use rein_core::Timestamp;
        // 3 tokens per second shared by 3 nodes: one per second each, after a burst of 2.
        let whole = Policy::single(Limit::token_bucket(6, 3, Micros::from_secs(1)).unwrap());
        let share = local_share(&whole, nodes(3)).unwrap();
        let mut state = share.new_state();
        let t0 = Timestamp::from_micros(0);
        assert!(share.acquire(t0, &mut state, 2).unwrap().is_allowed());
        let denied = share.acquire(t0, &mut state, 1).unwrap();
        assert_eq!(denied.retry_after, Micros::from_secs(1));
    }

    #[test]
    fn a_share_that_cannot_be_exact_is_a_config_error() {
        // One token every (2^51 − 1) / 17 µs: a span within MAX_SPAN, a period that is not.
        let slow = Policy::single(
            Limit::token_bucket(1, 17, Micros::from_micros(MAX_MICROS / 2)).unwrap(),
        );
        assert!(local_share(&slow, nodes(2)).is_ok());
        assert!(matches!(
            local_share(&slow, nodes(3)),
            Err(ConfigError::TooLarge {
                what: "period × expected nodes",
                ..
            })
        ));
    }
}
