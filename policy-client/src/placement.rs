//! Merging a decision's annotations into an object as a minimal RFC 6902 patch.
//!
//! Policy values replace the developer's on overlapping keys. Because the policy's
//! own earlier output would otherwise look like the developer's request on the next
//! evaluation (an UPDATE, or a remediation after a policy change), every value the
//! policy wrote over a different (or absent) developer value is recorded in the
//! [`OWNERSHIP_ANNOTATION`], together with what the developer had asked for.
//! [`developer_view`] uses that record to show the policy the developer's request,
//! and [`plan_patch`] keeps it up to date. Values the policy set to exactly what the
//! developer asked for need no record, so an object that already complies gets no
//! patch at all.
//!
//! The record is signed ([`OwnershipKeys`], HMAC-SHA256) over its content and
//! what identifies the object it belongs to: API group, kind, namespace, name
//! and uid. A record made while the object is being created, before the API
//! server gives it a uid (and, with generateName, a name), names its group,
//! kind, namespace and name or generateName and the time it was made, which
//! the object's creation time must match (within [`CREATION_WINDOW`]); once
//! what it records changes, it is bound to the uid. A record that anyone else
//! wrote or edited, or copied from another object (another name, namespace,
//! kind or group; the object deleted and created again under its name; a
//! sibling of the same generateName created later), does not verify and
//! counts as absent, so no client can make the policy mistake a value for
//! developer intent, nor hide or remove annotations through it. A copy of a
//! placed object (`kubectl get -o yaml | kubectl create -f -`) is then simply
//! the developer's request as it reads.

use std::borrow::Cow;
use std::collections::BTreeMap;

use json_patch::{AddOperation, Patch, PatchOperation, RemoveOperation, ReplaceOperation};
use jsonptr::PointerBuf;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::decision::{Decision, json_type};
use crate::ownership_keys::OwnershipKeys;

/// Annotation recording which annotation values the policy owns.
pub const OWNERSHIP_ANNOTATION: &str = "placement-policy.io/policy-owned";

/// The API server's limit on the total size of an object's annotations.
pub const TOTAL_ANNOTATION_SIZE_LIMIT: usize = 256 * 1024;

/// What the policy wrote for one key, and what the developer had asked for.
///
/// The written value is kept as a digest so the record costs little of the
/// API server's annotation size budget however large the policy's value is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnedValue {
    /// `sha256:<hex>` of the value the policy wrote.
    pub written: String,
    /// The developer's value before the policy wrote; `None` when there was none.
    pub requested: Option<String>,
}

/// The ownership record: annotation key -> what the policy owns of it.
pub type Ownership = BTreeMap<String, OwnedValue>;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MergeError {
    #[error("policy returned an invalid annotation key {key:?}: {reason}")]
    InvalidKey { key: String, reason: String },
    #[error(
        "annotations would total {size} bytes after the policy's values, over the API server's limit of {limit} bytes"
    )]
    TooLarge { size: usize, limit: usize },
    #[error("object is not a Kubernetes object: {0}")]
    InvalidObject(String),
    #[error("policy may not set the reserved annotation {0:?}")]
    ReservedKey(String),
    #[error("ownership record {OWNERSHIP_ANNOTATION:?} is not valid: {0}")]
    InvalidOwnership(String),
}

/// The object's annotations; `None` when the object has no annotations map.
pub fn annotations(object: &Value) -> Result<Option<BTreeMap<String, String>>, MergeError> {
    let Value::Object(root) = object else {
        return Err(MergeError::InvalidObject(format!(
            "expected a JSON object, got {}",
            json_type(object)
        )));
    };
    let metadata = match root.get("metadata") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(m)) => m,
        Some(other) => {
            return Err(MergeError::InvalidObject(format!(
                "metadata must be an object, got {}",
                json_type(other)
            )));
        }
    };
    match metadata.get("annotations") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(map)) => map
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                other => Err(MergeError::InvalidObject(format!(
                    "annotation {k:?} must be a string, got {}",
                    json_type(other)
                ))),
            })
            .collect::<Result<_, _>>()
            .map(Some),
        Some(other) => Err(MergeError::InvalidObject(format!(
            "metadata.annotations must be an object, got {}",
            json_type(other)
        ))),
    }
}

