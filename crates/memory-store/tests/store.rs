//! `MemoryLimiter`'s own behaviour: what it stores, what it evicts and in which order, the
//! memory bound, and time that goes backwards.

use std::num::NonZeroUsize;

use rein_core::{Limit, Micros, Policy, Timestamp};
use rein_memory::{FakeClock, MemoryLimiter};

const MS: u64 = 1_000;

fn at(micros: u64) -> Timestamp {
    Timestamp::from_micros(micros)
}

fn nonzero(n: usize) -> NonZeroUsize {
    NonZeroUsize::new(n).unwrap()
}

/// 20 tokens, refilled at 20 per second (one per 50 ms).
fn bucket_20() -> Policy {
    Policy::single(Limit::token_bucket(20, 20, Micros::from_secs(1)).unwrap())
}

/// One shard holding `max_keys`, so eviction order is visible.
fn one_shard(policy: Policy, max_keys: usize) -> MemoryLimiter<u64> {
    MemoryLimiter::builder(policy)
        .max_keys(nonzero(max_keys))
        .shards(nonzero(1))
        .build()
}

#[test]
fn peek_refund_and_zero_cost_do_not_store_keys() {
    let limiter = MemoryLimiter::<String>::new(bucket_20());
    limiter.peek_at(at(0), "a", 5).unwrap();
    limiter.refund_at(at(0), "b", 5).unwrap();
    limiter.acquire_at(at(0), "c", 0).unwrap();
    assert!(limiter.acquire_at(at(0), "d", 21).is_err());
    assert!(limiter.is_empty());
    limiter.acquire_at(at(0), "e", 1).unwrap();
    assert_eq!(limiter.len(), 1);
}

#[test]
fn refund_gives_back_never_beyond_full() {
    let limiter = MemoryLimiter::<u64>::new(bucket_20());
    limiter.acquire_at(at(0), &1, 15).unwrap();
    limiter.refund_at(at(0), &1, 10).unwrap();
    assert_eq!(limiter.peek_at(at(0), &1, 0).unwrap().remaining, 15);
    limiter.refund_at(at(0), &1, 100).unwrap();
    assert_eq!(limiter.peek_at(at(0), &1, 0).unwrap().remaining, 20);
    assert!(limiter.acquire_at(at(0), &1, 20).unwrap().is_allowed());
}

#[test]
fn full_keys_are_dropped_before_any_other_is_evicted() {
    let limiter = one_shard(bucket_20(), 8);
    // Keys 0..4 take one token (full again at 50 ms), keys 4..8 take ten (full at 500 ms).
    for key in 0..4 {
        limiter.acquire_at(at(0), &key, 1).unwrap();
    }
    for key in 4..8 {
        limiter.acquire_at(at(0), &key, 10).unwrap();
    }
    // At 100 ms the shard is at capacity, and a new key drops exactly the four full ones.
    limiter.acquire_at(at(100 * MS), &8, 1).unwrap();
    assert_eq!(limiter.len(), 5);
    for key in 4..8 {
        // 10 taken, 2 refilled: nothing of theirs was lost.
        assert_eq!(
            limiter.peek_at(at(100 * MS), &key, 0).unwrap().remaining,
            12
        );
    }
}

#[test]
fn without_full_keys_the_closest_to_full_are_evicted_first() {
    // 16 keys per shard: a batch is 16 / 8 = 2 keys.
    let limiter = one_shard(bucket_20(), 16);
    // Key k takes k + 1 tokens, so it is full again after (k + 1) × 50 ms.
    for key in 0..16 {
        limiter.acquire_at(at(0), &key, key + 1).unwrap();
    }
    limiter.acquire_at(at(0), &100, 1).unwrap();
    assert_eq!(limiter.len(), 15);
    // Keys 0 and 1 were nearest to full: forgotten, they read as full.
    for key in 0..2 {
        assert_eq!(
            limiter.peek_at(at(0), &key, 0).unwrap().remaining,
            20,
            "key {key}"
        );
    }
    for key in 2..16 {
        let remaining = limiter.peek_at(at(0), &key, 0).unwrap().remaining;
        assert_eq!(remaining, 20 - (key + 1), "key {key} should have been kept");
    }
    // The next new key fits in the room the batch made: nothing else goes.
    limiter.acquire_at(at(0), &101, 1).unwrap();
    assert_eq!(limiter.len(), 16);
    assert_eq!(limiter.peek_at(at(0), &2, 0).unwrap().remaining, 17);
}

#[test]
fn ties_evict_exactly_one_batch() {
    let limiter = one_shard(bucket_20(), 16);
    for key in 0..16 {
        limiter.acquire_at(at(0), &key, 5).unwrap();
    }
    limiter.acquire_at(at(0), &100, 5).unwrap();
    assert_eq!(limiter.len(), 15);
}

