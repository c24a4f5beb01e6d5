//! Where the policy, within what the user's placement selects, puts a
//! binding: its clusters and their replicas, or why it cannot.

use std::borrow::Cow;
use std::collections::BTreeMap;

use policy_client::decision::Decision;
use policy_client::engine::QueryOutcome;
use policy_client::karmada::PREFERENCES_ANNOTATION;
use policy_client::ownership_keys::OwnershipKeys;
use policy_client::placement::desired_annotations;
use serde::Deserialize;
use serde_json::{Value, json};

use super::model::{Binding, Reason, TargetCluster};
use crate::reconcile::karmada::affinity::{matches, untolerated_taint};
use crate::reconcile::karmada::division::{ClusterPreference, DivisionError, divide};

/// Where the policy puts a binding: its clusters, or why it cannot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Placement {
    Clusters {
        clusters: Vec<TargetCluster>,
        /// The `clusterAffinities` term they were chosen from (Karmada's
        /// `schedulerObservingAffinityName`), when the placement has terms.
        affinity: Option<String>,
    },
    Failed {
        reason: Reason,
        message: String,
    },
}

impl Placement {
    fn failed(reason: Reason, message: impl Into<String>) -> Placement {
        Placement::Failed {
            reason,
            message: message.into(),
        }
    }
}

/// The placement the decision gives `binding`. `template` is the resource
/// template as stored; `clusters` are Karmada's Cluster objects replicated,
/// by name, when they are (the policy may name no others; the user's
/// placement selects among them by their labels, fields and taints).
pub(crate) fn placement(
    binding: &Binding,
    template: &Value,
    outcome: &QueryOutcome,
    keys: &OwnershipKeys,
    clusters: Option<&BTreeMap<String, Value>>,
) -> Option<Placement> {
    let result = match outcome {
        // No decision yet (the engine is not in sync): nothing to write.
        QueryOutcome::Undefined => return None,
        QueryOutcome::Defined(result) => result,
    };
    let decision = match Decision::from_result(result) {
        Ok(decision) => decision,
        Err(e) => return Some(Placement::failed(Reason::SchedulerError, e.to_string())),
    };
    // A decision with errors never changes a placement: the binding keeps
    // its clusters, and its condition says why it is not scheduled.
    if decision.is_denied() {
        return Some(Placement::failed(
            Reason::NoClusterFit,
            decision.errors.join("; "),
        ));
    }
    // The template's annotations as the webhook would write them: the
    // policy's values over the developer's.
    let annotations = match desired_annotations(template, &decision, keys) {
        Ok(a) => a,
        Err(e) => return Some(Placement::failed(Reason::SchedulerError, e.to_string())),
    };
    let Some(preferences) = annotations.get(PREFERENCES_ANNOTATION) else {
        return Some(Placement::failed(
            Reason::NoClusterFit,
            format!(
                "the placement policy gives this {} no placement (no {PREFERENCES_ANNOTATION})",
                binding.spec.resource.kind
            ),
        ));
    };
    Some(clusters_from(
        binding,
        preferences,
        clusters,
        decision.policy_weights,
    ))
}

#[derive(Debug, Deserialize)]
struct ReplicaSetPreferences {
    clusters: BTreeMap<String, ClusterPreference>,
}

/// Where guardrail mode is the answer: a field of the user's placement this
/// scheduler does not implement, named.
fn unimplemented_field(placement: &Value, workload: bool) -> Option<&'static str> {
    let present = |pointer: &str| {
        placement
            .pointer(pointer)
            .is_some_and(|v| !v.is_null() && v.as_array().is_none_or(|a| !a.is_empty()))
    };
    if present("/spreadConstraints") {
        return Some("spreadConstraints");
    }
    if present("/workloadAffinity") {
        return Some("workloadAffinity");
    }
    if let Some(terms) = placement.get("clusterAffinities").and_then(Value::as_array)
        && terms.iter().any(|t| {
            t.get("overflowAffinities")
                .and_then(Value::as_array)
                .is_some_and(|o| !o.is_empty())
        })
    {
        return Some("clusterAffinities[].overflowAffinities");
    }
    if !workload {
        return None;
    }
    if present("/replicaScheduling/weightPreference/dynamicWeight") {
        return Some("replicaScheduling.weightPreference.dynamicWeight");
    }
    let divided = placement
        .pointer("/replicaScheduling/replicaSchedulingType")
        .and_then(Value::as_str)
        == Some("Divided");
    let aggregated = placement
        .pointer("/replicaScheduling/replicaDivisionPreference")
        .and_then(Value::as_str)
        == Some("Aggregated");
    (divided && aggregated).then_some("replicaScheduling.replicaDivisionPreference: Aggregated")
}

