//! Numbers as Redis reads and prints them.
//!
//! A differential test compares replies byte for byte, so "parses as an integer" must mean
//! exactly Redis's `string2ll` (no `+`, no leading zeros, no `-0`), "a valid float" exactly
//! `getDoubleFromObject` over C `strtod`, and a printed score exactly `printf("%.17g")`,
//! which Redis 7.0 uses for scores and for numbers a script passes to `redis.call`.

/// Redis's `string2ll`: a canonical decimal `i64`, or `None`.
pub fn parse_i64(text: &[u8]) -> Option<i64> {
    if text.is_empty() || text.len() > 20 {
        return None;
    }
    if text == b"0" {
        return Some(0);
    }
    let (negative, digits) = match text.split_first() {
        Some((b'-', digits)) => (true, digits),
        _ => (false, text),
    };
    match digits.first() {
        Some(b'1'..=b'9') => {}
        _ => return None,
    }
    let mut magnitude: u64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        magnitude = magnitude
            .checked_mul(10)?
            .checked_add(u64::from(d - b'0'))?;
    }
    if negative {
        // -(i64::MIN) does not fit an i64, so negate through the unsigned magnitude.
        0i64.checked_sub_unsigned(magnitude)
    } else {
        i64::try_from(magnitude).ok()
    }
}

/// `printf("%.17g", value)`, with Redis's spelling of the infinities.
pub fn format_double(value: f64) -> String {
    if value.is_nan() {
        return if value.is_sign_negative() {
            "-nan"
        } else {
            "nan"
        }
        .to_string();
    }
    if value.is_infinite() {
        return if value > 0.0 { "inf" } else { "-inf" }.to_string();
    }
    if value == 0.0 {
        return if value.is_sign_negative() { "-0" } else { "0" }.to_string();
    }
    // %g picks the style from the decimal exponent of the value rounded to 17 significant
    // digits, which is exactly what `{:.16e}` computes.
    let scientific = format!("{value:.16e}");
    let Some((mantissa, exponent)) = scientific.split_once('e') else {
        return scientific;
    };
    let exponent: i32 = exponent.parse().unwrap_or(0);
    if !(-4..SIGNIFICANT_DIGITS).contains(&exponent) {
        let sign = if exponent < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim_fraction(mantissa), exponent.abs())
    } else {
        // In range, the exponent leaves `16 - exponent` digits after the point.
        let decimals = (SIGNIFICANT_DIGITS - 1 - exponent) as usize;
        trim_fraction(&format!("{value:.decimals$}")).to_string()
    }
}

/// %g drops trailing zeros of the fraction, and the point if nothing is left after it.
fn trim_fraction(digits: &str) -> &str {
    if digits.contains('.') {
        digits.trim_end_matches('0').trim_end_matches('.')
    } else {
        digits
    }
}

/// The precision of `%.17g`: enough digits to round-trip any double.
const SIGNIFICANT_DIGITS: i32 = 17;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_parse_only_in_canonical_form() {
        assert_eq!(parse_i64(b"0"), Some(0));
        assert_eq!(parse_i64(b"-12"), Some(-12));
        assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
        for bad in [
            "",
            "+5",
            "05",
            "-0",
            "-",
            "1 ",
            " 1",
            "1.0",
            "9223372036854775808",
            "x",
        ] {
            assert_eq!(parse_i64(bad.as_bytes()), None, "{bad:?}");
        }
    }

    #[test]
    fn doubles_print_like_percent_17g() {
        // Expected strings were printed by redis-server 7.0.15 (ZSCORE, and GET after a
        // script passed the number to redis.call).
        let cases: &[(f64, &str)] = &[
            (1.0, "1"),
            (2.5, "2.5"),
            (0.1, "0.10000000000000001"),
            (1e-5, "1.0000000000000001e-05"),
            (1e20, "1e+20"),
            (123456789012345678.0, "1.2345678901234568e+17"),
            (123456789.123, "123456789.123"),
            (9007199254740992.0, "9007199254740992"),
            (-3.0, "-3"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
            (0.0001, "0.0001"),
            (1e16, "10000000000000000"),
            (1e17, "1e+17"),
        ];
        for &(value, expected) in cases {
            assert_eq!(format_double(value), expected, "{value:e}");
        }
    }
}
