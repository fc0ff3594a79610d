//! rein's deterministic simulator: many application nodes sharing limits through a simulated
//! Redis, inside a turmoil world where time, network and faults follow a seed.
//!
//! This crate is internal (`publish = false`): it tests rein, it is not a library to depend
//! on. To rate-limit through Redis use `rein-redis`; in one process, `rein-memory`.
//!
//! # Key decision
//!
//! The nodes run the real `rein-redis` store and its real Lua scripts; only Redis itself is
//! simulated, by [`redis`], a faithful Redis 7.0 subset whose replies are checked byte for
//! byte against a real `redis-server` by this crate's differential test. So a bug found
//! here is a bug in rein or in the simulator's fidelity, never in a stand-in for the store.
#![deny(missing_docs)]

pub mod oracle;
pub mod redis;
pub mod report;
pub mod world;
