//! Sorted-set commands, following Redis 7.0's `t_zset.c`: all arguments are parsed before the
//! key is looked up, so a bad argument is reported even for a missing key, and scores are
//! printed with `%.17g`.

use bytes::Bytes;

use super::super::number::{format_double, parse_f64, parse_i64, parse_score_bound};
use super::super::sorted_set::{AddFlags, AddOutcome, ScoreRange, SortedSet};
use super::{Context, Reply, is, not_an_integer, syntax_error};

/// `ZADD key [NX|XX] [GT|LT] [CH] [INCR] score member [score member ...]`.
pub fn zadd(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    let mut flags = AddFlags::default();
    let mut changed = false;
    let mut first = 2;
    while let Some(opt) = args.get(first) {
        if is(opt, "nx") {
            flags.nx = true;
        } else if is(opt, "xx") {
            flags.xx = true;
        } else if is(opt, "ch") {
            changed = true;
        } else if is(opt, "incr") {
            flags.incr = true;
        } else if is(opt, "gt") {
            flags.gt = true;
        } else if is(opt, "lt") {
            flags.lt = true;
        } else {
            break;
        }
        first += 1;
    }
    let pairs = &args[first..];
    if pairs.is_empty() || pairs.len() % 2 == 1 {
        return syntax_error();
    }
    if flags.nx && flags.xx {
        return Reply::error("ERR XX and NX options at the same time are not compatible");
    }
    if (flags.nx && (flags.gt || flags.lt)) || (flags.gt && flags.lt) {
        return Reply::error("ERR GT, LT, and/or NX options at the same time are not compatible");
    }
    if flags.incr && pairs.len() > 2 {
        return Reply::error("ERR INCR option supports a single increment-element pair");
    }
    // Every score is checked before anything is written: ZADD is all or nothing.
    let mut scores = Vec::with_capacity(pairs.len() / 2);
    for pair in pairs.chunks_exact(2) {
        match parse_f64(&pair[0]) {
            Some(score) => scores.push(score),
            None => return Reply::error("ERR value is not a valid float"),
        }
    }
    let now_ms = ctx.now_ms();
    let key = &args[1];
    match ctx.keyspace.sorted_set(key, now_ms) {
        Err(wrong) => return wrong.into(),
        Ok(None) if flags.xx => {
            return if flags.incr {
                Reply::Nil
            } else {
                Reply::Integer(0)
            };
        }
        Ok(_) => {}
    }
    let zset = match ctx.keyspace.sorted_set_or_create(key, now_ms) {
        Ok(zset) => zset,
        Err(wrong) => return wrong.into(),
    };
    let (mut added, mut updated, mut last) = (0, 0, None);
    for (pair, score) in pairs.chunks_exact(2).zip(scores) {
        match zset.add(&pair[1], score, flags) {
            AddOutcome::Added(s) => (added, last) = (added + 1, Some(s)),
            AddOutcome::Updated(s) => (updated, last) = (updated + 1, Some(s)),
            AddOutcome::Unchanged(s) => last = s,
            AddOutcome::NotANumber => {
                ctx.keyspace.remove_if_empty(key);
                return Reply::error("ERR resulting score is not a number (NaN)");
            }
        }
    }
    ctx.keyspace.remove_if_empty(key);
    if flags.incr {
        last.map_or(Reply::Nil, |s| Reply::Bulk(Bytes::from(format_double(s))))
    } else {
        Reply::Integer(if changed { added + updated } else { added })
    }
}

pub fn zrem(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    let now_ms = ctx.now_ms();
    let removed = match ctx.keyspace.sorted_set(&args[1], now_ms) {
        Ok(None) => return Reply::Integer(0),
        Ok(Some(zset)) => args[2..]
            .iter()
            .filter(|member| zset.remove(member))
            .count(),
        Err(wrong) => return wrong.into(),
    };
    ctx.keyspace.remove_if_empty(&args[1]);
    Reply::Integer(removed as i64)
}

pub fn zcard(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    let now_ms = ctx.now_ms();
    match ctx.keyspace.sorted_set(&args[1], now_ms) {
        Ok(zset) => Reply::Integer(zset.map_or(0, |z| z.len() as i64)),
        Err(wrong) => wrong.into(),
    }
}

pub fn zscore(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    let now_ms = ctx.now_ms();
    match ctx.keyspace.sorted_set(&args[1], now_ms) {
        Ok(zset) => zset
            .and_then(|z| z.score(&args[2]))
            .map_or(Reply::Nil, |s| Reply::Bulk(Bytes::from(format_double(s)))),
        Err(wrong) => wrong.into(),
    }
}

