//! Karmada bindings and the policy: what the policy sees of a binding, the
//! input of its resource template's decision, the clusters that decision
//! allows, and the guardrail's narrowing of a binding's placement to them.
//!
//! One module for the webhook (which narrows every binding write it admits)
//! and placement-sync (which has bindings admitted again when the answer
//! changes, and schedules the bindings handed to it), so both read the same
//! decision the same way.
//!
//! **The guardrail** leaves karmada-scheduler every feature (spread
//! constraints, fall-back groups, tolerations, weights, the estimator,
//! failover) and bounds only which clusters it may choose: the cluster names
//! of `clusterAffinity` and of every `clusterAffinities` term (and of each
//! term's `overflowAffinities`) become the user's names intersected with the
//! allowed set, or the allowed set where the user named none. Allow-lists,
//! never exclude-lists: a member that joins later is no candidate until the
//! policy allows it. An affinity left with no allowed cluster names
//! [`NO_CLUSTER`], a name no Karmada cluster can have (an empty `clusterNames`
//! would mean "any cluster" to Karmada). Everything else the user wrote stays.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Mutex;

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::discovery::{Scope, pinned_kind};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::decision::Decision;
use crate::input::{BINDING_INPUT_KEY, RequestMeta, policy_input};
use crate::ownership_keys::OwnershipKeys;

/// The API group of Karmada's bindings.
pub const BINDING_GROUP: &str = "work.karmada.io";

/// The kinds of Karmada's bindings.
pub const BINDING_KINDS: [&str; 2] = ["ResourceBinding", "ClusterResourceBinding"];

/// The placement the policy decides for a template: Federation v1's
/// replica-set preferences, whose `clusters` name the clusters it allows.
pub const PREFERENCES_ANNOTATION: &str = "federation.kubernetes.io/replica-set-preferences";

/// The guardrail's record on a binding of the clusters the policy allowed
/// when it last narrowed it: the names, comma-separated and sorted (empty:
/// none), or `*` when the policy bounds nothing for its template. A decision
/// that cannot be used (errors, an engine down) narrows by this record, so it
/// never widens what is stored.
pub const ALLOWED_CLUSTERS_ANNOTATION: &str = "placement-policy.io/allowed-clusters";

/// The cluster name an affinity with no allowed cluster names: it contains a
/// `/`, which no Karmada cluster name can (they are DNS labels), so the
/// affinity matches no cluster, now or later.
pub const NO_CLUSTER: &str = "placement-policy.io/no-cluster-allowed";

/// Whether `group`/`kind` is one of Karmada's bindings.
pub fn is_binding(group: &str, kind: &str) -> bool {
    group == BINDING_GROUP && BINDING_KINDS.contains(&kind)
}

/// What the policy sees of a binding (`input._binding`): its name, namespace
/// and spec, without `placement` and `clusters`. The policy bounds where a
/// workload may run; it does not read the user's placement or Karmada's
/// choice, so the webhook admitting any write of a binding and placement-sync
/// reading it as stored get the same answer.
pub fn binding_view(raw: &Value) -> Value {
    let mut metadata = Map::new();
    for key in ["name", "namespace"] {
        if let Some(v) = raw.pointer(&format!("/metadata/{key}")) {
            metadata.insert(key.to_owned(), v.clone());
        }
    }
    let mut spec = raw.get("spec").cloned().unwrap_or(Value::Null);
    if let Value::Object(fields) = &mut spec {
        fields.remove("placement");
        fields.remove("clusters");
    }
    json!({
        "apiVersion": raw.get("apiVersion").cloned().unwrap_or(Value::Null),
        "kind": raw.get("kind").cloned().unwrap_or(Value::Null),
        "metadata": metadata,
        "spec": spec,
    })
}

/// The policy input for a binding's resource `template` (of type
/// `resource`): the template in the developer's view, as an `UPDATE` of the
/// template as stored by no particular user (the template's own writer is
/// not known where bindings are decided), plus `binding` under
/// `input._binding` ([`binding_view`]).
pub fn template_input(
    template: &Value,
    resource: &ApiResource,
    binding: &Value,
    keys: &OwnershipKeys,
) -> Value {
    let kind = json!({"group": resource.group, "version": resource.version, "kind": resource.kind});
    let gvr =
        json!({"group": resource.group, "version": resource.version, "resource": resource.plural});
    let mut input = policy_input(
        template,
        &RequestMeta {
            uid: "",
            operation: "UPDATE",
            kind: &kind,
            resource: &gvr,
            namespace: template
                .pointer("/metadata/namespace")
                .and_then(Value::as_str),
            name: template.pointer("/metadata/name").and_then(Value::as_str),
            user_info: &json!({}),
            dry_run: false,
            old_object: Some(template),
            keys,
        },
    );
    if let Value::Object(map) = &mut input {
        map.insert(BINDING_INPUT_KEY.to_owned(), binding_view(binding));
    }
    input
}

