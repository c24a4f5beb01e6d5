//! Bytes as lowercase hex, for short digests and ids.

/// The first `take` of `bytes` as lowercase hex.
pub(crate) fn hex(bytes: &[u8], take: usize) -> String {
    bytes
        .iter()
        .take(take)
        .map(|b| format!("{b:02x}"))
        .collect()
}
