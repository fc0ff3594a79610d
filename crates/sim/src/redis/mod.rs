//! A simulated Redis: a faithful subset of Redis 7.0 for turmoil worlds.
//!
//! Application nodes in a simulation run the real `rein-redis` store over redis-rs, so the
//! server they talk to must answer like Redis, down to error texts and score formatting, and
//! must run the very Lua files rein-redis ships. This module is that server: RESP2 framing,
//! strings and hashes with lazy expiry, and `EVAL`/`EVALSHA` on real Lua 5.1.
//! Time comes only from an injected [`Clock`], so a run is a function of its seed.
//!
//! # Layout
//!
//! - `request` / [`Reply`]: parsing requests and encoding replies, no I/O.
//! - `keyspace`, `hash`: the data and its types.
//! - `commands`: the command table and each command, as functions over the keyspace.
//! - `scripting`: the Lua state, the script cache and Redis's script environment.
//! - [`Node`] / [`Shared`]: one server's state and the handle its connections share.
//! - [`serve`] / [`host`]: the socket loop and a turmoil host factory.
//!
//! # Use
//!
//! ```
//! use rein_core::Timestamp;
//! use sim::redis::{ManualClock, Reply, Shared};
//!
//! let clock = ManualClock::new(Timestamp::from_micros(1_700_000_000_000_000));
//! let redis = Shared::new(clock.clock());
//! assert_eq!(redis.execute(["HSET", "k", "tat", "5"]), Reply::Integer(1));
//! assert_eq!(redis.execute(["EVAL", "return redis.call('HGET', KEYS[1], 'tat')", "1", "k"]),
//!            Reply::bulk("5"));
//! ```
//!
//! Commands: PING, ECHO, TIME, SELECT (0 only), CLIENT SETNAME/GETNAME/SETINFO, DBSIZE,
//! FLUSHALL, FLUSHDB, GET, SET (NX, XX, GET, EX, PX, EXAT, PXAT, KEEPTTL), INCR, DECR,
//! INCRBY, DECRBY, DEL, EXISTS, TYPE, EXPIRE, PEXPIRE, EXPIREAT, PEXPIREAT (NX, XX, GT, LT),
//! TTL, PTTL, PERSIST, HGET, HMGET, HSET, HMSET, HGETALL, HDEL, HINCRBY, HLEN, HEXISTS,
//! EVAL, EVALSHA, SCRIPT LOAD/EXISTS/FLUSH. Anything else is an unknown command, as it would
//! be on a Redis that lacks it. rein's scripts need only GET, SET (PX), DEL and TIME; the
//! hashes serve the naive read-modify-write baseline, which stores its bucket in one. Sorted
//! sets went with the old sliding-log layout (a log is one string now).

mod clock;
mod commands;
mod hash;
mod keyspace;
mod node;
mod number;
mod reply;
mod request;
mod scripting;
mod server;

pub use clock::{Clock, ManualClock};
pub use commands::Session;
pub use node::{Node, Persistence, Shared};
pub use reply::Reply;
pub use request::{ProtocolError, parse as parse_request};
pub use server::{Observer, host, host_observed, serve, serve_connection};
