//! The Lua scripts, their arguments and their reply: pure encoding and decoding, no I/O.
//!
//! A decision is one `EVALSHA` of one script, picked per policy when its [`RedisPolicy`]
//! is built: a lean script for a policy of one token bucket, fixed window or sliding log (the
//! hot path: straight-line Lua, parameters precomputed, one `GET` and at most one
//! `SET ... PX`), and the generic policy script for everything else (several limits, or a
//! sliding counter). The protocol (KEYS, ARGV, reply) is documented at the top of each Lua
//! file and in docs/redis.md; this file is its Rust half.

use std::sync::LazyLock;

use redis::{Cmd, Value};
use rein_core::time::MAX_MICROS;
use rein_core::{
    Decision, Micros, Outcome, StoreError, Timestamp,
    rate_share::{Grant, RateAnswer, RateOp, RateShares, Taken},
};

use crate::RedisPolicy;

/// A script as it is sent: the preamble every script shares (`MAX`, `clock`), for a lean
/// script of the fixed window or the sliding log the steps they share (`lua/lean.lua`:
/// `keep`, `answer`), then its own text. Still one script per algorithm, one `EVALSHA` per
/// call.
macro_rules! script {
    ($file:literal) => {
        concat!(
            include_str!("../lua/preamble.lua"),
            include_str!(concat!("../lua/", $file))
        )
    };
    (lean $file:literal) => {
        concat!(
            include_str!("../lua/preamble.lua"),
            include_str!("../lua/lean.lua"),
            include_str!(concat!("../lua/", $file))
        )
    };
}

/// The Lua source of the generic policy script, which decides policies of several limits
/// (and of one sliding counter), for tools that run it outside Redis. [`SCRIPTS`] lists it
/// with the lean single-limit scripts; a tool that runs the store needs all of them.
///
/// It is `lua/preamble.lua` followed by `lua/policy.lua`; its calling convention is
/// documented at the top of `policy.lua` and in docs/redis.md. The Redis commands it uses:
/// `TIME`, `GET`, `SET` (with `PX`) and `DEL`.
pub const SCRIPT_SOURCE: &str = script!("policy.lua");

/// Every script the store may send, as `(name, Lua source)`: the generic policy script
/// ([`SCRIPT_SOURCE`]), the lean scripts for a policy of one token bucket, one fixed
/// window or one sliding log, and the rate-share script of a leased token bucket, each
/// after the shared preamble (`lua/preamble.lua`). A simulator or a deployment that
/// preloads scripts (`SCRIPT LOAD`, or converting them to Redis Functions) loads all of
/// them. The decision scripts use only `TIME`, `GET`, `SET` (with `PX`) and `DEL`; the
/// rate-share script `TIME`, `HGETALL`, `DEL`, `HSET` and `PEXPIRE`; the operator's script
/// (`admin`: a compare-and-set of one key) `TIME`, `GET`, `SET` and `DEL`.
pub const SCRIPTS: [(&str, &str); 6] = [
    ("policy", SCRIPT_SOURCE),
    ("token_bucket", script!("single_token_bucket.lua")),
    ("fixed_window", script!(lean "single_fixed_window.lua")),
    ("sliding_log", script!(lean "single_sliding_log.lua")),
    ("lease_rate", script!("lease_rate.lua")),
    ("admin", script!("admin.lua")),
];

/// Which of [`SCRIPTS`] a policy runs, by index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum ScriptKind {
    /// The generic driver: any policy.
    Policy = 0,
    /// One token bucket: capacity, units_per_token, units_per_micro, tol_us, tol_units.
    TokenBucket = 1,
    /// One fixed window: limit, window.
    FixedWindow = 2,
    /// One sliding log: limit, window.
    SlidingLog = 3,
    /// Rate shares of one token bucket (leases of rate): capacity, token_units, part_rate.
    LeaseRate = 4,
    /// An operator's compare-and-set of one key: read, then swap.
    Admin = 5,
}