pub fn zcount(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    let Some(range) = score_range(&args[2], &args[3]) else {
        return min_max_not_float();
    };
    let now_ms = ctx.now_ms();
    match ctx.keyspace.sorted_set(&args[1], now_ms) {
        Ok(zset) => Reply::Integer(zset.map_or(0, |z| z.range_by_score(range).count() as i64)),
        Err(wrong) => wrong.into(),
    }
}

pub fn zrange(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    range_generic(ctx, args, None, None)
}

pub fn zrevrange(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    range_generic(ctx, args, Some(By::Rank), Some(Direction::Reverse))
}

pub fn zrangebyscore(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    range_generic(ctx, args, Some(By::Score), Some(Direction::Forward))
}

pub fn zrevrangebyscore(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    range_generic(ctx, args, Some(By::Score), Some(Direction::Reverse))
}

pub fn zremrangebyscore(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    let Some(range) = score_range(&args[2], &args[3]) else {
        return min_max_not_float();
    };
    remove_members(ctx, &args[1], |zset| {
        zset.range_by_score(range).map(|(m, _)| m.clone()).collect()
    })
}

pub fn zremrangebyrank(ctx: &mut Context<'_>, args: &[Bytes]) -> Reply {
    let (Some(start), Some(stop)) = (parse_i64(&args[2]), parse_i64(&args[3])) else {
        return not_an_integer();
    };
    remove_members(ctx, &args[1], |zset| {
        match rank_window(start, stop, zset.len()) {
            Some((skip, take)) => zset
                .iter()
                .skip(skip)
                .take(take)
                .map(|(m, _)| m.clone())
                .collect(),
            None => Vec::new(),
        }
    })
}

/// Which index a range reads.
#[derive(Clone, Copy, PartialEq, Eq)]
enum By {
    Rank,
    Score,
}

/// Which end a range starts from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Forward,
    Reverse,
}

/// Redis's `zrangeGenericCommand`: `ZRANGE key min max [BYSCORE] [REV] [LIMIT o c]
/// [WITHSCORES]` and its fixed-mode relatives, which pass `by` and `direction` and refuse
/// the options that would set them. `BYLEX` is not supported.
fn range_generic(
    ctx: &mut Context<'_>,
    args: &[Bytes],
    by: Option<By>,
    direction: Option<Direction>,
) -> Reply {
    let (mut by_option, mut direction_option) = (by, direction);
    let (mut with_scores, mut offset, mut limit) = (false, 0i64, -1i64);
    let mut j = 4;
    while j < args.len() {
        let opt = &args[j];
        let left = args.len() - j - 1;
        if is(opt, "withscores") {
            with_scores = true;
        } else if is(opt, "limit") && left >= 2 {
            let (Some(o), Some(c)) = (parse_i64(&args[j + 1]), parse_i64(&args[j + 2])) else {
                return not_an_integer();
            };
            (offset, limit) = (o, c);
            j += 2;
        } else if direction_option.is_none() && is(opt, "rev") {
            direction_option = Some(Direction::Reverse);
        } else if by_option.is_none() && is(opt, "byscore") {
            by_option = Some(By::Score);
        } else if by_option.is_none() && is(opt, "bylex") {
            return Reply::error("ERR BYLEX is not supported by the simulated Redis");
        } else {
            return syntax_error();
        }
        j += 1;
    }
    let by = by_option.unwrap_or(By::Rank);
    let direction = direction_option.unwrap_or(Direction::Forward);
    if limit != -1 && by == By::Rank {
        return Reply::error(
            "ERR syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX",
        );
    }
    // A reversed score range is written max first.
    let (low, high) = match (by, direction) {
        (By::Score, Direction::Reverse) => (&args[3], &args[2]),
        _ => (&args[2], &args[3]),
    };
    let now_ms = ctx.now_ms();
    if by == By::Rank {
        let (Some(start), Some(stop)) = (parse_i64(low), parse_i64(high)) else {
            return not_an_integer();
        };
        let zset = match ctx.keyspace.sorted_set(&args[1], now_ms) {
            Ok(Some(zset)) => zset,
            Ok(None) => return Reply::Array(Vec::new()),
            Err(wrong) => return wrong.into(),
        };
        let Some((skip, take)) = rank_window(start, stop, zset.len()) else {
            return Reply::Array(Vec::new());
        };
        let picked: Vec<_> = match direction {
            Direction::Forward => zset.iter().skip(skip).take(take).collect(),
            Direction::Reverse => zset.iter().rev().skip(skip).take(take).collect(),
        };
        return members_reply(picked, with_scores);
    }
    let Some(range) = score_range(low, high) else {
        return min_max_not_float();
    };
    let zset = match ctx.keyspace.sorted_set(&args[1], now_ms) {
        Ok(Some(zset)) => zset,
        Ok(None) => return Reply::Array(Vec::new()),
        Err(wrong) => return wrong.into(),
    };
    // A negative offset skips everything and a negative count takes everything: Redis's
    // `while (offset--)` / `while (limit--)` loops over signed longs behave that way.
    if offset < 0 || (offset > 0 && offset as usize >= zset.len()) {
        return Reply::Array(Vec::new());
    }
    let take = usize::try_from(limit).unwrap_or(usize::MAX);
    let picked: Vec<_> = match direction {
        Direction::Forward => zset
            .range_by_score(range)
            .skip(offset as usize)
            .take(take)
            .collect(),
        Direction::Reverse => zset
            .range_by_score_rev(range)
            .skip(offset as usize)
            .take(take)
            .collect(),
    };
    members_reply(picked, with_scores)
}