/// The record as stored: what the policy owns, signed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct SignedRecord {
    owned: Ownership,
    /// Made while the object was being created (it had no uid yet): when,
    /// in Unix seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    creating: Option<i64>,
    mac: String,
}

/// How far after a record made at an object's creation the API server may
/// store the object (the admission chain after this webhook: other webhooks,
/// each within its timeout of at most 30 s), and how far the clocks of the
/// webhook and the API server may differ the other way.
pub const CREATION_WINDOW: std::time::Duration = std::time::Duration::from_secs(30);
const CLOCK_MARGIN: i64 = 5;

fn text<'a>(object: &'a Value, pointer: &str) -> &'a str {
    object
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// The object a record belongs to: API group, kind, namespace, name and uid;
/// or, for a record made at its creation (`creating`: when), API group,
/// kind, namespace, name (or generateName, which is all a CREATE may have)
/// and that time.
fn record_subject(object: &Value, creating: Option<i64>) -> String {
    let group = text(object, "/apiVersion")
        .rsplit_once('/')
        .map_or("", |(group, _)| group);
    let (kind, namespace) = (text(object, "/kind"), text(object, "/metadata/namespace"));
    match creating {
        None => format!(
            "object\n{group}\n{kind}\n{namespace}\n{}\n{}",
            text(object, "/metadata/name"),
            text(object, "/metadata/uid")
        ),
        Some(at) => {
            let name = match text(object, "/metadata/generateName") {
                "" => text(object, "/metadata/name"),
                generated => generated,
            };
            format!("creating\n{group}\n{kind}\n{namespace}\n{name}\n{at}")
        }
    }
}

/// Seconds since the Unix epoch, now.
fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Whether a record made at `at` while its object was being created belongs
/// to `object`: one stored since (it has a uid) was created within the
/// window after it; one still being created is being created now.
fn created_then(object: &Value, at: i64) -> bool {
    let created = if text(object, "/metadata/uid").is_empty() {
        Some(now_unix())
    } else {
        text(object, "/metadata/creationTimestamp")
            .parse::<k8s_openapi::jiff::Timestamp>()
            .ok()
            .map(|t| t.as_second())
    };
    let window = i64::try_from(CREATION_WINDOW.as_secs()).unwrap_or(i64::MAX);
    created.is_some_and(|t| t >= at - CLOCK_MARGIN && t <= at + window)
}

fn record_message(
    object: &Value,
    owned: &Ownership,
    creating: Option<i64>,
) -> Result<Vec<u8>, MergeError> {
    let mut message = record_subject(object, creating).into_bytes();
    message.push(b'\n');
    // Maps serialize in key order: one text per record.
    message.extend(
        serde_json::to_vec(owned).map_err(|e| MergeError::InvalidOwnership(e.to_string()))?,
    );
    Ok(message)
}

/// The object's ownership record, when it verifies; empty otherwise (absent,
/// unreadable, forged, edited, or copied from another object).
pub fn ownership(object: &Value, keys: &OwnershipKeys) -> Ownership {
    verified_record(object, keys).map_or_else(Ownership::new, |record| record.owned)
}

/// The object's record, when it verifies.
fn verified_record(object: &Value, keys: &OwnershipKeys) -> Option<SignedRecord> {
    let current = annotations(object).ok()??;
    let record = serde_json::from_str::<SignedRecord>(current.get(OWNERSHIP_ANNOTATION)?).ok()?;
    if record.creating.is_some_and(|at| !created_then(object, at)) {
        return None;
    }
    let message = record_message(object, &record.owned, record.creating).ok()?;
    keys.verify(&message, &record.mac).then_some(record)
}

/// The record of `owned` for `object`: bound to its uid; while it has none
/// (being created), to the time it is made. A record made at the creation
/// keeps that time while what it records stays the same (the webhook called
/// again on the same CREATE, the stored object evaluated again, signed again
/// with a new key: the same record, no write for nothing).
fn encode_record(
    object: &Value,
    owned: Ownership,
    current: Option<&SignedRecord>,
    keys: &OwnershipKeys,
) -> Result<String, MergeError> {
    let kept = current
        .filter(|record| record.owned == owned)
        .and_then(|record| record.creating);
    let creating = kept.or_else(|| text(object, "/metadata/uid").is_empty().then(now_unix));
    let mac = keys.sign(&record_message(object, &owned, creating)?);
    serde_json::to_string(&SignedRecord {
        owned,
        creating,
        mac,
    })
    .map_err(|e| MergeError::InvalidOwnership(e.to_string()))
}

