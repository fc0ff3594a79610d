//! Decisions allocate nothing: a counting global allocator proves it for the token bucket,
//! fixed window and sliding counter (acquire, try_acquire, peek, refund), for single- and
//! multi-limit policies of them, and for the sliding log once its buffer has grown to its steady size.
//!
//! The count is per thread, so tests running in parallel do not see each other's
//! allocations.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::hint::black_box;

use rein_core::{Limit, LimitState, Micros, Policy, Timestamp};

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count_one() {
    // `try_with`: the allocator may run while this thread's locals are being torn down.
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

// SAFETY: every method forwards to `System` unchanged; counting touches no allocator state.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which `System` shares.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_one();
        // SAFETY: `ptr` was allocated by this allocator, that is by `System`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by this allocator, that is by `System`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// How many allocations `f` makes on this thread.
fn allocations(f: impl FnOnce()) -> u64 {
    let before = ALLOCATIONS.with(Cell::get);
    f();
    ALLOCATIONS.with(Cell::get) - before
}

const MS: u64 = 1_000;

/// The three constant-size algorithms, each with settings that admit, deny and refill over
/// the instants `traffic` uses.
fn constant_size_limits() -> [Limit; 3] {
    [
        Limit::token_bucket(10, 3, Micros::from_secs(1)).unwrap(),
        Limit::fixed_window(10, Micros::from_secs(1)).unwrap(),
        Limit::sliding_counter(10, Micros::from_secs(1)).unwrap(),
    ]
}

/// Acquires, peeks and refunds over 5 s, every 10 ms: allowed and denied decisions alike.
fn traffic(limit: &Limit, state: &mut LimitState) {
    for step in 0..500u64 {
        let now = Timestamp::from_micros(step * 10 * MS);
        black_box(limit.acquire(now, state, 1 + step % 3).unwrap());
        black_box(limit.peek(now, state, 2).unwrap());
        black_box(limit.acquire(now, state, 0).unwrap());
        black_box(limit.try_acquire(now, state, 1).unwrap());
        if step % 7 == 0 {
            limit.refund(now, state, 1).unwrap();
        }
        black_box(limit.is_full(now, state));
    }
}

#[test]
fn constant_size_algorithms_decide_without_allocating() {
    for limit in constant_size_limits() {
        let mut state = limit.new_state();
        let n = allocations(|| traffic(&limit, &mut state));
        assert_eq!(n, 0, "{limit:?} allocated");
    }
}

#[test]
fn policies_of_them_decide_without_allocating() {
    let [bucket, window, counter] = constant_size_limits();
    let single = Policy::single(bucket);
    let multi = Policy::new([bucket, window, counter]).unwrap();
    for policy in [single, multi] {
        let mut state = policy.new_state();
        let n = allocations(|| {
            for step in 0..500u64 {
                let now = Timestamp::from_micros(step * 10 * MS);
                black_box(policy.acquire(now, &mut state, 1 + step % 3).unwrap());
                black_box(policy.peek(now, &state, 2).unwrap());
                black_box(policy.try_acquire(now, &mut state, 1).unwrap());
                if step % 7 == 0 {
                    policy.refund(now, &mut state, 1).unwrap();
                }
            }
        });
        assert_eq!(n, 0, "{} limits allocated", policy.limits().len());
    }
}

#[test]
fn sliding_log_decides_without_allocating_once_warm() {
    // 20 per second; a request every 10 ms keeps the log saturated, so it holds at most 20
    // entries and stops growing after the first window.
    let limit = Limit::sliding_log(20, Micros::from_secs(1)).unwrap();
    let mut state = limit.new_state();
    let run = |state: &mut LimitState, from: u64| {
        for step in from..from + 500 {
            let now = Timestamp::from_micros(step * 10 * MS);
            black_box(limit.acquire(now, state, 1 + step % 2).unwrap());
            black_box(limit.peek(now, state, 3).unwrap());
        }
    };
    run(&mut state, 0);
    let n = allocations(|| run(&mut state, 500));
    assert_eq!(n, 0, "the warm log allocated");
    let LimitState::SlidingLog(log) = &state else {
        unreachable!()
    };
    assert!(log.entries().len() <= 20);
    // And the counter does count: the proof above is not vacuous.
    assert!(allocations(|| drop(black_box(Vec::<u8>::with_capacity(8)))) > 0);
}
