//! Bounding text that can carry client- or policy-controlled content: denial
//! messages, log lines, Events. One function, so every place cuts the same way.
//! And byte counts as flags take them (`16Mi`), one parser for every binary.

use std::borrow::Cow;

/// The longest message sent back to a client or written to a log line.
pub const MAX_MESSAGE_BYTES: usize = 4096;

/// `text` cut to at most `max` bytes on a character boundary. A cut text ends
/// with a note of how many bytes were dropped, so readers know it was cut.
pub fn truncate(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max {
        return Cow::Borrowed(text);
    }
    // The note's length depends on the number it carries; size it for the
    // largest number it can carry so the result never exceeds `max`.
    let widest_note = note(text.len()).len();
    let Some(room) = max.checked_sub(widest_note) else {
        return Cow::Owned(text[..floor_char_boundary(text, max)].to_owned());
    };
    let end = floor_char_boundary(text, room);
    let mut out = String::with_capacity(max);
    out.push_str(&text[..end]);
    out.push_str(&note(text.len() - end));
    Cow::Owned(out)
}

/// [`truncate`] to [`MAX_MESSAGE_BYTES`], owned.
pub fn bounded(text: impl AsRef<str>) -> String {
    truncate(text.as_ref(), MAX_MESSAGE_BYTES).into_owned()
}

fn note(dropped: usize) -> String {
    format!("... [{dropped} more bytes]")
}

fn floor_char_boundary(text: &str, mut index: usize) -> usize {
    index = index.min(text.len());
    while !text.is_char_boundary(index) {
        index -= 1;
    }
    index
}

/// A byte count: digits with an optional `Ki`, `Mi`, `Gi` (or `K`, `M`, `G`;
/// powers of 1024) suffix, `B`/`iB` allowed.
pub fn parse_bytes(text: &str) -> Result<usize, String> {
    let trimmed = text.trim();
    let digits = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(digits);
    let number: usize = number
        .parse()
        .map_err(|_| format!("{text:?} is not a byte count (e.g. 6291456, 6Mi, 1Gi)"))?;
    let unit = unit
        .trim()
        .trim_end_matches("iB")
        .trim_end_matches(['i', 'B']);
    let scale: usize = match unit {
        "" => 1,
        "K" | "k" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        _ => return Err(format!("unknown unit in {text:?}: use Ki, Mi or Gi")),
    };
    number
        .checked_mul(scale)
        .ok_or_else(|| format!("{text:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_take_binary_suffixes() {
        assert_eq!(parse_bytes("6291456"), Ok(6 << 20));
        assert_eq!(parse_bytes("6Mi"), Ok(6 << 20));
        assert_eq!(parse_bytes("256MiB"), Ok(256 << 20));
        assert_eq!(parse_bytes("1Gi"), Ok(1 << 30));
        assert_eq!(parse_bytes("64K"), Ok(64 << 10));
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("5Xi").is_err());
    }

    #[test]
    fn short_text_is_kept() {
        assert!(matches!(truncate("abc", 3), Cow::Borrowed("abc")));
    }

    #[test]
    fn long_text_is_cut_within_the_limit_and_says_so() {
        let text = "é".repeat(5 * 1024 * 1024);
        for max in [0, 5, 16, 240, 1000, MAX_MESSAGE_BYTES] {
            let cut = truncate(&text, max);
            assert!(cut.len() <= max, "{max}: {}", cut.len());
        }
        let cut = truncate(&text, 100);
        assert!(cut.starts_with("éé"), "{cut}");
        assert!(cut.ends_with("more bytes]"), "{cut}");
        assert!(bounded(&text).len() <= MAX_MESSAGE_BYTES);
    }
}
