//! Memory per key, measured: a global allocator counts the live heap bytes a
//! `MemoryLimiter` holds after `KEYS` distinct keys were admitted once, for every algorithm
//! and both common key types, and the test holds them to the figures documented on
//! `MemoryLimiter` (section "Memory and eviction") and in docs/performance.md.
//!
//! Two figures per row: the bytes the limiter *asked* for, and the bytes glibc's malloc
//! really sets aside for them (each block rounded up to 16 bytes with an 8-byte header, 32
//! at least), which is what a process's resident size grows by. Run with `--nocapture` to
//! print the table:
//! `cargo test -p rein-memory --release --test memory -- --nocapture`.
//!
//! One test, run alone in its binary: the counter is process-wide.

use std::alloc::{GlobalAlloc, Layout, System};
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicI64, Ordering};

use rein_core::{Limit, Micros, Policy, Timestamp};
use rein_memory::MemoryLimiter;

struct Counting;

/// Live bytes as requested, and as glibc's chunks.
static REQUESTED: AtomicI64 = AtomicI64::new(0);
static CHUNKS: AtomicI64 = AtomicI64::new(0);

/// glibc malloc's chunk for a request of `size` bytes on 64-bit: an 8-byte size header,
/// rounded up to 16, and never below its 32-byte minimum chunk.
fn chunk(size: usize) -> i64 {
    (((size + 8).div_ceil(16) * 16).max(32)) as i64
}

fn note(size: usize, sign: i64) {
    REQUESTED.fetch_add(sign * size as i64, Ordering::Relaxed);
    CHUNKS.fetch_add(sign * chunk(size), Ordering::Relaxed);
}

// SAFETY: every method forwards to `System` unchanged; counting touches no allocator state.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size(), 1);
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which `System` shares.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size(), 1);
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(layout.size(), -1);
        note(new_size, 1);
        // SAFETY: as for `alloc`; `ptr` and `layout` come from this allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note(layout.size(), -1);
        // SAFETY: `ptr` and `layout` come from this allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Enough keys that the tables' fixed part is noise, few enough for a debug build. With
/// `SHARDS` shards the tables are about 3/4 full at this count: right after
/// they double, the table part of each figure (the slot) is 2× larger (see
/// `MemoryLimiter`'s "Memory and eviction").
const KEYS: u64 = 200_000;

/// The default shard count on the 2-core machines the figures were measured on (4 per
/// core), pinned so that the table part of each figure is the same on any machine.
const SHARDS: NonZeroUsize = NonZeroUsize::new(2 * 4).expect("not zero");

/// How far a figure may be above the documented one: its rounding to 0.1 B.
const ROUNDING: f64 = 0.05;

struct Row {
    label: &'static str,
    limit: Limit,
    /// The documented bytes per key, glibc chunks included, for `u64` and `String` keys
    /// (docs/performance.md, "Memory per key in process").
    max_u64: f64,
    max_string: f64,
}

/// Bytes per key (requested, chunks) after `KEYS` keys were admitted once at `now`.
fn measure<K: std::hash::Hash + Eq + Clone>(policy: &Policy, key: impl Fn(u64) -> K) -> (f64, f64) {
    let now = Timestamp::from_micros(1_000_000);
    let before = (
        REQUESTED.load(Ordering::Relaxed),
        CHUNKS.load(Ordering::Relaxed),
    );
    let limiter = MemoryLimiter::<K>::builder(policy.clone())
        .max_keys(NonZeroUsize::new(2 * KEYS as usize).expect("nonzero"))
        .shards(SHARDS)
        .build();
    for i in 0..KEYS {
        let key = key(i);
        let decision = limiter.acquire_at(now, &key, 1).expect("valid");
        assert!(decision.is_allowed());
    }
    assert_eq!(limiter.len(), KEYS as usize);
    let requested = REQUESTED.load(Ordering::Relaxed) - before.0;
    let chunks = CHUNKS.load(Ordering::Relaxed) - before.1;
    drop(limiter);
    (requested as f64 / KEYS as f64, chunks as f64 / KEYS as f64)
}

#[test]
fn memory_per_key_stays_within_the_documented_figures() {
    let minute = Micros::from_secs(60);
    #[rustfmt::skip]
    let rows = [
        Row { label: "token bucket (whole µs)", limit: Limit::token_bucket(100, 10, Micros::from_secs(1)).expect("valid"), max_u64: 22.3, max_string: 75.3 },
        Row { label: "token bucket (fractional)", limit: Limit::token_bucket(100, 3, Micros::from_secs(1)).expect("valid"), max_u64: 32.8, max_string: 85.7 },
        Row { label: "fixed window", limit: Limit::fixed_window(100, minute).expect("valid"), max_u64: 32.8, max_string: 85.7 },
        Row { label: "sliding counter", limit: Limit::sliding_counter(100, minute).expect("valid"), max_u64: 43.3, max_string: 96.2 },
        Row { label: "sliding log (1 entry)", limit: Limit::sliding_log(100, minute).expect("valid"), max_u64: 144.2, max_string: 197.2 },
    ];
    println!(
        "| policy | u64 key: requested | u64: glibc chunks | String key: requested | String: glibc chunks |"
    );
    println!("|---|---|---|---|---|");
    for row in rows {
        let policy = Policy::single(row.limit);
        let (u64_requested, u64_chunks) = measure(&policy, |i| i);
        // A realistic identifier: `user-` and a number, 10 to 11 bytes.
        let (string_requested, string_chunks) = measure(&policy, |i| format!("user-{i:06}"));
        println!(
            "| {} | {u64_requested:.1} | {u64_chunks:.1} | {string_requested:.1} | {string_chunks:.1} |",
            row.label
        );
        assert!(
            u64_chunks <= row.max_u64 + ROUNDING,
            "{}: {u64_chunks:.1} B per u64 key",
            row.label
        );
        assert!(
            string_chunks <= row.max_string + ROUNDING,
            "{}: {string_chunks:.1} B per String key",
            row.label
        );
    }
}
