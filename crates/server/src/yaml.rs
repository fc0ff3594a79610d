//! A YAML document as a tree of nodes that each know their line and column, so that every
//! error the loader reports (an unknown field, a wrong type, a bad value) names the file,
//! the line and the field path, whatever stage finds it.
//!
//! Why a tree rather than `#[derive(Deserialize)]` structs: serde's own errors name the
//! position but not the field path, and its `deny_unknown_fields`, `flatten` and untagged
//! enums either lose the span or the path. Walking a spanned tree by hand
//! (`crate::config`) reports both for every error, with rein's own messages.

use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;

/// One YAML value with its position.
#[derive(Debug)]
pub(crate) struct Node {
    pub value: Value,
    /// 1-based line (0 when the parser knows none).
    pub line: usize,
    /// 1-based column.
    pub column: usize,
}

/// A YAML value. Scalars keep the type YAML gave them, and those YAML read as a boolean or
/// a number also keep their text as written (`007`, `1.10`, `0x1F`, `yes`): a field that
/// wants a string takes that text, as a YAML reader decoding into a string field does.
#[derive(Debug)]
pub(crate) enum Value {
    Null,
    Bool(bool, String),
    Int(i128, String),
    /// No field takes a fractional number: only its text is kept.
    Float(String),
    Str(String),
    Seq(Vec<Node>),
    /// Entries in document order; keys are strings (the parser refuses duplicate keys).
    Map(Vec<(Node, Node)>),
}

impl Value {
    /// What the value is, for "expected X, found Y" messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Null => "nothing",
            Value::Bool(..) => "a boolean",
            Value::Int(..) => "an integer",
            Value::Float(_) => "a number",
            Value::Str(_) => "a string",
            Value::Seq(_) => "a list",
            Value::Map(_) => "a mapping",
        }
    }
}

/// Parses `text` into a tree. `Err` carries the parser's message and position.
///
/// The parser's budget against hostile input caps a document at 250 000 nodes and a
/// million events, which refused a rule file of about 20 000 descriptors (per-tenant rules
/// are generated that large; envoyproxy/ratelimit reads them). Both are sized by the text
/// instead, never below those defaults: a node takes a byte of text at least, so this
/// lets through nothing the file does not spell out, and aliases, the one way a small text
/// asks for much, keep their own caps.
pub(crate) fn parse(text: &str) -> Result<Node, (String, usize, usize)> {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_nodes = budget.max_nodes.max(text.len());
    budget.max_events = budget.max_events.max(text.len().saturating_mul(2));
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    match serde_saphyr::from_str_with_options::<Spanned<Raw>>(text, options) {
        Ok(root) => Ok(Node::new(root, text)),
        Err(error) => {
            let (line, column) = error
                .location()
                .map_or((1, 1), |l| (l.line() as usize, l.column() as usize));
            // The message without the source snippet; it ends with its own position, which
            // the loader's error repeats in its own format.
            let message = error.without_snippet().to_string();
            let message = message
                .rsplit_once(" at line ")
                .map_or(message.as_str(), |(head, _)| head)
                .to_owned();
            Err((message, line.max(1), column.max(1)))
        }
    }
}

/// The tree as serde-saphyr builds it: spans on every node.
enum Raw {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Seq(Vec<Spanned<Raw>>),
    Map(Vec<(Spanned<Raw>, Spanned<Raw>)>),
}

impl Node {
    /// The node of `spanned`, parsed from `text`.
    fn new(spanned: Spanned<Raw>, text: &str) -> Self {
        let line = spanned.referenced.line() as usize;
        let column = spanned.referenced.column() as usize;
        // Where the value is defined: an alias (`*z`) takes its anchor's scalar, not `*z`.
        let span = spanned.defined.span();
        // A plain scalar's text as written, from its byte span (the parsed value's own text
        // if the parser gave none).
        let written = |parsed: String| {
            let start = span.byte_offset().and_then(|o| usize::try_from(o).ok());
            let len = span.byte_len().and_then(|l| usize::try_from(l).ok());
            start
                .zip(len)
                .and_then(|(start, len)| text.get(start..start.checked_add(len)?))
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map_or(parsed, str::to_owned)
        };
        let value = match spanned.value {
            Raw::Null => Value::Null,
            Raw::Bool(b) => Value::Bool(b, written(b.to_string())),
            Raw::Int(i) => Value::Int(i, written(i.to_string())),
            Raw::Float(f) => Value::Float(written(f.to_string())),
            Raw::Str(s) => Value::Str(s),
            Raw::Seq(items) => Value::Seq(items.into_iter().map(|n| Node::new(n, text)).collect()),
            Raw::Map(entries) => Value::Map(
                entries
                    .into_iter()
                    .map(|(k, v)| (Node::new(k, text), Node::new(v, text)))
                    .collect(),
            ),
        };
        Node {
            value,
            line,
            column,
        }
    }
}

impl<'de> Deserialize<'de> for Raw {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(RawVisitor)
    }
}

struct RawVisitor;

impl<'de> Visitor<'de> for RawVisitor {
    type Value = Raw;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a YAML value")
    }

    fn visit_unit<E>(self) -> Result<Raw, E> {
        Ok(Raw::Null)
    }

    fn visit_none<E>(self) -> Result<Raw, E> {
        Ok(Raw::Null)
    }

    fn visit_bool<E>(self, v: bool) -> Result<Raw, E> {
        Ok(Raw::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Raw, E> {
        Ok(Raw::Int(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Raw, E> {
        Ok(Raw::Int(v.into()))
    }

    fn visit_i128<E>(self, v: i128) -> Result<Raw, E> {
        Ok(Raw::Int(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Raw, E> {
        Ok(Raw::Float(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Raw, E> {
        Ok(Raw::Str(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Raw, E> {
        Ok(Raw::Str(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Raw, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Raw::Seq(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Raw, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key()? {
            let value = map.next_value()?;
            entries.push((key, value));
        }
        Ok(Raw::Map(entries))
    }
}
