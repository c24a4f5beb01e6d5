# Unit tests of the placement policy over Karmada Clusters (cluster.karmada.io),
# and of the least-loaded weighting: `opa test policies/ -v`.
package io.k8s.federation.karmada_test

import data.io.k8s.federation.admission

eu_key := "policy.federation.alpha.kubernetes.io/eu-jurisdiction-required"

pci_key := "policy.federation.alpha.kubernetes.io/pci-compliance-level"

prefs_key := "federation.kubernetes.io/replica-set-preferences"

summary(allocatable, allocated) := {
	"allocatable": {"cpu": allocatable, "memory": "16Gi", "pods": "110"},
	"allocated": {"cpu": allocated, "memory": "1Gi", "pods": "3"},
}

member(name, region, level) := {
	"apiVersion": "cluster.karmada.io/v1alpha1",
	"kind": "Cluster",
	"metadata": {"name": name, "labels": {"placement-policy.io/pci-compliance-level": level}},
	"spec": {"apiEndpoint": "https://127.0.0.1:6443", "syncMode": "Push", "region": region},
	"status": {
		"conditions": [{"type": "Ready", "status": "True", "reason": "ClusterReady"}],
		"resourceSummary": summary("8", "2"),
	},
}

# The Karmada test bed's members.
members := {
	"member-eu-1": member("member-eu-1", "europe-west1", "2"),
	"member-eu-2": member("member-eu-2", "europe-west2", "3"),
	"member-us-1": member("member-us-1", "us-central1", "3"),
}

deployment(annotations) := {
	"apiVersion": "apps/v1",
	"kind": "Deployment",
	"metadata": {"name": "web", "namespace": "shop", "annotations": annotations},
	"spec": {"replicas": 6},
}

eu_pci2 := deployment({eu_key: "true", pci_key: "2"})

placed_on(doc) := {name | some name, _ in doc.annotations[prefs_key].clusters}

weights(doc) := {name: pref.weight | some name, pref in doc.annotations[prefs_key].clusters}

with_member(name, patch) := object.union(members, {name: object.union(members[name], patch)})

test_eu_pci2_goes_to_both_eu_members if {
	doc := admission with input as eu_pci2 with data.kubernetes.clusters as members
	placed_on(doc) == {"member-eu-1", "member-eu-2"}
	weights(doc) == {"member-eu-1": 1, "member-eu-2": 1}
	doc.errors == set()
}

test_a_member_not_ready_takes_no_workloads if {
	not_ready := with_member("member-eu-2", {"status": {"conditions": [{"type": "Ready", "status": "False"}]}})
	doc := admission with input as eu_pci2 with data.kubernetes.clusters as not_ready
	placed_on(doc) == {"member-eu-1"}
}

test_a_member_without_conditions_takes_no_workloads if {
	unknown := with_member("member-eu-2", {"status": {"conditions": []}})
	doc := admission with input as eu_pci2 with data.kubernetes.clusters as unknown
	placed_on(doc) == {"member-eu-1"}
}

test_no_schedule_and_no_execute_taints_keep_workloads_off if {
	some effect in ["NoSchedule", "NoExecute"]
	tainted := with_member("member-eu-2", {"spec": {"taints": [{"key": "cluster.karmada.io/not-ready", "effect": effect}]}})
	doc := admission with input as eu_pci2 with data.kubernetes.clusters as tainted
	placed_on(doc) == {"member-eu-1"}
}

test_a_prefer_no_schedule_taint_does_not if {
	tainted := with_member("member-eu-2", {"spec": {"taints": [{"key": "maintenance", "effect": "PreferNoSchedule"}]}})
	doc := admission with input as eu_pci2 with data.kubernetes.clusters as tainted
	placed_on(doc) == {"member-eu-1", "member-eu-2"}
}

test_a_member_labelled_non_eu_leaves_the_eu if {
	relabelled := with_member("member-eu-1", {"metadata": {"labels": {"placement-policy.io/jurisdiction": "non-eu"}}})
	doc := admission with input as eu_pci2 with data.kubernetes.clusters as relabelled
	placed_on(doc) == {"member-eu-2"}
}

