//! Which parts of `input` a policy set can read, from its source: the ground
//! the decision cache stands on. Two inputs that agree at every path found
//! here get the same decision from the same modules and data.
//!
//! Sound by over-approximation. Every read of `input` in Rego is a reference
//! that starts with the word `input` (an `import input.x as y` alias starts
//! with it too); the constant prefix of that reference (`.name`, `["key"]`)
//! covers everything the rest of it can reach, whatever the variables in it
//! take. A reference with no constant prefix (`input`, `input[x]`, `walk(input)`,
//! a function given the whole input) would cover the whole input, so the set
//! is refused rather than cached on everything. `object.get(input.p, "k", d)`
//! and `object.get(input.p, ["k1", "k2"], d)` read exactly `p.k` / `p.k1.k2`.
//! Builtins whose answer is not a function of their arguments (time, random,
//! network, printing, signing with a random nonce) refuse the set too, and so
//! does replacing a function with `with` (`... with object.get as f`,
//! `with g as http.send`, `with data.lib.f as ...`): the call it replaces
//! would no longer read what its name says. Replacing `input` or data with
//! `with` is followed like any other reference.
//!
//! A tokenizer, not a parser: comments and strings are read as what they are,
//! so `"input"` in a string or `# input` in a comment is no read; a template
//! string (`$"..."`, which can hold expressions) refuses the set.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::input::InputRoot;
use crate::rego_value::to_rego;

/// The input paths a policy set reads (none a prefix of another).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InputReads {
    paths: Vec<Vec<String>>,
}

/// Why a policy set's decisions cannot be cached.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{module}:{line}: {reason}")]
pub(crate) struct Uncacheable {
    pub(crate) module: String,
    pub(crate) line: usize,
    pub(crate) reason: String,
}

/// Builtins whose result is not a function of their arguments, or that act.
const IMPURE_CALLS: &[&str] = &[
    "time.now_ns",
    "rand.intn",
    "uuid.rfc4122",
    "http.send",
    "net.lookup_ip_addr",
    "opa.runtime",
    "io.jwt.decode_verify",
    "io.jwt.encode_sign",
    "io.jwt.encode_sign_raw",
    "crypto.x509.parse_and_verify_certificates",
    "crypto.x509.parse_and_verify_certificates_with_options",
    "print",
    "trace",
];

/// A key longer than this is not cached: the review is evaluated instead.
pub(crate) const MAX_KEY_BYTES: usize = 64 * 1024;

impl InputReads {
    /// The paths `modules` (id -> source) read, or why they cannot be pinned.
    pub(crate) fn of(modules: &BTreeMap<String, String>) -> Result<Self, Uncacheable> {
        let mut tokenized = Vec::with_capacity(modules.len());
        for (id, source) in modules {
            let tokens = tokenize(source).map_err(|(line, reason)| Uncacheable {
                module: id.clone(),
                line,
                reason,
            })?;
            tokenized.push((id, tokens));
        }
        // `object.get` is the builtin only when no module redefines `object`.
        let object_is_builtin = !tokenized.iter().any(|(_, t)| names_object(t));
        let functions: BTreeSet<String> = tokenized
            .iter()
            .flat_map(|(_, t)| functions_defined(t))
            .collect();
        let context = Context {
            object_is_builtin,
            functions,
        };
        let mut paths = BTreeSet::new();
        for (id, tokens) in &tokenized {
            scan(tokens, &context, &mut paths).map_err(|(line, reason)| Uncacheable {
                module: (*id).clone(),
                line,
                reason,
            })?;
        }
        // Sorted, a path's prefixes come before it.
        let mut kept: Vec<Vec<String>> = Vec::new();
        for path in paths {
            if !kept.iter().any(|k| path.starts_with(k)) {
                kept.push(path);
            }
        }
        Ok(InputReads { paths: kept })
    }

    /// The cache key of `input` under these reads: the value at each path, or
    /// where and how the path ends before it. `None` when it would exceed
    /// [`MAX_KEY_BYTES`].
    pub(crate) fn key(&self, query: &str, input: InputRoot<'_>) -> Option<Vec<u8>> {
        let mut key = Vec::with_capacity(128);
        key.extend_from_slice(query.as_bytes());
        for path in &self.paths {
            key.push(0);
            // The depth reached says which prefix the value belongs to; an
            // object that lacks the next key is marked absent (its other keys
            // are not read), anything else is written whole.
            let (depth, reached) = reach(input, path);
            key.extend_from_slice(&(depth as u32).to_le_bytes());
            match reached {
                None => key.push(b'-'),
                Some(node) => {
                    key.push(b'=');
                    serde_json::to_writer(&mut key, node).ok()?;
                }
            }
            if key.len() > MAX_KEY_BYTES {
                return None;
            }
        }
        Some(key)
    }

