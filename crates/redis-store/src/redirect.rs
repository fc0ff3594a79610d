//! What to do after a script call failed: follow a Redis Cluster redirect, wait out a
//! transient cluster state, or give up. Pure: no I/O, no clock; the caller passes the time
//! left before its deadline.
//!
//! # Which replies are resent
//!
//! A reply is resent only when it proves the script **did not run**: the node refused the
//! call before executing it. That holds for `MOVED` (another node owns the slot), `ASK` (the
//! key already moved to the importing node), `TRYAGAIN` (a multi-key call whose keys are
//! split by a migration), `CLUSTERDOWN`, `MASTERDOWN` and `LOADING` (the node serves no
//! calls yet), `READONLY` (the node was demoted to a replica, which cannot have written
//! anything), and redis-rs's `ClusterConnectionNotFound`, which it raises before sending,
//! when it has no connection to the chosen node. Everything else gives up at once: above all
//! an I/O error or a timeout, after which the script may have run and a replay could count
//! one request twice. `NOSCRIPT` is not handled here: it is answered on the same node by
//! resending the call as `EVAL` (see `Invocation::by_source`), inside one attempt.
//!
//! A call that the importing node twice sends back with `MOVED` after `ASKING` is ended
//! with an error naming `+asking` ([`asking_ignored`]): the node did not take the flag, and
//! the call would bounce between it and the source until its resends ran out.
//!
//! The decision is taken from the reply's kind (`ErrorKind::Server(ServerErrorKind::..)`)
//! and, for a redirect, its `redirect_node()`: never from message text.
//!
//! # Bound
//!
//! At most [`MAX_RESENDS`] resends per call. A redirect is followed at once; a transient
//! state waits [`FIRST_PAUSE`], doubling with each wait, and the last wait uses what is
//! left of the deadline (less the resend's own time: the call's longest attempt so far, at
//! least [`RESEND_ROOM`]): the one that would
//! not fit doubled, or the one before the last resend allowed. Giving up earlier (issue 22:
//! after 33.5–36.2 ms of a 50 ms deadline) failed calls that a migration would have let
//! through in time. A call with no time left to resend returns the reply it has (a
//! `Connection` error that says the script did not run) rather than a timeout.

use std::time::Duration;

use redis::{ErrorKind, RedisError, ServerErrorKind};

/// Where one attempt of a call is sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Target {
    /// Wherever the connection sends the call's keys: for a Cluster, the slot's owner in
    /// the client's slot map. Every call starts here.
    Slot,
    /// One Cluster node by address.
    Node(Node),
}

/// A Cluster node named by a `MOVED` or `ASK` reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Node {
    pub(crate) host: String,
    pub(crate) port: u16,
    /// Send `ASKING` first, on the same connection (an `ASK` redirect): the importing node
    /// then serves the slot it does not own yet, for this one call.
    pub(crate) asking: bool,
}

/// What the caller does next with a call whose attempt failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Sleep `after` (zero: not at all), then send the call again to `to`.
    Resend { to: Target, after: Duration },
    /// Return the attempt's error.
    GiveUp,
    /// Return [`asking_ignored`]: the importing node answered `MOVED` to the call sent with
    /// `ASKING`, twice.
    AskingIgnored,
}

/// The call's error once the importing node twice answered `MOVED` to a call sent with
/// `ASKING`: it did not take the flag, most likely because the ACL user may not send
/// `ASKING` (its refusal is hidden: redis-rs hands over a pipeline's redirect as its error),
/// and the call would bounce between the two nodes until its resends ran out. A server
/// error, not transient: it names the fix.
pub(crate) fn asking_ignored() -> RedisError {
    RedisError::from((
        ErrorKind::Server(ServerErrorKind::NoPerm),
        "the importing node of a migrating slot answered MOVED to ASKING twice: it did not \
         take ASKING (an ACL user without +asking, see docs/redis.md; or a slot set \
         MIGRATING on its source before IMPORTING on its target)",
    ))
}

/// The resends of one call so far. Create one per call; feed it each failed attempt in
/// order with [`next`](Self::next).
#[derive(Debug)]
pub(crate) struct Redirects {
    /// Whether the store can send to a node by address (a Cluster connection with its
    /// router). Without it, an `ASK` cannot be followed and a `MOVED` is resent to the slot
    /// once the client has refreshed its map.
    by_address: bool,
    resends: u32,
    waits: u32,
    /// What a resend keeps of the deadline for itself: [`RESEND_ROOM`], or the longest
    /// attempt of this call so far if longer ([`observe`](Self::observe)).
    room: Duration,
    /// `MOVED` replies to a call sent with `ASKING`: once is a migration undone or ended;
    /// twice, the flag was not taken ([`Step::AskingIgnored`]).
    moved_after_asking: u32,
}