/// Members, each followed by its score when asked.
fn members_reply(picked: Vec<(&Bytes, f64)>, with_scores: bool) -> Reply {
    let mut items = Vec::with_capacity(picked.len() * if with_scores { 2 } else { 1 });
    for (member, score) in picked {
        items.push(Reply::Bulk(member.clone()));
        if with_scores {
            items.push(Reply::Bulk(Bytes::from(format_double(score))));
        }
    }
    Reply::Array(items)
}

/// Redis's rank sanitising: negative indexes count from the end; `None` for an empty window,
/// else how many to skip and how many to take.
fn rank_window(start: i64, stop: i64, len: usize) -> Option<(usize, usize)> {
    let len = len as i64;
    let start = if start < 0 {
        (len + start).max(0)
    } else {
        start
    };
    let stop = if stop < 0 { len + stop } else { stop };
    if start > stop || start >= len {
        return None;
    }
    let stop = stop.min(len - 1);
    Some((start as usize, (stop - start + 1) as usize))
}

fn score_range(min: &[u8], max: &[u8]) -> Option<ScoreRange> {
    let (min, min_exclusive) = parse_score_bound(min)?;
    let (max, max_exclusive) = parse_score_bound(max)?;
    Some(ScoreRange {
        min,
        min_exclusive,
        max,
        max_exclusive,
    })
}

fn min_max_not_float() -> Reply {
    Reply::error("ERR min or max is not a float")
}

/// Removes the members `pick` chooses from the set at `key`; the count removed.
fn remove_members(
    ctx: &mut Context<'_>,
    key: &Bytes,
    pick: impl FnOnce(&SortedSet) -> Vec<Bytes>,
) -> Reply {
    let now_ms = ctx.now_ms();
    let removed = match ctx.keyspace.sorted_set(key, now_ms) {
        Ok(None) => return Reply::Integer(0),
        Ok(Some(zset)) => {
            let doomed = pick(zset);
            doomed.iter().filter(|m| zset.remove(m)).count()
        }
        Err(wrong) => return wrong.into(),
    };
    ctx.keyspace.remove_if_empty(key);
    Reply::Integer(removed as i64)
}

#[cfg(test)]
mod tests {
    use super::super::super::keyspace::Keyspace;
    use super::super::tests::run;
    use super::*;

    fn bulks(items: &[&str]) -> Reply {
        Reply::Array(items.iter().map(Reply::bulk).collect())
    }

    fn seeded() -> Keyspace {
        let mut ks = Keyspace::default();
        run(
            &mut ks,
            0,
            &[
                "ZADD", "z", "1", "a", "2", "b", "2", "c", "3.5", "d", "-inf", "m",
            ],
        );
        ks
    }

    #[test]
    fn zrange_by_index_with_scores_prints_scores_like_redis() {
        let mut ks = seeded();
        assert_eq!(
            run(&mut ks, 0, &["ZRANGE", "z", "0", "-1", "WITHSCORES"]),
            bulks(&["m", "-inf", "a", "1", "b", "2", "c", "2", "d", "3.5"])
        );
        assert_eq!(
            run(&mut ks, 0, &["ZRANGE", "z", "-2", "100", "REV"]),
            bulks(&["a", "m"])
        );
        assert_eq!(run(&mut ks, 0, &["ZRANGE", "z", "3", "1"]), bulks(&[]));
    }

