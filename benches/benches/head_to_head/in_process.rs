//! In process: rein's `MemoryLimiter`, governor and limitador's memory storage, their
//! throughput, latency and heap bytes per key.

use std::alloc::{GlobalAlloc, Layout, System};
#[cfg(feature = "limitador")]
use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};
use std::time::{Duration, Instant};

use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use rein_core::{Limit, Micros, Policy};
use rein_memory::{MemoryLimiter, QuantaClock};

use super::*;

/// One in-process limiter, behind the call an application makes per request.
pub(crate) trait MemoryPeer: Sync {
    /// Decides one request for `key`; true if admitted.
    fn admit(&self, key: u64) -> bool;
}

/// rein's `MemoryLimiter`, keyed by `K`: `u64`, or `String` ([`string_key`]).
pub(crate) struct ReinMemory<K>(MemoryLimiter<K, QuantaClock>);

impl<K: std::hash::Hash + Eq> ReinMemory<K> {
    pub(crate) fn new(capacity: u64, period: Micros) -> Self {
        let limit = Limit::token_bucket(capacity, capacity, period).expect("valid bucket");
        Self(
            MemoryLimiter::builder(Policy::single(limit))
                .clock(QuantaClock::new())
                .build(),
        )
    }
}

impl MemoryPeer for ReinMemory<u64> {
    fn admit(&self, key: u64) -> bool {
        self.0
            .acquire(&key, 1)
            .expect("cost 1 fits the capacity")
            .is_allowed()
    }
}

impl MemoryPeer for ReinMemory<String> {
    fn admit(&self, key: u64) -> bool {
        // rein looks a `String` key up by `&str`.
        self.0
            .acquire(string_key(key), 1)
            .expect("cost 1 fits the capacity")
            .is_allowed()
    }
}

/// governor's keyed limiter (DashMap of atomics, quanta clock), keyed by `K`.
pub(crate) struct Governor<K: std::hash::Hash + Eq + Clone>(DefaultKeyedRateLimiter<K>);

impl<K: std::hash::Hash + Eq + Clone> Governor<K> {
    pub(crate) fn new(per_second: u32) -> Self {
        let rate = NonZeroU32::new(per_second).expect("rate > 0");
        Self(RateLimiter::keyed(Quota::per_second(rate)))
    }
}

impl MemoryPeer for Governor<u64> {
    fn admit(&self, key: u64) -> bool {
        self.0.check_key(&key).is_ok()
    }
}

impl MemoryPeer for Governor<String> {
    fn admit(&self, key: u64) -> bool {
        // governor's keyed limiter takes `&K`: the key's `String`, made once.
        self.0.check_key(&string_keys()[key as usize]).is_ok()
    }
}

/// `key` as text, the usual per-client key of an HTTP limiter (an IPv4 address such as
/// `10.1.134.7`), for the `String`-keyed peers.
pub(crate) fn string_key(key: u64) -> &'static str {
    &string_keys()[key as usize]
}

/// Every key's text, made once, before anything is timed or counted.
pub(crate) fn string_keys() -> &'static [String] {
    static KEYS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    KEYS.get_or_init(|| {
        (0..MEMORY_KEYS)
            .map(|k| format!("10.{}.{}.{}", (k >> 16) & 255, (k >> 8) & 255, k & 255))
            .collect()
    })
}

#[cfg(feature = "limitador")]
pub(crate) struct LimitadorMemory {
    pub(crate) limiter: limitador::RateLimiter,
    pub(crate) namespace: limitador::limit::Namespace,
}

#[cfg(feature = "limitador")]
impl LimitadorMemory {
    pub(crate) fn new(max_counters: u64) -> Self {
        let limiter = limitador::RateLimiter::new(max_counters);
        limiter.add_limit(limitador_limit("h2h-memory", OPEN_LIMIT, OPEN_WINDOW_SECS));
        Self {
            limiter,
            namespace: "h2h-memory".into(),
        }
    }
}

