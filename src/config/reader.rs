//! Typed, path-aware access to the spanned tree: every value read through here knows
//! its field path ("ports[0].addresses[1]") and byte offset, so any complaint about it
//! can say where it is.

use std::ops::RangeInclusive;

use super::tree::{Entry, Node, Value};

/// A validation failure before it is turned into a `ConfigError` (which also needs the
/// file name and the text to turn `at` into a line and column).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Invalid {
    /// Byte offset into the document.
    pub at: usize,
    pub field: String,
    pub message: String,
}

pub(super) type Check<T> = Result<T, Invalid>;

/// A place in the document: enough to report an error there.
#[derive(Debug, Clone)]
pub(super) struct Location {
    pub field: String,
    pub at: usize,
}

impl Location {
    pub fn invalid(&self, message: impl Into<String>) -> Invalid {
        Invalid {
            at: self.at,
            field: self.field.clone(),
            message: message.into(),
        }
    }
}

/// One value together with its field path. It borrows the value from the parsed tree:
/// reading a table or array hands out views, never copies, as a copy at every level
/// would copy a 50,000-server `services` array several times over.
#[derive(Debug, Clone)]
pub(super) struct Field<'a> {
    pub path: String,
    pub node: &'a Node,
}

impl<'a> Field<'a> {
    pub fn location(&self) -> Location {
        Location {
            field: self.path.clone(),
            at: self.node.start(),
        }
    }

    pub fn invalid(&self, message: impl Into<String>) -> Invalid {
        self.location().invalid(message)
    }

    /// The serde-style complaint: "invalid type: string \"x\", expected an integer".
    fn wrong_type(&self, expected: &str) -> Invalid {
        self.invalid(format!(
            "invalid type: {}, expected {expected}",
            self.node.value.describe()
        ))
    }

    pub fn str(&self) -> Check<&'a str> {
        match &self.node.value {
            Value::Str(s) => Ok(s),
            _ => Err(self.wrong_type("a string")),
        }
    }

    pub fn bool(&self) -> Check<bool> {
        match self.node.value {
            Value::Bool(b) => Ok(b),
            _ => Err(self.wrong_type("a boolean")),
        }
    }

    /// An integer within `range`, converted to the field's Rust type (which `range`
    /// must fit in; a mismatch is reported as out of range rather than panicking).
    pub fn int<T: TryFrom<i64>>(&self, range: RangeInclusive<i64>) -> Check<T> {
        let Value::Int(i) = self.node.value else {
            return Err(self.wrong_type("an integer"));
        };
        let out_of_range = || {
            self.invalid(format!(
                "{i} is out of range ({}..={})",
                range.start(),
                range.end()
            ))
        };
        if !range.contains(&i) {
            return Err(out_of_range());
        }
        T::try_from(i).map_err(|_| out_of_range())
    }

    /// The elements of an array, each with its own path (`path[i]`).
    pub fn array(&self) -> Check<Vec<Field<'a>>> {
        let Value::Array(items) = &self.node.value else {
            return Err(self.wrong_type("an array"));
        };
        Ok(items
            .iter()
            .enumerate()
            .map(|(i, node)| Field {
                path: format!("{}[{i}]", self.path),
                node,
            })
            .collect())
    }

    /// An array of strings (e.g. `extra_args`).
    pub fn strings(&self) -> Check<Vec<String>> {
        self.array()?
            .iter()
            .map(|f| f.str().map(str::to_string))
            .collect()
    }

    /// A table whose keys must all be in `allowed`; the first other key is reported,
    /// by name, as unknown (typos must not be silently ignored).
    pub fn table(&self, allowed: &[&str]) -> Check<Table<'a>> {
        let Value::Table(entries) = &self.node.value else {
            return Err(self.wrong_type("a table"));
        };
        let table = Table {
            path: self.path.clone(),
            at: self.node.start(),
            entries,
        };
        table.reject_unknown(allowed)?;
        Ok(table)
    }
}

/// A table being read: keys are taken out by name.
#[derive(Debug)]
pub(super) struct Table<'a> {
    path: String,
    /// Where the table starts (its header), for "missing key" errors.
    at: usize,
    entries: &'a [Entry],
}

impl<'a> Table<'a> {
    /// The document root (which has no header: errors about it point at 1:1).
    pub fn root(node: &'a Node, allowed: &[&str]) -> Check<Table<'a>> {
        Field {
            path: String::new(),
            node,
        }
        .table(allowed)
    }

    pub fn location(&self) -> Location {
        Location {
            field: self.path.clone(),
            at: self.at,
        }
    }

    fn child_path(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    fn reject_unknown(&self, allowed: &[&str]) -> Check<()> {
        match self
            .entries
            .iter()
            .find(|e| !allowed.contains(&e.key.as_str()))
        {
            None => Ok(()),
            Some(e) => Err(Invalid {
                at: e.key_span.start,
                field: self.child_path(&e.key),
                message: format!(
                    "unknown key `{}` (expected one of: {})",
                    e.key,
                    allowed.join(", ")
                ),
            }),
        }
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<Field<'a>> {
        self.entries.iter().find(|e| e.key == key).map(|e| Field {
            path: self.child_path(key),
            node: &e.value,
        })
    }

    /// The value of `key`; its absence is reported at the table's header.
    pub fn require(&self, key: &str) -> Check<Field<'a>> {
        self.get(key).ok_or_else(|| Invalid {
            at: self.at,
            field: self.child_path(key),
            message: format!("missing required key `{key}`"),
        })
    }

    /// "missing key" error for `key`, pointing at this table.
    pub fn missing(&self, key: &str, why: &str) -> Invalid {
        Invalid {
            at: self.at,
            field: self.child_path(key),
            message: format!("missing key `{key}`: {why}"),
        }
    }

    /// A sub-table: present and well-formed, or absent (`None`).
    pub fn table(&self, key: &str, allowed: &[&str]) -> Check<Option<Table<'a>>> {
        self.get(key).map(|f| f.table(allowed)).transpose()
    }

    /// Reads `key` with `read`, or returns `default` when it is absent.
    pub fn or<T>(
        &self,
        key: &str,
        default: T,
        read: impl FnOnce(&Field<'a>) -> Check<T>,
    ) -> Check<T> {
        match self.get(key) {
            Some(f) => read(&f),
            None => Ok(default),
        }
    }

    /// Reads `key` with `read` if it is present.
    pub fn optional<T>(
        &self,
        key: &str,
        read: impl FnOnce(&Field<'a>) -> Check<T>,
    ) -> Check<Option<T>> {
        self.get(key).map(|f| read(&f)).transpose()
    }
}
