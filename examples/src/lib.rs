//! rein-examples: the source articles' usage examples, runnable on rein's stores.
//!
//! Each program in `src/bin/` prints what happens, and its doc comment holds the expected
//! output in a `text` block under "Expected output"; `tests/demos.rs` runs every program
//! and compares, so the documented output cannot drift from the real one. Internal: to use
//! rein, depend on `rein` (its paths are the ones these programs import).
//!
//! Time is explicit (`acquire_at` with a [`Timestamp`]) wherever the output must not depend
//! on when the program runs or how fast the machine is: a "pause" is a later timestamp,
//! not a sleep. This file holds what the programs share: where Redis is, how to start from
//! fresh keys, and how to print a decision.
#![deny(missing_docs)]

use std::error::Error;
use std::time::Duration;

use rein::core::{Decision, Micros, Timestamp};
use rein::redis::client::aio::ConnectionManager;
use rein::redis::{
    ConnectError, OptimisticStore, OptimisticStoreBuilder, RedisStore, RedisStoreBuilder,
};

/// The demos' error type: they print and exit on any failure.
pub type DemoResult = Result<(), Box<dyn Error>>;

/// The Redis to use: the first argument, else `REIN_REDIS_URL`, else
/// `redis://127.0.0.1:6379/`.
pub fn redis_url() -> String {
    std::env::args()
        .nth(1)
        .or_else(|| std::env::var("REIN_REDIS_URL").ok())
        .unwrap_or_else(|| DEFAULT_REDIS_URL.to_owned())
}

/// The demos' Lua store at `url`: its keys under `prefix` (which starts with [`PREFIX`]),
/// kept at least [`MIN_TTL`]. Two stores on one prefix would share their limits.
pub async fn lua_store(
    url: &str,
    prefix: &str,
) -> Result<RedisStore<ConnectionManager>, ConnectError> {
    RedisStoreBuilder::new()
        .prefix(prefix)
        .min_ttl(MIN_TTL)
        .connect(url)
        .await
}

/// The demos' optimistic store (`WATCH`, `MULTI`/`EXEC`) at `url`, on the terms of
/// [`lua_store`].
pub async fn optimistic_store(url: &str, prefix: &str) -> Result<OptimisticStore, ConnectError> {
    OptimisticStoreBuilder::new()
        .prefix(prefix)
        .min_ttl(MIN_TTL)
        .connect(url)
        .await
}

/// Deletes `keys`, so that a demo run twice against the same Redis prints the same thing.
pub async fn delete_keys(url: &str, keys: &[String]) -> DemoResult {
    let client = rein::redis::client::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    if !keys.is_empty() {
        let () = rein::redis::client::cmd("DEL")
            .arg(keys)
            .query_async(&mut conn)
            .await?;
    }
    Ok(())
}

/// The instant `secs` seconds after [`T0`].
pub fn at(secs: u64) -> Timestamp {
    at_millis(secs * 1_000)
}

/// The instant `ms` milliseconds after [`T0`].
pub fn at_millis(ms: u64) -> Timestamp {
    T0.saturating_add(Micros::from_millis(ms))
}

/// `allowed (4 left)` or `denied (retry in 1.5 s)`.
pub fn describe(d: &Decision) -> String {
    if d.is_allowed() {
        format!("allowed ({} left)", d.remaining)
    } else {
        format!("denied (retry in {})", seconds(d.retry_after))
    }
}

/// A span in seconds, with as many decimals as it needs (at most 6): `60 s`, `1.5 s`.
pub fn seconds(span: Micros) -> String {
    let us = span.as_micros();
    let (whole, frac) = (us / 1_000_000, us % 1_000_000);
    if frac == 0 {
        return format!("{whole} s");
    }
    let frac = format!("{frac:06}");
    format!("{whole}.{} s", frac.trim_end_matches('0'))
}

/// The demos' Redis key prefix: theirs alone, so deleting their keys touches nothing else.
pub const PREFIX: &str = "rein-demo";

/// The shortest TTL of a demo's Redis keys. The demos' clock is [`T0`] onwards, not Redis's,
/// so keys must not expire by Redis's clock while a demo's timeline still needs them.
pub const MIN_TTL: Duration = Duration::from_secs(600);

/// The demos' epoch: 2023-11-14 22:14:00 UTC, on a whole minute, so fixed windows of a
/// minute (aligned to the Unix epoch) start exactly at `T0`, `T0 + 60 s`, ...
pub const T0: Timestamp = Timestamp::from_micros(1_700_000_040_000_000);

const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379/";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_print_only_the_decimals_they_need() {
        assert_eq!(seconds(Micros::from_secs(60)), "60 s");
        assert_eq!(seconds(Micros::from_millis(1_500)), "1.5 s");
        assert_eq!(seconds(Micros::from_micros(400_001)), "0.400001 s");
        assert_eq!(seconds(Micros::ZERO), "0 s");
    }

    #[test]
    fn t0_is_on_a_minute() {
        assert_eq!(T0.as_micros() % 60_000_000, 0);
    }
}