impl ScriptKind {
    pub(crate) fn source(self) -> &'static str {
        SCRIPTS[self as usize].1
    }

    /// The script's SHA-1 in hex, the name `EVALSHA` calls it by.
    pub(crate) fn sha1(self) -> &'static str {
        &SCRIPT_SHA1S[self as usize]
    }
}

/// The SHA-1 of each of [`SCRIPTS`], computed once.
static SCRIPT_SHA1S: LazyLock<[String; 6]> =
    LazyLock::new(|| SCRIPTS.map(|(_, source)| sha1_smol::Sha1::from(source).digest().to_string()));

/// What the script is asked to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Acquire,
    Peek,
    Refund,
    /// `acquire_held`: the hold, µs, sent as the last argument.
    Hold(u64),
    /// `refund_held`: the stamp, µs, sent as the last argument.
    Settle(u64),
}

impl Op {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Op::Acquire => "acquire",
            Op::Peek => "peek",
            Op::Refund => "refund",
            Op::Hold(_) => "hold",
            Op::Settle(_) => "settle",
        }
    }

    /// The argument the lease operations add after the policy's.
    fn extra(self) -> Option<u64> {
        match self {
            Op::Hold(x) | Op::Settle(x) => Some(x.min(MAX_MICROS)),
            _ => None,
        }
    }
}

/// One decision in a call: what the script is asked to do, and the cost (or the amount
/// given back).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ask {
    pub(crate) op: Op,
    pub(crate) cost: u64,
}

/// One script call. For a decision, KEYS and ARGV follow the policy's script: the generic
/// policy script decides one request over the policy's keys (ARGV: the operation, `now`,
/// the cost, `min_ttl` in ms, the policy's parameters); a lean single-limit script decides
/// one request per key (ARGV: `now`, `min_ttl`, the policy's parameters, then the operation
/// and cost of each), so the store can send several concurrent decisions as one call.
pub(crate) struct Invocation<'a> {
    keys: &'a [String],
    call: Call<'a>,
}

/// What an [`Invocation`] runs.
enum Call<'a> {
    /// A decision script: `now`, the policy's arguments, and one [`Ask`] per decision (one
    /// per key for a lean script, exactly one for the policy script).
    Decide {
        now: String,
        min_ttl_ms: u64,
        policy: &'a RedisPolicy,
        asks: &'a [Ask],
    },
    /// Another script, with its whole ARGV.
    Script {
        kind: ScriptKind,
        args: Vec<Vec<u8>>,
    },
}

impl<'a> Invocation<'a> {
    /// Decisions of `policy` at `now`: for a lean script one ask per key, for the policy
    /// script one ask over the policy's keys.
    pub(crate) fn new(
        keys: &'a [String],
        now: Option<Timestamp>,
        min_ttl_ms: u64,
        policy: &'a RedisPolicy,
        asks: &'a [Ask],
    ) -> Self {
        debug_assert!(match policy.script() {
            ScriptKind::Policy => asks.len() == 1,
            _ => asks.len() == keys.len() && !asks.is_empty(),
        });
        Self {
            keys,
            call: Call::Decide {
                now: now.map_or_else(String::new, |t| t.as_micros().to_string()),
                min_ttl_ms,
                policy,
                asks,
            },
        }
    }

    /// A call of `kind` with its whole ARGV.
    pub(crate) fn script(keys: &'a [String], kind: ScriptKind, args: Vec<String>) -> Self {
        let args = args.into_iter().map(String::into_bytes).collect();
        Self::script_bytes(keys, kind, args)
    }

    /// [`script`](Self::script) with arguments that need not be text (a user key).
    pub(crate) fn script_bytes(keys: &'a [String], kind: ScriptKind, args: Vec<Vec<u8>>) -> Self {
        Self {
            keys,
            call: Call::Script { kind, args },
        }
    }

    fn kind(&self) -> ScriptKind {
        match &self.call {
            Call::Decide { policy, .. } => policy.script(),
            Call::Script { kind, .. } => *kind,
        }
    }

