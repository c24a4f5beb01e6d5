# Placement policy for federated workloads (Rego v1, OPA 1.x and regorus).
#
# The admission webhook asks for the whole document of this package,
#
#   POST /v1/data/io/k8s/federation/admission   {"input": <the Kubernetes object>}
#
# and gets back exactly two keys:
#
#   {"annotations": {<key>: <value>}, "errors": ["<message>", ...]}
#
# `annotations` are merged into the object (policy values replace the developer's
# values for the same key; non-string values are serialized to compact JSON).
# A non-empty `errors` denies the request and every message is shown to the user.
# Admission request metadata (operation, userInfo, ...) is under `input._admission`;
# this policy does not use it.
#
# Only the two rules `annotations` and `errors` are values of this package; every
# helper is a function, so it never appears in the decision document.
#
# Data: the replicated Cluster objects (CRD placement-policy.io/v1alpha1, kind
# Cluster) at data.kubernetes.clusters[<name>]. A cluster is
#   - RUNNING when status.phase == "running". Phase-1 rule: only running clusters
#     accept workloads; pending, offline and terminated clusters never do.
#   - in the EU when its label `placement-policy.io/jurisdiction` is "eu", or, when
#     that label is neither "eu" nor "non-eu", when its spec.region starts with
#     "europe-" (GCE style, e.g. europe-west1) or "eu-" (AWS style, e.g.
#     eu-central-1). The label "non-eu" marks a cluster as not in the EU whatever
#     its region is.
#   - of PCI compliance level N when its label
#     `placement-policy.io/pci-compliance-level` is the non-negative integer N;
#     a missing label or any other value means level 0.
#
# Rules, for workloads only (kind ReplicaSet or Deployment, any apiVersion; for
# every other kind the document is {"annotations": {}, "errors": []}):
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
#      and the request is denied; otherwise the selection is the requested
#      clusters (the intersection of request and policy). An empty "clusters"
#      object requests nothing. A value that is not JSON, or has no object
#      "clusters", is an error.
#   5. Even spreading (phase 1): the selected clusters (the requested ones, or
#      every allowed cluster when nothing was requested) get equal weight. The
#      answer is the annotation `federation.kubernetes.io/replica-set-preferences`
#      = {"clusters": {<name>: {"weight": 1}, ...}, "rebalance": R}, R being the
#      developer's "rebalance" when it is a boolean, else true.
#   6. No allowed cluster at all is an error ("no cluster satisfies the placement
#      requirements (...)").
#   The annotation is only given when there is no error. When an annotation value
#   of rules 2-3 is invalid, only that error is reported (the allowed clusters are
#   not known, so rules 4 and 6 are not checked).
package io.k8s.federation.admission

# ---------------------------------------------------------------------------
# The decision document.
# ---------------------------------------------------------------------------

# Rule 5: the placement annotation, when the workload is admitted.
annotations["federation.kubernetes.io/replica-set-preferences"] := value if {
	is_workload(input)
	count(errors) == 0
	value := {
		"clusters": {name: {"weight": 1} | some name in selected_clusters(input)},
		"rebalance": rebalance(input),
	}
}

# Rule 2: the EU annotation must be "true" or "false".
errors contains msg if {
	is_workload(input)
	not eu_valid(input)
	msg := sprintf(
		"policy.federation.alpha.kubernetes.io/eu-jurisdiction-required must be \"true\" or \"false\", got %s",
		[shown(eu_value(input))],
	)
}

# Rule 3: the PCI annotation must be a non-negative integer.
errors contains msg if {
	is_workload(input)
	not pci_valid(input)
	msg := sprintf(
		"policy.federation.alpha.kubernetes.io/pci-compliance-level must be a non-negative integer, got %s",
		[shown(pci_value(input))],
	)
}

# Rule 4: the developer's preferences must be JSON ...
errors contains msg if {
	is_workload(input)
	raw := preferences_raw(input)
	not valid_json(raw)
	msg := sprintf(
		"federation.kubernetes.io/replica-set-preferences must be a JSON object, got %s",
		[shown(raw)],
	)
}

# ... with an object "clusters".
errors contains msg if {
	is_workload(input)
	raw := preferences_raw(input)
	valid_json(raw)
	not preferences(input)
	msg := sprintf(
		"federation.kubernetes.io/replica-set-preferences must have an object \"clusters\", got %s",
		[shown(raw)],
	)
}

# Rule 4: every requested cluster must be allowed.
errors contains msg if {
	is_workload(input)
	requirements_valid(input)
	invalid := requested_clusters(input) - allowed_clusters(input)
	count(invalid) > 0
	msg := sprintf(
		"requested replica-set-preferences includes invalid clusters: %s",
		[concat(", ", sort(invalid))],
	)
}

