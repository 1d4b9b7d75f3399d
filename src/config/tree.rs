//! A parsed TOML document as a tree whose every key and value remembers where it was
//! written (a byte range into the text).
//!
//! Why not `#[derive(Deserialize)]` on the config structs? Serde's errors carry a span
//! but not the field path ("ports[1].addresses[0]"), and a missing key or a bad value
//! found after deserialization would have no location at all. Reading into this tree
//! first and validating by hand gives every error both a line and a path.
//!
//! `toml::Spanned<T>` cannot be used directly for the nodes: toml has no span for an
//! implicit table (`eal.hugepages = true`, or `[a]` created by a `[a.b]` header) and
//! `Spanned` then fails to deserialize. So the node type speaks the same small protocol
//! `Spanned` speaks (asking for a struct with serde_spanned's reserved names) and
//! also accepts the plain value toml falls back to when it has no span. Those names
//! are the fixed contract between toml 0.8 and serde_spanned 0.6; the test
//! `dotted_keys_and_implicit_tables_parse` notices if an upgrade changes them.

use std::fmt;
use std::ops::Range;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// serde_spanned's reserved struct and field names (see the module comment).
const SPANNED_NAME: &str = "$__serde_spanned_private_Spanned";
const SPANNED_START: &str = "$__serde_spanned_private_start";
const SPANNED_END: &str = "$__serde_spanned_private_end";
const SPANNED_VALUE: &str = "$__serde_spanned_private_value";
const SPANNED_FIELDS: &[&str] = &[SPANNED_START, SPANNED_END, SPANNED_VALUE];
/// toml hands a datetime over as a one-entry map with this key.
const DATETIME_KEY: &str = "$__toml_private_datetime";

/// One TOML value and the bytes it came from.
#[derive(Debug, Clone)]
pub(super) struct Node {
    /// `None` only for implicit tables; `Entry` fills it in from the key.
    pub span: Option<Range<usize>>,
    pub value: Value,
}

#[derive(Debug, Clone)]
pub(super) enum Value {
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
    Datetime(String),
    Array(Vec<Node>),
    Table(Vec<Entry>),
}

/// A key of a table, its position, and its value.
#[derive(Debug, Clone)]
pub(super) struct Entry {
    pub key: String,
    pub key_span: Range<usize>,
    pub value: Node,
}

impl Node {
    /// Byte offset where this value starts (0 when unknown: the document root).
    pub fn start(&self) -> usize {
        self.span.as_ref().map_or(0, |s| s.start)
    }
}

impl Value {
    /// How serde would describe the value in "invalid type: ..., expected ...".
    pub fn describe(&self) -> String {
        match self {
            Value::Str(s) => format!("string {s:?}"),
            Value::Int(i) => format!("integer `{i}`"),
            Value::Float(f) => format!("floating point `{f}`"),
            Value::Bool(b) => format!("boolean `{b}`"),
            Value::Datetime(d) => format!("datetime `{d}`"),
            Value::Array(_) => "array".to_string(),
            Value::Table(_) => "table".to_string(),
        }
    }
}

/// Parses a whole document. Errors are toml's own (syntax, duplicate keys).
pub(super) fn parse(text: &str) -> Result<Node, toml::de::Error> {
    toml::from_str(text)
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Node, D::Error> {
        d.deserialize_struct(SPANNED_NAME, SPANNED_FIELDS, NodeVisitor)
    }
}

/// The value inside a spanned triple. It must be read with `deserialize_any`: asking
/// toml for a spanned struct again would hand back the same triple, forever.
struct Bare(Node);

impl<'de> Deserialize<'de> for Bare {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Bare, D::Error> {
        d.deserialize_any(NodeVisitor).map(Bare)
    }
}

/// A table key; spanned when toml knows its position (it always does for real keys).
struct Key {
    span: Option<Range<usize>>,
    text: String,
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Key, D::Error> {
        d.deserialize_struct(SPANNED_NAME, SPANNED_FIELDS, KeyVisitor)
    }
}

struct KeyVisitor;

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a table key")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
        Ok(Key {
            span: None,
            text: v.to_string(),
        })
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Key, A::Error> {
        let (span, text): (_, String) = read_spanned(&mut map)?;
        Ok(Key {
            span: Some(span),
            text,
        })
    }
}

/// Reads the rest of a spanned triple once the caller has consumed the start key:
/// `start`, `end`, then the value itself.
fn read_spanned_after_start<'de, A, T>(map: &mut A) -> Result<(Range<usize>, T), A::Error>
where
    A: MapAccess<'de>,
    T: Deserialize<'de>,
{
    let start: usize = map.next_value()?;
    expect_key(map, SPANNED_END)?;
    let end: usize = map.next_value()?;
    expect_key(map, SPANNED_VALUE)?;
    let value: T = map.next_value()?;
    Ok((start..end, value))
}

fn read_spanned<'de, A, T>(map: &mut A) -> Result<(Range<usize>, T), A::Error>
where
    A: MapAccess<'de>,
    T: Deserialize<'de>,
{
    expect_key(map, SPANNED_START)?;
    read_spanned_after_start(map)
}

fn expect_key<'de, A: MapAccess<'de>>(map: &mut A, name: &str) -> Result<(), A::Error> {
    match map.next_key::<String>()? {
        Some(k) if k == name => Ok(()),
        other => Err(de::Error::custom(format!(
            "internal: expected span field {name}, got {other:?}"
        ))),
    }
}

struct NodeVisitor;

impl NodeVisitor {
    fn plain<E>(value: Value) -> Result<Node, E> {
        Ok(Node { span: None, value })
    }
}

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any TOML value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Node, E> {
        Self::plain(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Node, E> {
        Self::plain(Value::Int(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Node, E> {
        // TOML integers are i64; toml never produces a larger one.
        i64::try_from(v)
            .map(Value::Int)
            .map_err(|_| E::custom(format!("integer {v} is too large")))
            .and_then(Self::plain)
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Node, E> {
        Self::plain(Value::Float(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Node, E> {
        Self::plain(Value::Str(v.to_string()))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Node>()? {
            items.push(item);
        }
        Self::plain(Value::Array(items))
    }

    /// Either the spanned triple toml sends when it knows the position, or a plain
    /// table (implicit tables, datetimes).
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let Some(first) = map.next_key::<Key>()? else {
            return Self::plain(Value::Table(Vec::new()));
        };
        if first.text == SPANNED_START {
            let (span, Bare(node)) = read_spanned_after_start(&mut map)?;
            return Ok(Node {
                span: Some(span),
                value: node.value,
            });
        }
        if first.text == DATETIME_KEY {
            let text: String = map.next_value()?;
            return Self::plain(Value::Datetime(text));
        }
        read_table(first, &mut map).map(|entries| Node {
            span: None,
            value: Value::Table(entries),
        })
    }
}

/// Reads table entries, the first key already taken.
fn read_table<'de, A: MapAccess<'de>>(first: Key, map: &mut A) -> Result<Vec<Entry>, A::Error> {
    let mut entries = vec![entry(first, map.next_value()?)];
    while let Some(key) = map.next_key::<Key>()? {
        entries.push(entry(key, map.next_value()?));
    }
    Ok(entries)
}

fn entry(key: Key, mut value: Node) -> Entry {
    let key_span = key.span.unwrap_or(0..0);
    // An implicit table has no text of its own: its key is the closest place to point.
    if value.span.is_none() {
        value.span = Some(key_span.clone());
    }
    Entry {
        key: key.text,
        key_span,
        value,
    }
}