    /// The part of `input` these reads can reach, as the engine's value:
    /// along each path an object keeps only the keys on a path; where a path
    /// ends, or meets anything but an object, the value is taken whole. So an
    /// input and its projection agree at every path (the policy decides both
    /// alike), and two inputs with the same [`Self::key`] project alike.
    pub(crate) fn project(&self, input: InputRoot<'_>) -> regorus::Value {
        let paths: Vec<&[String]> = self.paths.iter().map(Vec::as_slice).collect();
        match input {
            InputRoot::Value(value) => project(value, &paths),
            // A read path is never empty (reading the whole input refuses
            // the set), so the root's members are always reduced.
            InputRoot::Parts { .. } => {
                project_members(|key| input.member(key).ok().flatten(), &paths)
            }
        }
    }

    #[cfg(test)]
    fn paths(&self) -> Vec<String> {
        self.paths.iter().map(|p| p.join(".")).collect()
    }
}

/// How far `path` reaches into `input`, and what is there: `None` for an
/// object without the next key, else the value to take whole (where the path
/// ends, or a non-object on the way).
fn reach<'a>(input: InputRoot<'a>, path: &[String]) -> (usize, Option<&'a Value>) {
    let Some((first, rest)) = path.split_first() else {
        unreachable!("a read path is never empty: reading the whole input refuses the set")
    };
    let mut node = match input.member(first) {
        Err(not_an_object) => return (0, Some(not_an_object)),
        Ok(None) => return (0, None),
        Ok(Some(child)) => child,
    };
    let mut depth = 1;
    for segment in rest {
        match node {
            Value::Object(map) => match map.get(segment) {
                Some(next) => {
                    node = next;
                    depth += 1;
                }
                None => return (depth, None),
            },
            _ => break,
        }
    }
    (depth, Some(node))
}

/// `node` reduced to `paths` (sorted, none a prefix of another).
fn project(node: &Value, paths: &[&[String]]) -> regorus::Value {
    match node {
        Value::Object(map) if paths.iter().all(|p| !p.is_empty()) => {
            project_members(|key| map.get(key), paths)
        }
        _ => to_rego(node),
    }
}

/// An object of the members `member` gives, each reduced to the rest of the
/// `paths` (sorted, none empty) that start with it.
fn project_members<'a>(
    member: impl Fn(&str) -> Option<&'a Value>,
    paths: &[&[String]],
) -> regorus::Value {
    let mut kept = BTreeMap::new();
    for group in paths.chunk_by(|a, b| a[0] == b[0]) {
        let segment = &group[0][0];
        if let Some(child) = member(segment) {
            let rest: Vec<&[String]> = group.iter().map(|p| &p[1..]).collect();
            kept.insert(
                regorus::Value::from(segment.as_str()),
                project(child, &rest),
            );
        }
    }
    regorus::Value::from(kept)
}

#[derive(Debug, Clone, PartialEq)]
enum Kind {
    Ident(String),
    /// A string literal's value; `None` when it holds escapes this reader
    /// does not decode (never a path segment then).
    Str(Option<String>),
    Number,
    Punct(char),
}

#[derive(Debug, Clone, PartialEq)]
struct Token {
    kind: Kind,
    line: usize,
}

