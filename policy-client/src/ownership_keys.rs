//! Keys that sign and verify the ownership record (HMAC-SHA256), so that no
//! client can forge what the policy sees as the developer's request.
//!
//! Keys are kept as text, one base64 key per line: the first signs, every one
//! verifies (during a rotation the old key stays on a later line until every
//! record has been rewritten). The webhook and the remediator share them
//! through a Secret ([`crate::ownership_secret`]) or a file.

use std::fmt;
use std::sync::Arc;

use parking_lot::RwLock;

use base64::Engine as _;
use ring::hmac;

/// Prefix of a record's signature.
const TAG_PREFIX: &str = "hmac-sha256:";
/// Bytes of a generated key; shorter keys are refused.
const KEY_BYTES: usize = 32;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("ownership keys: no key")]
    Empty,
    #[error("ownership keys: line {line} is not base64")]
    NotBase64 { line: usize },
    #[error("ownership keys: line {line} holds {bytes} bytes, at least {KEY_BYTES} are needed")]
    TooShort { line: usize, bytes: usize },
    #[error("ownership keys: no randomness to generate a key")]
    Random,
}

/// The keys in force. `Debug` never shows them.
#[derive(Clone)]
pub struct OwnershipKeys {
    keys: Vec<hmac::Key>,
}

impl fmt::Debug for OwnershipKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnershipKeys(<{} redacted>)", self.keys.len())
    }
}

impl OwnershipKeys {
    /// From text: one base64 key per line, the signing key first.
    pub fn from_text(text: &str) -> Result<OwnershipKeys, KeyError> {
        let mut keys = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(line)
                .map_err(|_| KeyError::NotBase64 { line: index + 1 })?;
            if bytes.len() < KEY_BYTES {
                return Err(KeyError::TooShort {
                    line: index + 1,
                    bytes: bytes.len(),
                });
            }
            keys.push(hmac::Key::new(hmac::HMAC_SHA256, &bytes));
        }
        if keys.is_empty() {
            return Err(KeyError::Empty);
        }
        Ok(OwnershipKeys { keys })
    }

    /// A new random key, as the text [`OwnershipKeys::from_text`] reads.
    pub fn generate_text() -> Result<String, KeyError> {
        let mut bytes = [0u8; KEY_BYTES];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
            .map_err(|_| KeyError::Random)?;
        Ok(format!(
            "{}\n",
            base64::engine::general_purpose::STANDARD.encode(bytes)
        ))
    }

    /// A key for this process only: records it signs verify nowhere else.
    pub fn ephemeral() -> Result<OwnershipKeys, KeyError> {
        OwnershipKeys::from_text(&OwnershipKeys::generate_text()?)
    }

    pub(crate) fn sign(&self, message: &[u8]) -> String {
        let tag = hmac::sign(&self.keys[0], message);
        format!(
            "{TAG_PREFIX}{}",
            base64::engine::general_purpose::STANDARD_NO_PAD.encode(tag.as_ref())
        )
    }

    pub(crate) fn verify(&self, message: &[u8], tag: &str) -> bool {
        let Some(encoded) = tag.strip_prefix(TAG_PREFIX) else {
            return false;
        };
        let Ok(tag) = base64::engine::general_purpose::STANDARD_NO_PAD.decode(encoded) else {
            return false;
        };
        self.keys
            .iter()
            .any(|key| hmac::verify(key, message, &tag).is_ok())
    }
}

