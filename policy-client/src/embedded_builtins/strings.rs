//! `strings.replace_n` and `strings.count` as OPA's Go runs them.

use anyhow::bail;
use regorus::Value;
use regorus::unstable::{ExprRef, Span};

/// `strings.replace_n(patterns, s)`: Go's `strings.NewReplacer` with the
/// patterns in key order, as OPA calls it. regorus 0.14.1 replaces each
/// pattern in turn over the whole string, so a replacement is scanned again
/// by later patterns and a longer key loses to a shorter one differently.
pub(super) fn replace_n(
    _span: &Span,
    _params: &[ExprRef],
    args: &[Value],
    _strict: bool,
) -> anyhow::Result<Value> {
    let [Value::Object(patterns), Value::String(s)] = args else {
        bail!("strings.replace_n: operand 1 must be an object and operand 2 a string");
    };
    let mut pairs = Vec::with_capacity(patterns.len());
    for (key, value) in patterns.iter_sorted() {
        match (key, value) {
            (Value::String(old), Value::String(new)) => pairs.push((old.as_ref(), new.as_ref())),
            (Value::String(_), _) => {
                bail!("strings.replace_n: operand 1 non-string value found in pattern object")
            }
            _ => bail!("strings.replace_n: operand 1 non-string key found in pattern object"),
        }
    }
    Ok(Value::from(go_replace(s, &pairs)))
}

/// What Go's `strings.NewReplacer(old1, new1, ...).Replace(s)` returns:
/// scanning left to right, at each position the first pair whose old string
/// starts there is replaced (an empty old string matches at every position,
/// but not twice in a row), and the scan goes on after it; replaced text is
/// never scanned again.
pub(super) fn go_replace(s: &str, pairs: &[(&str, &str)]) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let (mut at, mut copied) = (0, 0);
    let mut after_empty_match = false;
    while at <= bytes.len() {
        let rest = &bytes[at..];
        let found = pairs.iter().find(|(old, _)| {
            !(old.is_empty() && after_empty_match) && rest.starts_with(old.as_bytes())
        });
        match found {
            Some((old, new)) => {
                after_empty_match = old.is_empty();
                out.extend_from_slice(&bytes[copied..at]);
                out.extend_from_slice(new.as_bytes());
                at += old.len();
                copied = at;
            }
            None => {
                after_empty_match = false;
                at += 1;
            }
        }
    }
    if copied < bytes.len() {
        out.extend_from_slice(&bytes[copied..]);
    }
    // An empty old string matches between the bytes of a character too, as
    // in Go; JSON then carries the broken character as U+FFFD.
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// `strings.count(s, sub)`: Go's `strings.Count`, the non-overlapping
/// occurrences (one more than the characters for an empty `sub`). regorus
/// 0.14.1 counts overlapping ones, and panics on an empty `sub`.
pub(super) fn count(
    _span: &Span,
    _params: &[ExprRef],
    args: &[Value],
    _strict: bool,
) -> anyhow::Result<Value> {
    let [Value::String(s), Value::String(sub)] = args else {
        bail!("strings.count: both operands must be strings");
    };
    let n = if sub.is_empty() {
        s.chars().count() + 1
    } else {
        s.matches(sub.as_ref()).count()
    };
    Ok(Value::from(n))
}