#[cfg(feature = "limitador")]
impl MemoryPeer for LimitadorMemory {
    fn admit(&self, key: u64) -> bool {
        // limitador's request descriptor: variables by name, as a proxy would pass them.
        let ctx: limitador::limit::Context =
            HashMap::from([("user_id".to_owned(), key.to_string())]).into();
        !self
            .limiter
            .check_rate_limited_and_update(&self.namespace, &ctx, 1)
            .expect("in-memory storage does not fail")
            .limited
    }
}

/// The in-process peers, built fresh, each with a limit that always admits here (10^6 per
/// second for the buckets, 10^9 per minute for limitador's window), and the index of the
/// peer its ratio is taken against: rein with the same kind of key.
pub(crate) fn memory_peers() -> Vec<(&'static str, Box<dyn MemoryPeer>, usize)> {
    let peers: Vec<(&'static str, Box<dyn MemoryPeer>, usize)> = vec![
        (
            "rein MemoryLimiter",
            Box::new(ReinMemory::<u64>::new(1_000_000, Micros::from_secs(1))),
            0,
        ),
        (
            "governor (keyed)",
            Box::new(Governor::<u64>::new(1_000_000)),
            0,
        ),
        (
            "rein MemoryLimiter, String keys",
            Box::new(ReinMemory::<String>::new(1_000_000, Micros::from_secs(1))),
            2,
        ),
        (
            "governor (keyed), String keys",
            Box::new(Governor::<String>::new(1_000_000)),
            2,
        ),
    ];
    #[cfg(feature = "limitador")]
    let peers = {
        let mut peers = peers;
        peers.push((
            "limitador (memory)",
            Box::new(LimitadorMemory::new(2 * MEMORY_KEYS)),
            0,
        ));
        peers
    };
    peers
}

pub(crate) struct MemoryRow {
    pub(crate) name: &'static str,
    /// Decisions per second against rein's with the same kind of key, round by round.
    pub(crate) vs_rein: Ratio,
    pub(crate) decisions_per_sec: f64,
    pub(crate) cpu_ns: f64,
    /// CPU per decision against rein's with the same kind of key (medians).
    pub(crate) cpu_vs_rein: f64,
    pub(crate) p50_ns: f64,
    pub(crate) p99_ns: f64,
    pub(crate) bytes_per_key: f64,
}

pub(crate) fn memory_section(run: Duration) -> Vec<MemoryRow> {
    let keys = rein_benches::key_sequence(MEMORY_KEYS as u32, 1 << 16, 2026);
    // The keys' text is made here, outside every timed run and heap count.
    string_keys();
    let peers = memory_peers();
    // Every key once, so the timed runs find a populated table.
    for (_, peer, _) in &peers {
        for key in 0..MEMORY_KEYS {
            peer.admit(key);
        }
    }
    let mut rounds: Vec<Vec<MemoryRound>> = vec![Vec::new(); peers.len()];
    for _ in 0..ROUNDS {
        for (i, (_, peer, _)) in peers.iter().enumerate() {
            rounds[i].push(memory_throughput(peer.as_ref(), &keys, run));
        }
    }
    let rates = |i: usize| rounds[i].iter().map(|r| r.per_sec).collect::<Vec<_>>();
    let cpu = |i: usize| median(&rounds[i].iter().map(|r| r.cpu_ns).collect::<Vec<_>>());
    let mut rows = Vec::new();
    for (i, (name, peer, base)) in peers.iter().enumerate() {
        let (p50_ns, p99_ns) = memory_latency(peer.as_ref(), &keys);
        rows.push(MemoryRow {
            name,
            vs_rein: Ratio::of(&rates(i), &rates(*base)),
            decisions_per_sec: median(&rounds[i].iter().map(|r| r.per_sec).collect::<Vec<_>>()),
            cpu_ns: cpu(i),
            cpu_vs_rein: cpu(i) / cpu(*base).max(f64::MIN_POSITIVE),
            p50_ns,
            p99_ns,
            bytes_per_key: 0.0,
        });
    }
    drop(peers);
    // Memory per key: each peer built and filled inside the counting window, alone.
    for (i, row) in rows.iter_mut().enumerate() {
        row.bytes_per_key = heap_per_key(i);
    }
    rows
}

