//! Key layout: one key per policy and user key,
//! `<prefix>:v3:{<sha1 of the user key>}:<policy>:0:<tag>` for a policy of one limit and
//! `<prefix>:v4:{<sha1 of the user key>}:<policy>:<tag>+<tag>...` for a policy of several.
//!
//! The version names the format of the key's value. `v3`: one limit's state as one string
//! (`GET`, `SET ... PX`), a sliding log's with a header of its total and newest entry.
//! `v4` (issue 22): the states of all a policy's limits in one string, joined by `;` in the
//! policy's order, an empty part for a limit at its empty state (state.rs). Version 3 kept a
//! policy of several limits as one `v3` key per limit (`:<policy>:<index>:<tag>`); a slot
//! migration moves keys one by one, and while they sat on two nodes no node could run the
//! policy's script. One key cannot be split: a migration moves a decision's whole state at
//! once, and a call meets `ASK` or `MOVED`, never `TRYAGAIN`. A single-limit value did not
//! change, so its keys keep their `v3` names and survive the upgrade. Version 2 had no
//! sliding-log header; version 1 (no version in the key) kept hashes and sorted sets.
//!
//! A script never reads a key of another version: a `v3` key is read only as one limit's
//! state, a `v4` key only as a policy's joined states, and an older client's per-limit
//! keys of a multi-limit policy (`v3`, with an index) are names no new client forms. Old
//! and new clients can therefore run side by side during an upgrade, each counting a
//! multi-limit policy in its own keys (docs/redis.md, "Upgrading"). A lone fixed window
//! kept as one integer has the tag `fw<window µs>` (integer_window.rs), so an integer and
//! a string never share a key either.
//!
//! The user key is hashed, never embedded: any byte string of 1 byte to 1 KiB works
//! (binary, braces; `KeyError::check`), every key has the same bounded length, and user input cannot reach the
//! Cluster hash tag. The tag is the hex SHA-1 of the user key alone, so every key of one
//! user key (each of its policies) shares a hash slot. SHA-1 is used as a spreading hash,
//! not for security: a collision would only make two users share a limit.

use rein_core::KeyError;

use crate::{RedisPolicy, SettingsError};

/// The Redis key holding `policy`'s state for `user_key`: always exactly one (a `Vec`
/// because the scripts' callers take a list of keys).
pub(crate) fn state_keys(
    prefix: &str,
    policy: &RedisPolicy,
    user_key: &[u8],
) -> Result<Vec<String>, KeyError> {
    KeyError::check(user_key)?;
    let digest = sha1_smol::Sha1::from(user_key).digest().bytes();
    let (version, suffix) = (policy.key_version(), policy.key_suffix());
    let mut key =
        String::with_capacity(prefix.len() + version.len() + 2 * digest.len() + suffix.len() + 3);
    key.push_str(prefix);
    key.push_str(version);
    key.push_str(":{");
    push_hex(&mut key, &digest);
    key.push('}');
    key.push_str(suffix);
    Ok(vec![key])
}

/// Appends lower-case hex, as `Digest`'s `Display` writes it, without the formatting
/// machinery or a string of its own: this runs on every decision.
fn push_hex(out: &mut String, bytes: &[u8; 20]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for &b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
}

/// Checks a key prefix: 1 to 64 printable ASCII bytes, no spaces or braces.
pub(crate) fn validate_prefix(prefix: &str) -> Result<(), SettingsError> {
    let valid = (1..=MAX_PREFIX_LEN).contains(&prefix.len())
        && prefix
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'{' && b != b'}');
    if valid {
        Ok(())
    } else {
        Err(SettingsError::InvalidPrefix(prefix.to_owned()))
    }
}

/// The longest key prefix: it is repeated in every key.
const MAX_PREFIX_LEN: usize = 64;

#[cfg(test)]
mod tests {
    use rein_core::{Limit, Micros, Policy};

    use super::*;

    fn policy() -> RedisPolicy {
        let limits = [
            Limit::token_bucket(10, 1, Micros::from_secs(1)).unwrap(),
            Limit::sliding_log(5, Micros::from_secs(1)).unwrap(),
        ];
        RedisPolicy::new("api", Policy::new(limits).unwrap()).unwrap()
    }

    #[test]
    fn a_policy_of_several_limits_is_one_v4_key_naming_its_algorithms_in_order() {
        let keys = state_keys("rein", &policy(), b"abc").unwrap();
        // SHA-1("abc") is the FIPS 180 test vector.
        let tag = "a9993e364706816aba3e25717850c26c9cd0d89d";
        assert_eq!(keys, [format!("rein:v4:{{{tag}}}:api:tb+sl")]);
    }

    #[test]
    fn a_policy_of_one_limit_keeps_its_v3_key() {
        let one = Limit::sliding_counter(5, Micros::from_secs(1)).unwrap();
        let single = RedisPolicy::new("api", Policy::single(one)).unwrap();
        let tag = "a9993e364706816aba3e25717850c26c9cd0d89d";
        assert_eq!(
            state_keys("rein", &single, b"abc").unwrap(),
            [format!("rein:v3:{{{tag}}}:api:0:sc")]
        );
    }

    #[test]
    fn user_input_never_reaches_the_hash_tag() {
        let longest = [b'x'; rein_core::limiter::MAX_KEY_BYTES];
        for user_key in [&b"}{evil}"[..], b"\0\xff\n", &longest] {
            for key in state_keys("rein", &policy(), user_key).unwrap() {
                assert_eq!(key.matches('{').count(), 1, "{key}");
                assert!(key.len() < 100, "{key}");
            }
        }
        let over = [b'x'; rein_core::limiter::MAX_KEY_BYTES + 1];
        assert_eq!(
            state_keys("rein", &policy(), &over),
            Err(KeyError::TooLong { len: over.len() })
        );
    }

    #[test]
    fn hex_matches_the_digest_display() {
        let digest = sha1_smol::Sha1::from(&b"\x00\xff rein"[..]).digest();
        let mut hex = String::new();
        push_hex(&mut hex, &digest.bytes());
        assert_eq!(hex, digest.to_string());
    }

    #[test]
    fn empty_user_key_is_rejected() {
        assert_eq!(state_keys("rein", &policy(), b""), Err(KeyError::Empty));
    }

    #[test]
    fn prefixes_with_braces_spaces_or_nothing_are_rejected() {
        for bad in ["", "a{b", "a}", "has space", "é", &"x".repeat(65)] {
            assert!(validate_prefix(bad).is_err(), "{bad:?}");
        }
        for good in ["rein", "app:rl", "x".repeat(64).as_str()] {
            assert!(validate_prefix(good).is_ok(), "{good:?}");
        }
    }
}
