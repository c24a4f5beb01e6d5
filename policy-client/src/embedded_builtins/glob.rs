//! `glob.match` with brace groups that have an empty alternative.

use anyhow::bail;
use regorus::Value;
use regorus::unstable::{ExprRef, Span};

/// Patterns one pattern may expand to; beyond, the call fails (a pattern
/// with that many empty alternatives is no real policy's).
const MAX_EXPANSIONS: usize = 256;

/// `glob.match(pattern, delimiters, s)`: regorus 0.14.1's, except that a
/// brace group with an empty alternative (`{a,}`), which regorus never
/// matches, is expanded first: alternation distributes over concatenation,
/// so the pattern matches where one of its expansions does (as in OPA).
pub(super) fn glob_match(
    span: &Span,
    params: &[ExprRef],
    args: &[Value],
    strict: bool,
) -> anyhow::Result<Value> {
    let regorus_glob_match = super::regorus_builtin("glob.match")?;
    let Some(Value::String(pattern)) = args.first() else {
        return regorus_glob_match(span, params, args, strict);
    };
    let patterns = expand(pattern);
    if patterns.len() > MAX_EXPANSIONS {
        bail!("glob.match: the pattern has more than {MAX_EXPANSIONS} expansions");
    }
    if patterns.len() == 1 {
        return regorus_glob_match(span, params, args, strict);
    }
    let mut args = args.to_vec();
    for pattern in patterns {
        args[0] = Value::from(pattern);
        if regorus_glob_match(span, params, &args, strict)? == Value::Bool(true) {
            return Ok(Value::Bool(true));
        }
    }
    Ok(Value::Bool(false))
}

/// The patterns `pattern` stands for once every brace group holding an
/// empty alternative (at any depth) is expanded; `[pattern]` when none does.
pub(super) fn expand(pattern: &str) -> Vec<String> {
    let mut done = Vec::new();
    let mut todo = vec![pattern.to_owned()];
    while let Some(pattern) = todo.pop() {
        match group_to_expand(&pattern) {
            Some((start, end)) => {
                let (prefix, suffix) = (&pattern[..start], &pattern[end + 1..]);
                for alternative in alternatives(&pattern[start + 1..end]) {
                    todo.push(format!("{prefix}{alternative}{suffix}"));
                }
            }
            None => done.push(pattern),
        }
        if done.len() + todo.len() > MAX_EXPANSIONS {
            done.extend(todo);
            break;
        }
    }
    done
}

/// The byte range (`{` to its `}`) of the first top-level brace group that
/// holds an empty alternative at some depth. Escaped characters and
/// character classes (`[...]`) hold no braces.
fn group_to_expand(pattern: &str) -> Option<(usize, usize)> {
    let bytes = pattern.as_bytes();
    let mut at = 0;
    while at < bytes.len() {
        match bytes[at] {
            b'\\' => at += 2,
            b'[' => at = class_end(bytes, at) + 1,
            b'{' => {
                let end = group_end(bytes, at)?;
                if has_empty_alternative(&pattern[at + 1..end]) {
                    return Some((at, end));
                }
                at = end + 1;
            }
            _ => at += 1,
        }
    }
    None
}

/// Where the character class opened at `start` closes (the last byte when
/// it does not).
fn class_end(bytes: &[u8], start: usize) -> usize {
    let mut at = start + 1;
    // A `]` first in the class is one of its characters.
    if bytes.get(at) == Some(&b'!') || bytes.get(at) == Some(&b'^') {
        at += 1;
    }
    if bytes.get(at) == Some(&b']') {
        at += 1;
    }
    while at < bytes.len() {
        match bytes[at] {
            b'\\' => at += 2,
            b']' => return at,
            _ => at += 1,
        }
    }
    bytes.len().saturating_sub(1)
}

/// The `}` closing the group opened at `start`, if any.
fn group_end(bytes: &[u8], start: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut at = start;
    while at < bytes.len() {
        match bytes[at] {
            b'\\' => at += 1,
            b'[' => at = class_end(bytes, at),
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(at);
                }
            }
            _ => {}
        }
        at += 1;
    }
    None
}

/// The top-level alternatives of a group's inside.
fn alternatives(inside: &str) -> Vec<&str> {
    let bytes = inside.as_bytes();
    let mut parts = Vec::new();
    let (mut depth, mut from, mut at) = (0usize, 0, 0);
    while at < bytes.len() {
        match bytes[at] {
            b'\\' => at += 1,
            b'[' => at = class_end(bytes, at),
            b'{' => depth += 1,
            b'}' => depth = depth.saturating_sub(1),
            b',' if depth == 0 => {
                parts.push(&inside[from..at]);
                from = at + 1;
            }
            _ => {}
        }
        at += 1;
    }
    parts.push(&inside[from.min(inside.len())..]);
    parts
}

fn has_empty_alternative(inside: &str) -> bool {
    alternatives(inside)
        .iter()
        .any(|alternative| alternative.is_empty() || group_to_expand(alternative).is_some())
}