fn clusters_from(
    binding: &Binding,
    preferences: &str,
    clusters: Option<&BTreeMap<String, Value>>,
    policy_weights: bool,
) -> Placement {
    let preferences = match policy_clusters(preferences, clusters) {
        Ok(preferences) => preferences,
        Err(failed) => return failed,
    };
    let user = binding.spec.placement.clone().unwrap_or(Value::Null);
    if let Some(field) = unimplemented_field(&user, binding.is_workload()) {
        return Placement::failed(
            Reason::SchedulerError,
            format!(
                "placement-policy's scheduler does not implement {field}: run this PropagationPolicy with karmada-scheduler and placement-policy's guardrail (docs/karmada.md#guardrail-mode), which keeps every karmada-scheduler feature within the clusters the policy allows"
            ),
        );
    }
    let preferences = match not_evicted_from(binding, preferences) {
        Ok(preferences) => preferences,
        Err(failed) => return failed,
    };
    let (preferences, affinity) = match users_choice(binding, &user, preferences, clusters) {
        Ok(chosen) => chosen,
        Err(message) => return Placement::failed(Reason::NoClusterFit, message),
    };
    match with_replicas(binding, &user, preferences, clusters, policy_weights) {
        Ok(clusters) => Placement::Clusters { clusters, affinity },
        Err(failed) => failed,
    }
}

/// The clusters of the policy's preferences annotation, each a cluster
/// Karmada has (when its clusters are replicated).
fn policy_clusters(
    preferences: &str,
    clusters: Option<&BTreeMap<String, Value>>,
) -> Result<BTreeMap<String, ClusterPreference>, Placement> {
    let preferences = match serde_json::from_str::<ReplicaSetPreferences>(preferences) {
        Ok(p) => p.clusters,
        Err(e) => {
            return Err(Placement::failed(
                Reason::SchedulerError,
                format!("the policy's {PREFERENCES_ANNOTATION} cannot be read: {e}"),
            ));
        }
    };
    if preferences.contains_key("*") {
        return Err(Placement::failed(
            Reason::SchedulerError,
            format!(
                "the policy's {PREFERENCES_ANNOTATION} uses the \"*\" cluster, which a Karmada binding cannot take: name the clusters"
            ),
        ));
    }
    if let Some(known) = clusters {
        let unknown: Vec<&str> = preferences
            .keys()
            .filter(|name| !known.contains_key(*name))
            .map(String::as_str)
            .collect();
        if !unknown.is_empty() {
            return Err(Placement::failed(
                Reason::SchedulerError,
                format!(
                    "the policy names clusters Karmada does not have: {}",
                    unknown.join(", ")
                ),
            ));
        }
    }
    Ok(preferences)
}

/// Clusters being evicted from are no candidates (Karmada's
/// ClusterEviction filter).
fn not_evicted_from(
    binding: &Binding,
    mut preferences: BTreeMap<String, ClusterPreference>,
) -> Result<BTreeMap<String, ClusterPreference>, Placement> {
    for task in &binding.spec.graceful_eviction_tasks {
        preferences.remove(&task.from_cluster);
    }
    if preferences.is_empty() {
        return Err(Placement::failed(
            Reason::NoClusterFit,
            "every cluster the policy allows is being evicted from",
        ));
    }
    Ok(preferences)
}

/// The chosen clusters with their replicas: none for a non-workload, all for
/// a duplicated workload, divided by weight for a divided one.
fn with_replicas(
    binding: &Binding,
    user: &Value,
    preferences: BTreeMap<String, ClusterPreference>,
    clusters: Option<&BTreeMap<String, Value>>,
    policy_weights: bool,
) -> Result<Vec<TargetCluster>, Placement> {
    let each_with = |replicas: i32| {
        preferences
            .keys()
            .map(|name| TargetCluster {
                name: name.clone(),
                replicas,
            })
            .collect()
    };
    if !binding.is_workload() {
        // Non-workloads go to every cluster, without replicas.
        return Ok(each_with(0));
    }
    if !binding.is_divided_workload() {
        // Duplicated: every cluster runs all replicas.
        return Ok(each_with(binding.spec.replicas));
    }
    let preferences = if policy_weights {
        preferences
    } else {
        with_static_weights(user, preferences, clusters)
    };
    match divide(
        binding.spec.replicas,
        &preferences,
        &binding.spec.resource.uid,
    ) {
        Ok(division) => Ok(division
            .into_iter()
            .map(|(name, replicas)| TargetCluster { name, replicas })
            .collect()),
        Err(e @ DivisionError::Negative { .. }) => {
            Err(Placement::failed(Reason::SchedulerError, e.to_string()))
        }
        Err(e) => Err(Placement::failed(Reason::Unschedulable, e.to_string())),
    }
}

/// A cluster as replicated, or only its name when it is not.
fn cluster_object<'a>(clusters: Option<&'a BTreeMap<String, Value>>, name: &str) -> Cow<'a, Value> {
    match clusters.and_then(|c| c.get(name)) {
        Some(cluster) => Cow::Borrowed(cluster),
        None => Cow::Owned(json!({"metadata": {"name": name}})),
    }
}