/// Decisions per second of 2 threads (one per core) sharing `peer`, over `keys`, and the
/// CPU time the two threads spent per decision (which descheduling does not inflate).
pub(crate) fn memory_throughput(peer: &dyn MemoryPeer, keys: &[u32], run: Duration) -> MemoryRound {
    let stop = AtomicBool::new(false);
    let started = Instant::now();
    let total: (u64, f64) = std::thread::scope(|s| {
        let workers: Vec<_> = (0..2usize)
            .map(|t| {
                let stop = &stop;
                s.spawn(move || {
                    let mask = keys.len() - 1;
                    let mut i = t * keys.len() / 2;
                    let mut done = 0u64;
                    let cpu = thread_cpu_secs();
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..256 {
                            std::hint::black_box(peer.admit(u64::from(keys[i & mask])));
                            i += 1;
                        }
                        done += 256;
                    }
                    (done, thread_cpu_secs() - cpu)
                })
            })
            .collect();
        std::thread::sleep(run);
        stop.store(true, Ordering::Relaxed);
        workers
            .into_iter()
            .map(|w| w.join().expect("worker"))
            .fold((0, 0.0), |a, b| (a.0 + b.0, a.1 + b.1))
    });
    MemoryRound {
        per_sec: total.0 as f64 / started.elapsed().as_secs_f64(),
        cpu_ns: total.1 * 1e9 / total.0.max(1) as f64,
    }
}

/// One in-process throughput round: decisions per wall second, CPU ns per decision.
#[derive(Clone, Copy)]
pub(crate) struct MemoryRound {
    pub(crate) per_sec: f64,
    pub(crate) cpu_ns: f64,
}

/// p50 and p99 in ns of one decision, one thread, each call timed alone (the two clock
/// reads, ~20-40 ns here, are included for every peer alike).
pub(crate) fn memory_latency(peer: &dyn MemoryPeer, keys: &[u32]) -> (f64, f64) {
    let mut samples: Vec<Duration> = Vec::with_capacity(MEMORY_LATENCY_CALLS);
    let mask = keys.len() - 1;
    for i in 0..MEMORY_LATENCY_CALLS {
        let key = u64::from(keys[i & mask]);
        let t = Instant::now();
        std::hint::black_box(peer.admit(key));
        samples.push(t.elapsed());
    }
    let (p50, p99) = percentiles(&mut samples);
    (p50 * 1e3, p99 * 1e3)
}

/// Heap bytes per key held by peer number `index` of [`memory_peers`] after
/// [`MEMORY_KEYS`] distinct keys were admitted once.
pub(crate) fn heap_per_key(index: usize) -> f64 {
    ALLOCATOR.start();
    let peer = memory_peers().swap_remove(index);
    // Only the chosen peer is live; the others were built and dropped above.
    for key in 0..MEMORY_KEYS {
        peer.1.admit(key);
    }
    let bytes = ALLOCATOR.live();
    drop(peer);
    ALLOCATOR.stop();
    bytes as f64 / MEMORY_KEYS as f64
}

/// Counts the bytes live on the heap while [`CountingAllocator::start`]ed, so that the
/// timed benches pay one relaxed load per allocation and nothing else.
pub(crate) struct CountingAllocator;

pub(crate) static COUNTING: AtomicBool = AtomicBool::new(false);
pub(crate) static LIVE: AtomicIsize = AtomicIsize::new(0);

impl CountingAllocator {
    pub(crate) fn start(&self) {
        LIVE.store(0, Ordering::SeqCst);
        COUNTING.store(true, Ordering::SeqCst);
    }

    pub(crate) fn stop(&self) {
        COUNTING.store(false, Ordering::SeqCst);
    }

    pub(crate) fn live(&self) -> isize {
        LIVE.load(Ordering::SeqCst)
    }
}

// SAFETY: every call is forwarded to `System` unchanged; the counter is bookkeeping only.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc` is passed on as is.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() && COUNTING.load(Ordering::Relaxed) {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if COUNTING.load(Ordering::Relaxed) {
            LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        }
        // SAFETY: as for `alloc`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() && COUNTING.load(Ordering::Relaxed) {
            LIVE.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
        }
        new
    }
}
