//! Matching one request descriptor against a domain's tree, as envoyproxy/ratelimit does:
//! entry by entry, one level of the tree per entry, at each level the exact `key`+`value`,
//! then the first declared wildcard prefix that matches, then the `key` alone; the
//! descriptor gets the rule of the entry its last entry matched, if it has one. A
//! descriptor with more entries than the tree has levels, or an entry that matches
//! nothing, gets no rule.
//!
//! Pure: no I/O, no allocation beyond the key it returns; bounded by the descriptor's
//! length, which the service checks first.

use std::borrow::Cow;

use crate::config::{Domain, Entry, Rule};

/// A descriptor's rule and the key its counter lives under.
#[derive(Debug)]
pub struct Matched<'a> {
    /// The rule.
    pub rule: &'a Rule,
    /// The counter's key: each entry's key and value, each preceded by its length (4 bytes,
    /// little-endian), so that no two different descriptors make the same key whatever
    /// bytes they hold. A wildcard that shares (`share_threshold`) puts its pattern in
    /// place of the value, so all its matches count together. A key longer than a limiter
    /// takes ([`MAX_KEY_BYTES`](rein_core::limiter::MAX_KEY_BYTES)) is replaced by its
    /// digest (`bounded`), so a long descriptor is limited like any other.
    pub key: Vec<u8>,
    /// The metrics label: the rule's, or with `detailed_metric` the matched values.
    pub label: Cow<'a, str>,
}

/// The rule of `entries` (`(key, value)` pairs, in order) in `domain`, if any.
pub fn match_descriptor<'a, 'e>(
    domain: &'a Domain,
    entries: impl IntoIterator<Item = (&'e str, &'e str)>,
) -> Option<Matched<'a>> {
    let mut level = &domain.root;
    let mut key = Vec::new();
    let mut matched: Vec<(&'e str, &'e str)> = Vec::new();
    let mut last: Option<&'a Entry> = None;
    for (k, v) in entries {
        if let Some(entry) = last {
            level = &entry.children;
        }
        let exact = level.exact.get(k).and_then(|values| values.get(v));
        let (entry, counted) = if let Some(entry) = exact {
            (entry, None)
        } else if let Some((_, prefix, entry)) = level
            .wildcard
            .iter()
            .find(|(key, prefix, _)| key == k && v.starts_with(prefix.as_str()))
        {
            (entry, entry.share.then(|| format!("{prefix}*")))
        } else {
            (level.any.get(k)?, None)
        };
        push_counted(&mut key, k.as_bytes());
        push_counted(&mut key, counted.as_deref().unwrap_or(v).as_bytes());
        matched.push((k, v));
        last = Some(entry);
    }
    let rule = last?.rule.as_ref()?;
    let label = if rule.detailed_metric {
        let mut detailed = domain.name.clone();
        for (k, v) in matched {
            detailed.push('.');
            detailed.push_str(k);
            detailed.push('_');
            detailed.push_str(v);
        }
        Cow::Owned(detailed)
    } else {
        Cow::Borrowed(rule.label.as_str())
    };
    Some(Matched {
        rule,
        key: bounded(key),
        label,
    })
}

/// `key` if a limiter takes it, else a digest of it: four `0xff` bytes (a length no
/// counted key starts with: no entry is 4 GiB) and the key's SHA-1, 24 bytes. The service
/// bounds an entry's key (1 KiB), not its value (a client's) nor their sum: the limiter
/// bounds the key it counts (1 KiB), so a longer one is hashed here.
pub(crate) fn bounded(key: Vec<u8>) -> Vec<u8> {
    if key.len() <= rein_core::limiter::MAX_KEY_BYTES {
        return key;
    }
    let mut digest = vec![0xff; 4];
    digest.extend_from_slice(&sha1_smol::Sha1::from(&key).digest().bytes());
    digest
}

