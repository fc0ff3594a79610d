//! A fixed window held as one integer, so that an admission is one `INCRBY`.
//!
//! A policy of one fixed window runs the lean script (`lua/single_fixed_window.lua`). When
//! its numbers allow it, that script keeps the window's state as one integer,
//! `index × modulus + count`, where `index` is the window's start divided by its length.
//! An admission then adds its cost with `INCRBY` (which keeps the key's TTL) and looks at
//! the result: the same window and a count within the limit is the whole decision, one
//! write and no parsing. Anything else (a new window, a denial, a refund) takes the
//! longer path, still exact. The string form `<window_start>:<count>` stays for the
//! generic script and for limits too large for the integer (see [`IntegerWindow::new`]).
//!
//! The modulus depends on the window only, so a limit can be raised or lowered without
//! losing the stored count. The key carries the window (`…:fw<window µs>`, see
//! [`IntegerWindow::tag`]), so a new window length, or a limit that no longer fits,
//! starts from fresh keys instead of misreading an integer.
//!
//! This module is the Rust half (key tag, decoding for `RedisStore::state`, encoding for
//! the optimistic store); the script computes the same modulus from the same rule.

use rein_core::time::MAX_MICROS;
use rein_core::{
    Timestamp,
    fixed_window::{FixedWindow, FixedWindowState},
};

/// Every integer up to this is exact in a Lua number (a double): the script's arithmetic.
const EXACT: u64 = 1 << 53;

/// The integer layout of one fixed window's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IntegerWindow {
    window: u64,
    modulus: u64,
}

impl IntegerWindow {
    /// The layout for `limit`, or `None` if its count does not fit beside its window index.
    ///
    /// The modulus is the largest power of two `m` with `windows × m ≤ 2^53`, where
    /// `windows` counts the window starts up to `MAX_MICROS`: every stored value is then
    /// below 2^53, exact in Lua, and splits into index and count by a division by a power
    /// of two, which is exact too. The count field holds up to `m - 1`; a stored count is at
    /// most `(m - 1) / 2`, so one admission's cost (at most the limit) added to it never
    /// carries into the index. Hence the condition `2 × limit < m`, about
    /// `limit < window in µs ÷ 2`: for a window of a second, limits up to 524 287.
    pub(crate) fn new(limit: &FixedWindow) -> Option<Self> {
        let window = limit.window().as_micros();
        let modulus = modulus(window);
        (limit.limit() < modulus / 2).then_some(Self { window, modulus })
    }

    /// The tag that ends the key: `fw` and the window in µs.
    pub(crate) fn tag(&self) -> String {
        format!("fw{}", self.window)
    }

    /// A stored value, as the script checks it.
    pub(crate) fn decode(&self, value: &str) -> Result<FixedWindowState, String> {
        let digits = !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit());
        let value: u64 = value
            .parse()
            .ok()
            .filter(|_| digits)
            .ok_or_else(|| format!("{value:?}: not a fixed window's integer"))?;
        let (index, count) = (value / self.modulus, value % self.modulus);
        if value >= EXACT || 2 * count >= self.modulus || index > MAX_MICROS / self.window {
            return Err(format!(
                "{value}: out of range for a window of {} µs",
                self.window
            ));
        }
        Ok(FixedWindowState {
            window_start: Timestamp::from_micros(index * self.window),
            count,
        })
    }

    /// A state as the script stores it. rein-core's states are on the window's grid and
    /// count at most a limit, which fits (what [`decode`](Self::decode) returns fits too).
    pub(crate) fn encode(&self, state: &FixedWindowState) -> u64 {
        let start = state.window_start.as_micros();
        debug_assert!(start.is_multiple_of(self.window) && 2 * state.count < self.modulus);
        start / self.window * self.modulus + state.count
    }
}

/// The largest power of two `m` with `windows × m ≤ 2^53`, `windows` the number of window
/// starts from 0 to `MAX_MICROS` (at least 2: a window is at most `MAX_MICROS`).
fn modulus(window: u64) -> u64 {
    let windows = MAX_MICROS / window + 1;
    let ceil_log2 = u64::BITS - (windows - 1).leading_zeros();
    EXACT >> ceil_log2
}

#[cfg(test)]
mod tests {
    use rein_core::Micros;

    use super::*;

    fn layout(limit: u64, window: u64) -> Option<IntegerWindow> {
        IntegerWindow::new(&FixedWindow::new(limit, Micros::from_micros(window)).unwrap())
    }

    #[test]
    fn the_modulus_is_the_largest_power_of_two_that_keeps_every_value_exact() {
        // (window µs, modulus): windows × modulus ≤ 2^53 < windows × 2 × modulus.
        for (window, modulus) in [
            (1_000_000, 1 << 20),
            (60_000_000, 1 << 26),
            (1_000, 1 << 10),
            (2, 4),
            (1, 2),
            (1 << 48, 1 << 49),
            (1 << 47, 1 << 48),
            ((1 << 48) - 1, 1 << 48),
        ] {
            let windows = MAX_MICROS / window + 1;
            assert_eq!(super::modulus(window), modulus, "window {window}");
            assert!(windows * modulus <= EXACT && windows * 2 * modulus > EXACT);
        }
    }

    #[test]
    fn a_limit_fits_below_half_the_modulus() {
        assert!(layout(524_287, 1_000_000).is_some());
        assert_eq!(layout(524_288, 1_000_000), None);
        assert_eq!(layout(1_000_000_000, 60_000_000), None);
        assert!(layout(1, 2).is_some());
        assert_eq!(layout(1, 1), None);
        assert_eq!(layout(100, 1_000_000).unwrap().tag(), "fw1000000");
    }

    #[test]
    fn values_decode_to_the_state_they_encode_and_others_are_refused() {
        let w = layout(100, 1_000_000).unwrap();
        let state = FixedWindowState {
            window_start: Timestamp::from_micros(1_764_000_000_000_000),
            count: 42,
        };
        let value = w.encode(&state);
        assert_eq!(value, 1_764_000_000 * (1 << 20) + 42);
        assert_eq!(w.decode(&value.to_string()), Ok(state));
        assert_eq!(
            w.decode("0"),
            Ok(FixedWindowState {
                window_start: Timestamp::from_micros(0),
                count: 0
            })
        );
        for bad in [
            "",
            "-1",
            "+5",
            "1:2",
            "12a",
            "9007199254740992",
            "524288",
            "18446744073709551616",
        ] {
            assert!(w.decode(bad).is_err(), "{bad:?}");
        }
    }
}
