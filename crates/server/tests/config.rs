//! The rules loader: every field of the format and every error, each error checked for its
//! file, line and field path. Files are small so their line numbers are easy to read.

use std::path::{Path, PathBuf};

use rein_server::{Problem, RulesConfig, RulesError};

fn load(text: &str) -> Result<RulesConfig, RulesError> {
    let mut config = RulesConfig::default();
    config.add(Path::new("rules.yaml"), text)?;
    Ok(config)
}

/// One bad file: the field path and line the error must name, and its kind.
struct Bad {
    what: &'static str,
    yaml: &'static str,
    field: &'static str,
    line: usize,
    kind: &'static str,
}

fn kind(problem: &Problem) -> &'static str {
    match problem {
        Problem::Read(_) => "read",
        Problem::Syntax(_) => "syntax",
        Problem::UnknownField { .. } => "unknown",
        Problem::Missing(_) => "missing",
        Problem::WrongType { .. } => "type",
        Problem::BadValue(_) => "value",
        Problem::DuplicateDomain { .. } => "duplicate domain",
        Problem::DuplicateKey(_) => "duplicate key",
        Problem::UnlimitedWithLimit(_) => "unlimited",
        Problem::Limit(_) => "limit",
        _ => "other",
    }
}

#[test]
#[rustfmt::skip]
fn every_bad_file_is_refused_with_its_file_line_and_field() {
    let rows = [
        Bad { what: "not YAML", yaml: "domain: d\ndescriptors: [\n", field: "(file)", line: 2, kind: "syntax" },
        Bad { what: "a duplicate mapping key", yaml: "domain: d\ndomain: e\n", field: "(file)", line: 2, kind: "syntax" },
        Bad { what: "an empty file", yaml: "", field: "domain", line: 1, kind: "missing" },
        Bad { what: "a list at the top", yaml: "- domain: d\n", field: "(file)", line: 1, kind: "type" },
        Bad { what: "an empty domain", yaml: "domain: ''\n", field: "domain", line: 1, kind: "value" },
        Bad { what: "a domain that is a list", yaml: "domain: [a]\n", field: "domain", line: 1, kind: "type" },
        Bad { what: "an unknown top-level field", yaml: "domain: d\ndescriptor: []\n", field: "descriptor", line: 2, kind: "unknown" },
        Bad { what: "descriptors not a list", yaml: "domain: d\ndescriptors:\n  key: a\n", field: "descriptors", line: 3, kind: "type" },
        Bad { what: "a descriptor without a key", yaml: "domain: d\ndescriptors:\n  - value: a\n", field: "descriptors[0].key", line: 3, kind: "missing" },
        Bad { what: "an empty key", yaml: "domain: d\ndescriptors:\n  - key: ''\n", field: "descriptors[0].key", line: 3, kind: "value" },
        Bad { what: "an unknown descriptor field", yaml: "domain: d\ndescriptors:\n  - key: a\n    rate_limt: {}\n", field: "descriptors[0].rate_limt", line: 4, kind: "unknown" },
        Bad { what: "a duplicate key", yaml: "domain: d\ndescriptors:\n  - key: a\n  - key: a\n", field: "descriptors[1]", line: 4, kind: "duplicate key" },
        Bad { what: "a duplicate key and value", yaml: "domain: d\ndescriptors:\n  - key: a\n    value: v\n  - key: a\n    value: v\n", field: "descriptors[1]", line: 5, kind: "duplicate key" },
        Bad { what: "a duplicate wildcard", yaml: "domain: d\ndescriptors:\n  - key: a\n    value: v*\n  - key: a\n    value: v*\n", field: "descriptors[1]", line: 5, kind: "duplicate key" },
        Bad { what: "shadow_mode not a boolean", yaml: "domain: d\ndescriptors:\n  - key: a\n    shadow_mode: maybe\n", field: "descriptors[0].shadow_mode", line: 4, kind: "type" },
        Bad { what: "share_threshold without a wildcard", yaml: "domain: d\ndescriptors:\n  - key: a\n    value: v\n    share_threshold: true\n", field: "descriptors[0].share_threshold", line: 3, kind: "value" },
        Bad { what: "a nested duplicate", yaml: "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n      - key: b\n", field: "descriptors[0].descriptors[1]", line: 6, kind: "duplicate key" },
        Bad { what: "no unit", yaml: "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      requests_per_unit: 5\n", field: "descriptors[0].rate_limit.unit", line: 5, kind: "missing" },
        Bad { what: "no requests_per_unit", yaml: "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n", field: "descriptors[0].rate_limit.requests_per_unit", line: 5, kind: "missing" },
        Bad { what: "an unknown unit", yaml: "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 5\n", field: "descriptors[0].rate_limit.unit", line: 5, kind: "value" },
        Bad { what: "a negative count", yaml: "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: -5\n", field: "descriptors[0].rate_limit.requests_per_unit", line: 6, kind: "value" },
        Bad { what: "a count that is text", yaml: "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: many\n", field: "descriptors[0].rate_limit.requests_per_unit", line: 6, kind: "type" },
        Bad { what: "an unknown limit field", yaml: "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n      per: 1\n", field: "descriptors[0].rate_limit.per", line: 7, kind: "unknown" },
        Bad { what: "unlimited with a unit", yaml: "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unlimited: true\n      unit: second\n", field: "descriptors[0].rate_limit.unit", line: 6, kind: "unlimited" },
        Bad { what: "replaces not a list", yaml: "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n      replaces: x\n", field: "descriptors[0].rate_limit.replaces", line: 7, kind: "type" },
        Bad { what: "a replaces entry's field", yaml: "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n      replaces:\n        - nam: x\n", field: "descriptors[0].rate_limit.replaces[0].nam", line: 8, kind: "unknown" },
        Bad { what: "a rule that replaces itself", yaml: "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n      name: r\n      replaces:\n        - name: r\n", field: "descriptors[0].rate_limit.replaces", line: 9, kind: "value" },
        Bad { what: "an empty replaces name", yaml: "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n      replaces:\n        - name: ''\n", field: "descriptors[0].rate_limit.replaces[0].name", line: 8, kind: "value" },
        // rein's extensions.
        Bad { what: "an unknown algorithm", yaml: "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n      algorithm: leaky_bucket\n", field: "descriptors[0].rate_limit.algorithm", line: 7, kind: "value" },
        Bad { what: "unit and window", yaml: "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      window: 30s\n      requests_per_unit: 5\n", field: "descriptors[0].rate_limit.window", line: 6, kind: "value" },
        Bad { what: "a window that is no duration", yaml: "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      window: soon\n      requests_per_unit: 5\n", field: "descriptors[0].rate_limit.window", line: 5, kind: "value" },
        Bad { what: "a zero window", yaml: "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      window: 0s\n      requests_per_unit: 5\n", field: "descriptors[0].rate_limit.window", line: 5, kind: "value" },
        Bad { what: "a burst on a window", yaml: "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n      burst: 9\n", field: "descriptors[0].rate_limit.burst", line: 7, kind: "value" },
        Bad { what: "a window too long to stay exact", yaml: "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      window: 100years\n      requests_per_unit: 5\n", field: "descriptors[0].rate_limit", line: 5, kind: "limit" },
        Bad { what: "rate_limit and rate_limits", yaml: "domain: d\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, requests_per_unit: 1 }\n    rate_limits:\n      - { unit: hour, requests_per_unit: 9 }\n", field: "descriptors[0].rate_limits", line: 6, kind: "value" },
        Bad { what: "an empty rate_limits", yaml: "domain: d\ndescriptors:\n  - key: a\n    rate_limits: []\n", field: "descriptors[0].rate_limits", line: 4, kind: "value" },
        Bad { what: "a bad second limit", yaml: "domain: d\ndescriptors:\n  - key: a\n    rate_limits:\n      - { unit: second, requests_per_unit: 1 }\n      - { unit: hour }\n", field: "descriptors[0].rate_limits[1].requests_per_unit", line: 6, kind: "missing" },
        Bad { what: "an unlimited item of rate_limits", yaml: "domain: d\ndescriptors:\n  - key: a\n    rate_limits:\n      - { unit: second, requests_per_unit: 1 }\n      - unlimited: true\n", field: "descriptors[0].rate_limits[1].unlimited", line: 6, kind: "value" },
        Bad { what: "a second item's name", yaml: "domain: d\ndescriptors:\n  - key: a\n    rate_limits:\n      - { unit: second, requests_per_unit: 1 }\n      - { unit: hour, requests_per_unit: 9, name: h }\n", field: "descriptors[0].rate_limits[1].name", line: 6, kind: "value" },
        Bad { what: "nine limits", yaml: "domain: d\ndescriptors:\n  - key: a\n    rate_limits: [{unit: second, requests_per_unit: 1},{unit: second, requests_per_unit: 1},{unit: second, requests_per_unit: 1},{unit: second, requests_per_unit: 1},{unit: second, requests_per_unit: 1},{unit: second, requests_per_unit: 1},{unit: second, requests_per_unit: 1},{unit: second, requests_per_unit: 1},{unit: second, requests_per_unit: 1}]\n", field: "descriptors[0].rate_limits", line: 4, kind: "limit" },
    ];
    for row in rows {
        let error = match load(row.yaml) {
            Ok(_) => panic!("{}: loaded", row.what),
            Err(error) => error,
        };
        assert_eq!(
            (error.field.as_str(), error.line, kind(&error.problem)),
            (row.field, row.line, row.kind),
            "{}: {error}",
            row.what
        );
        assert_eq!(error.file, PathBuf::from("rules.yaml"));
        let shown = error.to_string();
        assert!(
            shown.starts_with(&format!("rules.yaml:{}:", row.line)) && shown.contains(row.field),
            "{}: {shown}",
            row.what
        );
    }
}

