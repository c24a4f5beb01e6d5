# The rules of the placement policy; see placement.rego for what they decide.
#
# Written for evaluation speed in both engines, where the cost of a decision is
# mostly the number of rules evaluated and looked up, not the work inside them:
# annotation keys and label names are literals rather than rules of their own,
# small checks are inlined rather than helper functions, and each set of clusters
# is built in one pass. Every rule here is evaluated at most once per query.
# The tests in placement_test.rego pin down the behaviour.
package io.k8s.federation.placement

# Always true: the admission package's decision is undefined without this
# package (a policy set missing it must not read as "nothing to place").
loaded := true

# What this policy places; the admission package asks for nothing else.
# ReplicaSets and Deployments always (the federation's replica sets) ...
workload if input.kind in {"ReplicaSet", "Deployment"}

# ... and any other object that carries a placement requirement (a
# StatefulSet, DaemonSet, Job, CronJob, bare Pod or custom workload annotated
# for EU jurisdiction or a PCI level): with no replicas of its own to
# divide, it is bounded by the allowed clusters alone. A requirement is never
# silently unbounded, whatever the kind.
workload if {
	some key, _ in input.metadata.annotations
	startswith(key, "policy.federation.alpha.kubernetes.io/")
}

# An Open Cluster Management Placement that placement-sync decides: its own
# annotations are requirements too (beside those of the workloads it delivers).
workload if {
	input.kind == "Placement"
	startswith(input.apiVersion, "cluster.open-cluster-management.io/")
}

# --- The clusters ---------------------------------------------------------------

# Every replicated cluster, by name: placement-policy.io and Karmada Clusters
# (data.kubernetes.clusters) and Open Cluster Management's ManagedClusters
# (cluster.open-cluster-management.io/v1, data.kubernetes.managedclusters).
default replicated_clusters := {}

replicated_clusters := data.kubernetes.clusters

default managed_clusters := {}

managed_clusters := data.kubernetes.managedclusters

clusters := object.union(replicated_clusters, managed_clusters)

# --- The workload's requirements (rules 2 and 3) -----------------------------

eu_value := object.get(input, ["metadata", "annotations", "policy.federation.alpha.kubernetes.io/eu-jurisdiction-required"], "false")

pci_value := object.get(input, ["metadata", "annotations", "policy.federation.alpha.kubernetes.io/pci-compliance-level"], "0")

eu_valid if eu_value in {"true", "false"}

# The required PCI level; undefined unless the annotation is a string of digits.
# Leading zeros are removed before to_number: regorus reads the string as a JSON
# number, and JSON numbers cannot start with 0 ("07" is an error there, 7 in OPA).
pci_min := to_number(object.get({"": "0"}, significant, significant)) if {
	is_string(pci_value)
	pci_value != ""
	trim_left(pci_value, "0123456789") == ""
	significant := trim_left(pci_value, "0")
}

requirements_valid if {
	eu_valid
	pci_min
}

# --- The allowed clusters (rules 1-3) -----------------------------------------

# Rule 1: only running clusters accept workloads. A placement-policy.io
# Cluster runs when its phase says so; a Karmada Cluster (cluster.karmada.io)
# when its Ready condition is True and no taint keeps new workloads off it
# (NoSchedule) or evicts them (NoExecute); an OCM ManagedCluster when the hub
# reports it available (its agent renews its lease).
running_clusters contains name if {
	some name, cluster in clusters
	cluster.status.phase == "running"
}

running_clusters contains name if {
	some name, cluster in clusters
	startswith(cluster.apiVersion, "cluster.open-cluster-management.io/")
	some condition in cluster.status.conditions
	condition.type == "ManagedClusterConditionAvailable"
	condition.status == "True"
}

running_clusters contains name if {
	some name, cluster in clusters
	startswith(cluster.apiVersion, "cluster.karmada.io/")
	some condition in cluster.status.conditions
	condition.type == "Ready"
	condition.status == "True"
	not tainted_clusters[name]
}

tainted_clusters contains name if {
	some name, cluster in clusters
	some taint in cluster.spec.taints
	taint.effect in {"NoSchedule", "NoExecute"}
}

# Rule 2: every cluster when EU jurisdiction is not required, else the EU
# clusters: by label, or by region when the label says neither "eu" nor "non-eu"
# (spec.region). What is set on the hub or control plane decides, never what a
# cluster reports about itself: an OCM ManagedCluster's claim
# region.open-cluster-management.io (set by the managed cluster's administrator)
# counts only when the settings trust cluster claims (trust_cluster_claims).
jurisdiction_clusters contains name if {
	eu_value == "false"
	some name, _ in clusters
}

