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
//!
//! # Layout
//!
//! - [`redis`]: the simulated Redis node and its turmoil host.
//! - [`world`]: application nodes, workloads, faults and the scenario runner; the default
//!   suite the report (`cargo run -p sim --release`) plays. docs/sim.md explains the world,
//!   docs/guarantees.md the bound each fault class is held to and the test that holds it.
//! - [`oracle`]: the exact per-window check of every admission.
//! - [`report`]: tables and SVG charts of scenario results.
#![deny(missing_docs)]

pub mod oracle;
pub mod redis;
pub mod report;
pub mod world;
