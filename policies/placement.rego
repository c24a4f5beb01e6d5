# Placement policy for federated workloads (Rego v1, OPA 1.x and regorus).
#
# The admission webhook asks for the whole document of this package,
#
#   POST /v1/data/io/k8s/federation/admission   {"input": <the Kubernetes object>}
#
# and gets back two keys, and a third that says whether the policy weighs on
# purpose:
#
#   {"annotations": {<key>: <value>}, "errors": ["<message>", ...],
#    "policy_weights": <true with the least-loaded weighting (rule 5), else false>}
#
# `annotations` are merged into the object (policy values replace the developer's
# values for the same key; non-string values are serialized to compact JSON).
# A non-empty `errors` denies the request and every message is shown to the user.
# Admission request metadata (operation, userInfo, ...) is under `input._admission`;
# this policy does not use it.
#
# Only the rules `annotations`, `errors` and `policy_weights` are values of this
# package, each defined whenever the rules package is loaded (a member left
# undefined makes the embedded engine's compiled form hand the decision to its
# interpreter, at several times the CPU); the
# rules they are computed from live in package io.k8s.federation.placement
# (placement_rules.rego, deployed with this file), where each is evaluated at most
# once per query and none appears in the decision document. Those rules are only
# consulted for workloads. They are referred to by their full paths, not through
# `import data.io.k8s.federation.placement`: the embedded engine's compiled form
# builds an imported package's whole document at each reference (three times the
# instructions of this decision).
#
# Data: the replicated Cluster objects at data.kubernetes.clusters[<name>]: the
# CRD placement-policy.io/v1alpha1 Cluster, or Karmada's Cluster
# (cluster.karmada.io/v1alpha1), or both side by side; and Open Cluster
# Management's ManagedClusters (cluster.open-cluster-management.io/v1) at
# data.kubernetes.managedclusters[<name>]. A cluster is
#   - RUNNING when status.phase == "running" (placement-policy.io), or when its
#     Ready condition is "True" and no taint of effect NoSchedule or NoExecute
#     is on it (Karmada), or when its ManagedClusterConditionAvailable
#     condition is "True" (OCM: its agent renews its lease). Phase-1 rule: only
#     running clusters accept workloads; pending, offline, terminated,
#     not-ready, tainted and unavailable ones never do.
#   - in the EU when its label `placement-policy.io/jurisdiction` is "eu", or, when
#     that label is neither "eu" nor "non-eu", when its region starts with
#     "europe-" (GCE style, e.g. europe-west1) or "eu-" (AWS style, e.g.
#     eu-central-1): spec.region. The label "non-eu" marks a cluster as not in
#     the EU whatever its region is. What a cluster reports about itself
#     counts only when the settings say so: a ManagedCluster's claim
#     `region.open-cluster-management.io` (its administrator's, not the hub's)
#     is its region only with `trust_cluster_claims := true` in
#     placement_settings.rego; by default label a ManagedCluster's
#     jurisdiction on the hub.
#   - of PCI compliance level N when its label
#     `placement-policy.io/pci-compliance-level` is the non-negative integer N;
#     a missing label or any other value means level 0.
#
# Rules, for workloads only (kind ReplicaSet or Deployment, any apiVersion;
# any other object that carries an annotation under
# `policy.federation.alpha.kubernetes.io/` (a StatefulSet, DaemonSet, Job,
# CronJob, Pod or custom workload with a requirement: bounded by the allowed
# clusters, whatever its kind); and an OCM Placement,
# cluster.open-cluster-management.io, whose own annotations placement-sync
# weighs beside those of the workloads it delivers; for every other object
# the document is {"annotations": {}, "errors": []}):
#
#   1. Eligible clusters: the running clusters.
#   2. EU jurisdiction: workload annotation
#      `policy.federation.alpha.kubernetes.io/eu-jurisdiction-required: "true"`
#      keeps only EU clusters; "false" or no annotation keeps all. Any other value
#      is an error.
#   3. PCI compliance: workload annotation
#      `policy.federation.alpha.kubernetes.io/pci-compliance-level: "N"` keeps only
#      clusters of level >= N. N must be a non-negative integer (digits only), or
#      it is an error.
#      The clusters left after 1-3 are the ALLOWED clusters.
#   4. Developer request: workload annotation
#      `federation.kubernetes.io/replica-set-preferences` (JSON, e.g.
#      {"rebalance": false, "clusters": {"a": {"weight": 1}}}) requests the clusters
#      named by the keys of "clusters". A requested cluster that is not allowed is
#      an error ("requested replica-set-preferences includes invalid clusters: ...")
#      and the request is denied; the selection is the requested clusters that
#      are allowed (the intersection of request and policy: the policy says which
#      clusters MAY be used). An empty "clusters" object requests nothing. A value
#      that is not JSON, or has no object "clusters", is an error.
#   5. Spreading: the selected clusters (the requested ones, or every allowed
#      cluster when nothing was requested) get equal weight (phase 1). The
#      answer is the annotation `federation.kubernetes.io/replica-set-preferences`
#      = {"clusters": {<name>: {"weight": 1}, ...}, "rebalance": R}, R being the
#      developer's "rebalance" when it is a boolean, else true. With the
#      setting `weighting := "least-loaded"` (placement_settings.rego,
#      package io.k8s.federation.settings), each selected cluster is weighted by its
#      free CPU in millicores (a Karmada Cluster's status.resourceSummary:
#      allocatable - allocated - allocating, at least 0), when every selected
#      cluster reports it; otherwise evenly. Any other weighting is an error.
#   6. No allowed cluster at all is an error ("no cluster satisfies the placement
#      requirements (...)").
#   The annotation is given when there is no error, and also when the only
#   errors are requested clusters that are not allowed while some requested
#   cluster is (a request in conflict with the policy: errors and the intersection). Any
#   error denies a new request; and a decision with errors never removes or
#   replaces a placement a workload already has (the webhook and the remediator
#   keep what is stored, whatever annotations come beside the errors), so a
#   workload whose requested cluster has gone offline since keeps its
#   placement and its developer is told what to fix. When an annotation
#   value of rules 2-3 is invalid, only that error is reported (the allowed
#   clusters are not known, so rules 4 and 6 are not checked).
#
#   When placement-sync decides an OCM Placement it asks for each of its
#   workloads (and the Placement itself) with the Placement under
#   `input._placement`; the answer then also has the annotation
#   `placement-policy.io/cluster-reasons` = {<name>: "<why>", ...}, why each
#   selected cluster may run it ("running, in the EU (eu-jurisdiction-required),
#   PCI compliance level 3 >= 2 (pci-compliance-level)"): the reasons of the
#   PlacementDecisions. The webhook never sends `_placement`.
#
#   Both values are undefined, and so is the decision, when the rules package is
#   not loaded: a policy set missing a module it depends on never reads as
#   "nothing to place" (the webhook fails closed iff policies exist).
package io.k8s.federation.admission