/// The clusters a policy allows a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bound {
    /// The policy places no such template (no preferences), or allows any
    /// cluster (`"*"`): nothing to narrow.
    Any,
    /// These clusters only (none: no cluster at all).
    Clusters(BTreeSet<String>),
}

impl Bound {
    /// The record of this bound ([`ALLOWED_CLUSTERS_ANNOTATION`]).
    pub fn record(&self) -> String {
        match self {
            Bound::Any => "*".to_owned(),
            Bound::Clusters(names) => names
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join(","),
        }
    }

    /// The bound a record says; `None` for a value the guardrail never writes.
    pub fn from_record(record: &str) -> Option<Bound> {
        if record == "*" {
            return Some(Bound::Any);
        }
        let names: BTreeSet<String> = record
            .split(',')
            .filter(|n| !n.is_empty())
            .map(str::to_owned)
            .collect();
        names
            .iter()
            .all(|n| valid_cluster_name(n))
            .then_some(Bound::Clusters(names))
    }
}

impl std::fmt::Display for Bound {
    /// As a message says it: `any cluster`, `no cluster`, or the names.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Bound::Any => f.write_str("any cluster"),
            Bound::Clusters(names) if names.is_empty() => f.write_str("no cluster"),
            Bound::Clusters(names) => {
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                f.write_str(&names.join(", "))
            }
        }
    }
}

/// A Karmada cluster name: a DNS label (what Karmada's API accepts).
fn valid_cluster_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// The decision's placement cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BoundError {
    #[error("the policy's {PREFERENCES_ANNOTATION} cannot be read: {0}")]
    Unreadable(String),
    #[error("the policy's {PREFERENCES_ANNOTATION} names {0:?}, which is no cluster name")]
    InvalidName(String),
}

/// The clusters an error-free `decision` allows: the clusters its
/// replica-set preferences name (the policy's value, not the developer's).
pub fn bound(decision: &Decision) -> Result<Bound, BoundError> {
    let Some(preferences) = decision.annotations.get(PREFERENCES_ANNOTATION) else {
        return Ok(Bound::Any);
    };
    let parsed: Value =
        serde_json::from_str(preferences).map_err(|e| BoundError::Unreadable(e.to_string()))?;
    let Some(clusters) = parsed.get("clusters").and_then(Value::as_object) else {
        return Err(BoundError::Unreadable(
            "it has no object \"clusters\"".to_owned(),
        ));
    };
    if clusters.contains_key("*") {
        return Ok(Bound::Any);
    }
    let mut names = BTreeSet::new();
    for name in clusters.keys() {
        if !valid_cluster_name(name) {
            return Err(BoundError::InvalidName(name.clone()));
        }
        names.insert(name.clone());
    }
    Ok(Bound::Clusters(names))
}

/// The bound of a stored binding, for a decision that cannot be used (errors,
/// undefined, an engine down): its record; without one (a binding the
/// guardrail never admitted), the clusters it runs on now. So a write never
/// widens what is stored, and a placement is never lost to an error.
pub fn stored_bound(stored: &Value) -> Bound {
    stored
        .pointer(&format!(
            "/metadata/annotations/{}",
            ALLOWED_CLUSTERS_ANNOTATION.replace('/', "~1")
        ))
        .and_then(Value::as_str)
        .and_then(Bound::from_record)
        .unwrap_or_else(|| Bound::Clusters(scheduled_clusters(stored)))
}

