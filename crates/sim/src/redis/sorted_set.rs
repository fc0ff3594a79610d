//! A Redis sorted set: members ordered by `(score, member)`, as Redis orders them.
//!
//! Two indexes over the same pairs: member → score for `ZSCORE` and updates, and an ordered
//! set of `(score, member)` for ranges. Equal scores order by the member's bytes, which is
//! Redis's tie-breaker, so `ZRANGE` replies match a real server exactly.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

use bytes::Bytes;

/// Members and their scores. Scores are never NaN (every write path rejects it).
#[derive(Clone, Debug, Default)]
pub struct SortedSet {
    scores: BTreeMap<Bytes, f64>,
    order: BTreeSet<Ranked>,
}

/// `ZADD`'s flags, as `zsetAdd` receives them.
#[derive(Clone, Copy, Debug, Default)]
pub struct AddFlags {
    /// Only add new members.
    pub nx: bool,
    /// Only update existing members.
    pub xx: bool,
    /// Only update when the new score is greater.
    pub gt: bool,
    /// Only update when the new score is less.
    pub lt: bool,
    /// Add the score to the current one.
    pub incr: bool,
}

/// What one `zsetAdd` did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum AddOutcome {
    /// A new member, with its score.
    Added(f64),
    /// An existing member got a different score.
    Updated(f64),
    /// The member kept its score (equal score, or refused by NX/XX/GT/LT). Carries the
    /// score `ZADD INCR` reports: the new one if the member was processed, else none.
    Unchanged(Option<f64>),
    /// `INCR` produced NaN (`inf + -inf`); nothing changed.
    NotANumber,
}

/// A score interval as `zslParseRange` builds it.
#[derive(Clone, Copy, Debug)]
pub struct ScoreRange {
    /// Lower end.
    pub min: f64,
    /// Whether `min` itself is excluded.
    pub min_exclusive: bool,
    /// Upper end.
    pub max: f64,
    /// Whether `max` itself is excluded.
    pub max_exclusive: bool,
}

impl ScoreRange {
    /// Whether `score` is at or above the lower end.
    pub fn above_min(&self, score: f64) -> bool {
        if self.min_exclusive {
            score > self.min
        } else {
            score >= self.min
        }
    }

    /// Whether `score` is at or below the upper end.
    pub fn below_max(&self, score: f64) -> bool {
        if self.max_exclusive {
            score < self.max
        } else {
            score <= self.max
        }
    }
}

impl SortedSet {
    /// Number of members.
    pub fn len(&self) -> usize {
        self.scores.len()
    }

    /// Whether there are no members (the key must then be deleted).
    pub fn is_empty(&self) -> bool {
        self.scores.is_empty()
    }

    /// The score of `member`.
    pub fn score(&self, member: &[u8]) -> Option<f64> {
        self.scores.get(member).copied()
    }

    /// Redis's `zsetAdd` for one member: `score` is not NaN.
    pub fn add(&mut self, member: &Bytes, score: f64, flags: AddFlags) -> AddOutcome {
        match self.scores.get(member).copied() {
            Some(current) => {
                if flags.nx {
                    return AddOutcome::Unchanged(None);
                }
                let score = if flags.incr { current + score } else { score };
                if score.is_nan() {
                    return AddOutcome::NotANumber;
                }
                if (flags.lt && score >= current) || (flags.gt && score <= current) {
                    return AddOutcome::Unchanged(None);
                }
                if score == current {
                    return AddOutcome::Unchanged(Some(current));
                }
                self.insert(member.clone(), score);
                AddOutcome::Updated(score)
            }
            None if flags.xx => AddOutcome::Unchanged(None),
            None => {
                self.insert(member.clone(), score);
                AddOutcome::Added(score)
            }
        }
    }

    /// Removes `member`; whether it was there.
    pub fn remove(&mut self, member: &[u8]) -> bool {
        match self.scores.remove(member) {
            Some(score) => {
                self.order.remove(&Ranked {
                    score,
                    member: Bytes::copy_from_slice(member),
                });
                true
            }
            None => false,
        }
    }

    /// Members in order, lowest first.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&Bytes, f64)> {
        self.order.iter().map(|r| (&r.member, r.score))
    }

    /// Members with scores in `range`, lowest first.
    pub fn range_by_score(&self, range: ScoreRange) -> impl Iterator<Item = (&Bytes, f64)> {
        // The empty member sorts first among equal scores, so this starts at the first
        // member whose score is `min`.
        let start = Ranked {
            score: range.min,
            member: Bytes::new(),
        };
        self.order
            .range((Bound::Included(start), Bound::Unbounded))
            .skip_while(move |r| !range.above_min(r.score))
            .take_while(move |r| range.below_max(r.score))
            .map(|r| (&r.member, r.score))
    }

    /// Members with scores in `range`, highest first.
    pub fn range_by_score_rev(&self, range: ScoreRange) -> impl Iterator<Item = (&Bytes, f64)> {
        self.order
            .iter()
            .rev()
            .skip_while(move |r| !range.below_max(r.score))
            .take_while(move |r| range.above_min(r.score))
            .map(|r| (&r.member, r.score))
    }

    fn insert(&mut self, member: Bytes, score: f64) {
        // Redis prints a score of -0 as "0": adding +0.0 turns -0.0 into +0.0 and leaves
        // every other value alone.
        let score = score + 0.0;
        if let Some(old) = self.scores.insert(member.clone(), score) {
            self.order.remove(&Ranked {
                score: old,
                member: member.clone(),
            });
        }
        self.order.insert(Ranked { score, member });
    }
}

