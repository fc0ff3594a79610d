//! [`RulesConfig`]: a directory of envoyproxy/ratelimit YAML files, one domain each, read
//! whole and checked before anything is served, with rein's extensions.
//!
//! The format is envoyproxy/ratelimit's, unchanged: a file names a `domain` and a tree of
//! `descriptors` (`key`, optional `value` with a trailing `*` as a prefix wildcard,
//! `rate_limit` with `unit` and `requests_per_unit`, `name`, `replaces`, `unlimited`,
//! `shadow_mode`, `detailed_metric`, `value_to_metric`, `share_threshold`, nested
//! `descriptors`). rein adds, in the same files: `algorithm` (default `fixed_window`, the
//! only one envoyproxy/ratelimit has), `window` (any duration, instead of `unit`), `burst`
//! (a token bucket's capacity), and `rate_limits`, a list of several limits on one
//! descriptor decided all or nothing. docs/server.md documents every field.
//!
//! Every error is a [`RulesError`]: the file, line, column and field path, and what is
//! wrong ([`Problem`]).

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rein_core::{Limit, Micros, NamedPolicy, Policy};
use thiserror::Error;

use crate::yaml::{self, Node, Value};

/// Every domain of a configuration directory, validated.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RulesConfig {
    domains: BTreeMap<String, Domain>,
    warnings: Vec<RulesWarning>,
}

/// Something valid in a rules file that does not do what it seems to (envoyproxy/ratelimit
/// takes such files, so rein-server does too): a wildcard that never matches. The server
/// logs each at load; `check-config` and `rein config check` print them.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("{}:{line}: {field}: {problem}", file.display())]
pub struct RulesWarning {
    /// The file.
    pub file: PathBuf,
    /// 1-based line.
    pub line: usize,
    /// The field's path in the file.
    pub field: String,
    /// What it does instead.
    pub problem: String,
}

/// One file: a domain and its tree of descriptors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Domain {
    pub(crate) name: String,
    pub(crate) file: PathBuf,
    /// Where `domain:`'s value stands in the file (line, column), for an error naming it.
    pub(crate) at: (usize, usize),
    pub(crate) root: Level,
}

/// The descriptors at one depth of the tree, indexed for matching: an exact `key`+`value`
/// first, then the first declared wildcard prefix that matches, then the `key` alone (any value).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Level {
    /// By key, then value: looked up with borrowed text, no allocation per request.
    pub exact: HashMap<String, HashMap<String, Entry>>,
    /// `(key, prefix, entry)`, in the order the file declares them.
    pub wildcard: Vec<(String, String, Entry)>,
    pub any: HashMap<String, Entry>,
}

/// One configured descriptor entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    /// What a request matching down to here gets; `None`: no limit (only nested entries).
    pub rule: Option<Rule>,
    pub children: Level,
    /// A wildcard whose matches share one counter (`share_threshold: true`).
    pub share: bool,
}

/// What a descriptor that matches down to an entry gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// The rule's path as envoyproxy/ratelimit's stats name it: `domain.key_value.key`.
    pub(crate) label: String,
    /// `rate_limit.name`, which `replaces` refers to.
    pub(crate) name: Option<String>,
    /// The names of the rules this one replaces when both match.
    pub(crate) replaces: Vec<String>,
    pub(crate) shadow_mode: bool,
    /// Metrics name the matched value, not only the configured key.
    pub(crate) detailed_metric: bool,
    pub(crate) action: Action,
}

/// What a rule does with a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// `unlimited: true`: always OK, counted, never sent to the store.
    Unlimited,
    /// `requests_per_unit: 0`: always over the limit, never sent to the store.
    DenyAll { unit: Unit },
    /// Decided by the store. `policy`'s name is stable across reloads (it is derived from
    /// the domain and the rule's path), so a reloaded rule keeps its counted state.
    Limit {
        policy: NamedPolicy,
        /// The policy under a readable name, for the `RateLimit*` headers.
        header_policy: NamedPolicy,
        /// Its `RateLimit-Policy` value, rendered once.
        policy_header: String,
        /// Each limit's unit and count, in the policy's order, for Envoy's
        /// `current_limit` (which reports the limit that decided).
        limits: Vec<(Unit, u64)>,
    },
}

/// envoyproxy/ratelimit's units, and rein's any-window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// One of the named units.
    Named(NamedUnit),
    /// A `window` that is no named unit (`30s`): reported to Envoy as `UNKNOWN`.
    Window(Duration),
}

