//! Key layout: `<prefix>:v3:{<sha1 of the user key>}:<policy>:<index>:<tag>`.
//!
//! `v3` is the version of the state format: one string per limit (`GET`, `SET ... PX`), a
//! sliding log's with a header of its total and newest entry. Version 2 had no such header;
//! version 1 (no version in the key) kept hashes and sorted sets. A script never reads a
//! key of another version, so old and new clients can run side by side during an upgrade,
//! each counting in its own keys (docs/redis.md, "Upgrading"). A lone fixed window kept as
//! one integer has the tag `fw<window µs>` (integer_window.rs), so an integer and a string
//! never share a key either.
//!
//! The user key is hashed, never embedded: any byte string works (binary, braces, a
//! megabyte), every key has the same bounded length, and user input cannot reach the
//! Cluster hash tag. The tag is the hex SHA-1 of the user key alone, so all keys of one
//! user key (every limit of every policy) share a hash slot, and the one script call that
//! decides a policy is a single-slot call on Redis Cluster. SHA-1 is used as a spreading
//! hash, not for security: a collision would only make two users share a limit.

use rein_core::KeyError;

use crate::{ConfigError, RedisPolicy};

/// The Redis keys of `policy`'s limits for `user_key`, in the policy's order.
pub(crate) fn state_keys(
    prefix: &str,
    policy: &RedisPolicy,
    user_key: &[u8],
) -> Result<Vec<String>, KeyError> {
    if user_key.is_empty() {
        return Err(KeyError::Empty);
    }
    let digest = sha1_smol::Sha1::from(user_key).digest().bytes();
    Ok(policy
        .key_suffixes()
        .iter()
        .map(|suffix| {
            let mut key = String::with_capacity(
                prefix.len() + KEY_VERSION.len() + 2 * digest.len() + suffix.len() + 4,
            );
            key.push_str(prefix);
            key.push_str(KEY_VERSION);
            key.push_str(":{");
            push_hex(&mut key, &digest);
            key.push('}');
            key.push_str(suffix);
            key
        })
        .collect())
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
pub(crate) fn validate_prefix(prefix: &str) -> Result<(), ConfigError> {
    let valid = (1..=MAX_PREFIX_LEN).contains(&prefix.len())
        && prefix
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'{' && b != b'}');
    if valid {
        Ok(())
    } else {
        Err(ConfigError::InvalidPrefix(prefix.to_owned()))
    }
}

/// The state format's version, between the prefix and the hash tag. Bump it whenever any
/// script stores a state another version would misread.
const KEY_VERSION: &str = ":v3";

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
    fn keys_name_prefix_version_hash_tag_policy_index_and_algorithm() {
        let keys = state_keys("rein", &policy(), b"abc").unwrap();
        // SHA-1("abc") is the FIPS 180 test vector.
        let tag = "a9993e364706816aba3e25717850c26c9cd0d89d";
        assert_eq!(
            keys,
            [
                format!("rein:v3:{{{tag}}}:api:0:tb"),
                format!("rein:v3:{{{tag}}}:api:1:sl")
            ]
        );
    }

    #[test]
    fn user_input_never_reaches_the_hash_tag() {
        for user_key in [&b"}{evil}"[..], b"\0\xff\n", &[b'x'; 1 << 20]] {
            for key in state_keys("rein", &policy(), user_key).unwrap() {
                assert_eq!(key.matches('{').count(), 1, "{key}");
                assert!(key.len() < 100, "{key}");
            }
        }
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