fn tokenize(source: &str) -> Result<Vec<Token>, (usize, String)> {
    let bytes = source.as_bytes();
    let mut tokens = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        match c {
            b'\n' => {
                line += 1;
                i += 1;
            }
            c if c.is_ascii_whitespace() => i += 1,
            b'#' => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            b'$' if matches!(bytes.get(i + 1), Some(b'"' | b'`')) => {
                return Err((
                    line,
                    "a template string can read input in ways this analysis does not follow"
                        .to_owned(),
                ));
            }
            b'"' => {
                let start_line = line;
                let start = i + 1;
                let mut j = start;
                let mut escaped = false;
                while j < bytes.len() && bytes[j] != b'"' {
                    if bytes[j] == b'\\' {
                        escaped = true;
                        j += 1;
                    }
                    if j < bytes.len() && bytes[j] == b'\n' {
                        line += 1;
                    }
                    j += 1;
                }
                let text = &source[start..j.min(bytes.len())];
                let value = if escaped {
                    serde_json::from_str::<String>(&format!("\"{text}\"")).ok()
                } else {
                    Some(text.to_owned())
                };
                tokens.push(Token {
                    kind: Kind::Str(value),
                    line: start_line,
                });
                i = j + 1;
            }
            b'`' => {
                let start_line = line;
                let start = i + 1;
                let mut j = start;
                while j < bytes.len() && bytes[j] != b'`' {
                    if bytes[j] == b'\n' {
                        line += 1;
                    }
                    j += 1;
                }
                tokens.push(Token {
                    kind: Kind::Str(Some(source[start..j.min(bytes.len())].to_owned())),
                    line: start_line,
                });
                i = j + 1;
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let start = i;
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                    i += 1;
                }
                tokens.push(Token {
                    kind: Kind::Ident(source[start..i].to_owned()),
                    line,
                });
            }
            c if c.is_ascii_digit() => {
                while i < bytes.len()
                    && (bytes[i].is_ascii_alphanumeric()
                        || bytes[i] == b'.' && { bytes.get(i + 1).is_some_and(u8::is_ascii_digit) })
                {
                    i += 1;
                }
                tokens.push(Token {
                    kind: Kind::Number,
                    line,
                });
            }
            _ => {
                // Multi-byte characters only appear in strings and comments
                // of valid Rego; step over the whole character anyway.
                let width = source[i..].chars().next().map_or(1, char::len_utf8);
                tokens.push(Token {
                    kind: Kind::Punct(c as char),
                    line,
                });
                i += width;
            }
        }
    }
    Ok(tokens)
}

fn ident(tokens: &[Token], at: usize) -> Option<&str> {
    match tokens.get(at).map(|t| &t.kind) {
        Some(Kind::Ident(name)) => Some(name),
        _ => None,
    }
}

fn punct(tokens: &[Token], at: usize, c: char) -> bool {
    matches!(tokens.get(at).map(|t| &t.kind), Some(Kind::Punct(p)) if *p == c)
}

fn string(tokens: &[Token], at: usize) -> Option<&str> {
    match tokens.get(at).map(|t| &t.kind) {
        Some(Kind::Str(Some(s))) => Some(s),
        _ => None,
    }
}

/// Whether a module may make `object` name something else than the
/// builtins: any `object` on an `import` or `package` line, or heading a line
/// or a `default` rule (a rule or function of that name).
fn names_object(tokens: &[Token]) -> bool {
    let line_start = |i: usize| i == 0 || tokens[i - 1].line != tokens[i].line;
    tokens.iter().enumerate().any(|(i, t)| {
        if t.kind != Kind::Ident("object".to_owned()) {
            return false;
        }
        let first = (0..=i).rev().find(|&j| line_start(j)).unwrap_or(0);
        matches!(ident(tokens, first), Some("import" | "package" | "default")) || first == i
    })
}

/// The functions `tokens` (one module) define, as `data.<package>.<name>`:
/// a name (dotted or not) heading a line (or after `default`) and followed
/// by `(`. Calls heading a line of a rule body count too, which only makes
/// more names functions.
fn functions_defined(tokens: &[Token]) -> Vec<String> {
    let line_start = |i: usize| i == 0 || tokens[i - 1].line != tokens[i].line;
    let package = tokens
        .iter()
        .position(|t| t.kind == Kind::Ident("package".to_owned()))
        .map(|at| dotted(tokens, at + 1).0)
        .unwrap_or_default();
    let mut found = Vec::new();
    for i in 0..tokens.len() {
        let head = if ident(tokens, i) == Some("default") && line_start(i) {
            i + 1
        } else if line_start(i) {
            i
        } else {
            continue;
        };
        if let Some((name, _)) = call_name(tokens, head) {
            found.push(format!("data.{package}.{name}"));
        }
    }
    found
}

/// The dotted name starting at `at` (`a.b.c`), and where it ends.
fn dotted(tokens: &[Token], at: usize) -> (String, usize) {
    let Some(first) = ident(tokens, at) else {
        return (String::new(), at);
    };
    let mut name = first.to_owned();
    let mut j = at + 1;
    while punct(tokens, j, '.')
        && let Some(next) = ident(tokens, j + 1)
    {
        name.push('.');
        name.push_str(next);
        j += 2;
    }
    (name, j)
}