test_pci3_leaves_member_eu_1_out if {
	doc := admission with input as deployment({eu_key: "true", pci_key: "3"}) with data.kubernetes.clusters as members
	placed_on(doc) == {"member-eu-2"}
}

test_no_eu_member_left_is_an_error if {
	down := object.union(members, {
		"member-eu-1": object.union(members["member-eu-1"], {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
		"member-eu-2": object.union(members["member-eu-2"], {"spec": {"taints": [{"key": "x", "effect": "NoExecute"}]}}),
	})
	doc := admission with input as eu_pci2 with data.kubernetes.clusters as down
	doc.annotations == {}
	count(doc.errors) == 1
}

# Karmada's Clusters and placement-policy.io Clusters can be replicated side by side.
test_both_cluster_kinds_in_one_registry if {
	ours := {
		"apiVersion": "placement-policy.io/v1alpha1",
		"kind": "Cluster",
		"metadata": {"name": "gce-europe-west4", "labels": {"placement-policy.io/pci-compliance-level": "2"}},
		"spec": {"region": "europe-west4"},
		"status": {"phase": "running"},
	}
	doc := admission with input as eu_pci2 with data.kubernetes.clusters as object.union(members, {"gce-europe-west4": ours})
	placed_on(doc) == {"member-eu-1", "member-eu-2", "gce-europe-west4"}
}

# --- least-loaded weighting --------------------------------------------------

loaded := object.union(members, {
	"member-eu-1": object.union(members["member-eu-1"], {"status": {"resourceSummary": summary("2", "1500m")}}),
	"member-eu-2": object.union(members["member-eu-2"], {"status": {"resourceSummary": summary("8", "2")}}),
})

test_least_loaded_weights_by_free_millicores if {
	doc := admission with input as eu_pci2
		with data.kubernetes.clusters as loaded
		with data.io.k8s.federation.settings.weighting as "least-loaded"
	weights(doc) == {"member-eu-1": 500, "member-eu-2": 6000}
	doc.policy_weights == true
}

test_even_weights_are_not_the_policys_own if {
	doc := admission with input as eu_pci2 with data.kubernetes.clusters as members
	not doc.policy_weights
}

test_least_loaded_counts_allocating_and_never_goes_below_zero if {
	full := object.union(loaded, {"member-eu-1": object.union(loaded["member-eu-1"], {"status": {"resourceSummary": {
		"allocatable": {"cpu": "2"},
		"allocated": {"cpu": "1"},
		"allocating": {"cpu": "1500m"},
	}}})})
	doc := admission with input as eu_pci2
		with data.kubernetes.clusters as full
		with data.io.k8s.federation.settings.weighting as "least-loaded"
	weights(doc) == {"member-eu-1": 0, "member-eu-2": 6000}
}

test_least_loaded_without_a_summary_spreads_evenly if {
	no_summary := object.remove(members, ["member-eu-2"])
	ours := {
		"apiVersion": "placement-policy.io/v1alpha1",
		"kind": "Cluster",
		"metadata": {"name": "member-eu-2", "labels": {"placement-policy.io/pci-compliance-level": "3"}},
		"spec": {"region": "europe-west2"},
		"status": {"phase": "running"},
	}
	doc := admission with input as eu_pci2
		with data.kubernetes.clusters as object.union(no_summary, {"member-eu-2": ours})
		with data.io.k8s.federation.settings.weighting as "least-loaded"
	weights(doc) == {"member-eu-1": 1, "member-eu-2": 1}
	not doc.policy_weights
}

test_an_unknown_weighting_is_an_error if {
	doc := admission with input as eu_pci2
		with data.kubernetes.clusters as members
		with data.io.k8s.federation.settings.weighting as "least_loaded"
	doc.errors == {"placement settings: weighting must be \"even\" or \"least-loaded\", got \"least_loaded\""}
}
