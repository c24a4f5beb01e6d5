//! How flag values are read: lists, paths, `NAMESPACE/NAME`.

use std::collections::BTreeSet;

use crate::error::SyncError;

/// `NAMESPACE/NAME` of an object a flag names.
pub(super) fn namespaced_name(flag: &str, text: &str) -> Result<(String, String), SyncError> {
    match text.split_once('/') {
        Some((namespace, name)) if !namespace.is_empty() && !name.is_empty() => {
            Ok((namespace.to_owned(), name.to_owned()))
        }
        _ => Err(SyncError::Config(format!(
            "{flag} must be NAMESPACE/NAME, got {text:?}"
        ))),
    }
}

/// A comma-separated list's entries, trimmed, empty ones left out.
pub(super) fn trimmed_list(items: &[String]) -> BTreeSet<String> {
    items
        .iter()
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Trim slashes; `None` when nothing is left.
pub(super) fn normalize_path(path: &str) -> Option<String> {
    let trimmed = path.trim().trim_matches('/');
    (!trimmed.is_empty()).then(|| trimmed.to_owned())
}