/// Why `with <target> as ...` (the target's dotted name) refuses the set:
/// it replaces a function (a builtin, a function named without `data.`, or
/// a function the modules define), or anything this reader cannot name.
fn with_replaces_a_function(target: &str, functions: &BTreeSet<String>) -> Option<String> {
    let head = target.split('.').next().unwrap_or_default();
    let replaces = match head {
        "input" => false,
        "data" => {
            let prefix = format!("{target}.");
            functions
                .iter()
                .any(|f| f == target || f.starts_with(&prefix))
        }
        _ => true,
    };
    replaces.then(|| {
        format!(
            "`with {target} as ...` replaces a function: the calls it replaces no longer read what their names say"
        )
    })
}

/// What every module's scan needs to know of the whole set.
struct Context {
    /// No module names something `object`: `object.get` is the builtin.
    object_is_builtin: bool,
    /// The functions the modules define (`data.<package>.<name>`).
    functions: BTreeSet<String>,
}

/// The dotted name of a call starting at `at` (`time.now_ns(` -> `time.now_ns`).
fn call_name(tokens: &[Token], at: usize) -> Option<(String, usize)> {
    let mut name = ident(tokens, at)?.to_owned();
    let mut j = at + 1;
    while punct(tokens, j, '.') {
        name.push('.');
        name.push_str(ident(tokens, j + 1)?);
        j += 2;
    }
    punct(tokens, j, '(').then_some((name, j))
}

type ScanError = (usize, String);

fn scan(
    tokens: &[Token],
    context: &Context,
    paths: &mut BTreeSet<Vec<String>>,
) -> Result<(), ScanError> {
    for (i, token) in tokens.iter().enumerate() {
        let Kind::Ident(word) = &token.kind else {
            continue;
        };
        let after_dot = i > 0 && punct(tokens, i - 1, '.');
        if after_dot {
            continue;
        }
        if let Some((name, _)) = call_name(tokens, i)
            && IMPURE_CALLS.contains(&name.as_str())
        {
            return Err((
                token.line,
                format!("`{name}` does not answer the same for the same input"),
            ));
        }
        if word == "with" {
            let (target, _) = dotted(tokens, i + 1);
            if let Some(reason) = with_replaces_a_function(&target, &context.functions) {
                return Err((token.line, reason));
            }
            continue;
        }
        if word != "input" {
            continue;
        }
        let (mut path, end) = constant_path(tokens, i + 1);
        if context.object_is_builtin && is_object_get_argument(tokens, i) && punct(tokens, end, ',')
        {
            path.extend(object_get_key(tokens, end + 1));
        }
        if path.is_empty() {
            return Err((
                token.line,
                "reads the whole input (`input` without a constant path after it)".to_owned(),
            ));
        }
        paths.insert(path);
    }
    Ok(())
}

/// The constant segments after a reference's head at `at`, and where they end.
fn constant_path(tokens: &[Token], mut at: usize) -> (Vec<String>, usize) {
    let mut path = Vec::new();
    loop {
        if punct(tokens, at, '.')
            && let Some(name) = ident(tokens, at + 1)
        {
            path.push(name.to_owned());
            at += 2;
        } else if punct(tokens, at, '[')
            && let Some(key) = string(tokens, at + 1)
            && punct(tokens, at + 2, ']')
        {
            path.push(key.to_owned());
            at += 3;
        } else {
            return (path, at);
        }
    }
}

/// Whether the reference at `at` is the first argument of `object.get(`.
fn is_object_get_argument(tokens: &[Token], at: usize) -> bool {
    at >= 4
        && punct(tokens, at - 1, '(')
        && ident(tokens, at - 2) == Some("get")
        && punct(tokens, at - 3, '.')
        && ident(tokens, at - 4) == Some("object")
        && !(at >= 5 && punct(tokens, at - 5, '.'))
}

/// `object.get`'s key argument at `at` as path segments, when it is a string
/// or an array of strings written out and followed by the default argument.
fn object_get_key(tokens: &[Token], at: usize) -> Vec<String> {
    if let Some(key) = string(tokens, at)
        && punct(tokens, at + 1, ',')
    {
        return vec![key.to_owned()];
    }
    if !punct(tokens, at, '[') {
        return Vec::new();
    }
    let mut keys = Vec::new();
    let mut j = at + 1;
    loop {
        if punct(tokens, j, ']') {
            break;
        }
        let Some(key) = string(tokens, j) else {
            return Vec::new();
        };
        keys.push(key.to_owned());
        j += 1;
        if punct(tokens, j, ',') {
            j += 1;
        } else if !punct(tokens, j, ']') {
            return Vec::new();
        }
    }
    if punct(tokens, j + 1, ',') {
        keys
    } else {
        Vec::new()
    }
}

#[cfg(test)]
mod tests;
