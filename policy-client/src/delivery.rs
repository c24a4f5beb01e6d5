//! The last hop: may this manifest run on this member?
//!
//! Schedulers are asked where a workload may run (a Karmada binding's
//! placement, an OCM Placement's decisions); what delivers it is another
//! object: a Karmada `Work` in the execution namespace `karmada-es-<member>`,
//! an OCM `ManifestWork` in the namespace of its managed cluster, a
//! `ManifestWorkReplicaSet` (through its Placements). Each of its manifests
//! gets the decision every other path gets (the one policy input, the
//! manifest as the template), and the member must be among the clusters that
//! decision allows ([`Bound`]).
//!
//! A manifest the policy answers with errors goes nowhere; a manifest that
//! carries a placement requirement (an annotation under
//! [`REQUIREMENT_PREFIX`]) but whose decision names no clusters is refused:
//! a policy that does not place its kind cannot keep it where it requires,
//! and a requirement is never silently unbounded.

use std::borrow::Cow;

use kube::api::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

use crate::decision::Decision;
use crate::input::stored_input;
use crate::karmada::{Bound, BoundError, PREFERENCES_ANNOTATION, bound};
use crate::ownership_keys::OwnershipKeys;
use crate::placement::OWNERSHIP_ANNOTATION;

/// The prefix of the placement requirements workloads carry as annotations
/// (`policy.federation.alpha.kubernetes.io/eu-jurisdiction-required`,
/// `.../pci-compliance-level`).
pub const REQUIREMENT_PREFIX: &str = "policy.federation.alpha.kubernetes.io/";

/// The prefix of Karmada's execution namespaces: `karmada-es-<member>`.
pub const KARMADA_EXECUTION_PREFIX: &str = "karmada-es-";

/// An object that delivers manifests to members.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Carrier {
    /// `work.karmada.io` `Work`, in the execution namespace of its member.
    KarmadaWork,
    /// `work.open-cluster-management.io` `ManifestWork`, in the namespace of
    /// its managed cluster.
    ManifestWork,
    /// `work.open-cluster-management.io` `ManifestWorkReplicaSet`: a
    /// ManifestWork for every cluster its Placements decide.
    ManifestWorkReplicaSet,
}

impl Carrier {
    /// The carrier of API group `group` and kind `kind`, if it is one.
    pub fn of(group: &str, kind: &str) -> Option<Carrier> {
        match (group, kind) {
            ("work.karmada.io", "Work") => Some(Carrier::KarmadaWork),
            ("work.open-cluster-management.io", "ManifestWork") => Some(Carrier::ManifestWork),
            ("work.open-cluster-management.io", "ManifestWorkReplicaSet") => {
                Some(Carrier::ManifestWorkReplicaSet)
            }
            _ => None,
        }
    }

    /// The kind, as a message says it.
    pub fn kind(self) -> &'static str {
        match self {
            Carrier::KarmadaWork => "Work",
            Carrier::ManifestWork => "ManifestWork",
            Carrier::ManifestWorkReplicaSet => "ManifestWorkReplicaSet",
        }
    }

    /// The member a carrier in `namespace` delivers to: Karmada's member of
    /// an execution namespace (none outside them: Karmada executes no other
    /// Work), OCM's managed cluster of a cluster namespace; none for a
    /// ManifestWorkReplicaSet, which delivers through its Placements.
    pub fn member(self, namespace: &str) -> Option<String> {
        match self {
            Carrier::KarmadaWork => namespace
                .strip_prefix(KARMADA_EXECUTION_PREFIX)
                .filter(|m| !m.is_empty())
                .map(str::to_owned),
            Carrier::ManifestWork => (!namespace.is_empty()).then(|| namespace.to_owned()),
            Carrier::ManifestWorkReplicaSet => None,
        }
    }

    /// The manifests the carrier `object` delivers.
    pub fn manifests(self, object: &Value) -> &[Value] {
        let pointer = match self {
            Carrier::KarmadaWork | Carrier::ManifestWork => "/spec/workload/manifests",
            Carrier::ManifestWorkReplicaSet => "/spec/manifestWorkTemplate/workload/manifests",
        };
        object
            .pointer(pointer)
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default()
    }

    /// The manifests of `object` that `stored` (the carrier before this
    /// write) does not deliver as they are: every one for a new carrier.
    /// A write that changes none of them (status, finalizers, labels)
    /// delivers nothing new.
    pub fn changed_manifests<'a>(
        self,
        object: &'a Value,
        stored: Option<&Value>,
    ) -> Vec<&'a Value> {
        let before = stored.map(|s| self.manifests(s)).unwrap_or_default();
        self.manifests(object)
            .iter()
            .filter(|m| !before.contains(m))
            .collect()
    }
}

/// The placement requirements `manifest` carries: its annotations under
/// [`REQUIREMENT_PREFIX`], with their values, but for those that require
/// nothing (`"false"`, `"0"`, empty: the shipped policy's "no requirement").
pub fn requirements(manifest: &Value) -> Vec<(&str, &str)> {
    manifest
        .pointer("/metadata/annotations")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter(|(key, _)| key.starts_with(REQUIREMENT_PREFIX))
        .map(|(key, value)| (key.as_str(), value.as_str().unwrap_or_default()))
        .filter(|(_, value)| !matches!(value.trim(), "" | "false" | "0"))
        .collect()
}