/// The units envoyproxy/ratelimit accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NamedUnit {
    /// 1 s.
    Second,
    /// 60 s.
    Minute,
    /// 3 600 s.
    Hour,
    /// 86 400 s.
    Day,
    /// 7 days.
    Week,
    /// 30 days.
    Month,
    /// 365 days.
    Year,
}

impl NamedUnit {
    /// The unit's length. A month is 30 days and a year 365 (windows are fixed lengths, not
    /// calendar months).
    pub fn duration(self) -> Duration {
        const DAY: u64 = 86_400;
        Duration::from_secs(match self {
            NamedUnit::Second => 1,
            NamedUnit::Minute => 60,
            NamedUnit::Hour => 3_600,
            NamedUnit::Day => DAY,
            NamedUnit::Week => 7 * DAY,
            NamedUnit::Month => 30 * DAY,
            NamedUnit::Year => 365 * DAY,
        })
    }

    fn parse(text: &str) -> Option<Self> {
        Some(match text.to_ascii_lowercase().as_str() {
            "second" => NamedUnit::Second,
            "minute" => NamedUnit::Minute,
            "hour" => NamedUnit::Hour,
            "day" => NamedUnit::Day,
            "week" => NamedUnit::Week,
            "month" => NamedUnit::Month,
            "year" => NamedUnit::Year,
            _ => return None,
        })
    }
}

impl Unit {
    /// The window's length.
    pub fn duration(self) -> Duration {
        match self {
            Unit::Named(unit) => unit.duration(),
            Unit::Window(window) => window,
        }
    }
}

/// Why a configuration could not be loaded: where, and what.
#[derive(Debug, Error)]
#[error("{}:{line}:{column}: {field}: {problem}", file.display())]
pub struct RulesError {
    /// The file (the directory itself for a directory that cannot be read).
    pub file: PathBuf,
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// The field's path in the file, e.g. `descriptors[0].rate_limit.unit`; `(file)` for
    /// the file as a whole.
    pub field: String,
    /// What is wrong.
    pub problem: Problem,
}