/// The policy's clusters the user's placement selects (karmada-scheduler's
/// filters inside the policy's allowed set): its `clusterAffinity`, or the
/// first of its `clusterAffinities` terms (from the one observed last, as
/// karmada-scheduler goes on from it) that selects any, and its
/// `clusterTolerations`. With the term's name; an error message when none fits.
fn users_choice(
    binding: &Binding,
    user: &Value,
    preferences: BTreeMap<String, ClusterPreference>,
    clusters: Option<&BTreeMap<String, Value>>,
) -> Result<(BTreeMap<String, ClusterPreference>, Option<String>), String> {
    let (candidates, untolerated) = tolerated(binding, user, preferences, clusters);
    let fitting = |affinity: &Value| -> BTreeMap<String, ClusterPreference> {
        candidates
            .iter()
            .filter(|(name, _)| matches(&cluster_object(clusters, name), affinity))
            .map(|(name, p)| (name.clone(), *p))
            .collect()
    };
    let why = |what: &str| no_fit(&candidates, &untolerated, what);
    let terms = user
        .get("clusterAffinities")
        .and_then(Value::as_array)
        .filter(|t| !t.is_empty());
    if let Some(terms) = terms {
        return first_fitting_term(binding, terms, fitting)
            .map_err(|tried| why(&format!("clusterAffinities (tried {tried})")));
    }
    let fit = match user.get("clusterAffinity").filter(|a| !a.is_null()) {
        Some(affinity) => fitting(affinity),
        None => candidates.clone(),
    };
    if fit.is_empty() {
        return Err(why("clusterAffinity and clusterTolerations"));
    }
    Ok((fit, None))
}

/// The policy's clusters whose taints the placement's `clusterTolerations`
/// tolerate, and the others as `name (taint)`. A cluster the binding is on
/// already stays a candidate (Karmada's TaintToleration filter).
fn tolerated(
    binding: &Binding,
    user: &Value,
    preferences: BTreeMap<String, ClusterPreference>,
    clusters: Option<&BTreeMap<String, Value>>,
) -> (BTreeMap<String, ClusterPreference>, Vec<String>) {
    let tolerations = user
        .get("clusterTolerations")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut untolerated = Vec::new();
    let candidates = preferences
        .into_iter()
        .filter(|(name, _)| {
            if binding.spec.clusters.iter().any(|c| &c.name == name) {
                return true;
            }
            match untolerated_taint(&cluster_object(clusters, name), &tolerations) {
                Some(taint) => {
                    untolerated.push(format!("{name} ({taint})"));
                    false
                }
                None => true,
            }
        })
        .collect();
    (candidates, untolerated)
}

/// Why no cluster fits the placement's `what`: the candidates left, and the
/// clusters whose taints are not tolerated.
fn no_fit(
    candidates: &BTreeMap<String, ClusterPreference>,
    untolerated: &[String],
    what: &str,
) -> String {
    let allowed = candidates.keys().cloned().collect::<Vec<_>>().join(", ");
    let mut message = format!(
        "no cluster the placement policy allows ({}) matches the placement's {what}",
        if allowed.is_empty() {
            "none left"
        } else {
            &allowed
        }
    );
    if !untolerated.is_empty() {
        message.push_str(&format!("; untolerated taints: {}", untolerated.join(", ")));
    }
    message
}

/// The clusters of the first `clusterAffinities` term that selects any, from
/// the one observed last (from the first when a reschedule is required), with
/// its name; else the names of the terms tried.
fn first_fitting_term(
    binding: &Binding,
    terms: &[Value],
    fitting: impl Fn(&Value) -> BTreeMap<String, ClusterPreference>,
) -> Result<(BTreeMap<String, ClusterPreference>, Option<String>), String> {
    let observed = binding.status.scheduler_observed_affinity_name.as_deref();
    let start = if binding.reschedule_required() {
        0
    } else {
        terms
            .iter()
            .position(|t| affinity_name(t) == observed)
            .unwrap_or(0)
    };
    for term in &terms[start..] {
        let fit = fitting(term);
        if !fit.is_empty() {
            return Ok((fit, affinity_name(term).map(str::to_owned)));
        }
    }
    let tried: Vec<&str> = terms[start..].iter().filter_map(affinity_name).collect();
    Err(tried.join(", "))
}

fn affinity_name(term: &Value) -> Option<&str> {
    term.get("affinityName").and_then(Value::as_str)
}

/// The user's `staticWeightList` over the policy's even weights (Karmada's
/// rule: a cluster's weight is the largest of the rules that select it; a
/// cluster no rule selects gets none; when none gets any, all weigh alike).
/// The policy's `minReplicas`/`maxReplicas` stay.
fn with_static_weights(
    user: &Value,
    mut preferences: BTreeMap<String, ClusterPreference>,
    clusters: Option<&BTreeMap<String, Value>>,
) -> BTreeMap<String, ClusterPreference> {
    let Some(rules) = user
        .pointer("/replicaScheduling/weightPreference/staticWeightList")
        .and_then(Value::as_array)
        .filter(|r| !r.is_empty())
    else {
        return preferences;
    };
    for (name, preference) in preferences.iter_mut() {
        let object = cluster_object(clusters, name);
        preference.weight = rules
            .iter()
            .filter(|rule| {
                rule.get("targetCluster")
                    .is_some_and(|target| matches(&object, target))
            })
            .filter_map(|rule| rule.get("weight").and_then(Value::as_i64))
            .max()
            .unwrap_or(0);
    }
    preferences
}