    /// `EVALSHA <sha1> <numkeys> KEYS... ARGV...`: the normal case.
    pub(crate) fn by_hash(&self) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.kind().sha1());
        self.fill(cmd)
    }

    /// `EVAL <source> <numkeys> KEYS... ARGV...`, sent only when the server answered
    /// [`by_hash`](Self::by_hash) with `NOSCRIPT` (restarted, failed over, `SCRIPT FLUSH`).
    /// The script had not run, so this cannot double count; and unlike `SCRIPT LOAD` then
    /// `EVALSHA`, it is one command, which a concurrent flush cannot slip between. It also
    /// leaves the script cached for the next `EVALSHA`.
    pub(crate) fn by_source(&self) -> Cmd {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(self.kind().source());
        self.fill(cmd)
    }

    fn fill(&self, mut cmd: Cmd) -> Cmd {
        cmd.arg(self.keys.len()).arg(self.keys);
        match &self.call {
            Call::Decide {
                now,
                min_ttl_ms,
                policy,
                asks,
            } => {
                let kind = policy.script();
                if kind == ScriptKind::Policy {
                    // One request over the policy's keys: the ask leads, the header follows.
                    let ask = asks.first().copied().unwrap_or(Ask {
                        op: Op::Peek,
                        cost: 0,
                    });
                    let op = sent_op(ask.op, kind);
                    cmd.arg(op.as_str())
                        .arg(now)
                        .arg(ask.cost.min(MAX_MICROS))
                        .arg(*min_ttl_ms)
                        .arg(policy.script_args());
                    if let Some(extra) = op.extra() {
                        cmd.arg(extra);
                    }
                } else {
                    cmd.arg(now).arg(*min_ttl_ms).arg(policy.script_args());
                    for ask in *asks {
                        let op = sent_op(ask.op, kind);
                        cmd.arg(op.as_str()).arg(ask.cost.min(MAX_MICROS));
                        if let Some(extra) = op.extra() {
                            cmd.arg(extra);
                        }
                    }
                }
            }
            Call::Script { args, .. } => {
                cmd.arg(args);
            }
        }
        cmd
    }
}

/// The operation as `kind`'s script knows it. The lean token-bucket and fixed-window
/// scripts know no lease operations: for them a held acquire is an acquire and (for the
/// token bucket) a held refund a refund, as in rein-core. (A cost or refund is sent as at
/// most MAX_MICROS: every capacity is at most that, so a larger refund means the same, and
/// the scripts only accept integers they can hold exactly.)
fn sent_op(op: Op, kind: ScriptKind) -> Op {
    match (op, kind) {
        (Op::Hold(_), ScriptKind::TokenBucket | ScriptKind::FixedWindow) => Op::Acquire,
        (Op::Settle(_), ScriptKind::TokenBucket) => Op::Refund,
        (op, _) => op,
    }
}

/// `SCRIPT LOAD` of each of [`SCRIPTS`], with the SHA-1 the server must answer.
pub(crate) fn load_commands() -> impl Iterator<Item = (Cmd, &'static str)> {
    [
        ScriptKind::Policy,
        ScriptKind::TokenBucket,
        ScriptKind::FixedWindow,
        ScriptKind::SlidingLog,
        ScriptKind::LeaseRate,
        ScriptKind::Admin,
    ]
    .into_iter()
    .map(|kind| {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(kind.source());
        (cmd, kind.sha1())
    })
}

/// Checks the reply of one of [`load_commands`].
pub(crate) fn check_load_reply(value: &Value, sha1: &str) -> Result<(), StoreError> {
    match value {
        Value::BulkString(sha) if sha.as_slice() == sha1.as_bytes() => Ok(()),
        other => Err(StoreError::UnexpectedReply(format!(
            "SCRIPT LOAD answered {other:?}, not the script's SHA-1"
        ))),
    }
}