    #[test]
    fn zrangebyscore_bounds_and_limit() {
        let mut ks = seeded();
        assert_eq!(
            run(&mut ks, 0, &["ZRANGEBYSCORE", "z", "(1", "2"]),
            bulks(&["b", "c"])
        );
        assert_eq!(
            run(&mut ks, 0, &["ZRANGEBYSCORE", "z", "-inf", "(2"]),
            bulks(&["m", "a"])
        );
        assert_eq!(
            run(
                &mut ks,
                0,
                &["ZRANGEBYSCORE", "z", "-inf", "+inf", "LIMIT", "1", "2"]
            ),
            bulks(&["a", "b"])
        );
        assert_eq!(
            run(
                &mut ks,
                0,
                &["ZRANGEBYSCORE", "z", "-inf", "+inf", "LIMIT", "-1", "2"]
            ),
            bulks(&[])
        );
        assert_eq!(
            run(
                &mut ks,
                0,
                &["ZRANGEBYSCORE", "z", "2", "+inf", "LIMIT", "1", "-1"]
            ),
            bulks(&["c", "d"])
        );
        assert_eq!(
            run(
                &mut ks,
                0,
                &["ZREVRANGEBYSCORE", "z", "(3.5", "1", "WITHSCORES"]
            ),
            bulks(&["c", "2", "b", "2", "a", "1"])
        );
        assert_eq!(
            run(&mut ks, 0, &["ZRANGEBYSCORE", "z", "x", "1"]),
            min_max_not_float()
        );
        assert_eq!(
            run(&mut ks, 0, &["ZRANGEBYSCORE", "z", "1", "2", "REV"]),
            syntax_error()
        );
        assert!(run(&mut ks, 0, &["ZRANGE", "z", "1", "2", "LIMIT", "0", "1"]).is_error());
    }

    #[test]
    fn removal_by_score_and_rank_deletes_an_emptied_key() {
        let mut ks = seeded();
        assert_eq!(
            run(&mut ks, 0, &["ZREMRANGEBYSCORE", "z", "-inf", "(2"]),
            Reply::Integer(2)
        );
        assert_eq!(
            run(&mut ks, 0, &["ZREMRANGEBYRANK", "z", "0", "0"]),
            Reply::Integer(1)
        );
        assert_eq!(
            run(&mut ks, 0, &["ZRANGE", "z", "0", "-1"]),
            bulks(&["c", "d"])
        );
        assert_eq!(
            run(&mut ks, 0, &["ZREMRANGEBYRANK", "z", "0", "-1"]),
            Reply::Integer(2)
        );
        assert_eq!(run(&mut ks, 0, &["EXISTS", "z"]), Reply::Integer(0));
    }

    #[test]
    fn zadd_options_and_errors() {
        let mut ks = seeded();
        assert_eq!(
            run(
                &mut ks,
                0,
                &["ZADD", "z", "GT", "CH", "0", "a", "5", "b", "1", "n"]
            ),
            Reply::Integer(2)
        );
        assert_eq!(
            run(&mut ks, 0, &["ZADD", "z", "INCR", "1.5", "a"]),
            Reply::bulk("2.5")
        );
        assert_eq!(
            run(&mut ks, 0, &["ZADD", "z", "XX", "INCR", "1", "new"]),
            Reply::Nil
        );
        assert_eq!(
            run(&mut ks, 0, &["ZADD", "z", "nan", "a"]),
            Reply::error("ERR value is not a valid float")
        );
        assert_eq!(
            run(&mut ks, 0, &["ZADD", "z", "1", "a", "2"]),
            syntax_error()
        );
        assert_eq!(
            run(&mut ks, 0, &["ZADD", "q", "XX", "1", "a"]),
            Reply::Integer(0)
        );
        assert_eq!(run(&mut ks, 0, &["EXISTS", "q"]), Reply::Integer(0));
        assert_eq!(run(&mut ks, 0, &["ZSCORE", "z", "b"]), Reply::bulk("5"));
        assert_eq!(run(&mut ks, 0, &["ZSCORE", "z", "zz"]), Reply::Nil);
        assert_eq!(run(&mut ks, 0, &["ZCARD", "z"]), Reply::Integer(6));
        assert_eq!(
            run(&mut ks, 0, &["ZCOUNT", "z", "(1", "+inf"]),
            Reply::Integer(4)
        );
    }
}
