//! A simulated Redis: a faithful subset of Redis 7.0 for turmoil worlds.
//!
//! Application nodes in a simulation run the real `rein-redis` store over redis-rs, so the
//! server they talk to must answer like Redis, down to error texts and number formatting, and
//! must run the very Lua files rein-redis ships. This module is that server: RESP2 framing,
//! strings and hashes with lazy expiry, and `EVAL`/`EVALSHA` on real Lua 5.1.
//! Time comes only from an injected [`Clock`], so a run is a function of its seed.
//!
//! # Layout
//!
//! - `request` / [`Reply`]: parsing requests and encoding replies, no I/O.
//! - `keyspace`, `hash`: the data and its types.
//! - `commands`: the command table and the commands, as functions over the keyspace.
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
//! assert_eq!(redis.execute(["SET", "k", "5", "PX", "1000"]), Reply::ok());
//! assert_eq!(redis.execute(["EVAL", "return redis.call('GET', KEYS[1])", "1", "k"]),
//!            Reply::bulk("5"));
//! ```
//!
//! Commands: only what rein sends and the simulator's tests use. From scripts: GET,
//! SET key value [PX ms], DEL, TIME; the overrides' (`admin.lua`): HGET, HGETALL, HEXISTS,
//! HLEN, HSET, HDEL, PUBLISH (which reaches no one: there is no SUBSCRIBE). From
//! rein's store: EVALSHA, EVAL, SCRIPT LOAD, GET.
//! From the naive read-modify-write baseline: HGETALL, HMSET. From the optimistic store:
//! WATCH, UNWATCH, MULTI, EXEC, DISCARD, TIME, GET, SET (a transaction per connection;
//! `EXEC` runs the queue atomically unless a watched key changed). From tests and redis-rs: PING,
//! DBSIZE, FLUSHALL, SCRIPT EXISTS/FLUSH, CLIENT SETNAME/SETINFO. Anything else is an
//! unknown command (and any other SET option a syntax error), as on a Redis that lacks it.
//! Scripts see Redis's environment as far as rein's scripts use it: `redis.call`/`pcall`,
//! `redis.error_reply`, `redis.REDIS_VERSION_NUM`, Redis's `pcall` and read-only globals;
//! no `math.random`.

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
pub use node::{Node, Persistence, Shared};
pub use reply::Reply;
pub use request::{ProtocolError, parse as parse_request};
pub use server::{
    Observer, host, host_observed, serve, serve_connection, serve_connection_observed,
};