/// Decodes a decision script's reply: the instant the script decided at, and one decision
/// (or that decision's own error) per ask, in order. `limit` is the policy's capacity, which
/// a lean script does not repeat.
pub(crate) fn decode_decisions(
    value: Value,
    kind: ScriptKind,
    asks: usize,
    limit: u64,
) -> Result<(Timestamp, Vec<Result<Decision, StoreError>>), StoreError> {
    if kind == ScriptKind::Policy {
        let (decision, now) = decode_policy_reply(value)?;
        return Ok((now, vec![Ok(decision)]));
    }
    let Value::Array(items) = value else {
        return Err(StoreError::UnexpectedReply(format!(
            "expected an array of 1 + 4 × {asks} items, got {value:?}"
        )));
    };
    if items.len() != 1 + 4 * asks {
        return Err(StoreError::UnexpectedReply(format!(
            "expected an array of 1 + 4 × {asks} items, got {} items",
            items.len()
        )));
    }
    let mut items = items.into_iter();
    let now = items.next().map_or(Ok(0), figure)?;
    let mut decisions = Vec::with_capacity(asks);
    while let (Some(allowed), Some(remaining), Some(retry_after), Some(reset_after)) =
        (items.next(), items.next(), items.next(), items.next())
    {
        let outcome = match allowed {
            // This decision's own failure (corrupt state, a write refused): its key is as
            // it was, and the other decisions of the call stand. Classified as a whole
            // reply's error would be: a server held by a long script (`BUSY`) is the
            // connection's fault, not the deployment's. (A `READONLY` element never gets
            // here: the store fails the whole call on it, every write of which was refused.)
            Value::ServerError(e) => {
                decisions.push(Err(crate::error::store_error(
                    redis::RedisError::from(e),
                    std::time::Duration::ZERO,
                )));
                continue;
            }
            Value::Int(1) => Outcome::Allowed,
            Value::Int(0) => Outcome::Denied,
            other => {
                return Err(StoreError::UnexpectedReply(format!(
                    "expected an outcome of 0 or 1, got {other:?}"
                )));
            }
        };
        decisions.push(Ok(Decision {
            outcome,
            limit,
            remaining: figure(remaining)?,
            retry_after: Micros::from_micros(figure(retry_after)?),
            reset_after: Micros::from_micros(figure(reset_after)?),
            limit_index: 0,
        }));
    }
    Ok((Timestamp::from_micros(now), decisions))
}

/// One figure of a reply: an integer from 0 to MAX_MICROS.
fn figure(value: Value) -> Result<u64, StoreError> {
    match value {
        Value::Int(i) => u64::try_from(i)
            .ok()
            .filter(|&n| n <= MAX_MICROS)
            .ok_or_else(|| StoreError::UnexpectedReply("a figure out of range".to_owned())),
        other => Err(StoreError::UnexpectedReply(format!(
            "expected an integer, got {other:?}"
        ))),
    }
}

/// Decodes one decision as the policy script answers it, `[allowed, limit, remaining,
/// retry_after, reset_after, now, limit_index]`, or the rate-share script's direct
/// decision, the same without `limit_index`.
fn decode_policy_reply(value: Value) -> Result<(Decision, Timestamp), StoreError> {
    let wrong = |what: &str| StoreError::UnexpectedReply(what.to_owned());
    // The policy script answers 7 figures; the rate-share script's direct decision the
    // first 6 (its limit index is 0).
    let items = match value {
        Value::Array(items) if (6..=7).contains(&items.len()) => items,
        other => {
            return Err(StoreError::UnexpectedReply(format!(
                "expected an array of 6 or 7 integers, got {other:?}"
            )));
        }
    };
    let mut numbers = [0u64; 7];
    for (n, item) in numbers.iter_mut().zip(items) {
        *n = figure(item)?;
    }
    let [
        allowed,
        limit,
        remaining,
        retry_after,
        reset_after,
        now,
        index,
    ] = numbers;
    let outcome = match allowed {
        1 => Outcome::Allowed,
        0 => Outcome::Denied,
        _ => return Err(wrong("an outcome other than 0 or 1")),
    };
    let limit_index = u8::try_from(index)
        .ok()
        .filter(|&i| usize::from(i) < rein_core::policy::MAX_LIMITS)
        .ok_or_else(|| wrong("a limit index beyond the policy"))?;
    let decision = Decision {
        outcome,
        limit,
        remaining,
        retry_after: Micros::from_micros(retry_after),
        reset_after: Micros::from_micros(reset_after),
        limit_index,
    };
    Ok((decision, Timestamp::from_micros(now)))
}

