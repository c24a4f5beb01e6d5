//! The last hop in admission ([`policy_client::delivery`]): what delivers a
//! workload to a member is checked, not only what a scheduler is asked.
//!
//! - A Karmada `Work` or an OCM `ManifestWork` is admitted only when every
//!   manifest it adds or changes may run on its member (the execution
//!   namespace's, the cluster namespace's).
//! - An OCM `ManifestWorkReplicaSet` is admitted only when each manifest it
//!   adds or changes (every one when its Placements change) can be placed at
//!   all; the clusters its Placements decide now that a manifest may not run
//!   on are named in a warning (their ManifestWorks will be refused), so a
//!   tenant learns at once.
//! - A Karmada binding write (`/validate`) is admitted only when every member
//!   it adds to `spec.clusters` or `spec.requiredBy` (or gives more replicas,
//!   or gets another template) is allowed the binding's template.
//!
//! Writes that deliver nothing new (status, finalizers, labels, fewer
//! replicas) pass unevaluated, so no controller is ever stopped from
//! finishing or cleaning up; deletions never reach here. A decision with
//! errors delivers nowhere new; without any decision, the fail-closed rule
//! applies ([`Admission::guard`]).

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use policy_client::delivery::{Carrier, Refusal, allowed, allows, describe, manifest_input};
use policy_client::input::PolicyInput;
use policy_client::karmada::{Bound, added_clusters};
use policy_client::text::bounded;
use serde_json::Value;
use tokio::time::Instant;

use super::{Admission, guardrail};
use crate::failure::PlacementFailure;
use crate::metrics::Outcome;
use crate::review::{AdmissionRequest, AdmissionResponse, Operation};

/// The Event reason of a write refused for what it would deliver.
pub(crate) const DELIVERY_DENIED: &str = "DeliveryDenied";

/// The label OCM puts on a Placement's PlacementDecisions.
const PLACEMENT_LABEL: &str = "cluster.open-cluster-management.io/placement";

impl Admission {
    /// A Work, ManifestWork or ManifestWorkReplicaSet write.
    pub(super) async fn guard_delivery(
        &self,
        request: &AdmissionRequest,
        object: &Value,
        carrier: Carrier,
    ) -> (AdmissionResponse, Outcome) {
        let uid = request.uid.as_str();
        let changed = delivered_manifests(request, object, carrier);
        let member = carrier.member(request.namespace.as_deref().unwrap_or_default());
        // A Karmada Work outside an execution namespace delivers nowhere.
        let delivers = member.is_some() || carrier == Carrier::ManifestWorkReplicaSet;
        if changed.is_empty() || !delivers {
            return (AdmissionResponse::allow(uid), Outcome::Skipped);
        }
        let bounds = match self.manifest_bounds(&changed).await {
            Ok(bounds) => bounds,
            Err(failure) => return self.guard(request, failure),
        };
        let mut refused = Vec::new();
        let mut placed = Vec::new();
        for (manifest, bound) in changed.iter().zip(bounds) {
            match (bound, &member) {
                (Err(refusal), _) => refused.push(format!("{}: {refusal}", describe(manifest))),
                (Ok(bound), Some(member)) if !allows(&bound, member) => refused.push(format!(
                    "{} may not run on {member}: the placement policy allows it {bound}",
                    describe(manifest)
                )),
                (Ok(bound), _) => placed.push((*manifest, bound)),
            }
        }
        if !refused.is_empty() {
            return self.deny_delivery(request, object, carrier, member.as_deref(), &refused);
        }
        let response = AdmissionResponse::allow(uid);
        if carrier != Carrier::ManifestWorkReplicaSet {
            return (response, Outcome::Unchanged);
        }
        match self.decided_elsewhere(request, object, &placed).await {
            Some(warning) => (response.with_warning(warning), Outcome::Tolerated),
            None => (response, Outcome::Unchanged),
        }
    }

    /// The denial of a delivery for the manifests `refused` (each with why),
    /// with its Event.
    fn deny_delivery(
        &self,
        request: &AdmissionRequest,
        object: &Value,
        carrier: Carrier,
        member: Option<&str>,
        refused: &[String],
    ) -> (AdmissionResponse, Outcome) {
        let target = match member {
            Some(member) => format!(" to {member}"),
            None => String::new(),
        };
        let made_by = replica_set_of(carrier, object);
        let of = match &made_by {
            Some(set) => format!(
                " (of ManifestWorkReplicaSet {}/{})",
                set.namespace.as_deref().unwrap_or_default(),
                set.name.as_deref().unwrap_or_default()
            ),
            None => String::new(),
        };
        let message = bounded(format!(
            "placement-policy: {} {}{of} may not deliver{target}: {}",
            carrier.kind(),
            named(request, object),
            refused.join("; ")
        ));
        // A ManifestWork its ManifestWorkReplicaSet writes is never
        // stored: the Event goes where its tenant looks.
        match made_by {
            Some(set) => self
                .events
                .emit_about(request, set, DELIVERY_DENIED, &message),
            None => self.events.emit(request, DELIVERY_DENIED, &message),
        }
        (
            AdmissionResponse::deny(request.uid.as_str(), 403, "Forbidden", message),
            Outcome::Denied,
        )
    }