/// The annotations as the developer asked for them: values the policy still owns
/// are replaced by the developer's request, and the ownership record is removed.
/// A value that differs from what the policy wrote was changed by someone since,
/// so it is the developer's new request and is kept.
pub fn requested_annotations(
    current: &BTreeMap<String, String>,
    owned: &Ownership,
) -> BTreeMap<String, String> {
    let mut requested = current.clone();
    requested.remove(OWNERSHIP_ANNOTATION);
    for (key, value) in owned {
        if current.get(key).map(|v| digest(v)) == Some(value.written.clone()) {
            match &value.requested {
                Some(original) => {
                    requested.insert(key.clone(), original.clone());
                }
                None => {
                    requested.remove(key);
                }
            }
        }
    }
    requested
}

/// The object as the policy should see it: the developer's requested annotations
/// (see [`requested_annotations`]), from the object's verified record; the
/// record itself is never shown.
pub fn developer_view(object: &Value, keys: &OwnershipKeys) -> Value {
    borrowed_developer_view(object, keys).into_owned()
}

/// [`developer_view`], borrowing the object when it is its own view (it
/// carries no ownership record).
pub(crate) fn borrowed_developer_view<'a>(
    object: &'a Value,
    keys: &OwnershipKeys,
) -> Cow<'a, Value> {
    let Ok(Some(current)) = annotations(object) else {
        return Cow::Borrowed(object);
    };
    if !current.contains_key(OWNERSHIP_ANNOTATION) {
        return Cow::Borrowed(object);
    }
    let owned = ownership(object, keys);
    let requested = requested_annotations(&current, &owned);
    let mut view = object.clone();
    if let Some(meta) = view.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert(
            "annotations".to_owned(),
            Value::Object(
                requested
                    .into_iter()
                    .map(|(k, v)| (k, Value::String(v)))
                    .collect(),
            ),
        );
    }
    Cow::Owned(view)
}

/// The annotations `object` should carry under `decision`, including the
/// updated, signed ownership record.
pub fn desired_annotations(
    object: &Value,
    decision: &Decision,
    keys: &OwnershipKeys,
) -> Result<BTreeMap<String, String>, MergeError> {
    let current = annotations(object)?.unwrap_or_default();
    let verified = verified_record(object, keys);
    let owned = verified
        .as_ref()
        .map_or_else(Ownership::new, |record| record.owned.clone());
    let requested = requested_annotations(&current, &owned);
    let mut desired = requested.clone();
    let mut record = Ownership::new();
    for (key, value) in &decision.annotations {
        if key == OWNERSHIP_ANNOTATION {
            return Err(MergeError::ReservedKey(key.clone()));
        }
        validate_annotation_key(key)?;
        let developer_value = requested.get(key);
        if developer_value != Some(value) {
            record.insert(
                key.clone(),
                OwnedValue {
                    written: digest(value),
                    requested: developer_value.cloned(),
                },
            );
        }
        desired.insert(key.clone(), value.clone());
    }
    if !record.is_empty() {
        desired.insert(
            OWNERSHIP_ANNOTATION.to_owned(),
            encode_record(object, record, verified.as_ref(), keys)?,
        );
    }
    let size: usize = desired.iter().map(|(k, v)| k.len() + v.len()).sum();
    if size > TOTAL_ANNOTATION_SIZE_LIMIT {
        return Err(MergeError::TooLarge {
            size,
            limit: TOTAL_ANNOTATION_SIZE_LIMIT,
        });
    }
    Ok(desired)
}

/// The minimal JSON patch that brings `object`'s annotations to what `decision`
/// requires, or `None` when they already are.
pub fn plan_patch(
    object: &Value,
    decision: &Decision,
    keys: &OwnershipKeys,
) -> Result<Option<Patch>, MergeError> {
    let desired = desired_annotations(object, decision, keys)?;
    patch_annotations_to(object, &desired)
}