/// The ARGV of `lua/lease_rate.lua` for `op` (see its header).
pub(crate) fn rate_args(
    op: &RateOp,
    now: Option<Timestamp>,
    min_ttl_ms: u64,
    shares: &RateShares,
) -> Vec<String> {
    let (name, numbers): (&str, Vec<u64>) = match *op {
        RateOp::Take(r) => (
            "take",
            vec![
                r.node,
                r.held,
                r.seq,
                r.applied,
                r.demand,
                r.validity.as_micros(),
            ],
        ),
        // A return of more than MAX_MICROS units means the same as MAX_MICROS: a share holds
        // at most `capacity × token_units`, itself at most that.
        RateOp::Return(r) => ("return", vec![r.node, r.id, r.seq, r.units.min(MAX_MICROS)]),
        RateOp::Direct(cost) => ("direct", vec![cost]),
    };
    let mut args = Vec::with_capacity(6 + numbers.len());
    args.push(name.to_owned());
    args.push(now.map_or_else(String::new, |t| t.as_micros().to_string()));
    for n in [
        min_ttl_ms,
        shares.capacity(),
        shares.token_units(),
        shares.part_rate(),
    ]
    .into_iter()
    .chain(numbers)
    {
        args.push(n.to_string());
    }
    args
}

/// Decodes `lua/lease_rate.lua`'s reply to `op`.
pub(crate) fn decode_rate_reply(op: &RateOp, value: Value) -> Result<RateAnswer, StoreError> {
    if let RateOp::Direct(_) = op {
        return decode_policy_reply(value).map(|(decision, _)| RateAnswer::Decided(decision));
    }
    let numbers = integers(value)?;
    match (op, numbers.as_slice()) {
        (RateOp::Return(_), &[applied, _now]) if applied <= 1 => {
            Ok(RateAnswer::Returned(applied == 1))
        }
        (RateOp::Take(_), &[kind, id, continued, burst, parts, moved, _now]) => {
            let taken = match (kind, continued) {
                (0, 0 | 1) => Taken::Granted(Grant {
                    id,
                    continued: continued == 1,
                    burst,
                    parts,
                    moved,
                }),
                (1, _) => Taken::Full,
                (2, _) => Taken::Stale,
                _ => {
                    return Err(StoreError::UnexpectedReply(format!(
                        "a rate share answer of kind {kind}"
                    )));
                }
            };
            Ok(RateAnswer::Taken(taken))
        }
        (_, other) => Err(StoreError::UnexpectedReply(format!(
            "a rate share reply of {} integers",
            other.len()
        ))),
    }
}