    /// The clusters each of `manifests` may run on, or why none; `Err` when
    /// no decision can be had.
    async fn manifest_bounds(
        &self,
        manifests: &[&Value],
    ) -> Result<Vec<Result<Bound, Refusal>>, PlacementFailure> {
        let deadline = Instant::now() + self.settings.engine_deadline;
        let keys = self.keys()?;
        let mut bounds = Vec::with_capacity(manifests.len());
        for manifest in manifests {
            let input = PolicyInput::from(manifest_input(manifest, &keys));
            let decision = self.query(&input, deadline).await?;
            bounds.push(allowed(manifest, &decision));
        }
        Ok(bounds)
    }

    /// For a ManifestWorkReplicaSet: the clusters its Placements decided that
    /// one of its manifests (`placed`, each with the clusters allowed it) may
    /// not run on, as a warning; `None` when there are none or they cannot be
    /// read (the ManifestWorks are checked on their own anyway).
    async fn decided_elsewhere(
        &self,
        request: &AdmissionRequest,
        object: &Value,
        placed: &[(&Value, Bound)],
    ) -> Option<String> {
        let client = self.guardrail.client()?;
        let namespace = request.namespace.as_deref()?;
        let decisions_type = ApiResource::from_gvk(&GroupVersionKind::gvk(
            "cluster.open-cluster-management.io",
            "v1beta1",
            "PlacementDecision",
        ));
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), namespace, &decisions_type);
        let mut notes = Vec::new();
        let placements = object
            .pointer("/spec/placementRefs")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|r| r.get("name").and_then(Value::as_str));
        for placement in placements {
            let selector = format!("{PLACEMENT_LABEL}={placement}");
            let list = match api.list(&ListParams::default().labels(&selector)).await {
                Ok(list) => list,
                Err(e) => {
                    tracing::debug!(placement, error = %e, "cannot read a Placement's decisions");
                    continue;
                }
            };
            let decided: BTreeSet<String> = list
                .items
                .iter()
                .filter_map(|d| {
                    d.data
                        .pointer("/status/decisions")
                        .and_then(Value::as_array)
                })
                .flatten()
                .filter_map(|d| d.get("clusterName").and_then(Value::as_str))
                .map(str::to_owned)
                .collect();
            for (manifest, bound) in placed {
                let forbidden: Vec<&str> = decided
                    .iter()
                    .filter(|c| !allows(bound, c))
                    .map(String::as_str)
                    .collect();
                if !forbidden.is_empty() {
                    notes.push(format!(
                        "Placement {placement} decides {}, where {} may not run (the placement policy allows it {bound}): its ManifestWorks there will be refused",
                        forbidden.join(", "),
                        describe(manifest)
                    ));
                }
            }
        }
        (!notes.is_empty()).then(|| bounded(format!("placement-policy: {}", notes.join("; "))))
    }

    /// A binding write in validation: every member it adds must be allowed
    /// its template. Karmada-scheduler's results, a user's patch of
    /// `spec.clusters`, a binding written by hand and placement-sync's own
    /// schedules all pass here.
    pub(super) async fn guard_binding_delivery(
        &self,
        request: &AdmissionRequest,
        object: &Value,
    ) -> (AdmissionResponse, Outcome) {
        let uid = request.uid.as_str();
        let stored = match request.operation {
            Operation::Update => request.old_object.as_ref(),
            _ => None,
        };
        let added = added_clusters(object, stored);
        if added.is_empty() {
            return (AdmissionResponse::allow(uid), Outcome::Skipped);
        }
        // An error never widens: without a usable answer an UPDATE may
        // deliver within what was allowed before, a CREATE nowhere.
        let (bound, why) = match self.binding_decision(request, object).await {
            Ok((decision, template)) => match allowed(&template, &decision) {
                Ok(bound) => (bound, None),
                Err(refusal) => (
                    guardrail::fallback_bound(request),
                    Some(refusal.to_string()),
                ),
            },
            Err(failure) => {
                let fallback = guardrail::fallback_bound(request);
                if added.iter().all(|member| allows(&fallback, member)) {
                    self.count_engine_error(&failure);
                    return (AdmissionResponse::allow(uid), Outcome::Tolerated);
                }
                return self.guard(request, failure);
            }
        };
        let forbidden: Vec<&str> = added
            .iter()
            .filter(|member| !allows(&bound, member))
            .map(String::as_str)
            .collect();
        if forbidden.is_empty() {
            return (AdmissionResponse::allow(uid), Outcome::Unchanged);
        }
        let template = object
            .pointer("/spec/resource")
            .map(|r| {
                format!(
                    "{} {}",
                    r.get("kind").and_then(Value::as_str).unwrap_or("template"),
                    [r.get("namespace"), r.get("name")]
                        .iter()
                        .filter_map(|v| v.and_then(Value::as_str))
                        .collect::<Vec<_>>()
                        .join("/")
                )
            })
            .unwrap_or_else(|| "its template".to_owned());
        let reason = match why {
            Some(why) => format!("no new member may be given it, because {why}"),
            None => format!("the placement policy allows it {bound}"),
        };
        let message = bounded(format!(
            "placement-policy: binding {} may not deliver {template} to {}: {reason}",
            named(request, object),
            forbidden.join(", ")
        ));
        self.events.emit(request, DELIVERY_DENIED, &message);
        (
            AdmissionResponse::deny(uid, 403, "Forbidden", message),
            Outcome::Denied,
        )
    }
}

