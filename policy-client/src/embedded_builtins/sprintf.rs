//! `sprintf` with Go's float verbs.

use regorus::Value;
use regorus::unstable::{ExprRef, Span};

/// `sprintf(format, values)`: regorus 0.14.1's, except for the float verbs
/// (`%e %E %f %F %g %G`), which are formatted as Go's `fmt` formats a
/// float64 (regorus writes `%f` of 1.5 as `1.5` where Go writes
/// `1.500000`). Other verbs go to regorus one at a time. A format with `*`
/// or an argument index (`%[1]d`) goes to regorus whole.
///
/// OPA passes a number written as an integer (`100`, not `1e2` or `100.0`)
/// to Go as an int, and Go prints a float verb of an int as `%!f(int=100)`;
/// regorus keeps no such difference (`1e2` is the integer 100), so a float
/// verb here formats every number as a float.
pub(super) fn sprintf(
    span: &Span,
    params: &[ExprRef],
    args: &[Value],
    strict: bool,
) -> anyhow::Result<Value> {
    let regorus_sprintf = super::regorus_builtin("sprintf")?;
    let whole = || regorus_sprintf(span, params, args, strict);
    let [Value::String(format), Value::Array(values)] = args else {
        return whole();
    };
    let Some(pieces) = parse(format) else {
        return whole();
    };
    if !pieces
        .iter()
        .any(|piece| matches!(piece, Piece::Verb(spec) if spec.is_float()))
    {
        return whole();
    }
    let mut out = String::new();
    let mut next = 0;
    for piece in pieces {
        let spec = match piece {
            Piece::Text(text) => {
                out.push_str(text);
                continue;
            }
            Piece::Verb(spec) => spec,
        };
        let value = values.get(next);
        next += 1;
        match (value, spec.is_float()) {
            (None, _) => {
                out.push_str("%!");
                out.push(spec.verb);
                out.push_str("(MISSING)");
            }
            (Some(Value::Number(_)), true) => {
                let number = value.and_then(|v| v.as_f64().ok()).unwrap_or(f64::NAN);
                out.push_str(&spec.format_float(number));
            }
            (Some(value), _) => {
                let one = [Value::from(spec.text), Value::from(vec![value.clone()])];
                match regorus_sprintf(span, params, &one, strict)? {
                    Value::String(s) => out.push_str(&s),
                    other => return Ok(other),
                }
            }
        }
    }
    Ok(Value::from(out))
}

enum Piece<'a> {
    Text(&'a str),
    Verb(Spec<'a>),
}

/// One `%` verb: its text, flags, width, precision and verb.
struct Spec<'a> {
    text: &'a str,
    plus: bool,
    minus: bool,
    space: bool,
    zero: bool,
    width: Option<usize>,
    precision: Option<usize>,
    verb: char,
}

type Chars<'a> = std::iter::Peekable<std::iter::Skip<std::str::CharIndices<'a>>>;

/// The number at the front of `chars`, if any.
fn number(chars: &mut Chars<'_>) -> Option<usize> {
    let mut n: Option<usize> = None;
    while let Some(digit) = chars.peek().and_then(|&(_, c)| c.to_digit(10)) {
        n = Some(
            n.unwrap_or(0)
                .saturating_mul(10)
                .saturating_add(digit as usize),
        );
        chars.next();
    }
    n
}

/// The format's text and verbs (`%%` is text); `None` for what only regorus
/// reads (`*`, argument indexes, `#`) or a format ending inside a verb.
fn parse(format: &str) -> Option<Vec<Piece<'_>>> {
    let mut pieces = Vec::new();
    let mut rest = format;
    while let Some(at) = rest.find('%') {
        if at > 0 {
            pieces.push(Piece::Text(&rest[..at]));
        }
        let verb_text = &rest[at..];
        let mut chars = verb_text.char_indices().skip(1).peekable();
        let mut spec = Spec {
            text: "",
            plus: false,
            minus: false,
            space: false,
            zero: false,
            width: None,
            precision: None,
            verb: '%',
        };
        while let Some(&(_, c)) = chars.peek() {
            match c {
                '+' => spec.plus = true,
                '-' => spec.minus = true,
                ' ' => spec.space = true,
                '0' => spec.zero = true,
                '#' | '*' | '[' => return None,
                _ => break,
            }
            chars.next();
        }
        spec.width = number(&mut chars);
        if chars.peek().is_some_and(|&(_, c)| c == '.') {
            chars.next();
            spec.precision = Some(number(&mut chars).unwrap_or(0));
        }
        let (end, verb) = chars.next()?;
        if matches!(verb, '*' | '[') {
            return None;
        }
        let len = end + verb.len_utf8();
        if verb == '%' {
            pieces.push(Piece::Text("%"));
        } else {
            spec.verb = verb;
            spec.text = &verb_text[..len];
            pieces.push(Piece::Verb(spec));
        }
        rest = &verb_text[len..];
    }
    if !rest.is_empty() {
        pieces.push(Piece::Text(rest));
    }
    Some(pieces)
}