# Rule 5: the placement annotation (see above for when it is given), and the
# reasons when placement-sync decides an OCM Placement (input._placement).
annotations := {
	"federation.kubernetes.io/replica-set-preferences": data.io.k8s.federation.placement.preferences,
	"placement-policy.io/cluster-reasons": data.io.k8s.federation.placement.reasons,
} if {
	input._placement
	data.io.k8s.federation.placement.workload
	count(data.io.k8s.federation.placement.selected) > 0
	count(data.io.k8s.federation.placement.errors - data.io.k8s.federation.placement.request_conflicts) == 0
} else := {"federation.kubernetes.io/replica-set-preferences": data.io.k8s.federation.placement.preferences} if {
	data.io.k8s.federation.placement.workload
	count(data.io.k8s.federation.placement.selected) > 0
	count(data.io.k8s.federation.placement.errors - data.io.k8s.federation.placement.request_conflicts) == 0
} else := {} if data.io.k8s.federation.placement.loaded

# Weights by free CPU are deliberate: a scheduler given weights of its own
# (a Karmada PropagationPolicy's staticWeightList) keeps the policy's. Even
# weights are not (false: given weights replace them).
policy_weights if {
	data.io.k8s.federation.placement.load_weighted
} else := false if data.io.k8s.federation.placement.loaded

# Rules 2-4 and 6: every reason the workload cannot be placed.
errors := data.io.k8s.federation.placement.errors if data.io.k8s.federation.placement.workload

else := set() if data.io.k8s.federation.placement.loaded
