//! Positions in the config text: byte offsets to line and column, and a best-effort
//! field path for toml's own (syntax) errors, which come with a span but no path.

use std::collections::HashMap;
use std::path::Path;

use super::reader::Invalid;
use super::ConfigError;

/// The text being parsed, for turning byte offsets into positions.
pub(super) struct Source<'a> {
    pub text: &'a str,
    pub path: &'a Path,
    /// Byte offsets where each line after the first starts, found on the first
    /// [`Source::line`]: a config of thousands of services asks for a line per
    /// service, and counting from the top each time would be quadratic.
    line_starts: std::cell::OnceCell<Vec<usize>>,
}

impl<'a> Source<'a> {
    pub fn new(text: &'a str, path: &'a Path) -> Source<'a> {
        Source {
            text,
            path,
            line_starts: std::cell::OnceCell::new(),
        }
    }
}

impl Source<'_> {
    pub fn error(&self, e: Invalid) -> ConfigError {
        let (line, column) = line_column(self.text, e.at);
        ConfigError {
            file: self.path.to_path_buf(),
            line,
            column,
            field: e.field,
            message: e.message,
        }
    }

    /// The 1-based line of byte offset `at`.
    pub fn line(&self, at: usize) -> usize {
        let starts = self.line_starts.get_or_init(|| {
            (self.text.bytes().enumerate())
                .filter(|&(_, b)| b == b'\n')
                .map(|(i, _)| i + 1)
                .collect()
        });
        // Lines starting at or before `at`, plus the first.
        starts.partition_point(|&start| start <= at) + 1
    }

    /// toml's own errors (syntax, duplicate keys) carry a span but no field path;
    /// the path is recovered from the surrounding text.
    pub fn syntax_error(&self, e: &toml::de::Error) -> ConfigError {
        let at = e.span().map_or(0, |s| s.start);
        self.error(Invalid {
            at,
            field: field_at(self.text, at),
            // toml's messages span lines ("invalid array\nexpected `]`"): keep one line.
            message: format!("invalid TOML: {}", one_line(e.message())),
        })
    }
}

fn one_line(message: &str) -> String {
    let lines: Vec<&str> = message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    lines.join(": ")
}

/// 1-based line and column (in characters) of byte offset `at`.
pub(super) fn line_column(text: &str, at: usize) -> (usize, usize) {
    let mut at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    let before = &text[..at];
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let line = before.matches('\n').count() + 1;
    (line, before[line_start..].chars().count() + 1)
}

/// Best-effort field path for a syntax error at byte `at`: the enclosing table
/// (`[eal]`, the n-th `[[ports]]`, `services[1].real_servers[0]`) plus the key on
/// that line, if the line is a `key = value` line. A line inside a multi-line value
/// yields just the table.
fn field_at(text: &str, at: usize) -> String {
    let mut table = String::new();
    // Arrays of tables by resolved path ("services[1].real_servers"): elements so far.
    let mut array_counts: HashMap<String, usize> = HashMap::new();
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim();
        if let Some(name) = header_name(trimmed, "[[") {
            let array = match name.rsplit_once('.') {
                Some((parent, last)) => join_path(&resolve(parent, &array_counts), last.trim()),
                None => name.to_string(),
            };
            let n = array_counts.entry(array.clone()).or_insert(0);
            table = format!("{array}[{n}]");
            *n += 1;
        } else if let Some(name) = header_name(trimmed, "[") {
            table = resolve(name, &array_counts);
        }
        let on_error_line = at < offset + line.len();
        offset += line.len();
        if !on_error_line {
            continue;
        }
        if trimmed.starts_with('[') {
            return table;
        }
        return match trimmed.split_once('=') {
            Some((key, _)) if is_bare_key(key.trim()) => join_path(&table, key.trim()),
            _ => table,
        };
    }
    table
}

/// A dotted table name as a field path: every part that is an array of tables
/// stands for its latest element (`services.real_servers` after two `[[services]]`
/// is `services[1].real_servers`), as in TOML.
fn resolve(name: &str, array_counts: &HashMap<String, usize>) -> String {
    let mut path = String::new();
    for part in name.split('.') {
        path = join_path(&path, part.trim());
        if let Some(n) = array_counts.get(&path) {
            path = format!("{path}[{}]", n.saturating_sub(1));
        }
    }
    path
}

/// The name in a `[name]` or `[[name]]` header line (tolerating a broken closer).
fn header_name<'a>(line: &'a str, open: &str) -> Option<&'a str> {
    let rest = line.strip_prefix(open)?;
    let name = rest.split(']').next().unwrap_or(rest).trim();
    (!name.is_empty() && !name.starts_with('[')).then_some(name)
}

/// A bare or dotted key (`rx_desc`, `eal.hugepages`); a quoted one is not guessed at.
fn is_bare_key(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ' '))
}

fn join_path(table: &str, key: &str) -> String {
    if table.is_empty() {
        key.to_string()
    } else {
        format!("{table}.{key}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_count_characters_not_bytes() {
        let text = "a = 1\nb = \"ßß\" x\n";
        let at = text.find('x').unwrap();
        assert_eq!(line_column(text, at), (2, 10));
        assert_eq!(line_column(text, 0), (1, 1));
        assert_eq!(line_column(text, 10_000), (3, 1));
    }

    #[test]
    fn the_line_of_an_offset_is_the_one_counting_from_the_top_gives() {
        let text = "\na = 1\n\nb = \"ßß\"\n[[x]]\nc = 2";
        let source = Source::new(text, Path::new("t.toml"));
        for at in 0..text.len() + 3 {
            assert_eq!(source.line(at), line_column(text, at).0, "offset {at}");
        }
    }

    #[test]
    fn syntax_field_paths() {
        let text = "top = 1\n[eal]\nx = 1\n[[ports]]\n[[ports]]\nmtu = 1 2\naddresses = [\n  \"a=b\",\n]\n";
        let at = |needle: &str| field_at(text, text.find(needle).unwrap());
        assert_eq!(at("top"), "top");
        assert_eq!(at("x = 1"), "eal.x");
        assert_eq!(at("mtu"), "ports[1].mtu");
        assert_eq!(at("\"a=b\""), "ports[1]");
        assert_eq!(at("[[ports]]\nmtu"), "ports[1]");

        let text = "[[services]]\n[[services.real_servers]]\nip = 1 2\n[[services]]\n\
                    [services.x]\na = 1 2\n[[services.real_servers]]\n[[services.real_servers]]\n\
                    port = 1 2\n";
        let at = |needle: &str| field_at(text, text.find(needle).unwrap());
        assert_eq!(at("ip"), "services[0].real_servers[0].ip");
        assert_eq!(at("a = 1"), "services[1].x.a");
        assert_eq!(at("port"), "services[1].real_servers[1].port");
    }
}