impl Spec<'_> {
    fn is_float(&self) -> bool {
        matches!(self.verb, 'e' | 'E' | 'f' | 'F' | 'g' | 'G')
    }

    /// `f` as Go's `fmt` writes a float64 under this verb.
    fn format_float(&self, f: f64) -> String {
        let body = match self.verb {
            'e' | 'E' => format_e(f, self.precision.unwrap_or(6)),
            'g' | 'G' => format_g(f, self.precision),
            _ => format!("{:.*}", self.precision.unwrap_or(6), f),
        };
        let body = if self.verb.is_ascii_uppercase() {
            body.to_ascii_uppercase()
        } else {
            body
        };
        let (negative, digits) = match body.strip_prefix('-') {
            Some(digits) => (true, digits.to_owned()),
            None => (false, body),
        };
        let sign = if negative {
            "-"
        } else if self.plus {
            "+"
        } else if self.space {
            " "
        } else {
            ""
        };
        let width = self.width.unwrap_or(0);
        let len = sign.len() + digits.chars().count();
        if len >= width {
            return format!("{sign}{digits}");
        }
        let fill = width - len;
        if self.minus {
            format!("{sign}{digits}{}", " ".repeat(fill))
        } else if self.zero {
            format!("{sign}{}{digits}", "0".repeat(fill))
        } else {
            format!("{}{sign}{digits}", " ".repeat(fill))
        }
    }
}

/// The decimal digits of `f` (no leading or trailing zeros; `"0"` for zero)
/// and the position of the decimal point relative to them: `precision`
/// significant digits, or the fewest that read back as `f`.
fn digits(f: f64, precision: Option<usize>) -> (String, i32) {
    let text = match precision {
        Some(p) => format!("{:.*e}", p.max(1) - 1, f.abs()),
        None => format!("{:e}", f.abs()),
    };
    let (mantissa, exponent) = text.split_once('e').unwrap_or((&text, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let trimmed = digits.trim_end_matches('0');
    if trimmed.is_empty() {
        return ("0".to_owned(), 1);
    }
    (trimmed.to_owned(), exponent + 1)
}

/// `%e` with `precision` digits after the point: `d.ddde±dd`.
fn format_e(f: f64, precision: usize) -> String {
    let text = format!("{:.*e}", precision, f);
    let (mantissa, exponent) = text.split_once('e').unwrap_or((&text, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let sign = if exponent < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exponent.unsigned_abs())
}

/// `%g`: Go's `strconv.FormatFloat(f, 'g', precision or -1, 64)`.
fn format_g(f: f64, precision: Option<usize>) -> String {
    let (digits, point) = digits(f, precision);
    let count = digits.len() as i32;
    let shortest = precision.is_none();
    let mut precision = match precision {
        Some(p) => p.max(1) as i32,
        None => count,
    };
    let mut eprec = precision;
    if eprec > count && count >= point {
        eprec = count;
    }
    if shortest {
        eprec = 6;
    }
    let exponent = point - 1;
    let sign = if f.is_sign_negative() { "-" } else { "" };
    if exponent < -4 || exponent >= eprec {
        if precision > count {
            precision = count;
        }
        let mut mantissa = digits[..1].to_owned();
        let tail = (precision - 1).max(0) as usize;
        if tail > 0 {
            mantissa.push('.');
            mantissa.push_str(&format!(
                "{:0<tail$}",
                &digits[1..digits.len().min(tail + 1)]
            ));
        }
        let esign = if exponent < 0 { '-' } else { '+' };
        return format!("{sign}{mantissa}e{esign}{:02}", exponent.unsigned_abs());
    }
    if precision > point {
        precision = count;
    }
    let fraction = (precision - point).max(0) as usize;
    let mut out = String::from(sign);
    if point > 0 {
        let whole = point as usize;
        out.push_str(&format!("{:0<whole$}", &digits[..digits.len().min(whole)]));
    } else {
        out.push('0');
    }
    if fraction > 0 {
        out.push('.');
        for i in 0..fraction as i32 {
            let at = point + i;
            let digit = if at < 0 {
                '0'
            } else {
                digits
                    .as_bytes()
                    .get(at as usize)
                    .map_or('0', |&b| b as char)
            };
            out.push(digit);
        }
    }
    out
}

#[cfg(test)]
pub(super) fn go(format: &str, f: f64) -> String {
    match parse(format).as_deref() {
        Some([Piece::Verb(spec)]) => spec.format_float(f),
        _ => String::new(),
    }
}