impl Redirects {
    pub(crate) fn new(by_address: bool) -> Self {
        Self {
            by_address,
            resends: 0,
            waits: 0,
            room: RESEND_ROOM,
            moved_after_asking: 0,
        }
    }

    /// An attempt of this call took `took`: a resend needs about as long, so no resend is
    /// made (or waited for) with less than that left. (With a fixed 2 ms, a Redis a few
    /// milliseconds away got a resend whose reply came after the deadline: a timeout, the
    /// script's effect unknown, where the reply in hand said it had not run.)
    pub(crate) fn observe(&mut self, took: Duration) {
        self.room = self.room.max(took);
    }

    /// Resends so far: the hop count for tracing.
    pub(crate) fn resends(&self) -> u32 {
        self.resends
    }

    /// The next step after the attempt sent to `sent_to` failed with `error`, with `left`
    /// before the call's deadline.
    pub(crate) fn next(&mut self, error: &RedisError, sent_to: &Target, left: Duration) -> Step {
        // Too little left to resend within the deadline: the error it has, which says the
        // call did not run there, rather than a timeout that would leave it unknown.
        if self.resends >= MAX_RESENDS || left < self.room {
            return Step::GiveUp;
        }
        if error.kind() == ErrorKind::Server(ServerErrorKind::Moved)
            && matches!(sent_to, Target::Node(Node { asking: true, .. }))
        {
            self.moved_after_asking += 1;
            if self.moved_after_asking >= 2 {
                return Step::AskingIgnored;
            }
        }
        let step = match error.kind() {
            ErrorKind::Server(ServerErrorKind::Moved) => match self.redirect(error, false) {
                Some(node) => self.at_once(Target::Node(node)),
                // The client refreshes its slot map after a `MOVED`: the slot's owner is
                // right once that is done.
                None => self.after_pause(Target::Slot, left),
            },
            ErrorKind::Server(ServerErrorKind::Ask) => match self.redirect(error, true) {
                Some(node) => self.at_once(Target::Node(node)),
                None => Step::GiveUp,
            },
            // The same node, again: the keys of a split call are on their way, the cluster
            // or the node is coming back. After an `ASK` that is still the importing node,
            // with `ASKING`.
            ErrorKind::Server(
                ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
                | ServerErrorKind::BusyLoading,
            ) => self.after_pause(sent_to.clone(), left),
            // In a Cluster, the node was demoted, or the named node is unknown to the
            // client: both make the client refresh its map, so the slot's owner is found
            // again. A standalone server demoted to a replica stays one: resending to it
            // would only spend the deadline.
            ErrorKind::Server(ServerErrorKind::ReadOnly) | ErrorKind::ClusterConnectionNotFound
                if self.by_address =>
            {
                self.after_pause(Target::Slot, left)
            }
            // I/O errors, timeouts (the script may have run) and every other reply.
            _ => Step::GiveUp,
        };
        if let Step::Resend { .. } = step {
            self.resends += 1;
        }
        step
    }

    fn at_once(&self, to: Target) -> Step {
        Step::Resend {
            to,
            after: Duration::ZERO,
        }
    }

    /// A wait, then a resend to `to`: [`FIRST_PAUSE`] doubled per earlier wait, except the
    /// last wait, which is sized to what is left (less the room a resend keeps). A wait is the last
    /// when the doubled one would not fit before the deadline, or when no resend may follow
    /// this one ([`MAX_RESENDS`]): a shorter wait then would leave time unused that could
    /// only end in an error, and a split call that its migration joins again before the
    /// deadline is decided instead of failed.
    fn after_pause(&mut self, to: Target, left: Duration) -> Step {
        // Sleeping to the deadline itself would turn a known "did not run" into a timeout:
        // the resend needs time to reach the node and come back.
        let Some(usable) = left.checked_sub(self.room).filter(|d| !d.is_zero()) else {
            return Step::GiveUp;
        };
        let doubled = FIRST_PAUSE.saturating_mul(1 << self.waits.min(16));
        let last = self.resends + 1 >= MAX_RESENDS;
        let after = if last { usable } else { doubled.min(usable) };
        self.waits += 1;
        Step::Resend { to, after }
    }

    /// The node a `MOVED` or `ASK` names, if it can be sent to.
    fn redirect(&self, error: &RedisError, asking: bool) -> Option<Node> {
        if !self.by_address {
            return None;
        }
        let (addr, _slot) = error.redirect_node()?;
        // `host:port`, where an IPv6 host holds colons of its own. An empty host (a node
        // that does not know its endpoint) cannot be dialled.
        let (host, port) = addr.rsplit_once(':')?;
        let port = port.parse().ok()?;
        (!host.is_empty() && host != "?").then(|| Node {
            host: host.to_owned(),
            port,
            asking,
        })
    }
}