/// The minimal JSON patch that makes `object`'s annotations exactly
/// `desired`, or `None` when they already are.
pub(crate) fn patch_annotations_to(
    object: &Value,
    desired: &BTreeMap<String, String>,
) -> Result<Option<Patch>, MergeError> {
    let current = annotations(object)?;
    let has_metadata = object.get("metadata").is_some_and(Value::is_object);
    let ops = match current {
        None if desired.is_empty() => Vec::new(),
        None => {
            let map = string_map(desired);
            if has_metadata {
                vec![add(&["metadata", "annotations"], map)]
            } else {
                let mut meta = Map::new();
                meta.insert("annotations".to_owned(), map);
                vec![add(&["metadata"], Value::Object(meta))]
            }
        }
        Some(current) => diff(&current, desired),
    };
    Ok((!ops.is_empty()).then_some(Patch(ops)))
}

fn diff(
    current: &BTreeMap<String, String>,
    desired: &BTreeMap<String, String>,
) -> Vec<PatchOperation> {
    let mut ops = Vec::new();
    for key in current.keys() {
        if !desired.contains_key(key) {
            ops.push(PatchOperation::Remove(RemoveOperation {
                path: pointer(&["metadata", "annotations", key]),
            }));
        }
    }
    for (key, value) in desired {
        match current.get(key) {
            Some(old) if old == value => {}
            Some(_) => ops.push(PatchOperation::Replace(ReplaceOperation {
                path: pointer(&["metadata", "annotations", key]),
                value: Value::String(value.clone()),
            })),
            None => ops.push(add(
                &["metadata", "annotations", key],
                Value::String(value.clone()),
            )),
        }
    }
    ops
}

/// The digest recorded for a value the policy wrote.
pub fn digest(value: &str) -> String {
    let hash = ring::digest::digest(&ring::digest::SHA256, value.as_bytes());
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256:");
    for byte in hash.as_ref() {
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

fn add(tokens: &[&str], value: Value) -> PatchOperation {
    PatchOperation::Add(AddOperation {
        path: pointer(tokens),
        value,
    })
}

fn pointer(tokens: &[&str]) -> PointerBuf {
    PointerBuf::from_tokens(tokens.iter().copied())
}

fn string_map(map: &BTreeMap<String, String>) -> Value {
    Value::Object(
        map.iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect(),
    )
}

/// Check an annotation key the way the API server does: a qualified name, an
/// optional DNS-subdomain prefix and a name of at most 63 characters.
pub fn validate_annotation_key(key: &str) -> Result<(), MergeError> {
    let invalid = |reason: String| MergeError::InvalidKey {
        key: key.to_owned(),
        reason,
    };
    // The API server lower-cases annotation keys before checking them.
    let lowered = key.to_ascii_lowercase();
    let parts: Vec<&str> = lowered.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                return Err(invalid("prefix part must not be empty".to_owned()));
            }
            if prefix.len() > 253 {
                return Err(invalid(
                    "prefix part must be no more than 253 characters".to_owned(),
                ));
            }
            if !is_dns_subdomain(prefix) {
                return Err(invalid(format!(
                    "prefix part {prefix:?} must be a DNS subdomain: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"
                )));
            }
            *name
        }
        _ => {
            return Err(invalid(
                "a qualified name has at most one '/' (an optional prefix and a name)".to_owned(),
            ));
        }
    };
    if name.is_empty() {
        return Err(invalid("name part must not be empty".to_owned()));
    }
    if name.len() > 63 {
        return Err(invalid(
            "name part must be no more than 63 characters".to_owned(),
        ));
    }
    let bytes = name.as_bytes();
    let alnum = |b: &u8| b.is_ascii_alphanumeric();
    let ok = alnum(&bytes[0])
        && alnum(&bytes[bytes.len() - 1])
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if !ok {
        return Err(invalid(format!(
            "name part {name:?} must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
        )));
    }
    Ok(())
}

fn is_dns_subdomain(s: &str) -> bool {
    s.split('.').all(|label| {
        let b = label.as_bytes();
        !b.is_empty()
            && b.len() <= 63
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
    })
}

#[cfg(test)]
mod tests;
