# The rules of the placement policy; see placement.rego for what they decide.
#
# They are rules rather than functions of the input so that each is evaluated
# once per query (OPA and regorus cache rule values within a query, not function
# calls), which keeps a decision to a few hundred microseconds.
package io.k8s.federation.placement

eu_key := "policy.federation.alpha.kubernetes.io/eu-jurisdiction-required"

pci_key := "policy.federation.alpha.kubernetes.io/pci-compliance-level"

preferences_key := "federation.kubernetes.io/replica-set-preferences"

# Workload kinds this policy places.
workload if input.kind in {"ReplicaSet", "Deployment"}

# --- Rule 2: EU jurisdiction ------------------------------------------------

eu_value := object.get(input, ["metadata", "annotations", eu_key], "false")

eu_valid if eu_value in {"true", "false"}

eu_required if eu_value == "true"

# --- Rule 3: PCI compliance -------------------------------------------------

pci_value := object.get(input, ["metadata", "annotations", pci_key], "0")

pci_valid if non_negative_integer(pci_value)

pci_min := digits_value(pci_value) if pci_valid

requirements_valid if {
	eu_valid
	pci_valid
}

# --- The allowed clusters (rules 1-3) ---------------------------------------
#
# Sets of cluster names built with plain expressions rather than calls of small
# functions per cluster: function calls dominate evaluation time in both engines.

clusters := data.kubernetes.clusters

# Rule 1: only running clusters accept workloads.
running_clusters contains name if {
	some name, cluster in clusters
	cluster.status.phase == "running"
}

# Rule 2: EU clusters, by label or else by region.
eu_clusters contains name if {
	some name, cluster in clusters
	cluster.metadata.labels["placement-policy.io/jurisdiction"] == "eu"
}

eu_clusters contains name if {
	some name, cluster in clusters
	not object.get(cluster, ["metadata", "labels", "placement-policy.io/jurisdiction"], "") in {"eu", "non-eu"}
	region := cluster.spec.region
	is_string(region)
	startswith(region, "europe-")
}

eu_clusters contains name if {
	some name, cluster in clusters
	not object.get(cluster, ["metadata", "labels", "placement-policy.io/jurisdiction"], "") in {"eu", "non-eu"}
	region := cluster.spec.region
	is_string(region)
	startswith(region, "eu-")
}

# Rule 3: clusters whose PCI level label is at least the required level.
pci_clusters contains name if {
	some name, cluster in clusters
	level := cluster.metadata.labels["placement-policy.io/pci-compliance-level"]
	non_negative_integer(level)
	digits_value(level) >= pci_min
}

pci_clusters contains name if {
	pci_min == 0
	some name, _ in clusters
}

eligible_clusters := running_clusters & eu_clusters if eu_required

else := running_clusters

allowed contains name if {
	requirements_valid
	some name in eligible_clusters
	name in pci_clusters
}

# --- Rule 4: the developer's request ----------------------------------------

preferences_raw := input.metadata.annotations[preferences_key]

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

requested contains name if some name, _ in requested_preferences.clusters

# --- Rule 5: even spreading -------------------------------------------------

selected := requested & allowed if {
	count(requested) > 0
} else := allowed

rebalance := r if {
	r := requested_preferences.rebalance
	is_boolean(r)
} else := true

preferences := {
	"clusters": {name: {"weight": 1} | some name in selected},
	"rebalance": rebalance,
}

# --- Errors -------------------------------------------------------------------

# Rule 2: the EU annotation must be "true" or "false".
errors contains msg if {
	workload
	not eu_valid
	msg := sprintf(
		"policy.federation.alpha.kubernetes.io/eu-jurisdiction-required must be \"true\" or \"false\", got %s",
		[shown(eu_value)],
	)
}

# Rule 3: the PCI annotation must be a non-negative integer.
errors contains msg if {
	workload
	not pci_valid
	msg := sprintf(
		"policy.federation.alpha.kubernetes.io/pci-compliance-level must be a non-negative integer, got %s",
		[shown(pci_value)],
	)
}

# Rule 4: the developer's preferences must be JSON ...
errors contains msg if {
	workload
	preferences_raw
	not preferences_json
	msg := sprintf(
		"federation.kubernetes.io/replica-set-preferences must be a JSON object, got %s",
		[shown(preferences_raw)],
	)
}

# ... with an object "clusters".
errors contains msg if {
	workload
	preferences_json
	not requested_preferences
	msg := sprintf(
		"federation.kubernetes.io/replica-set-preferences must have an object \"clusters\", got %s",
		[shown(preferences_raw)],
	)
}

# Rule 4: every requested cluster must be allowed.
errors contains msg if {
	workload
	requirements_valid
	invalid := requested - allowed
	count(invalid) > 0
	msg := sprintf(
		"requested replica-set-preferences includes invalid clusters: %s",
		[concat(", ", sort(invalid))],
	)
}

# Rule 6: at least one cluster must be allowed.
errors contains msg if {
	workload
	requirements_valid
	count(allowed) == 0
	msg := sprintf(
		"no cluster satisfies the placement requirements (eu-jurisdiction-required=%s, pci-compliance-level>=%s)",
		[eu_value, significant_digits(pci_value)],
	)
}

# --- Functions of a value ---------------------------------------------------

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

# A value for an error message: strings quoted, anything else as Rego prints it.
shown(v) := sprintf("%q", [v]) if is_string(v)

shown(v) := sprintf("%v", [v]) if not is_string(v)