/// The names of a binding's `spec.clusters`.
pub fn scheduled_clusters(binding: &Value) -> BTreeSet<String> {
    binding
        .pointer("/spec/clusters")
        .and_then(Value::as_array)
        .map(|clusters| {
            clusters
                .iter()
                .filter_map(|c| c.get("name").and_then(Value::as_str))
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// `placement` (a binding's or a PropagationPolicy's `spec.placement`)
/// narrowed to `bound` (see the module documentation). Narrowing is
/// idempotent, and narrowing twice is narrowing by the intersection.
pub fn narrow(placement: &Value, bound: &Bound) -> Value {
    let Bound::Clusters(allowed) = bound else {
        return placement.clone();
    };
    let mut narrowed = match placement {
        Value::Object(_) => placement.clone(),
        _ => json!({}),
    };
    let has_terms = narrowed
        .get("clusterAffinities")
        .and_then(Value::as_array)
        .is_some_and(|terms| !terms.is_empty());
    if has_terms {
        if let Some(terms) = narrowed
            .get_mut("clusterAffinities")
            .and_then(Value::as_array_mut)
        {
            for term in terms {
                narrow_affinity(term, allowed);
                if let Some(overflows) = term
                    .get_mut("overflowAffinities")
                    .and_then(Value::as_array_mut)
                {
                    for overflow in overflows {
                        narrow_affinity(overflow, allowed);
                    }
                }
            }
        }
    } else {
        let affinity = narrowed
            .as_object_mut()
            .expect("an object")
            .entry("clusterAffinity")
            .or_insert_with(|| json!({}));
        if !affinity.is_object() {
            *affinity = json!({});
        }
        narrow_affinity(affinity, allowed);
    }
    narrowed
}

/// One `ClusterAffinity`'s `clusterNames`: the user's names that are allowed
/// (in the user's order), or every allowed name when the user named none;
/// [`NO_CLUSTER`] when nothing is left.
fn narrow_affinity(affinity: &mut Value, allowed: &BTreeSet<String>) {
    let Value::Object(fields) = affinity else {
        return;
    };
    let requested: Vec<String> = fields
        .get("clusterNames")
        .and_then(Value::as_array)
        .map(|names| {
            names
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    let mut names: Vec<String> = if requested.is_empty() {
        allowed.iter().cloned().collect()
    } else {
        requested
            .into_iter()
            .filter(|name| allowed.contains(name))
            .collect()
    };
    if names.is_empty() {
        names.push(NO_CLUSTER.to_owned());
    }
    fields.insert("clusterNames".to_owned(), json!(names));
}

/// `binding` with its placement narrowed from `requested` to `bound`, and the
/// record of `bound`.
pub fn guarded(binding: &Value, requested: &Value, bound: &Bound) -> Value {
    let mut guarded = binding.clone();
    if let Some(spec) = guarded.get_mut("spec").and_then(Value::as_object_mut) {
        spec.insert("placement".to_owned(), narrow(requested, bound));
    }
    if let Some(metadata) = guarded.get_mut("metadata").and_then(Value::as_object_mut) {
        let annotations = metadata.entry("annotations").or_insert_with(|| json!({}));
        if !annotations.is_object() {
            *annotations = json!({});
        }
        annotations[ALLOWED_CLUSTERS_ANNOTATION] = json!(bound.record());
    }
    guarded
}

/// The PropagationPolicy or ClusterPropagationPolicy that made a binding, as
/// Karmada's detector names it in the binding's annotations:
/// `(Some(namespace), name)` or `(None, name)`.
pub fn propagation_policy(binding: &Value) -> Option<(Option<String>, String)> {
    let annotation = |key: &str| {
        binding
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(key))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    if let (Some(namespace), Some(name)) = (
        annotation("propagationpolicy.karmada.io/namespace"),
        annotation("propagationpolicy.karmada.io/name"),
    ) {
        return Some((Some(namespace), name));
    }
    annotation("clusterpropagationpolicy.karmada.io/name").map(|name| (None, name))
}

/// The resource template a binding propagates (`spec.resource`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateRef {
    pub api_version: String,
    pub kind: String,
    #[serde(default)]
    pub namespace: Option<String>,
    pub name: String,
    #[serde(default)]
    pub uid: String,
    #[serde(default)]
    pub resource_version: String,
}

impl TemplateRef {
    /// The template of `binding`; `None` when it names none.
    pub fn of(binding: &Value) -> Option<TemplateRef> {
        serde_json::from_value(binding.pointer("/spec/resource")?.clone()).ok()
    }
}

/// A binding's template cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("cannot find the API of {api_version} {kind}: {reason}")]
    Discovery {
        api_version: String,
        kind: String,
        reason: String,
    },
    #[error("cannot read {kind} {name}: {source}")]
    Read {
        kind: String,
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// Reads bindings' resource templates from the API server, their resource
/// types found by discovery once each. A template read is kept by its UID and
/// resourceVersion: a binding names the version of its template it was built
/// from (`spec.resource.resourceVersion`), and Karmada's detector rewrites a
/// binding from the same version on every reconcile, so those writes need no
/// read ([`Templates::get_version`]; a version's content never changes).
pub struct Templates {
    client: kube::Client,
    /// `(apiVersion, kind)` -> the type and whether it is namespaced.
    types: Mutex<HashMap<(String, String), (ApiResource, bool)>>,
    versions: Mutex<Versions>,
}

/// How much the templates kept by version may take (their JSON, in bytes).
const KEPT_VERSIONS_BYTES: usize = 8 * 1024 * 1024;

/// Templates by `(uid, resourceVersion)`, the oldest dropped first beyond a
/// byte budget.
struct Versions {
    kept: HashMap<(String, String), (Value, ApiResource, usize)>,
    order: VecDeque<(String, String)>,
    bytes: usize,
    budget: usize,
}

impl Versions {
    fn new(budget: usize) -> Versions {
        Versions {
            kept: HashMap::new(),
            order: VecDeque::new(),
            bytes: 0,
            budget,
        }
    }

    fn get(&self, uid: &str, version: &str) -> Option<(Value, ApiResource)> {
        self.kept
            .get(&(uid.to_owned(), version.to_owned()))
            .map(|(value, resource, _)| (value.clone(), resource.clone()))
    }

    /// Keep `value` (of `size` bytes) unless it alone is over the budget.
    fn keep(
        &mut self,
        uid: String,
        version: String,
        value: Value,
        resource: ApiResource,
        size: usize,
    ) {
        if size > self.budget || uid.is_empty() || version.is_empty() {
            return;
        }
        let key = (uid, version);
        if self.kept.contains_key(&key) {
            return;
        }
        while self.bytes + size > self.budget {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            if let Some((_, _, freed)) = self.kept.remove(&oldest) {
                self.bytes -= freed;
            }
        }
        self.bytes += size;
        self.order.push_back(key.clone());
        self.kept.insert(key, (value, resource, size));
    }
}

impl std::fmt::Debug for Templates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Templates").finish_non_exhaustive()
    }
}

impl Templates {
    pub fn new(client: kube::Client) -> Templates {
        Templates {
            client,
            types: Mutex::default(),
            versions: Mutex::new(Versions::new(KEPT_VERSIONS_BYTES)),
        }
    }

    /// The resource type of `api_version`/`kind`, and whether it is namespaced.
    pub async fn resource(
        &self,
        api_version: &str,
        kind: &str,
    ) -> Result<(ApiResource, bool), TemplateError> {
        let id = (api_version.to_owned(), kind.to_owned());
        if let Some(found) = self
            .types
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
        {
            return Ok(found.clone());
        }
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (resource, capabilities) =
            pinned_kind(&self.client, &gvk)
                .await
                .map_err(|e| TemplateError::Discovery {
                    api_version: api_version.to_owned(),
                    kind: kind.to_owned(),
                    reason: e.to_string(),
                })?;
        let found = (resource, capabilities.scope == Scope::Namespaced);
        self.types
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, found.clone());
        Ok(found)
    }

    /// The version of the template `template` names, when it was read
    /// before, else [`Templates::get`]. Only for a reference the writer of
    /// the binding cannot choose (a stored binding's, or one a write leaves as
    /// stored): an old version may allow what the current one does not.
    pub async fn get_version(
        &self,
        template: &TemplateRef,
    ) -> Result<Option<(Value, ApiResource)>, TemplateError> {
        let kept = self
            .versions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&template.uid, &template.resource_version);
        match kept {
            Some(kept) => Ok(Some(kept)),
            None => self.get(template).await,
        }
    }

    /// The template as stored now (without `managedFields`), with its type;
    /// `None` when it is gone.
    pub async fn get(
        &self,
        template: &TemplateRef,
    ) -> Result<Option<(Value, ApiResource)>, TemplateError> {
        let versions = || self.versions.lock().unwrap_or_else(|e| e.into_inner());
        let (resource, namespaced) = self.resource(&template.api_version, &template.kind).await?;
        let api: Api<DynamicObject> = match (&template.namespace, namespaced) {
            (Some(ns), true) => Api::namespaced_with(self.client.clone(), ns, &resource),
            _ => Api::all_with(self.client.clone(), &resource),
        };
        let Some(mut object) =
            api.get_opt(&template.name)
                .await
                .map_err(|source| TemplateError::Read {
                    kind: template.kind.clone(),
                    name: template.name.clone(),
                    source,
                })?
        else {
            return Ok(None);
        };
        object.metadata.managed_fields = None;
        let mut value = serde_json::to_value(&object).unwrap_or(Value::Null);
        if let Value::Object(map) = &mut value {
            map.insert("apiVersion".to_owned(), json!(resource.api_version));
            map.insert("kind".to_owned(), json!(resource.kind));
        }
        let uid = object.metadata.uid.clone().unwrap_or_default();
        let version = object.metadata.resource_version.clone().unwrap_or_default();
        let size = serde_json::to_vec(&value).map_or(usize::MAX, |v| v.len());
        versions().keep(uid, version, value.clone(), resource.clone(), size);
        Ok(Some((value, resource)))
    }
}

#[cfg(test)]
mod tests;