/// The manifests a write adds or changes. A ManifestWorkReplicaSet given
/// other Placements delivers all its manifests to their clusters: each is
/// looked at again (and the warning names the clusters they decide).
fn delivered_manifests<'a>(
    request: &AdmissionRequest,
    object: &'a Value,
    carrier: Carrier,
) -> Vec<&'a Value> {
    let stored = match request.operation {
        Operation::Update => request.old_object.as_ref(),
        _ => None,
    };
    if carrier == Carrier::ManifestWorkReplicaSet
        && stored.is_some_and(|s| {
            s.pointer("/spec/placementRefs") != object.pointer("/spec/placementRefs")
        })
    {
        return carrier.manifests(object).iter().collect();
    }
    carrier.changed_manifests(object, stored)
}

/// The reviewed object as a message names it: `namespace/name`, or `name`
/// (`prefix*` for a name yet to be generated).
fn named(request: &AdmissionRequest, object: &Value) -> String {
    let field = |pointer: &str| {
        object
            .pointer(pointer)
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
    };
    let name = request
        .name
        .as_deref()
        .filter(|n| !n.is_empty())
        .or_else(|| field("/metadata/name"))
        .map(str::to_owned)
        .or_else(|| field("/metadata/generateName").map(|prefix| format!("{prefix}*")))
        .unwrap_or_else(|| "(unnamed)".to_owned());
    match request.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name,
    }
}

/// OCM's label on the ManifestWorks a ManifestWorkReplicaSet writes:
/// `<namespace>.<name>` of the ManifestWorkReplicaSet.
const REPLICA_SET_LABEL: &str = "work.open-cluster-management.io/manifestworkreplicaset";

/// The ManifestWorkReplicaSet that wrote ManifestWork `object`, by OCM's
/// label (namespaces have no dots, so the first one divides).
fn replica_set_of(carrier: Carrier, object: &Value) -> Option<ObjectReference> {
    if carrier != Carrier::ManifestWork {
        return None;
    }
    let label = object
        .pointer("/metadata/labels")?
        .get(REPLICA_SET_LABEL)?
        .as_str()?;
    let (namespace, name) = label.split_once('.')?;
    (!namespace.is_empty() && !name.is_empty()).then(|| ObjectReference {
        api_version: Some("work.open-cluster-management.io/v1alpha1".to_owned()),
        kind: Some("ManifestWorkReplicaSet".to_owned()),
        name: Some(name.to_owned()),
        namespace: Some(namespace.to_owned()),
        ..ObjectReference::default()
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_manifestwork_names_the_replica_set_that_wrote_it() {
        let written = json!({"metadata": {"generateName": "web", "labels": {
            REPLICA_SET_LABEL: "shop.web",
            "work.open-cluster-management.io/placement": "eu"}}});
        let set = replica_set_of(Carrier::ManifestWork, &written).expect("its writer");
        assert_eq!(set.kind.as_deref(), Some("ManifestWorkReplicaSet"));
        assert_eq!(set.namespace.as_deref(), Some("shop"));
        assert_eq!(set.name.as_deref(), Some("web"));
        // A dotted name: the namespace ends at the first dot.
        let dotted = json!({"metadata": {"labels": {REPLICA_SET_LABEL: "shop.web.v2"}}});
        let set = replica_set_of(Carrier::ManifestWork, &dotted).expect("its writer");
        assert_eq!(set.name.as_deref(), Some("web.v2"));
        for other in [
            json!({"metadata": {"name": "by-hand"}}),
            json!({"metadata": {"labels": {REPLICA_SET_LABEL: "nodot"}}}),
            json!({"metadata": {"labels": {REPLICA_SET_LABEL: ".web"}}}),
        ] {
            assert!(
                replica_set_of(Carrier::ManifestWork, &other).is_none(),
                "{other}"
            );
        }
        assert!(replica_set_of(Carrier::KarmadaWork, &written).is_none());
    }
}