/// Appends `bytes` after its length. Lengths are bounded by the service's checks (and a
/// `u32` holds any a request can carry).
pub(crate) fn push_counted(key: &mut Vec<u8>, bytes: &[u8]) {
    key.extend_from_slice(&u32::try_from(bytes.len()).unwrap_or(u32::MAX).to_le_bytes());
    key.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::RulesConfig;

    fn config(text: &str) -> RulesConfig {
        let mut config = RulesConfig::default();
        config.add(Path::new("test.yaml"), text).expect("valid");
        config
    }

    fn label(config: &RulesConfig, entries: &[(&str, &str)]) -> Option<String> {
        let domain = config.domain("d").expect("domain d");
        match_descriptor(domain, entries.iter().copied()).map(|m| m.rule.label.clone())
    }

    const TREE: &str = include_str!("../tests/rules/tree.yaml");

    #[test]
    #[rustfmt::skip]
    fn the_most_specific_entry_matches_at_each_level() {
        let config = config(TREE);
        type Row<'a> = (&'a [(&'a str, &'a str)], Option<&'a str>);
        let rows: [Row; 11] = [
            // Key alone: any value.
            (&[("remote_address", "50.0.0.1")], Some("d.remote_address")),
            // Key and value before key alone.
            (&[("remote_address", "50.0.0.5")], Some("d.remote_address_50.0.0.5")),
            // The first declared wildcard that matches, as in envoyproxy/ratelimit: the
            // file declares `/api/v2/*` before `/api/*`, and `/a*` before `/ab*`.
            (&[("path", "/api/v1/users")], Some("d.path_/api/*")),
            (&[("path", "/api/v2/users")], Some("d.path_/api/v2/*")),
            (&[("file", "/abc")], Some("d.file_/a*")),
            // `value: ""` is the key alone: any value.
            (&[("tenant", "acme")], Some("d.tenant")),
            (&[("path", "/web")], None),
            // Nested: both levels must match, and the rule is the last level's.
            (&[("message_type", "marketing"), ("to_number", "2061111111")], Some("d.message_type_marketing.to_number")),
            // A placeholder entry with no rule limits nothing.
            (&[("message_type", "marketing")], None),
            // More entries than levels: no rule (envoyproxy/ratelimit's example 4).
            (&[("remote_address", "1.2.3.4"), ("path", "/x")], None),
            (&[("unknown", "x")], None),
        ];
        for (entries, expected) in rows {
            assert_eq!(label(&config, entries).as_deref(), expected, "{entries:?}");
        }
        // The shadowed wildcard is valid, and said once, where it stands.
        let warnings: Vec<String> = config.warnings().iter().map(|w| w.to_string()).collect();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].starts_with("test.yaml:") && warnings[0].contains("`file: /ab*` never matches"),
            "{warnings:?}"
        );
    }

    #[test]
    fn each_value_counts_alone_unless_a_wildcard_shares() {
        let config = config(TREE);
        let domain = config.domain("d").expect("domain");
        let key = |entries: &[(&str, &str)]| {
            match_descriptor(domain, entries.iter().copied()).map(|m| m.key)
        };
        assert_eq!(
            key(&[("path", "/api/v1/a")]),
            Some(b"\x04\0\0\0path\x09\0\0\0/api/v1/a".to_vec())
        );
        assert_eq!(
            key(&[("path", "/api/v2/a")]),
            key(&[("path", "/api/v2/b")]),
            "share_threshold: one counter"
        );
        // A descriptor longer than a limiter's key is counted under its digest: limited, and
        // apart from every other.
        let long = "v".repeat(1_000);
        let (a, b) = (
            key(&[("remote_address", &long)]),
            key(&[("remote_address", &format!("{long}!"))]),
        );
        assert!(a.as_ref().is_some_and(|k| k.len() <= 1024), "{a:?}");
        assert_ne!(a, b);
        assert_ne!(
            key(&[("remote_address", &"w".repeat(2_000))]),
            key(&[("remote_address", &"w".repeat(2_001))])
        );
        // Lengths, not separators: no value can make two descriptors one counter.
        assert_ne!(
            key(&[("message_type", "marketing"), ("to_number", "1")]),
            key(&[("message_type", "marketing"), ("to_number", "\0\0\0\x01")]),
        );
    }
}
