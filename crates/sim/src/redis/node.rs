//! One simulated Redis server's state, and the handle its connections share.
//!
//! [`Node`] is a plain state machine: arguments in, [`Reply`] out, time from its injected
//! [`Clock`]. [`Shared`] puts it behind a mutex for the server's connection tasks and for test
//! code that inspects or faults it. Keeping the `Shared` outside turmoil's host factory is
//! what lets a `bounce` choose between a restart that keeps the data and a crash that loses
//! it (see [`Persistence`]).

use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;

use super::clock::Clock;
use super::commands::{self, Caller, Context};
use super::keyspace::{Entry, Keyspace};
use super::reply::Reply;
use super::scripting::Scripting;

/// A simulated Redis: its data, its script engine and its clock.
///
/// Commands run one at a time, each atomically; a script is one command. Every command
/// reads the clock once, so a script sees a single `now` for expiry and `TIME`.
pub struct Node {
    keyspace: Keyspace,
    scripting: Scripting,
    clock: Clock,
}

impl Node {
    /// An empty node reading time from `clock`.
    pub fn new(clock: Clock) -> Self {
        Self {
            keyspace: Keyspace::default(),
            scripting: fresh_scripting(),
            clock,
        }
    }

    /// Runs one command (`["SET", "k", "v"]`).
    pub fn execute(&mut self, args: &[Bytes]) -> Reply {
        let spec = match commands::resolve(args, Caller::Client) {
            Ok(spec) => spec,
            Err(reply) => return reply,
        };
        let now = self.clock.now();
        let keyspace = &mut self.keyspace;
        match spec.kind {
            Some(run) => run(&mut Context { keyspace, now }, args),
            None => self.scripting.command(keyspace, now, args),
        }
    }

    /// What `WATCH` remembers of `key`: its live entry, if any.
    pub fn watch(&mut self, key: &[u8]) -> Option<Entry> {
        let now_ms = i64::try_from(self.clock.now().as_micros() / 1000).unwrap_or(i64::MAX);
        self.keyspace.snapshot(key, now_ms)
    }

    /// `EXEC`: runs `queued` as one atomic step, unless a key of `watched` no longer holds
    /// what it held when watched (written, deleted or expired since, by anyone), in which
    /// case nothing runs and the answer is nil. Comparing values rather than counting
    /// writes misses a write that restored the very same value and expiry; rein's states
    /// only move forward, so for its keys the two are the same.
    pub fn exec(&mut self, watched: &[(Bytes, Option<Entry>)], queued: &[Vec<Bytes>]) -> Reply {
        if watched.iter().any(|(key, then)| self.watch(key) != *then) {
            // Redis answers `*-1`; redis-rs reads it and `$-1` alike, as nil.
            return Reply::Nil;
        }
        Reply::Array(queued.iter().map(|args| self.execute(args)).collect())
    }

    /// A restart of a server whose data persisted: keys survive, while the script cache,
    /// and the Lua state start over, as in a new Redis process.
    pub fn restart_keeping_data(&mut self) {
        self.scripting = fresh_scripting();
    }

    /// A crash of a server without persistence: everything is lost.
    pub fn restart_losing_data(&mut self) {
        self.restart_keeping_data();
        self.keyspace.flush();
    }

    /// The clock the node reads.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("keyspace", &self.keyspace)
            .finish_non_exhaustive()
    }
}

/// A cloneable handle to one [`Node`], shared by its connections and by test code.
#[derive(Clone, Debug)]
pub struct Shared {
    node: Arc<Mutex<Node>>,
}

impl Shared {
    /// A handle to a new empty node reading `clock`.
    pub fn new(clock: Clock) -> Self {
        Self {
            node: Arc::new(Mutex::new(Node::new(clock))),
        }
    }

    /// Runs one command in-process: `shared.execute(["SET", "k", "1"])`.
    pub fn execute<I>(&self, args: I) -> Reply
    where
        I: IntoIterator,
        I::Item: AsRef<[u8]>,
    {
        let args: Vec<Bytes> = args
            .into_iter()
            .map(|a| Bytes::copy_from_slice(a.as_ref()))
            .collect();
        if args.is_empty() {
            return Reply::error("ERR empty command");
        }
        self.lock().execute(&args)
    }