#[test]
fn the_key_count_never_exceeds_max_keys() {
    let policy = Policy::single(Limit::sliding_log(3, Micros::from_secs(60)).unwrap());
    for (max_keys, shards) in [(100, 4), (37, 8), (1, 1), (1_000, 16)] {
        let limiter = MemoryLimiter::<u64>::builder(policy.clone())
            .max_keys(nonzero(max_keys))
            .shards(nonzero(shards))
            .build();
        assert!(limiter.max_keys() <= max_keys);
        let mut seed = 7_u64;
        for step in 0..5_000u64 {
            // Mostly new keys, some repeats; time creeps so some states become full.
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let key = (seed >> 33) % 20_000;
            limiter.acquire_at(at(step * 10 * MS), &key, 1).unwrap();
            let len = limiter.len();
            assert!(
                len <= limiter.max_keys(),
                "{len} keys with max {}",
                limiter.max_keys()
            );
        }
    }
}

#[test]
fn purge_drops_only_full_keys() {
    let limiter = MemoryLimiter::<u64>::new(bucket_20());
    limiter.acquire_at(at(0), &1, 1).unwrap(); // full at 50 ms
    limiter.acquire_at(at(0), &2, 20).unwrap(); // full at 1 s
    assert_eq!(limiter.purge_full_at(at(50 * MS)), 1);
    assert_eq!(limiter.len(), 1);
    assert_eq!(limiter.peek_at(at(50 * MS), &2, 0).unwrap().remaining, 1);
}

#[test]
fn a_clock_regression_after_a_drop_does_not_readmit_a_burst() {
    let limiter = one_shard(bucket_20(), 1);
    // Key 1 spends its burst at 0; at 2 s it is full again and dropped for key 2.
    assert!(limiter.acquire_at(at(0), &1, 20).unwrap().is_allowed());
    limiter.acquire_at(at(2_000 * MS), &2, 1).unwrap();
    assert_eq!(
        limiter.peek_at(at(2_000 * MS), &1, 0).unwrap().remaining,
        20
    );
    // The clock steps back to 500 ms. The latest reading (2 s) admits one burst of key 1...
    let burst = limiter.acquire_at(at(500 * MS), &1, 20).unwrap();
    assert!(burst.is_allowed());
    // ...counted from the caller's clock: full again 1.5 s + 1 s from now.
    assert_eq!(burst.reset_after, Micros::from_millis(2_500));
    // ...and only one: back at 2 s, the bucket is empty, as if time had not stepped back.
    let after = limiter.acquire_at(at(2_000 * MS), &1, 1).unwrap();
    assert!(!after.is_allowed());
    assert_eq!(after.retry_after, Micros::from_millis(50));
}

#[test]
fn time_going_backwards_never_panics() {
    let second = Micros::from_secs(1);
    let policies = [
        Policy::single(Limit::token_bucket(5, 3, second).unwrap()),
        Policy::single(Limit::fixed_window(5, second).unwrap()),
        Policy::single(Limit::sliding_log(5, second).unwrap()),
        Policy::single(Limit::sliding_counter(5, second).unwrap()),
        Policy::new([
            Limit::token_bucket(4, 1, second).unwrap(),
            Limit::sliding_log(6, Micros::from_secs(10)).unwrap(),
        ])
        .unwrap(),
    ];
    let times = [
        u64::MAX,
        0,
        5 * MS,
        1,
        10_000_000_000,
        3,
        rein_core::time::MAX_MICROS,
        0,
    ];
    for policy in policies {
        let limiter = one_shard(policy, 2);
        for (i, &now) in times.iter().enumerate() {
            for key in 0..3u64 {
                let cost = (i as u64 + key) % 4;
                limiter.acquire_at(at(now), &key, cost).unwrap();
                limiter.peek_at(at(now), &key, cost).unwrap();
                limiter.refund_at(at(now), &key, 1).unwrap();
            }
            limiter.purge_full_at(at(now));
        }
    }
}

#[test]
fn the_clock_conveniences_read_the_given_clock() {
    let clock = FakeClock::new(at(0));
    let limiter = MemoryLimiter::<u64>::builder(bucket_20())
        .clock(clock.clone())
        .build();
    assert!(limiter.acquire(&1, 20).unwrap().is_allowed());
    assert!(!limiter.acquire(&1, 1).unwrap().is_allowed());
    clock.advance(Micros::from_millis(50));
    assert_eq!(limiter.peek(&1, 0).unwrap().remaining, 1);
    limiter.refund(&1, 19).unwrap();
    assert_eq!(limiter.purge_full(), 1);
    assert!(limiter.is_empty());
}