jurisdiction_clusters contains name if {
	eu_value == "true"
	some name, cluster in clusters
	cluster.metadata.labels["placement-policy.io/jurisdiction"] == "eu"
}

jurisdiction_clusters contains name if {
	eu_value == "true"
	some name, cluster in clusters
	not object.get(cluster, ["metadata", "labels", "placement-policy.io/jurisdiction"], "") in {"eu", "non-eu"}
	region := cluster.spec.region
	is_string(region)
	strings.any_prefix_match(region, ["europe-", "eu-"])
}

jurisdiction_clusters contains name if {
	eu_value == "true"
	data.io.k8s.federation.settings.trust_cluster_claims == true
	some name, cluster in clusters
	not object.get(cluster, ["metadata", "labels", "placement-policy.io/jurisdiction"], "") in {"eu", "non-eu"}
	some claim in cluster.status.clusterClaims
	claim.name == "region.open-cluster-management.io"
	is_string(claim.value)
	strings.any_prefix_match(claim.value, ["europe-", "eu-"])
}

# Rule 3: every cluster when no PCI level is required, else the clusters whose
# level label is a string of digits at least the required level.
pci_clusters contains name if {
	pci_min == 0
	some name, _ in clusters
}

pci_clusters contains name if {
	min := pci_min
	min > 0
	some name, cluster in clusters
	level := cluster.metadata.labels["placement-policy.io/pci-compliance-level"]
	is_string(level)
	level != ""
	trim_left(level, "0123456789") == ""
	significant := trim_left(level, "0")
	to_number(object.get({"": "0"}, significant, significant)) >= min
}

allowed := (running_clusters & jurisdiction_clusters) & pci_clusters

# --- Rule 4: the developer's request ------------------------------------------

preferences_raw := input.metadata.annotations["federation.kubernetes.io/replica-set-preferences"]

preferences_json if {
	is_string(preferences_raw)
	json.is_valid(preferences_raw)
}

# The parsed request; undefined when absent or invalid.
requested_preferences := prefs if {
	preferences_json
	prefs := json.unmarshal(preferences_raw)
	is_object(prefs)
	is_object(prefs.clusters)
}

requested := {name | some name, _ in requested_preferences.clusters}

# --- Rule 5: spreading ----------------------------------------------------------

selected := requested & allowed if {
	count(requested) > 0
} else := allowed

rebalance := r if {
	r := requested_preferences.rebalance
	is_boolean(r)
} else := true

# How the selected clusters are weighted: "even" (phase 1: every cluster
# weight 1), or "least-loaded" (phase 1's other rule: weight by free CPU),
# as the settings module (placement_settings.rego) says.
default weighting := "even"

weighting := data.io.k8s.federation.settings.weighting

# Weighted by free CPU when every selected cluster reports it, else evenly.
load_weighted if {
	weighting == "least-loaded"
	count(free_millicores) == count(selected)
}

preferences := {
	"clusters": {name: {"weight": free_millicores[name]} | some name in selected},
	"rebalance": rebalance,
} if {
	load_weighted
} else := {
	"clusters": {name: {"weight": 1} | some name in selected},
	"rebalance": rebalance,
}

# Free CPU of each selected cluster, in millicores (at least 0), from a
# Karmada Cluster's status.resourceSummary: allocatable - allocated -
# allocating. A cluster with no free CPU gets no replicas.
free_millicores[name] := max([0, round(1000 * ((allocatable - allocated) - allocating))]) if {
	weighting == "least-loaded"
	some name in selected
	summary := clusters[name].status.resourceSummary
	allocatable := units.parse(summary.allocatable.cpu)
	allocated := units.parse(object.get(summary, ["allocated", "cpu"], "0"))
	allocating := units.parse(object.get(summary, ["allocating", "cpu"], "0"))
}

# --- Reasons (asked by Open Cluster Management's decider) ---------------------

# Why each selected cluster may run the workload, in the policy's words: the
# reason of an OCM PlacementDecision (the admission package gives it when
# placement-sync asks for a Placement's workloads, with input._placement).
reasons[name] := concat(", ", parts) if {
	some name in selected
	level := object.get(clusters[name], ["metadata", "labels", "placement-policy.io/pci-compliance-level"], "0")
	parts := array.concat(array.concat(array.concat(["running"], eu_reason), pci_reason(level)), asked_reason)
}

# The parts of a reason, each empty where it does not apply. Rules of their
# own, not comprehensions inside the iteration above: the embedded engine's
# compiled form does not take a comprehension inside an iteration (it would
# interpret the whole policy set, several times slower).
eu_reason := ["in the EU (eu-jurisdiction-required)"] if eu_value == "true"

