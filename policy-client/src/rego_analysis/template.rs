//! Template strings (`$"..."`, `` $`...` ``) for a parser that does not read
//! them: regorus 0.14.1. Each becomes an array of its expressions, written
//! over the template in place (the text blanked, newlines kept), so that the
//! parse sees the expressions as the code they are, each on its own line and
//! column: `$"a {x} b {y}"` becomes `[   x    ,y ]`.
//!
//! What a template string says is not kept; only what it refers to is, and an
//! array of its expressions refers to exactly that.

/// `source` with every template string rewritten as an array of its
/// expressions, byte for byte in place.
pub(super) fn to_arrays(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    code(&mut source.chars().peekable(), &mut out, false);
    out
}

type Chars<'a> = std::iter::Peekable<std::str::Chars<'a>>;

/// Blank `c` (one space per byte), keeping newlines.
fn blank(out: &mut String, c: char) {
    if c == '\n' {
        out.push('\n');
    } else {
        out.extend(std::iter::repeat_n(' ', c.len_utf8()));
    }
}

/// Code, copied as it is, to its end or, `in_template`, through the `}` that
/// closes a template's expression (blanked: the caller separates items).
fn code(chars: &mut Chars<'_>, out: &mut String, in_template: bool) {
    let mut depth = 0usize;
    while let Some(c) = chars.next() {
        match c {
            '#' => {
                out.push('#');
                while let Some(c) = chars.next_if(|&c| c != '\n') {
                    out.push(c);
                }
            }
            '"' | '`' => literal(chars, out, c),
            '$' if matches!(chars.peek(), Some('"' | '`')) => {
                let quote = chars.next().unwrap_or('"');
                out.push_str("[ ");
                template(chars, out, quote);
            }
            '{' => {
                depth += 1;
                out.push('{');
            }
            '}' if in_template && depth == 0 => {
                out.push(' ');
                return;
            }
            '}' => {
                depth = depth.saturating_sub(1);
                out.push('}');
            }
            other => out.push(other),
        }
    }
}

/// A string (`"`, escapes read) or raw string (`` ` ``) after its opening
/// `quote`, copied through its closing one.
fn literal(chars: &mut Chars<'_>, out: &mut String, quote: char) {
    out.push(quote);
    while let Some(c) = chars.next() {
        out.push(c);
        if c == '\\' && quote == '"' {
            out.extend(chars.next());
        } else if c == quote {
            return;
        }
    }
}

/// A template's text after its opening `quote`, through its closing one
/// (written `]`): `{` starts an expression, `\{` is a literal brace, and in
/// `$"..."` a backslash escapes the character after it.
fn template(chars: &mut Chars<'_>, out: &mut String, quote: char) {
    let mut items = 0usize;
    while let Some(c) = chars.next() {
        match c {
            '\\' if quote == '"' || chars.peek() == Some(&'{') => {
                blank(out, c);
                if let Some(escaped) = chars.next() {
                    blank(out, escaped);
                }
            }
            c if c == quote => {
                out.push(']');
                return;
            }
            '{' => {
                out.push(if items == 0 { ' ' } else { ',' });
                items += 1;
                code(chars, out, true);
            }
            other => blank(out, other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::to_arrays;

    #[test]
    fn a_template_becomes_an_array_of_its_expressions_in_place() {
        let cases = [
            (r#"m := $"a {x} b {y}""#, r#"m := [    x    ,y ]"#),
            (
                r#"m := $"\{no} {f("}", {"k": 1})}""#,
                r#"m := [        f("}", {"k": 1}) ]"#,
            ),
            ("m := $`\\{no} {x}`", "m := [        x ]"),
            (r#"m := $"{$"{x}"}""#, r#"m := [  [  x ] ]"#),
            (
                "# $\"{x}\"\ns := \"$\\\"{x}\"",
                "# $\"{x}\"\ns := \"$\\\"{x}\"",
            ),
            ("m := $\"é\n{x}\"", "m := [   \n x ]"),
        ];
        for (source, arrays) in cases {
            let out = to_arrays(source);
            assert_eq!(out, arrays, "{source}");
            assert_eq!(out.len(), source.len(), "{source}");
        }
    }
}