# Rule 6: at least one cluster must be allowed.
errors contains msg if {
	is_workload(input)
	requirements_valid(input)
	count(allowed_clusters(input)) == 0
	msg := sprintf(
		"no cluster satisfies the placement requirements (eu-jurisdiction-required=%s, pci-compliance-level>=%s)",
		[eu_value(input), significant_digits(pci_value(input))],
	)
}

# ---------------------------------------------------------------------------
# Helpers (functions, so they are not part of the decision document).
# ---------------------------------------------------------------------------

# Workload kinds this policy places.
is_workload(obj) if obj.kind in {"ReplicaSet", "Deployment"}

# A value for an error message: strings quoted, anything else as Rego prints it.
shown(v) := sprintf("%q", [v]) if is_string(v)

shown(v) := sprintf("%v", [v]) if not is_string(v)

# --- Rule 1: eligible clusters ----------------------------------------------

running(cluster) if cluster.status.phase == "running"

# --- Rule 2: EU jurisdiction ------------------------------------------------

eu_value(obj) := object.get(obj, ["metadata", "annotations", "policy.federation.alpha.kubernetes.io/eu-jurisdiction-required"], "false")

eu_valid(obj) if eu_value(obj) in {"true", "false"}

eu_required(obj) if eu_value(obj) == "true"

jurisdiction(cluster) := object.get(cluster, ["metadata", "labels", "placement-policy.io/jurisdiction"], "")

eu_region(region) if {
	is_string(region)
	startswith(region, "europe-")
}

eu_region(region) if {
	is_string(region)
	startswith(region, "eu-")
}

in_eu(cluster) if jurisdiction(cluster) == "eu"

in_eu(cluster) if {
	not jurisdiction(cluster) in {"eu", "non-eu"}
	eu_region(object.get(cluster, ["spec", "region"], ""))
}

eu_ok(obj, _) if not eu_required(obj)

eu_ok(obj, cluster) if {
	eu_required(obj)
	in_eu(cluster)
}

# --- Rule 3: PCI compliance -------------------------------------------------

pci_value(obj) := object.get(obj, ["metadata", "annotations", "policy.federation.alpha.kubernetes.io/pci-compliance-level"], "0")

non_negative_integer(v) if {
	is_string(v)
	regex.match(`^[0-9]+$`, v)
}

# The number a string of decimal digits stands for. Leading zeros are removed
# first: regorus's to_number reads the string as a JSON number, and JSON numbers
# cannot start with 0 ("07" is an error there, 7 in OPA). Messages show the
# digits rather than the number, so huge values print the same in both engines.
significant_digits(digits) := significant if {
	significant := trim_left(digits, "0")
	significant != ""
} else := "0"

digits_value(digits) := to_number(significant_digits(digits))

pci_valid(obj) if non_negative_integer(pci_value(obj))

pci_min(obj) := digits_value(pci_value(obj)) if pci_valid(obj)

cluster_pci(cluster) := digits_value(v) if {
	v := object.get(cluster, ["metadata", "labels", "placement-policy.io/pci-compliance-level"], "")
	non_negative_integer(v)
} else := 0

pci_ok(obj, cluster) if cluster_pci(cluster) >= pci_min(obj)

# --- The allowed clusters (rules 1-3) ---------------------------------------

requirements_valid(obj) if {
	eu_valid(obj)
	pci_valid(obj)
}

allowed_clusters(obj) := {name |
	some name, cluster in data.kubernetes.clusters
	running(cluster)
	eu_ok(obj, cluster)
	pci_ok(obj, cluster)
}

# --- Rule 4: the developer's request ----------------------------------------

preferences_raw(obj) := obj.metadata.annotations["federation.kubernetes.io/replica-set-preferences"]

valid_json(raw) if {
	is_string(raw)
	json.is_valid(raw)
}

# The parsed preferences; undefined when absent or invalid.
preferences(obj) := prefs if {
	raw := preferences_raw(obj)
	valid_json(raw)
	prefs := json.unmarshal(raw)
	is_object(prefs)
	is_object(prefs.clusters)
}

requested_clusters(obj) := {name | some name, _ in preferences(obj).clusters}

# --- Rule 5: even spreading -------------------------------------------------

selected_clusters(obj) := requested_clusters(obj) & allowed_clusters(obj) if {
	count(requested_clusters(obj)) > 0
} else := allowed_clusters(obj)

rebalance(obj) := r if {
	r := preferences(obj).rebalance
	is_boolean(r)
} else := true