/// What is wrong with a configuration, one variant per case a caller may tell apart.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Problem {
    /// The directory or file cannot be read. Check the path and its permissions.
    #[error("cannot read: {0}")]
    Read(std::io::Error),
    /// The file is not valid YAML (or has a duplicate mapping key).
    #[error("invalid YAML: {0}")]
    Syntax(String),
    /// A field this format does not have (a typo, or a field of another version).
    #[error("unknown field; expected one of {expected}")]
    UnknownField {
        /// The fields allowed here.
        expected: &'static str,
    },
    /// A required field is absent.
    #[error("missing: {0}")]
    Missing(&'static str),
    /// A value of the wrong YAML type.
    #[error("expected {expected}, found {found}")]
    WrongType {
        /// What the field takes.
        expected: &'static str,
        /// What the file has.
        found: &'static str,
    },
    /// A value of the right type that is not allowed.
    #[error("{0}")]
    BadValue(String),
    /// Two files name the same domain.
    #[error("domain {domain:?} is also defined in {}", other.display())]
    DuplicateDomain {
        /// The domain.
        domain: String,
        /// The other file.
        other: PathBuf,
    },
    /// Two descriptors at one level have the same key and value.
    #[error("duplicate descriptor {0:?} at this level")]
    DuplicateKey(String),
    /// `unlimited: true` beside a limit's numbers.
    #[error("an unlimited rate_limit takes no {0}")]
    UnlimitedWithLimit(&'static str),
    /// rein-core refuses the limit's numbers (too large to stay exact).
    #[error("{0}")]
    Limit(#[from] rein_core::ConfigError),
}

impl RulesConfig {
    /// Reads every `*.yaml` and `*.yml` file of `dir` (not recursing, skipping dot files),
    /// or the single file `dir` names, and validates them all. The first error stops it.
    pub fn load(dir: impl AsRef<Path>) -> Result<Self, RulesError> {
        let dir = dir.as_ref();
        let files = rule_files(dir)?;
        let mut config = RulesConfig::default();
        for file in files {
            let text = std::fs::read_to_string(&file).map_err(|e| RulesError {
                file: file.clone(),
                line: 1,
                column: 1,
                field: "(file)".into(),
                problem: Problem::Read(e),
            })?;
            config.add(&file, &text)?;
        }
        Ok(config)
    }

    /// Adds one file's domain, read from `text`; `file` names it in errors.
    pub fn add(&mut self, file: &Path, text: &str) -> Result<(), RulesError> {
        let loader = Loader {
            file,
            warnings: RefCell::default(),
        };
        let domain = loader.file(text)?;
        if let Some(other) = self.domains.get(&domain.name) {
            return Err(RulesError {
                file: file.to_owned(),
                line: domain.at.0,
                column: domain.at.1,
                field: "domain".into(),
                problem: Problem::DuplicateDomain {
                    domain: domain.name,
                    other: other.file.clone(),
                },
            });
        }
        self.domains.insert(domain.name.clone(), domain);
        self.warnings.extend(loader.warnings.into_inner());
        Ok(())
    }

    /// What the files say that does not do what it seems to, in the order read.
    pub fn warnings(&self) -> &[RulesWarning] {
        &self.warnings
    }

    /// The domain named `name`.
    pub fn domain(&self, name: &str) -> Option<&Domain> {
        self.domains.get(name)
    }

    /// The domains' names, sorted.
    pub fn domain_names(&self) -> impl Iterator<Item = &str> {
        self.domains.keys().map(String::as_str)
    }

    /// Every policy the rules decide with, each once (by name), for the limiter's table.
    pub fn policies(&self) -> Vec<NamedPolicy> {
        let mut out: BTreeMap<String, NamedPolicy> = BTreeMap::new();
        for domain in self.domains.values() {
            domain.root.visit(&mut |rule| {
                if let Action::Limit { policy, .. } = &rule.action {
                    out.entry(policy.name().to_owned())
                        .or_insert_with(|| policy.clone());
                }
            });
        }
        out.into_values().collect()
    }

    /// Every rule's metrics label (`domain.key_value.key`), each once.
    pub fn rule_labels(&self) -> Vec<String> {
        let mut labels = Vec::new();
        for domain in self.domains.values() {
            domain
                .root
                .visit(&mut |rule| labels.push(rule.label.clone()));
        }
        labels.sort_unstable();
        labels.dedup();
        labels
    }

    /// How many rules all domains hold.
    pub fn rule_count(&self) -> usize {
        let mut count = 0;
        for domain in self.domains.values() {
            domain.root.visit(&mut |_| count += 1);
        }
        count
    }
}

impl Level {
    fn visit(&self, f: &mut impl FnMut(&Rule)) {
        let entries = self
            .exact
            .values()
            .flat_map(HashMap::values)
            .chain(self.wildcard.iter().map(|(_, _, e)| e))
            .chain(self.any.values());
        for entry in entries {
            if let Some(rule) = &entry.rule {
                f(rule);
            }
            entry.children.visit(f);
        }
    }
}

/// The rule files of `dir` (`*.yaml` and `*.yml`, dot files skipped), or `dir` itself if it
/// is a file, sorted by name (so errors and duplicate-domain reports are the same on every
/// run): what [`RulesConfig::load`] reads, and all a watcher needs to look at.
pub fn rule_files(dir: &Path) -> Result<Vec<PathBuf>, RulesError> {
    let unreadable = |e| RulesError {
        file: dir.to_owned(),
        line: 1,
        column: 1,
        field: "(directory)".into(),
        problem: Problem::Read(e),
    };
    if dir.is_file() {
        return Ok(vec![dir.to_owned()]);
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(unreadable)? {
        let path = entry.map_err(unreadable)?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let yaml = path.extension().is_some_and(|e| e == "yaml" || e == "yml");
        if yaml && !name.starts_with('.') && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// Turns one file's tree into a [`Domain`].
struct Loader<'a> {
    file: &'a Path,
    warnings: RefCell<Vec<RulesWarning>>,
}

impl Loader<'_> {
    fn file(&self, text: &str) -> Result<Domain, RulesError> {
        let root = yaml::parse(text).map_err(|(message, line, column)| RulesError {
            file: self.file.to_owned(),
            line,
            column,
            field: "(file)".into(),
            problem: Problem::Syntax(message),
        })?;
        let fields = self.map(&root, "(file)")?;
        let mut domain = None;
        let mut at = (1, 1);
        let mut descriptors = None;
        for (key, value) in fields {
            match key {
                "domain" => {
                    domain = Some(self.string(value, "domain")?);
                    at = (value.line.max(1), value.column.max(1));
                }
                "descriptors" => descriptors = Some(value),
                _ => return Err(self.unknown(value, key, "domain, descriptors")),
            }
        }
        let domain = domain.ok_or_else(|| {
            self.error(
                &root,
                "domain",
                Problem::Missing("the domain these limits are for"),
            )
        })?;
        if domain.is_empty() {
            return Err(self.error(&root, "domain", Problem::BadValue("empty domain".into())));
        }
        let root_level = match descriptors {
            None => Level::default(),
            Some(list) => self.level(list, "descriptors", &domain, &Trail::root(&domain))?,
        };
        Ok(Domain {
            name: domain,
            file: self.file.to_owned(),
            at,
            root: root_level,
        })
    }

    /// One level of descriptors; `trail` is the path above it.
    fn level(
        &self,
        list: &Node,
        path: &str,
        domain: &str,
        trail: &Trail,
    ) -> Result<Level, RulesError> {
        let items = match &list.value {
            Value::Seq(items) => items,
            // `descriptors:` with nothing under it: none, as envoyproxy/ratelimit reads it.
            Value::Null => return Ok(Level::default()),
            _ => return Err(self.wrong(list, path, "a list of descriptors")),
        };
        let mut level = Level::default();
        for (index, item) in items.iter().enumerate() {
            let path = format!("{path}[{index}]");
            let (key, value, entry) = self.descriptor(item, &path, domain, trail)?;
            let duplicate = match &value {
                None => level.any.insert(key.clone(), entry).is_some(),
                Some(value) => match value.strip_suffix('*') {
                    Some(prefix) => {
                        let taken = level
                            .wildcard
                            .iter()
                            .any(|(k, p, _)| *k == key && p == prefix);
                        // Declared after a wildcard that takes every value it would: valid
                        // (envoyproxy/ratelimit takes such files), but never matched.
                        let shadow = level.wildcard.iter().find(|(k, p, _)| {
                            *k == key && p != prefix && prefix.starts_with(p.as_str())
                        });
                        if let Some((_, earlier, _)) = shadow {
                            self.warnings.borrow_mut().push(RulesWarning {
                                file: self.file.to_owned(),
                                line: item.line.max(1),
                                field: path.to_string(),
                                problem: format!(
                                    "`{key}: {prefix}*` never matches: `{earlier}*`, declared \
                                     before it, takes every value it would (the first \
                                     declared wildcard that matches wins: declare the most \
                                     specific first)"
                                ),
                            });
                        }
                        if !taken {
                            level.wildcard.push((key.clone(), prefix.to_owned(), entry));
                        }
                        taken
                    }
                    None => level
                        .exact
                        .entry(key.clone())
                        .or_default()
                        .insert(value.clone(), entry)
                        .is_some(),
                },
            };
            if duplicate {
                let shown = match &value {
                    Some(value) => format!("{key}_{value}"),
                    None => key,
                };
                return Err(self.error(item, &path, Problem::DuplicateKey(shown)));
            }
        }
        // Wildcards stay in the order the file declares them: the first that matches wins,
        // as in envoyproxy/ratelimit (declare the most specific first).
        Ok(level)
    }

    fn descriptor(
        &self,
        node: &Node,
        path: &str,
        domain: &str,
        trail: &Trail,
    ) -> Result<(String, Option<String>, Entry), RulesError> {
        const FIELDS: &str = "key, value, rate_limit, rate_limits, descriptors, shadow_mode, \
                              detailed_metric, value_to_metric, share_threshold";
        let fields = self.map(node, path)?;
        let (mut key, mut value, mut rate_limit, mut rate_limits, mut children) =
            (None, None, None, None, None);
        let (mut shadow, mut detailed, mut share) = (false, false, false);
        for (name, field) in fields {
            let at = format!("{path}.{name}");
            match name {
                "key" => key = Some(self.string(field, &at)?),
                // An empty value (`""`, or none at all) is the key alone, any value
                // matching, as in envoyproxy/ratelimit: what a template renders for it.
                "value" => {
                    value = match field.value {
                        Value::Null => None,
                        _ => Some(self.string(field, &at)?).filter(|v| !v.is_empty()),
                    }
                }
                // `rate_limit:` with nothing under it is no limit, as envoyproxy/ratelimit
                // reads it (its absent pointer), not a limit missing its unit.
                "rate_limit" => {
                    rate_limit = Some(field).filter(|f| !matches!(f.value, Value::Null))
                }
                "rate_limits" => rate_limits = Some(field),
                "descriptors" => children = Some(field),
                "shadow_mode" => shadow = self.boolean(field, &at)?,
                "detailed_metric" => detailed = self.boolean(field, &at)?,
                // Metrics name the value: rein reads it as detailed_metric.
                "value_to_metric" => detailed |= self.boolean(field, &at)?,
                "share_threshold" => share = self.boolean(field, &at)?,
                _ => return Err(self.unknown(field, &at, FIELDS)),
            }
        }
        let key = key.ok_or_else(|| {
            self.error(
                node,
                &format!("{path}.key"),
                Problem::Missing("the entry's key"),
            )
        })?;
        if key.is_empty() {
            return Err(self.error(
                node,
                &format!("{path}.key"),
                Problem::BadValue("empty key".into()),
            ));
        }
        if share && !value.as_deref().is_some_and(|v| v.ends_with('*')) {
            return Err(self.error(
                node,
                &format!("{path}.share_threshold"),
                Problem::BadValue("only a wildcard value (ending in `*`) can share".into()),
            ));
        }
        let trail = trail.child(&key, value.as_deref());
        let rule = match (rate_limit, rate_limits) {
            (Some(_), Some(list)) => {
                return Err(self.error(
                    list,
                    &format!("{path}.rate_limits"),
                    Problem::BadValue("set `rate_limit` or `rate_limits`, not both".into()),
                ));
            }
            (Some(one), None) => Some(self.rule(
                std::slice::from_ref(one),
                &format!("{path}.rate_limit"),
                false,
                &trail,
                shadow,
                detailed,
            )?),
            (None, Some(list)) => {
                let Value::Seq(items) = &list.value else {
                    return Err(self.wrong(list, &format!("{path}.rate_limits"), "a list"));
                };
                if items.is_empty() {
                    return Err(self.error(
                        list,
                        &format!("{path}.rate_limits"),
                        Problem::BadValue("list at least one limit".into()),
                    ));
                }
                Some(self.rule(
                    items,
                    &format!("{path}.rate_limits"),
                    true,
                    &trail,
                    shadow,
                    detailed,
                )?)
            }
            (None, None) => None,
        };
        let children = match children {
            None => Level::default(),
            Some(list) => self.level(list, &format!("{path}.descriptors"), domain, &trail)?,
        };
        Ok((
            key,
            value,
            Entry {
                rule,
                children,
                share,
            },
        ))
    }

    /// A rule from one `rate_limit` (`listed` false) or the items of `rate_limits`.
    #[allow(clippy::too_many_arguments)]
    fn rule(
        &self,
        items: &[Node],
        path: &str,
        listed: bool,
        trail: &Trail,
        shadow_mode: bool,
        detailed_metric: bool,
    ) -> Result<Rule, RulesError> {
        let label = trail.label.as_str();
        let mut limits = Vec::new();
        let mut name = None;
        let mut replaces = Vec::new();
        let mut units: Vec<(Unit, u64)> = Vec::new();
        let mut unlimited = false;
        let mut deny_all = None;
        for (index, item) in items.iter().enumerate() {
            let path = if listed {
                format!("{path}[{index}]")
            } else {
                path.to_owned()
            };
            let parsed = self.limit(item, &path)?;
            if listed {
                // What a list item cannot say, refused rather than dropped: an unlimited
                // item would lift every limit beside it, and a later item's name would
                // name nothing.
                let refused = [
                    (
                        "unlimited",
                        matches!(parsed.shape, Shape::Unlimited),
                        "a limit of `rate_limits` cannot be unlimited: use `rate_limit: { unlimited: true }` for a rule without limits",
                    ),
                    (
                        "name",
                        index > 0 && parsed.name.is_some(),
                        "only the first item of `rate_limits` names the rule",
                    ),
                    (
                        "replaces",
                        index > 0 && !parsed.replaces.is_empty(),
                        "only the first item of `rate_limits` says what the rule replaces",
                    ),
                ];
                if let Some((field, _, why)) = refused.into_iter().find(|(_, bad, _)| *bad) {
                    let node = self.field(item, field).unwrap_or(item);
                    return Err(self.error(
                        node,
                        &format!("{path}.{field}"),
                        Problem::BadValue(why.into()),
                    ));
                }
            }
            if index == 0 {
                name = parsed.name;
                replaces = parsed.replaces;
                if let Some(own) = name.as_deref().filter(|n| replaces.iter().any(|r| r == n)) {
                    let node = self.field(item, "replaces").unwrap_or(item);
                    return Err(self.error(
                        node,
                        &format!("{path}.replaces"),
                        Problem::BadValue(format!(
                            "the rule {own:?} replaces itself, so it would never be evaluated"
                        )),
                    ));
                }
            }
            match parsed.shape {
                Shape::Unlimited => unlimited = true,
                Shape::Counted {
                    unit,
                    requests_per_unit: 0,
                    ..
                } => {
                    deny_all.get_or_insert(unit);
                }
                Shape::Counted {
                    unit,
                    requests_per_unit,
                    algorithm,
                    burst,
                } => {
                    units.push((unit, requests_per_unit));
                    // Clamped at rein's longest span; rein-core refuses a window past it.
                    let window = Micros::from(unit.duration());
                    let limit = match algorithm {
                        Algorithm::FixedWindow => Limit::fixed_window(requests_per_unit, window),
                        Algorithm::SlidingLog => Limit::sliding_log(requests_per_unit, window),
                        Algorithm::SlidingCounter => {
                            Limit::sliding_counter(requests_per_unit, window)
                        }
                        Algorithm::TokenBucket => Limit::token_bucket(
                            burst.unwrap_or(requests_per_unit),
                            requests_per_unit,
                            window,
                        ),
                    }
                    .map_err(|e| self.error(item, &path, Problem::Limit(e)))?;
                    limits.push(limit);
                }
            }
        }
        let action = if unlimited {
            Action::Unlimited
        } else if let Some(unit) = deny_all {
            Action::DenyAll { unit }
        } else {
            let policy =
                Policy::new(limits).map_err(|e| self.error(&items[0], path, Problem::Limit(e)))?;
            let named = |name: String, what: &str| {
                NamedPolicy::new(name, policy.clone()).map_err(|_| {
                    self.error(
                        &items[0],
                        path,
                        Problem::BadValue(format!("cannot name this rule's {what}")),
                    )
                })
            };
            let header_policy =
                named(header_name(name.as_deref().unwrap_or(label)), "header item")?;
            Action::Limit {
                policy: named(policy_name(trail), "policy")?,
                policy_header: rein_tower::headers::render_policy(&header_policy),
                header_policy,
                limits: units,
            }
        };
        Ok(Rule {
            label: label.to_owned(),
            name,
            replaces,
            shadow_mode,
            detailed_metric,
            action,
        })
    }

    /// One limit table. In `rate_limits` the rule's `name` and `replaces` are the first
    /// item's.
    fn limit(&self, node: &Node, path: &str) -> Result<ParsedLimit, RulesError> {
        const FIELDS: &str = "unit, requests_per_unit, name, replaces, unlimited, algorithm, \
                              window, burst";
        let fields = self.map(node, path)?;
        let mut unit = None;
        let mut window = None;
        let mut requests = None;
        let mut name = None;
        let mut replaces = Vec::new();
        let mut unlimited = None;
        let mut algorithm = None;
        let mut burst = None;
        for (field_name, field) in fields {
            let at = format!("{path}.{field_name}");
            match field_name {
                "unit" => {
                    let text = self.string(field, &at)?;
                    unit = Some((
                        NamedUnit::parse(&text).ok_or_else(|| {
                            self.error(
                                field,
                                &at,
                                Problem::BadValue(format!(
                                    "unknown unit {text:?}: second, minute, hour, day, week, \
                                     month or year (or `window: 30s` instead)"
                                )),
                            )
                        })?,
                        field,
                    ));
                }
                "window" => {
                    let text = self.string(field, &at)?;
                    let parsed = humantime::parse_duration(&text).map_err(|e| {
                        self.error(
                            field,
                            &at,
                            Problem::BadValue(format!(
                                "expected a duration such as \"30s\" or \"5m\", got {text:?}: {e}"
                            )),
                        )
                    })?;
                    if parsed.is_zero() {
                        return Err(self.error(
                            field,
                            &at,
                            Problem::BadValue("must be longer than zero".into()),
                        ));
                    }
                    window = Some((parsed, field));
                }
                "requests_per_unit" => requests = Some((self.unsigned(field, &at)?, field)),
                "name" => name = Some(self.string(field, &at)?),
                "replaces" => replaces = self.replaces(field, &at)?,
                "unlimited" => unlimited = Some((self.boolean(field, &at)?, field)),
                "algorithm" => {
                    let text = self.string(field, &at)?;
                    algorithm = Some(Algorithm::parse(&text).ok_or_else(|| {
                        self.error(
                            field,
                            &at,
                            Problem::BadValue(format!(
                                "unknown algorithm {text:?}: fixed_window, sliding_log, \
                                 sliding_counter or token_bucket"
                            )),
                        )
                    })?);
                }
                "burst" => burst = Some((self.unsigned(field, &at)?, field)),
                _ => return Err(self.unknown(field, &at, FIELDS)),
            }
        }
        if let Some((true, _)) = unlimited {
            // envoyproxy/ratelimit refuses a unit beside `unlimited` and ignores a count: the
            // count is ignored here too (with a warning), so that its files load unchanged.
            if let Some((_, node)) = requests {
                self.warnings.borrow_mut().push(RulesWarning {
                    file: self.file.to_owned(),
                    line: node.line.max(1),
                    field: format!("{path}.requests_per_unit"),
                    problem: "ignored: the rate_limit is unlimited".into(),
                });
            }
            for (present, what, at) in [
                (unit.map(|u| u.1), "unit", "unit"),
                (window.map(|w| w.1), "window", "window"),
                (burst.map(|b| b.1), "burst", "burst"),
            ] {
                if let Some(node) = present {
                    return Err(self.error(
                        node,
                        &format!("{path}.{at}"),
                        Problem::UnlimitedWithLimit(what),
                    ));
                }
            }
            return Ok(ParsedLimit {
                name,
                replaces,
                shape: Shape::Unlimited,
            });
        }
        let unit = match (unit, window) {
            (Some((unit, _)), None) => Unit::Named(unit),
            (None, Some((window, _))) => Unit::Window(window),
            (Some(_), Some((_, node))) => {
                return Err(self.error(
                    node,
                    &format!("{path}.window"),
                    Problem::BadValue("set `unit` or `window`, not both".into()),
                ));
            }
            (None, None) => {
                return Err(self.error(
                    node,
                    &format!("{path}.unit"),
                    Problem::Missing("second, minute, hour, day, week, month or year"),
                ));
            }
        };
        let (requests_per_unit, _) = requests.ok_or_else(|| {
            self.error(
                node,
                &format!("{path}.requests_per_unit"),
                Problem::Missing("how many requests each unit admits"),
            )
        })?;
        let algorithm = algorithm.unwrap_or(Algorithm::FixedWindow);
        if let Some((_, at)) = burst
            && algorithm != Algorithm::TokenBucket
        {
            return Err(self.error(
                at,
                &format!("{path}.burst"),
                Problem::BadValue("only a token_bucket has a burst".into()),
            ));
        }
        Ok(ParsedLimit {
            name,
            replaces,
            shape: Shape::Counted {
                unit,
                requests_per_unit,
                algorithm,
                burst: burst.map(|b| b.0),
            },
        })
    }

    fn replaces(&self, node: &Node, path: &str) -> Result<Vec<String>, RulesError> {
        let Value::Seq(items) = &node.value else {
            return Err(self.wrong(node, path, "a list of `- name: ...`"));
        };
        let mut names = Vec::new();
        for (index, item) in items.iter().enumerate() {
            let at = format!("{path}[{index}]");
            for (key, value) in self.map(item, &at)? {
                match key {
                    "name" => {
                        let name = self.string(value, &format!("{at}.name"))?;
                        if name.is_empty() {
                            return Err(self.error(
                                value,
                                &format!("{at}.name"),
                                Problem::BadValue("an empty name replaces nothing".into()),
                            ));
                        }
                        names.push(name);
                    }
                    _ => return Err(self.unknown(value, &format!("{at}.{key}"), "name")),
                }
            }
        }
        Ok(names)
    }

    // Scalars and shapes.

    /// The value of `node`'s field `name`, if `node` is a mapping that has it.
    fn field<'n>(&self, node: &'n Node, name: &str) -> Option<&'n Node> {
        let Value::Map(entries) = &node.value else {
            return None;
        };
        entries
            .iter()
            .find(|(k, _)| matches!(&k.value, Value::Str(key) if key == name))
            .map(|(_, v)| v)
    }

    /// A mapping's entries (an empty value reads as no entries).
    fn map<'n>(&self, node: &'n Node, path: &str) -> Result<Vec<(&'n str, &'n Node)>, RulesError> {
        match &node.value {
            Value::Map(entries) => entries
                .iter()
                .map(|(k, v)| match &k.value {
                    Value::Str(key) => Ok((key.as_str(), v)),
                    _ => Err(self.wrong(k, path, "string keys")),
                })
                .collect(),
            // An empty file, or `rate_limit:` with nothing under it.
            Value::Null => Ok(Vec::new()),
            _ => Err(self.error(
                node,
                path,
                Problem::WrongType {
                    expected: "a mapping",
                    found: node.value.kind(),
                },
            )),
        }
    }

    /// A string field's text. YAML may read `value: 02139`, `key: 404` or `value: true` as a
    /// number or a boolean; like envoyproxy/ratelimit, whose YAML reader decodes a string
    /// field from the scalar's source, the field is the text as written (`02139`, not
    /// `2139`).
    fn string(&self, node: &Node, path: &str) -> Result<String, RulesError> {
        match &node.value {
            Value::Str(s) | Value::Int(_, s) | Value::Bool(_, s) | Value::Float(s) => Ok(s.clone()),
            _ => Err(self.wrong(node, path, "a string")),
        }
    }

    fn boolean(&self, node: &Node, path: &str) -> Result<bool, RulesError> {
        match node.value {
            Value::Bool(b, _) => Ok(b),
            _ => Err(self.wrong(node, path, "true or false")),
        }
    }

    fn unsigned(&self, node: &Node, path: &str) -> Result<u64, RulesError> {
        match node.value {
            Value::Int(i, _) => u64::try_from(i).map_err(|_| {
                self.error(
                    node,
                    path,
                    Problem::BadValue(format!("{i} is not a count (0 or more)")),
                )
            }),
            _ => Err(self.wrong(node, path, "an integer")),
        }
    }

    fn wrong(&self, node: &Node, path: &str, expected: &'static str) -> RulesError {
        self.error(
            node,
            path,
            Problem::WrongType {
                expected,
                found: node.value.kind(),
            },
        )
    }

    fn unknown(&self, node: &Node, path: &str, expected: &'static str) -> RulesError {
        self.error(node, path, Problem::UnknownField { expected })
    }

    fn error(&self, node: &Node, path: &str, problem: Problem) -> RulesError {
        RulesError {
            file: self.file.to_owned(),
            line: node.line.max(1),
            column: node.column.max(1),
            field: path.to_owned(),
            problem,
        }
    }
}