/// `current` key text with every key of `ours` it lacks appended (to verify
/// only: the first line of `current` still signs); `None` when it lacks none.
/// A process that held `ours` and finds the Secret refilled by someone who
/// did not (it was deleted, or recreated empty, meanwhile) keeps the records
/// signed with them verifying.
pub fn merged_text(current: &str, ours: &str) -> Option<String> {
    let lines = |text: &str| -> Vec<String> {
        text.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let mut merged = lines(current);
    let missing: Vec<String> = lines(ours)
        .into_iter()
        .filter(|line| !merged.contains(line))
        .collect();
    if missing.is_empty() {
        return None;
    }
    merged.extend(missing);
    Some(merged.join("\n") + "\n")
}

/// Keys that may be replaced while in use (a rotated Secret).
#[derive(Debug, Clone)]
pub struct SharedKeys(Arc<RwLock<Arc<OwnershipKeys>>>);

impl SharedKeys {
    pub fn new(keys: OwnershipKeys) -> SharedKeys {
        SharedKeys(Arc::new(RwLock::new(Arc::new(keys))))
    }

    /// The keys in force now.
    pub fn current(&self) -> Arc<OwnershipKeys> {
        Arc::clone(&self.0.read())
    }

    pub fn replace(&self, keys: OwnershipKeys) {
        *self.0.write() = Arc::new(keys);
    }
}

/// Keys that may not be there yet: the webhook listens (and fails closed
/// iff policies exist) before its Secret has been read.
#[derive(Debug, Clone, Default)]
pub struct LoadingKeys(Arc<std::sync::OnceLock<SharedKeys>>);

impl LoadingKeys {
    /// Keys that are there from the start.
    pub fn loaded(keys: SharedKeys) -> LoadingKeys {
        let loading = LoadingKeys::default();
        loading.set(keys);
        loading
    }

    /// The keys have arrived (only the first call counts; later changes
    /// come through the [`SharedKeys`] themselves).
    pub fn set(&self, keys: SharedKeys) {
        let _ = self.0.set(keys);
    }

    /// The keys in force, once they are there.
    pub fn current(&self) -> Option<Arc<OwnershipKeys>> {
        self.0.get().map(SharedKeys::current)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refilled_secret_keeps_the_keys_it_lost() {
        let old = OwnershipKeys::generate_text().unwrap();
        let new = OwnershipKeys::generate_text().unwrap();
        assert_eq!(merged_text(&old, &old), None);
        let merged = merged_text(&new, &old).unwrap();
        assert_eq!(merged, format!("{}\n{}\n", new.trim(), old.trim()));
        let keys = OwnershipKeys::from_text(&merged).unwrap();
        let before = OwnershipKeys::from_text(&old).unwrap();
        assert!(
            keys.verify(b"r", &before.sign(b"r")),
            "the old key verifies"
        );
        let signer = OwnershipKeys::from_text(&new).unwrap();
        assert_eq!(keys.sign(b"r"), signer.sign(b"r"), "the new key signs");
        let loading = LoadingKeys::default();
        assert!(loading.current().is_none());
        loading.set(SharedKeys::new(keys));
        assert!(loading.current().is_some());
    }

    #[test]
    fn signs_with_the_first_key_and_verifies_with_any() {
        let old = OwnershipKeys::generate_text().unwrap();
        let new = OwnershipKeys::generate_text().unwrap();
        let before = OwnershipKeys::from_text(&old).unwrap();
        let rotated = OwnershipKeys::from_text(&format!("{new}{old}")).unwrap();
        let tag = before.sign(b"record");
        assert!(
            rotated.verify(b"record", &tag),
            "the old key still verifies"
        );
        assert!(!rotated.verify(b"other", &tag));
        let tag = rotated.sign(b"record");
        assert!(!before.verify(b"record", &tag), "signed with the new key");
        assert!(!format!("{rotated:?}").contains(new.trim()));
    }

    #[test]
    fn bad_key_text_is_a_named_error() {
        assert_eq!(OwnershipKeys::from_text("\n").unwrap_err(), KeyError::Empty);
        assert_eq!(
            OwnershipKeys::from_text("not base64!").unwrap_err(),
            KeyError::NotBase64 { line: 1 }
        );
        assert_eq!(
            OwnershipKeys::from_text("c2hvcnQ=").unwrap_err(),
            KeyError::TooShort { line: 1, bytes: 5 }
        );
        assert!(!OwnershipKeys::ephemeral().unwrap().verify(b"x", "sha1:abc"));
    }
}