else := []

pci_reason(level) := [sprintf("PCI compliance level %s >= %d (pci-compliance-level)", [level, pci_min])] if pci_min > 0

else := []

asked_reason := ["requested (replica-set-preferences)"] if count(requested) > 0

else := []

# --- Errors (asked for workloads only) ---------------------------------------

# Rule 2: the EU annotation must be "true" or "false".
errors contains msg if {
	not eu_valid
	msg := sprintf(
		"policy.federation.alpha.kubernetes.io/eu-jurisdiction-required must be \"true\" or \"false\", got %s",
		[shown(eu_value)],
	)
}

# Rule 3: the PCI annotation must be a non-negative integer.
errors contains msg if {
	not pci_min
	msg := sprintf(
		"policy.federation.alpha.kubernetes.io/pci-compliance-level must be a non-negative integer, got %s",
		[shown(pci_value)],
	)
}

# Rule 4: the developer's preferences must be JSON ...
errors contains msg if {
	preferences_raw
	not preferences_json
	msg := sprintf(
		"federation.kubernetes.io/replica-set-preferences must be a JSON object, got %s",
		[shown(preferences_raw)],
	)
}

# ... with an object "clusters".
errors contains msg if {
	preferences_json
	not requested_preferences
	msg := sprintf(
		"federation.kubernetes.io/replica-set-preferences must have an object \"clusters\", got %s",
		[shown(preferences_raw)],
	)
}

# Rule 4: every requested cluster must be allowed. (A conflict: the decision
# carries the allowed part of the request beside the errors; see placement.rego.)
request_conflicts contains msg if {
	requirements_valid
	invalid := requested - allowed
	count(invalid) > 0
	msg := sprintf(
		"requested replica-set-preferences includes invalid clusters: %s",
		[concat(", ", sort(invalid))],
	)
}

errors contains msg if some msg in request_conflicts

# Rule 6: at least one cluster must be allowed.
errors contains msg if {
	requirements_valid
	count(allowed) == 0
	significant := trim_left(pci_value, "0")
	msg := sprintf(
		"no cluster satisfies the placement requirements (eu-jurisdiction-required=%s, pci-compliance-level>=%s)",
		[eu_value, object.get({"": "0"}, significant, significant)],
	)
}

# The settings must name a known weighting.
errors contains msg if {
	not weighting in {"even", "least-loaded"}
	msg := sprintf(
		"placement settings: weighting must be \"even\" or \"least-loaded\", got %s",
		[shown(weighting)],
	)
}

# A value for an error message: strings quoted, anything else as Rego prints it.
shown(v) := sprintf("%q", [v]) if is_string(v)

shown(v) := sprintf("%v", [v]) if not is_string(v)

# --- Exclusions (asked by kubectl placement explain) ----------------------------

# Why each cluster the workload is not placed on is left out, in the policy's
# words, beside `reasons` for the clusters it is placed on: "not running
# (status.phase offline)", "not in the EU (eu-jurisdiction-required)", "PCI
# compliance level 1 < 2 (pci-compliance-level)", "not requested
# (replica-set-preferences)", joined by ", " where several apply. Defined
# while the workload's requirements are valid (else `errors` says what is
# wrong). Each part is a function of its own, not a comprehension inside this
# iteration, for the embedded engine's compiled form (see `reasons`).
exclusions[name] := concat(", ", parts) if {
	requirements_valid
	some name, cluster in clusters
	not selected[name]
	level := object.get(cluster, ["metadata", "labels", "placement-policy.io/pci-compliance-level"], "0")
	parts := array.concat(array.concat(array.concat(down_reason(name), outside_eu_reason(name)), low_pci_reason(name, level)), unrequested_reason(name))
}

down_reason(name) := [sprintf("not running (status.phase %s)", [phase])] if {
	not running_clusters[name]
	phase := clusters[name].status.phase
	is_string(phase)
} else := ["not running (tainted NoSchedule or NoExecute)"] if {
	not running_clusters[name]
	tainted_clusters[name]
} else := ["not running (not Ready, or not available)"] if {
	not running_clusters[name]
} else := []

outside_eu_reason(name) := ["not in the EU (eu-jurisdiction-required)"] if {
	not jurisdiction_clusters[name]
} else := []

low_pci_reason(name, level) := [sprintf("PCI compliance level %s < %d (pci-compliance-level)", [level, pci_min])] if {
	not pci_clusters[name]
} else := []

unrequested_reason(name) := ["not requested (replica-set-preferences)"] if {
	allowed[name]
	count(requested) > 0
	not requested[name]
} else := []