/// Resends per call. A slot migration costs a call at most two (`MOVED` to the new owner,
/// or `ASK` to the importing node, and one `TRYAGAIN`); five leave room for a migration
/// that ends while the call is on its way, without letting a flapping cluster bounce a call
/// around for its whole deadline.
pub(crate) const MAX_RESENDS: u32 = 5;

/// The first wait after `TRYAGAIN`, `CLUSTERDOWN`, `MASTERDOWN`, `LOADING` or `READONLY`,
/// doubled at each further wait (2, 4, 8, 16 ms, then the last one to the deadline). A split
/// multi-key call waits for a `MIGRATE` of a few keys, well under a millisecond on a LAN;
/// 2 ms lets it finish without adding much to a 50 ms deadline.
const FIRST_PAUSE: Duration = Duration::from_millis(2);

/// What a resend keeps of the deadline for itself: the last wait ends this long before it.
/// A script call's round trip on a LAN is well under a millisecond, but a loaded client
/// (the tests' debug builds on 2 cores) adds some; a resend whose reply comes after the
/// deadline ends in a timeout, which says less than the reply in hand (the script may have
/// run) and costs the connection (the store replaces a connection after a timeout).
pub(crate) const RESEND_ROOM: Duration = Duration::from_millis(2);

#[cfg(test)]
mod tests {
    use super::*;

    /// A redis-rs error as it decodes a server's error reply (`-MOVED 3999 host:port`).
    fn reply(resp: &str) -> RedisError {
        let value = redis::parse_redis_value(format!("-{resp}\r\n").as_bytes())
            .expect("a well-formed error reply");
        value.extract_error().expect_err("an error reply")
    }

    fn node(host: &str, port: u16, asking: bool) -> Target {
        Target::Node(Node {
            host: host.to_owned(),
            port,
            asking,
        })
    }

    fn resend(to: Target, after_ms: u64) -> Step {
        Step::Resend {
            to,
            after: Duration::from_millis(after_ms),
        }
    }

    struct Row {
        label: &'static str,
        sent_to: Target,
        error: RedisError,
        left_ms: u64,
        expected: Step,
    }

    /// Runs `rows` in order against one call's [`Redirects`].
    fn run(by_address: bool, rows: Vec<Row>) {
        let mut redirects = Redirects::new(by_address);
        for row in rows {
            let step = redirects.next(&row.error, &row.sent_to, Duration::from_millis(row.left_ms));
            assert_eq!(step, row.expected, "row {:?}", row.label);
        }
    }

    /// A resend keeps as much of the deadline as an attempt of the call took: from a Redis
    /// 5 ms away, 4 ms left is a give-up with the reply in hand ("did not run"), not a resend
    /// whose reply would come after the deadline (before: a 2 ms wait and a resend, then a
    /// timeout, the script's effect unknown).
    #[test]
    fn a_resend_keeps_as_much_as_an_attempt_took() {
        let tryagain = reply("TRYAGAIN Multiple keys request during rehashing of slot");
        let ms = Duration::from_millis;
        let mut redirects = Redirects::new(true);
        redirects.observe(ms(5));
        assert_eq!(
            redirects.next(&tryagain, &Target::Slot, ms(4)),
            Step::GiveUp
        );
        let mut redirects = Redirects::new(true);
        redirects.observe(ms(5));
        assert_eq!(
            redirects.next(&tryagain, &Target::Slot, ms(8)),
            resend(Target::Slot, 2)
        );
        // The last wait leaves the attempt's time, not 2 ms.
        let mut redirects = Redirects::new(true);
        redirects.observe(ms(5));
        for _ in 0..MAX_RESENDS - 1 {
            let _ = redirects.next(&tryagain, &Target::Slot, ms(40));
        }
        assert_eq!(
            redirects.next(&tryagain, &Target::Slot, ms(20)),
            resend(Target::Slot, 15)
        );
    }

