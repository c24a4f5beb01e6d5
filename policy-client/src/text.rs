//! Bounding text that can carry client- or policy-controlled content: denial
//! messages, log lines, Events. One function, so every place cuts the same way.

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

#[cfg(test)]
mod tests {
    use super::*;

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