    /// Runs one command for a connection.
    pub fn execute_args(&self, args: &[Bytes]) -> Reply {
        self.lock().execute(args)
    }

    /// See [`Node::watch`].
    pub fn watch(&self, key: &[u8]) -> Option<Entry> {
        self.lock().watch(key)
    }

    /// See [`Node::exec`].
    pub fn exec(&self, watched: &[(Bytes, Option<Entry>)], queued: &[Vec<Bytes>]) -> Reply {
        self.lock().exec(watched, queued)
    }

    /// See [`Node::restart_keeping_data`].
    pub fn restart_keeping_data(&self) {
        self.lock().restart_keeping_data();
    }

    /// See [`Node::restart_losing_data`].
    pub fn restart_losing_data(&self) {
        self.lock().restart_losing_data();
    }

    /// Restarts the node as a server with `persistence` would come back: with or without
    /// its data, always without its script cache.
    pub fn restart(&self, persistence: Persistence) {
        match persistence {
            Persistence::KeepData => self.restart_keeping_data(),
            Persistence::LoseData => self.restart_losing_data(),
        }
    }

    /// Exclusive access to the node, for inspection between simulation steps.
    pub fn lock(&self) -> MutexGuard<'_, Node> {
        // A std mutex, not tokio's: no command awaits while holding it. A panic inside a
        // command poisons it; the data is still consistent per command, so carry on.
        self.node
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// What a (re)started simulated Redis host finds, as configured persistence would decide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Persistence {
    /// Like `appendonly yes` with `appendfsync always`: every acknowledged write survives a
    /// restart; the script cache does not.
    KeepData,
    /// Like a cache with persistence off (rein's default deployment): a restart starts
    /// empty.
    LoseData,
}

fn fresh_scripting() -> Scripting {
    // The prelude is a constant of this crate; failing to load it is a bug, not an input.
    Scripting::new().expect("the simulator's Lua prelude loads")
}

#[cfg(test)]
mod tests {
    use rein_core::{Micros, Timestamp};

    use super::super::clock::ManualClock;
    use super::*;

    fn shared() -> (Shared, ManualClock) {
        let clock = ManualClock::new(Timestamp::from_micros(1_700_000_000_000_000));
        (Shared::new(clock.clock()), clock)
    }

    #[test]
    fn a_restart_keeps_keys_but_forgets_scripts() {
        let (node, _) = shared();
        node.execute(["SET", "k", "v"]);
        let Reply::Bulk(sha) = node.execute(["SCRIPT", "LOAD", "return 1"]) else {
            panic!("SCRIPT LOAD failed");
        };
        node.restart_keeping_data();
        assert_eq!(node.execute(["GET", "k"]), Reply::bulk("v"));
        assert_eq!(
            node.execute([&b"EVALSHA"[..], &sha[..], &b"0"[..]]),
            Reply::error("NOSCRIPT No matching script. Please use EVAL.")
        );
        node.restart_losing_data();
        assert_eq!(node.execute(["DBSIZE"]), Reply::Integer(0));
    }

    #[test]
    fn keys_expire_with_the_injected_clock() {
        let (node, clock) = shared();
        node.execute(["SET", "k", "v", "PX", "1000"]);
        clock.advance(Micros::from_millis(1000));
        assert_eq!(node.execute(["GET", "k"]), Reply::bulk("v"));
        clock.advance(Micros::from_millis(1));
        assert_eq!(node.execute(["GET", "k"]), Reply::Nil);
    }

    #[test]
    fn time_inside_a_script_is_the_simulated_clock() {
        let (node, _) = shared();
        assert_eq!(
            node.execute(["EVAL", "return redis.call('TIME')", "0"]),
            Reply::Array(vec![Reply::bulk("1700000000"), Reply::bulk("0")])
        );
    }
}