    #[rustfmt::skip]
    #[test]
    fn a_migration_is_followed_to_the_new_owner_then_bounded() {
        let a = || node("127.0.0.1", 7001, true);
        run(true, vec![
            // The key moved during a migration: ASKING on the importing node.
            Row { label: "ask", sent_to: Target::Slot, error: reply("ASK 3999 127.0.0.1:7001"),
                  left_ms: 50, expected: resend(a(), 0) },
            // Its keys are split between the nodes: wait, then the same node with ASKING.
            Row { label: "tryagain", sent_to: a(), error: reply("TRYAGAIN Multiple keys request during rehashing of slot"),
                  left_ms: 49, expected: resend(a(), 2) },
            Row { label: "tryagain twice", sent_to: a(), error: reply("TRYAGAIN again"),
                  left_ms: 46, expected: resend(a(), 4) },
            // The migration ended: the owner moved on, no ASKING.
            Row { label: "moved", sent_to: a(), error: reply("MOVED 3999 127.0.0.1:7002"),
                  left_ms: 41, expected: resend(node("127.0.0.1", 7002, false), 0) },
            // The fifth resend is the last allowed: its wait uses what is left, less 2 ms.
            Row { label: "loading", sent_to: node("127.0.0.1", 7002, false), error: reply("LOADING Redis is loading the dataset in memory"),
                  left_ms: 40, expected: resend(node("127.0.0.1", 7002, false), 38) },
            // Five resends: the sixth failure is returned, redirect or not.
            Row { label: "bound", sent_to: node("127.0.0.1", 7002, false), error: reply("MOVED 3999 127.0.0.1:7003"),
                  left_ms: 30, expected: Step::GiveUp },
        ]);
    }

    /// An importing node that does not take `ASKING` (an ACL user without `+asking`) sends
    /// the call back with `MOVED`, and the source sends it there again with `ASK`: the
    /// second such `MOVED` ends the call with an error naming the cause (before, the bounce
    /// spent every resend and ended as a connection error). One `MOVED` after `ASKING`, a
    /// migration ended or undone, is followed.
    #[test]
    fn a_bounce_between_source_and_importing_node_is_named() {
        let source = || node("127.0.0.1", 7000, false);
        let importing = || node("127.0.0.1", 7001, true);
        let mut redirects = Redirects::new(true);
        for (sent_to, error, expected) in [
            (
                Target::Slot,
                "ASK 3999 127.0.0.1:7001",
                resend(importing(), 0),
            ),
            (
                importing(),
                "MOVED 3999 127.0.0.1:7000",
                resend(source(), 0),
            ),
            (source(), "ASK 3999 127.0.0.1:7001", resend(importing(), 0)),
            (
                importing(),
                "MOVED 3999 127.0.0.1:7000",
                Step::AskingIgnored,
            ),
        ] {
            let step = redirects.next(&reply(error), &sent_to, Duration::from_millis(50));
            assert_eq!(step, expected, "{error} from {sent_to:?}");
        }
    }

