//! The baseline rein replaces: the common token bucket over Redis that reads, decides and
//! writes from the client (`HGETALL`, decide in floats, `HSET`), rendered faithfully.
//!
//! It lives here only, as the control group of the simulation: run under the same workload
//! and network as rein's store, it shows the race such designs call "a small amount of
//! over-counting" (two nodes read the same state, both admit, both write) as a measured
//! over-admission, next to rein's zero. Not for use anywhere else.

use std::collections::HashMap;

use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use rein_core::{Algorithm, Limit, Policy, Timestamp};

/// The read-modify-write `TokenBucketLimiter`: `capacity` tokens, `refill_rate` tokens per second,
/// state in a hash `{tokens, last_refill}` read and written in two round trips.
#[derive(Clone, Debug)]
pub struct NaiveBucket {
    capacity: f64,
    refill_rate: f64,
}

impl NaiveBucket {
    /// The baseline's bucket with the figures of `policy`'s first limit, which must be a token
    /// bucket; `None` otherwise.
    pub fn for_policy(policy: &Policy) -> Option<Self> {
        match policy.limits().first()? {
            Limit::TokenBucket(bucket) => {
                let (per_token, per_micro) = bucket.emission_interval();
                Some(Self {
                    capacity: bucket.capacity() as f64,
                    refill_rate: per_micro as f64 * 1e6 / per_token as f64,
                })
            }
            _ => None,
        }
    }

    /// `IsAllowed`: reads the state, refills, takes a token and writes back, at `now`.
    pub async fn is_allowed(
        &self,
        conn: &mut MultiplexedConnection,
        now: Timestamp,
        user: &str,
    ) -> redis::RedisResult<bool> {
        let key = format!("rl:tb:{user}");
        let now_ns = now.as_micros() as i64 * 1_000;
        let data: HashMap<String, String> = conn.hgetall(&key).await?;
        let (mut tokens, last_refill_ns) = if data.is_empty() {
            (self.capacity, now_ns)
        } else {
            (
                data.get("tokens")
                    .and_then(|t| t.parse().ok())
                    .unwrap_or(0.0),
                data.get("last_refill")
                    .and_then(|t| t.parse().ok())
                    .unwrap_or(0_i64),
            )
        };
        let elapsed = (now_ns - last_refill_ns) as f64 / 1e9;
        tokens = self.capacity.min(tokens + elapsed * self.refill_rate);
        if tokens < 1.0 {
            return Ok(false);
        }
        tokens -= 1.0;
        let () = conn
            .hset_multiple(
                &key,
                &[
                    ("tokens", tokens.to_string()),
                    ("last_refill", now_ns.to_string()),
                ],
            )
            .await?;
        Ok(true)
    }
}