/// A manifest as a message names it: `Deployment shop/web`.
pub fn describe(manifest: &Value) -> String {
    let field = |pointer: &str| manifest.pointer(pointer).and_then(Value::as_str);
    let kind = field("/kind").unwrap_or("object");
    let name = field("/metadata/name").unwrap_or("(unnamed)");
    match field("/metadata/namespace") {
        Some(ns) if !ns.is_empty() => format!("{kind} {ns}/{name}"),
        _ => format!("{kind} {name}"),
    }
}

/// The type of `manifest` (its `apiVersion` and `kind`), its resource named
/// as Kubernetes pluralizes kinds: a manifest may be of a type only its
/// member serves, so no discovery is asked.
pub fn manifest_type(manifest: &Value) -> ApiResource {
    let field = |key: &str| {
        manifest
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or_default()
    };
    let (group, version) = match field("apiVersion").split_once('/') {
        Some((group, version)) => (group, version),
        None => ("", field("apiVersion")),
    };
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, field("kind")))
}

/// The policy input for a delivered `manifest`: the manifest as a template
/// is placed everywhere else (an `UPDATE` of itself as stored, by no
/// particular user), so a Work, a binding and the template itself get one
/// answer to where it may run ([`as_template`]).
pub fn manifest_input(manifest: &Value, keys: &OwnershipKeys) -> Value {
    let manifest = &as_template(manifest);
    stored_input(manifest, &manifest_type(manifest), &json!({}), keys)
}

/// `manifest` as its template was asked about: without its placement request
/// and without the marks Karmada puts on what it delivers.
///
/// - The request: the placement annotation ([`PREFERENCES_ANNOTATION`]) and
///   the ownership record ([`OWNERSHIP_ANNOTATION`]). Delivery asks where a
///   manifest may run (its requirements decide that), not where it asked to:
///   a manifest copied from a placed template carries the policy's earlier
///   answer, whose record is bound to the template (its uid and creation
///   time, which a delivered copy lacks), so it would read as the
///   developer's request, and a request the policy no longer grants in full
///   (a member relabelled) would refuse the manifest even on the members it
///   may run on. Requests narrow where a workload runs, never widen it, so
///   leaving them out never lets a manifest through that its requirements
///   keep out.
/// - Karmada's marks: the labels and annotations in Karmada's domains
///   (`karmada.io/...`, `*.karmada.io/...`: the binding, Work, policy and
///   template it came from) that Karmada adds to each copy, which the
///   template was decided without. They name the copy (its Work, its
///   execution namespace), so with them every copy was a decision of its own
///   that no remembered answer could serve (two per Deployment on two
///   members); requirements are never in Karmada's domains.
pub fn as_template(manifest: &Value) -> Cow<'_, Value> {
    let asked_without = |key: &str, of: &str| match of {
        "annotations" => {
            key == PREFERENCES_ANNOTATION || key == OWNERSHIP_ANNOTATION || karmadas_mark(key)
        }
        _ => karmadas_mark(key),
    };
    let carries = |of: &str| {
        manifest
            .pointer(&format!("/metadata/{of}"))
            .and_then(Value::as_object)
            .is_some_and(|m| m.keys().any(|k| asked_without(k, of)))
    };
    if !carries("annotations") && !carries("labels") {
        return Cow::Borrowed(manifest);
    }
    let mut stripped = manifest.clone();
    for of in ["annotations", "labels"] {
        if let Some(map) = stripped
            .pointer_mut(&format!("/metadata/{of}"))
            .and_then(Value::as_object_mut)
        {
            map.retain(|k, _| !asked_without(k, of));
        }
    }
    Cow::Owned(stripped)
}

/// Whether a label or annotation key is in Karmada's domains.
fn karmadas_mark(key: &str) -> bool {
    key.split_once('/')
        .is_some_and(|(domain, _)| domain == "karmada.io" || domain.ends_with(".karmada.io"))
}

/// Why a decision allows a manifest no member.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the placement policy reports errors for it: {}", .0.join("; "))]
    Errors(Vec<String>),
    #[error(transparent)]
    InvalidBound(#[from] BoundError),
    #[error(
        "it carries the placement requirement {requirement}, but the placement policy names no clusters for a {kind} (a policy that does not place this kind cannot keep it where it requires: place it in the policy)"
    )]
    Unbounded { kind: String, requirement: String },
}

/// The clusters `decision` allows `object` (a manifest, or a binding's
/// template): its bound, unless the decision has errors, or names no
/// clusters for an object that carries a requirement.
pub fn allowed(object: &Value, decision: &Decision) -> Result<Bound, Refusal> {
    if decision.is_denied() {
        return Err(Refusal::Errors(decision.errors.clone()));
    }
    let bound = bound(decision)?;
    if bound == Bound::Any
        && let Some((key, value)) = requirements(object).first()
    {
        return Err(Refusal::Unbounded {
            kind: object
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or("object")
                .to_owned(),
            requirement: format!("{key}={value:?}"),
        });
    }
    Ok(bound)
}

/// Whether `bound` allows `member`.
pub fn allows(bound: &Bound, member: &str) -> bool {
    match bound {
        Bound::Any => true,
        Bound::Clusters(names) => names.contains(member),
    }
}

#[cfg(test)]
mod tests;