    #[rustfmt::skip]
    #[test]
    fn an_unknown_outcome_is_never_resent() {
        let io = || RedisError::from(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset"));
        let timeout = || RedisError::from(std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out"));
        for (label, error) in [
            ("connection reset", io()),
            ("timed out", timeout()),
            ("script error", reply("ERR user_script:1: bad")),
            ("noscript", reply("NOSCRIPT No matching script")),
            ("crossslot", reply("CROSSSLOT Keys in request don't hash to the same slot")),
            ("noperm", reply("NOPERM this user has no permissions")),
        ] {
            run(true, vec![Row { label, sent_to: Target::Slot, error, left_ms: 50, expected: Step::GiveUp }]);
        }
    }

    #[rustfmt::skip]
    #[test]
    fn transient_states_wait_within_the_deadline() {
        run(true, vec![
            Row { label: "clusterdown", sent_to: Target::Slot, error: reply("CLUSTERDOWN The cluster is down"),
                  left_ms: 50, expected: resend(Target::Slot, 2) },
            Row { label: "masterdown", sent_to: Target::Slot, error: reply("MASTERDOWN Link with MASTER is down"),
                  left_ms: 47, expected: resend(Target::Slot, 4) },
            // A demoted node: back to the slot map, which the client refreshes.
            Row { label: "readonly", sent_to: node("127.0.0.1", 7001, false), error: reply("READONLY You can't write against a read only replica."),
                  left_ms: 42, expected: resend(Target::Slot, 8) },
            // No time left to resend: the reply is returned, not a timeout.
            Row { label: "no time left", sent_to: Target::Slot, error: reply("CLUSTERDOWN The cluster is down"),
                  left_ms: 2, expected: Step::GiveUp },
        ]);
        run(true, vec![
            Row { label: "no connection to the node", sent_to: node("10.0.0.9", 7001, true),
                  error: RedisError::from((ErrorKind::ClusterConnectionNotFound, "Requested connection not found")),
                  left_ms: 50, expected: resend(Target::Slot, 2) },
        ]);
        // A standalone primary demoted to a replica stays one: its READONLY is returned at
        // once (it spent the deadline on five resends to the same replica before), while
        // a node coming back is still waited for.
        run(false, vec![
            Row { label: "standalone readonly", sent_to: Target::Slot, error: reply("READONLY You can't write against a read only replica."),
                  left_ms: 50, expected: Step::GiveUp },
        ]);
        run(false, vec![
            Row { label: "standalone loading", sent_to: Target::Slot, error: reply("LOADING Redis is loading the dataset in memory"),
                  left_ms: 50, expected: resend(Target::Slot, 2) },
        ]);
    }

    /// Issue 22: a call split by a migration used to give up once the next doubled wait
    /// would not fit, with up to a third of its deadline unused.
    #[rustfmt::skip]
    #[test]
    fn the_last_wait_uses_what_is_left() {
        let tryagain = || reply("TRYAGAIN Multiple keys request during rehashing of slot");
        // A 50 ms deadline, on a number line: waits of 2, 4, 8 and 16 ms, and the fifth
        // (the last resend allowed) lasts until 2 ms before the deadline.
        run(true, vec![
            Row { label: "t=0",  sent_to: Target::Slot, error: tryagain(), left_ms: 50, expected: resend(Target::Slot, 2) },
            Row { label: "t=3",  sent_to: Target::Slot, error: tryagain(), left_ms: 47, expected: resend(Target::Slot, 4) },
            Row { label: "t=8",  sent_to: Target::Slot, error: tryagain(), left_ms: 42, expected: resend(Target::Slot, 8) },
            Row { label: "t=17", sent_to: Target::Slot, error: tryagain(), left_ms: 33, expected: resend(Target::Slot, 16) },
            Row { label: "t=34, last resend", sent_to: Target::Slot, error: tryagain(), left_ms: 16, expected: resend(Target::Slot, 14) },
            Row { label: "t=48, bound", sent_to: Target::Slot, error: tryagain(), left_ms: 2, expected: Step::GiveUp },
        ]);
        // A 20 ms deadline: the third doubled wait (8 ms) would not fit in the 7 ms left,
        // so it lasts 5 ms; at 2 ms before the deadline nothing is left to wait for.
        run(true, vec![
            Row { label: "t=0",  sent_to: Target::Slot, error: tryagain(), left_ms: 20, expected: resend(Target::Slot, 2) },
            Row { label: "t=3",  sent_to: Target::Slot, error: tryagain(), left_ms: 17, expected: resend(Target::Slot, 4) },
            Row { label: "t=13", sent_to: Target::Slot, error: tryagain(), left_ms: 7,  expected: resend(Target::Slot, 5) },
            Row { label: "t=18", sent_to: Target::Slot, error: tryagain(), left_ms: 2,  expected: Step::GiveUp },
        ]);
        // After an ASK the importing node gets the waits, and an unknown outcome is still
        // returned however much time is left.
        let a = || node("127.0.0.1", 7001, true);
        let reset = || RedisError::from(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset"));
        run(true, vec![
            Row { label: "ask",   sent_to: Target::Slot, error: reply("ASK 3999 127.0.0.1:7001"), left_ms: 50, expected: resend(a(), 0) },
            Row { label: "split", sent_to: a(), error: tryagain(), left_ms: 3, expected: resend(a(), 1) },
            Row { label: "reset", sent_to: a(), error: reset(), left_ms: 45, expected: Step::GiveUp },
        ]);
    }

    #[rustfmt::skip]
    #[test]
    fn redirects_need_an_address_to_send_to() {
        // A connection that cannot route by address: a MOVED waits for the slot map, an
        // ASK cannot be followed.
        run(false, vec![
            Row { label: "moved, no router", sent_to: Target::Slot, error: reply("MOVED 3999 127.0.0.1:7002"),
                  left_ms: 50, expected: resend(Target::Slot, 2) },
            Row { label: "ask, no router", sent_to: Target::Slot, error: reply("ASK 3999 127.0.0.1:7002"),
                  left_ms: 48, expected: Step::GiveUp },
        ]);
        run(true, vec![
            Row { label: "ipv6", sent_to: Target::Slot, error: reply("MOVED 3999 ::1:7002"),
                  left_ms: 50, expected: resend(node("::1", 7002, false), 0) },
            Row { label: "unknown endpoint", sent_to: Target::Slot, error: reply("MOVED 3999 :7002"),
                  left_ms: 50, expected: resend(Target::Slot, 2) },
            Row { label: "ask, unknown endpoint", sent_to: Target::Slot, error: reply("ASK 3999 ?:7002"),
                  left_ms: 48, expected: Step::GiveUp },
        ]);
    }
}