/// One `(score, member)` pair in range order.
#[derive(Clone, Debug)]
struct Ranked {
    score: f64,
    member: Bytes,
}

impl Ord for Ranked {
    fn cmp(&self, other: &Self) -> Ordering {
        // Scores are never NaN, so `partial_cmp` always answers.
        self.score
            .partial_cmp(&other.score)
            .unwrap_or(Ordering::Equal)
            .then_with(|| self.member.cmp(&other.member))
    }
}

impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Ranked {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Ranked {}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(pairs: &[(&str, f64)]) -> SortedSet {
        let mut z = SortedSet::default();
        for &(member, score) in pairs {
            z.add(
                &Bytes::copy_from_slice(member.as_bytes()),
                score,
                AddFlags::default(),
            );
        }
        z
    }

    fn members<'a>(it: impl Iterator<Item = (&'a Bytes, f64)>) -> Vec<String> {
        it.map(|(m, _)| String::from_utf8_lossy(m).into_owned())
            .collect()
    }

    #[test]
    fn equal_scores_order_by_member_bytes() {
        let z = set(&[("b", 1.0), ("a", 1.0), ("c", 0.5), ("B", 1.0)]);
        assert_eq!(members(z.iter()), ["c", "B", "a", "b"]);
    }

    #[test]
    fn updating_a_score_moves_the_member() {
        let mut z = set(&[("a", 1.0), ("b", 2.0)]);
        let a = Bytes::from_static(b"a");
        assert_eq!(
            z.add(&a, 3.0, AddFlags::default()),
            AddOutcome::Updated(3.0)
        );
        assert_eq!(members(z.iter()), ["b", "a"]);
        assert_eq!(z.len(), 2);
        assert!(z.remove(b"a"));
        assert_eq!(members(z.iter()), ["b"]);
    }

    #[test]
    fn score_ranges_honour_exclusive_bounds() {
        let z = set(&[("a", 1.0), ("b", 2.0), ("c", 2.0), ("d", 3.0)]);
        let range = |min, min_exclusive, max, max_exclusive| ScoreRange {
            min,
            min_exclusive,
            max,
            max_exclusive,
        };
        assert_eq!(
            members(z.range_by_score(range(2.0, false, 3.0, false))),
            ["b", "c", "d"]
        );
        assert_eq!(
            members(z.range_by_score(range(1.0, true, 3.0, true))),
            ["b", "c"]
        );
        assert_eq!(
            members(z.range_by_score(range(2.0, true, 2.0, false))),
            Vec::<String>::new()
        );
        let all = range(f64::NEG_INFINITY, false, f64::INFINITY, false);
        assert_eq!(members(z.range_by_score_rev(all)), ["d", "c", "b", "a"]);
        assert_eq!(
            members(z.range_by_score_rev(range(1.0, true, 3.0, true))),
            ["c", "b"]
        );
    }

    #[test]
    fn flags_gate_updates_like_zset_add() {
        let mut z = set(&[("a", 5.0)]);
        let a = Bytes::from_static(b"a");
        let gt = AddFlags {
            gt: true,
            ..AddFlags::default()
        };
        assert_eq!(z.add(&a, 4.0, gt), AddOutcome::Unchanged(None));
        assert_eq!(z.add(&a, 6.0, gt), AddOutcome::Updated(6.0));
        let nx = AddFlags {
            nx: true,
            ..AddFlags::default()
        };
        assert_eq!(z.add(&a, 1.0, nx), AddOutcome::Unchanged(None));
        let xx = AddFlags {
            xx: true,
            ..AddFlags::default()
        };
        assert_eq!(
            z.add(&Bytes::from_static(b"new"), 1.0, xx),
            AddOutcome::Unchanged(None)
        );
        let incr = AddFlags {
            incr: true,
            ..AddFlags::default()
        };
        assert_eq!(
            z.add(&a, f64::INFINITY, incr),
            AddOutcome::Updated(f64::INFINITY)
        );
        assert_eq!(z.add(&a, f64::NEG_INFINITY, incr), AddOutcome::NotANumber);
    }

    #[test]
    fn negative_zero_is_stored_as_zero() {
        let z = set(&[("a", -0.0)]);
        assert!(z.score(b"a").is_some_and(|s| s.is_sign_positive()));
    }
}