struct ParsedLimit {
    name: Option<String>,
    replaces: Vec<String>,
    shape: Shape,
}

enum Shape {
    Unlimited,
    Counted {
        unit: Unit,
        requests_per_unit: u64,
        algorithm: Algorithm,
        burst: Option<u64>,
    },
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Algorithm {
    FixedWindow,
    SlidingLog,
    SlidingCounter,
    TokenBucket,
}

impl Algorithm {
    fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "fixed_window" => Algorithm::FixedWindow,
            "sliding_log" => Algorithm::SlidingLog,
            "sliding_counter" => Algorithm::SlidingCounter,
            "token_bucket" => Algorithm::TokenBucket,
            _ => return None,
        })
    }
}

/// The store's name for a rule's policy: readable, at most 64 characters, and stable for
/// as long as the rule's place in the tree is (so a reload keeps its counted state). Two
/// rules whose readable parts collide still differ by 64 bits of the hash of their
/// unambiguous paths.
fn policy_name(trail: &Trail) -> String {
    let digest = sha1_smol::Sha1::from(&trail.ident).digest().to_string();
    let readable: String = sanitize(&trail.label).chars().take(MAX_NAME - 17).collect();
    format!("{readable}-{}", &digest[..16])
}

/// Where a rule sits in its domain's tree, twice: its stats label (`domain.key_value.key`,
/// readable, but the same for `key: a_b` and `key: a, value: b`, or for a top-level
/// `key: a.b` and `a` above `b`), and an unambiguous form of the same path (each part
/// with its length), which its policy name hashes: two rules never share a policy.
#[derive(Clone, Debug)]
struct Trail {
    label: String,
    ident: String,
}

impl Trail {
    fn root(domain: &str) -> Self {
        Trail {
            label: domain.to_owned(),
            ident: format!("{}:{domain}", domain.len()),
        }
    }

    /// The trail of `key` (with `value`, if any) one level below.
    fn child(&self, key: &str, value: Option<&str>) -> Self {
        let (label, value) = match value {
            Some(v) => (
                format!("{}.{key}_{v}", self.label),
                format!("{}:{v}", v.len()),
            ),
            None => (format!("{}.{key}", self.label), "-".to_owned()),
        };
        Trail {
            label,
            ident: format!("{}/{}:{key}={value}", self.ident, key.len()),
        }
    }
}

/// A header item name: the rule's `name` or its path, in the characters a policy name may
/// hold.
fn header_name(text: &str) -> String {
    let name: String = sanitize(text).chars().take(MAX_NAME).collect();
    if name.is_empty() { "rule".into() } else { name }
}

fn sanitize(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The longest policy name rein-core accepts.
const MAX_NAME: usize = 64;