#[test]
fn every_field_of_the_format_and_its_extensions_loads() {
    let config = load(
        "
domain: full
descriptors:
  - key: remote_address
    rate_limit:
      name: per_ip
      unit: minute
      requests_per_unit: 60
    detailed_metric: true
  - key: remote_address
    value: 10.0.0.1
    shadow_mode: true
    value_to_metric: true
    rate_limit:
      replaces:
        - name: per_ip
      unit: hour
      requests_per_unit: 1000
  - key: path
    value: /api/*
    share_threshold: true
    rate_limit: { unit: week, requests_per_unit: 7 }
  - key: ldap
    rate_limit: { unlimited: true }
  - key: blocked
    rate_limit: { unit: second, requests_per_unit: 0 }
  - key: nested
    descriptors:
      - key: inner
        rate_limit: { unit: month, requests_per_unit: 3, algorithm: sliding_counter }
  - key: bucket
    rate_limit: { window: 250ms, requests_per_unit: 2, algorithm: token_bucket, burst: 10 }
  - key: both
    rate_limits:
      - { window: 30s, requests_per_unit: 5, algorithm: sliding_log }
      - { unit: year, requests_per_unit: 100000 }
",
    )
    .expect("a valid file");
    assert_eq!(config.domain_names().collect::<Vec<_>>(), ["full"]);
    // Unlimited and always-over rules need no store policy.
    assert_eq!(config.rule_count(), 8);
    assert_eq!(config.policies().len(), 6);
}

/// Fields envoyproxy/ratelimit reads as absent load here too (before, each refused the whole
/// set): `descriptors:` or `rate_limit:` with nothing under it (its YAML reader decodes
/// them as an empty list and no limit), and a count beside `unlimited: true` (which it
/// ignores; here with a warning naming the line).
#[test]
fn fields_envoyproxy_ratelimit_reads_as_absent_load() {
    let empty_domain = load("domain: overrides_only\ndescriptors:\n").expect("loads");
    assert_eq!(empty_domain.rule_count(), 0);
    let config = load(
        "
domain: d
descriptors:
  - key: parent
    descriptors:
  - key: no_limit_yet
    rate_limit:
  - key: ldap
    rate_limit:
      unlimited: true
      requests_per_unit: 10
",
    )
    .expect("loads");
    assert_eq!(config.rule_count(), 1, "only the unlimited rule");
    let warnings: Vec<String> = config.warnings().iter().map(|w| w.to_string()).collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains(":11: descriptors[2].rate_limit.requests_per_unit: ignored"),
        "{warnings:?}"
    );
}

/// A generated rule file of 20 000 descriptors, 260 000 YAML nodes, loads (before, the
/// YAML parser's default budget of 250 000 nodes refused it as invalid YAML).
#[test]
fn a_generated_file_of_twenty_thousand_rules_loads() {
    let mut text = String::from("domain: tenants\ndescriptors:\n");
    for tenant in 0..20_000 {
        let count = tenant % 7 + 1;
        text.push_str(&format!(
            "  - {{ key: tenant, value: t{tenant}, shadow_mode: false, \
             rate_limit: {{ unit: second, requests_per_unit: {count} }} }}\n"
        ));
    }
    let config = load(&text).expect("loads");
    assert_eq!(config.rule_count(), 20_000);
}

#[test]
fn a_domain_defined_twice_names_both_files() {
    let dir = std::env::temp_dir().join(format!("rein-server-dup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(dir.join("a.yaml"), "domain: d\n").expect("write");
    // At `domain:`'s line and column (before, always 1:1).
    std::fs::write(dir.join("b.yml"), "# shop limits\n\ndomain: d\n").expect("write");
    std::fs::write(dir.join(".hidden.yaml"), "not: [valid").expect("write");
    std::fs::write(dir.join("notes.txt"), "not yaml: [").expect("write");
    let error = RulesConfig::load(&dir).expect_err("a duplicate domain");
    assert_eq!(error.file, dir.join("b.yml"));
    assert_eq!((error.line, error.column), (3, 9), "{error}");
    assert!(
        matches!(&error.problem, Problem::DuplicateDomain { domain, other } if domain == "d" && *other == dir.join("a.yaml")),
        "{error}"
    );
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn the_shipped_example_is_valid() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/config");
    let config = RulesConfig::load(&dir).expect("examples/config is valid");
    assert_eq!(config.domain_names().collect::<Vec<_>>(), ["example"]);
}

/// A value YAML reads as a number or a boolean is matched as written, as envoyproxy/ratelimit
/// matches it (its YAML reader decodes a string field from the scalar's source): a zip code
/// keeps its leading zero, a version its trailing one, a hex number its form. Before, the
/// number's own text was matched (`2139`, `1.1`, `31`), and a descriptor Envoy sends with
/// the header's text matched no rule.
#[test]
fn values_yaml_reads_as_numbers_match_as_written() {
    use rein_server::matcher::match_descriptor;
    let config = load(
        "
domain: d
descriptors:
  - key: zip
    value: &boston 02139
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: office
    value: *boston
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: version
    value: 1.10
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: code
    value: 0x1F   # a comment after it
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: flag
    value: true
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: 503
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: status
    descriptors: [{ key: code, value: 0404, rate_limit: { unit: hour, requests_per_unit: 1 } }]
",
    )
    .expect("valid");
    let domain = config.domain("d").expect("domain");
    let matches =
        |entries: &[(&str, &str)]| match_descriptor(domain, entries.iter().copied()).is_some();
    for (key, written, parsed) in [
        ("zip", "02139", "2139"),
        ("version", "1.10", "1.1"),
        ("code", "0x1F", "31"),
    ] {
        assert!(matches(&[(key, written)]), "{key}: {written}");
        assert!(!matches(&[(key, parsed)]), "{key}: {parsed}");
    }
    assert!(matches(&[("flag", "true")]));
    assert!(
        matches(&[("office", "02139")]),
        "an alias takes its anchor's text"
    );
    assert!(matches(&[("503", "any")]), "a key YAML reads as a number");
    assert!(
        matches(&[("status", "s"), ("code", "0404")]),
        "in a flow mapping"
    );
}