/// An array of integers from 0 to MAX_MICROS.
fn integers(value: Value) -> Result<Vec<u64>, StoreError> {
    let Value::Array(items) = value else {
        return Err(StoreError::UnexpectedReply(format!(
            "expected an array of integers, got {value:?}"
        )));
    };
    items
        .iter()
        .map(|item| match item {
            Value::Int(i) => u64::try_from(*i)
                .ok()
                .filter(|&n| n <= MAX_MICROS)
                .ok_or_else(|| StoreError::UnexpectedReply("a figure out of range".into())),
            other => Err(StoreError::UnexpectedReply(format!(
                "expected an integer, got {other:?}"
            ))),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_kinds_index_their_own_scripts() {
        let names = [
            (ScriptKind::Policy, "policy"),
            (ScriptKind::TokenBucket, "token_bucket"),
            (ScriptKind::FixedWindow, "fixed_window"),
            (ScriptKind::SlidingLog, "sliding_log"),
            (ScriptKind::LeaseRate, "lease_rate"),
        ];
        for (kind, name) in names {
            assert_eq!(SCRIPTS[kind as usize].0, name);
            let sha = sha1_smol::Sha1::from(kind.source()).digest().to_string();
            assert_eq!(kind.sha1(), sha);
        }
    }

    #[test]
    fn well_formed_reply_decodes() {
        let reply = Value::Array([0, 10, 3, 250, 900, 1_000, 1].map(Value::Int).to_vec());
        let (decision, now) = decode_policy_reply(reply).unwrap();
        assert_eq!(decision.outcome, Outcome::Denied);
        assert_eq!((decision.limit, decision.remaining), (10, 3));
        assert_eq!(decision.retry_after, Micros::from_micros(250));
        assert_eq!(decision.reset_after, Micros::from_micros(900));
        assert_eq!(now, Timestamp::from_micros(1_000));
    }

    #[test]
    fn a_lean_reply_decodes_each_decision_and_keeps_an_element_error_to_its_own() {
        // As Redis sends it: `now`, then 4 figures per decision, the second decision's
        // state corrupt.
        let reply = redis::parse_redis_value(
            b"*13\r\n:1000\r\n:1\r\n:4\r\n:0\r\n:200\r\n\
              -REIN corrupt token bucket state\r\n:0\r\n:0\r\n:0\r\n\
              :0\r\n:0\r\n:0\r\n:7\r\n",
        )
        .unwrap();
        let (now, decisions) = decode_decisions(reply, ScriptKind::TokenBucket, 3, 5).unwrap();
        assert_eq!(now, Timestamp::from_micros(1_000));
        let allowed = decisions[0].as_ref().unwrap();
        assert_eq!(allowed.outcome, Outcome::Allowed);
        assert_eq!((allowed.limit, allowed.remaining), (5, 4));
        assert_eq!(allowed.reset_after, Micros::from_micros(200));
        assert!(matches!(decisions[1], Err(StoreError::Server(_))));
        let denied = decisions[2].as_ref().unwrap();
        assert_eq!(denied.outcome, Outcome::Denied);
        assert_eq!(denied.reset_after, Micros::from_micros(7));
        // A server held by a long script is the connection's (it may pass later), not the
        // deployment's. (`READONLY` fails the whole call before decoding: store.rs.)
        let busy = b"*5\r\n:1000\r\n-BUSY Redis is busy running a script.\r\n:0\r\n:0\r\n:0\r\n";
        let reply = redis::parse_redis_value(busy).unwrap();
        let (_, decisions) = decode_decisions(reply, ScriptKind::TokenBucket, 1, 5).unwrap();
        assert!(
            matches!(decisions[0], Err(StoreError::Connection(_))),
            "{:?}",
            decisions[0]
        );
        // A reply of another length than the call's decisions is no answer at all.
        let short = Value::Array(vec![Value::Int(1_000), Value::Int(1)]);
        assert!(matches!(
            decode_decisions(short, ScriptKind::FixedWindow, 1, 5),
            Err(StoreError::UnexpectedReply(_))
        ));
        // An outcome that is neither 0, 1 nor an error.
        let odd = Value::Array([1_000, 2, 0, 0, 0].map(Value::Int).to_vec());
        assert!(matches!(
            decode_decisions(odd, ScriptKind::SlidingLog, 1, 5),
            Err(StoreError::UnexpectedReply(_))
        ));
    }

    #[test]
    fn wrong_shapes_are_unexpected_replies() {
        let ints = |v: &[i64]| Value::Array(v.iter().copied().map(Value::Int).collect());
        for reply in [
            Value::Okay,
            Value::Int(1),
            Value::Nil,
            ints(&[1, 2, 3]),
            // Each figure of a well-sized reply checked on its own.
            ints(&[2, 10, 3, 0, 0, 0, 0]),
            ints(&[1, -1, 3, 0, 0, 0, 0]),
            ints(&[1, 1 << 53, 3, 0, 0, 0, 0]),
            ints(&[1, 10, 3, 0, 0, 0, 8]),
            Value::Array(vec![Value::Okay; 7]),
        ] {
            assert!(
                matches!(
                    decode_policy_reply(reply),
                    Err(StoreError::UnexpectedReply(_))
                ),
                "accepted a wrong shape"
            );
        }
    }
}
