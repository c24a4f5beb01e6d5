# Unit tests of the exclusions (placement_rules.rego): why each cluster a
# workload is not placed on is left out, as `kubectl placement explain` shows
# it beside the reasons of the clusters it is placed on.
package io.k8s.federation.placement_explain_test

import data.io.k8s.federation.admission_test.cluster
import data.io.k8s.federation.admission_test.eu_key
import data.io.k8s.federation.admission_test.pci
import data.io.k8s.federation.admission_test.pci_key
import data.io.k8s.federation.admission_test.prefs_key
import data.io.k8s.federation.admission_test.registry
import data.io.k8s.federation.admission_test.rs
import data.io.k8s.federation.placement

test_an_eu_pci2_workload_says_why_each_other_cluster_is_left_out if {
	placement.exclusions == {
		"aws-eu-central-1": "PCI compliance level 1 < 2 (pci-compliance-level)",
		"gce-europe-north1": "not running (status.phase offline)",
		"gce-us-central1": "not in the EU (eu-jurisdiction-required)",
		"aws-us-east-1": "not running (status.phase pending), not in the EU (eu-jurisdiction-required)",
	} with input as rs({eu_key: "true", pci_key: "2"})
		with data.kubernetes.clusters as registry
}

test_every_cluster_has_a_reason_or_an_exclusion if {
	exclusions := placement.exclusions with input as rs({eu_key: "true", pci_key: "2"})
		with data.kubernetes.clusters as registry
	reasons := placement.reasons with input as rs({eu_key: "true", pci_key: "2"})
		with data.kubernetes.clusters as registry
	{name | some name, _ in exclusions} | {name | some name, _ in reasons} == {name | some name, _ in registry}
	count({name | some name, _ in exclusions} & {name | some name, _ in reasons}) == 0
}

test_an_allowed_cluster_not_requested_says_so if {
	prefs := json.marshal({"clusters": {"gce-europe-west2": {"weight": 1}}})
	exclusions := placement.exclusions with input as rs({eu_key: "true", pci_key: "2", prefs_key: prefs})
		with data.kubernetes.clusters as registry
	exclusions["gce-europe-west1"] == "not requested (replica-set-preferences)"
	not exclusions["gce-europe-west2"]
}

test_a_requested_cluster_not_allowed_says_why_not_that_it_was_not_requested if {
	prefs := json.marshal({"clusters": {"gce-us-central1": {"weight": 1}, "gce-europe-west2": {"weight": 1}}})
	exclusions := placement.exclusions with input as rs({eu_key: "true", prefs_key: prefs})
		with data.kubernetes.clusters as registry
	exclusions["gce-us-central1"] == "not in the EU (eu-jurisdiction-required)"
}

test_karmada_and_ocm_clusters_that_do_not_run_say_why if {
	karmada := {
		"member-tainted": {
			"apiVersion": "cluster.karmada.io/v1alpha1",
			"kind": "Cluster",
			"metadata": {"name": "member-tainted", "labels": {}},
			"spec": {"region": "europe-west1", "taints": [{"key": "k", "effect": "NoSchedule"}]},
			"status": {"conditions": [{"type": "Ready", "status": "True"}]},
		},
		"member-down": {
			"apiVersion": "cluster.karmada.io/v1alpha1",
			"kind": "Cluster",
			"metadata": {"name": "member-down", "labels": {}},
			"spec": {"region": "europe-west1"},
			"status": {"conditions": [{"type": "Ready", "status": "False"}]},
		},
	}
	managed := {"ocm-gone": {
		"apiVersion": "cluster.open-cluster-management.io/v1",
		"kind": "ManagedCluster",
		"metadata": {"name": "ocm-gone", "labels": {}},
		"status": {"conditions": [{"type": "ManagedClusterConditionAvailable", "status": "Unknown"}]},
	}}
	placement.exclusions == {
		"member-tainted": "not running (tainted NoSchedule or NoExecute)",
		"member-down": "not running (not Ready, or not available)",
		"ocm-gone": "not running (not Ready, or not available)",
	} with input as rs({})
		with data.kubernetes.clusters as karmada
		with data.kubernetes.managedclusters as managed
}

test_invalid_requirements_give_errors_not_exclusions if {
	exclusions := placement.exclusions with input as rs({eu_key: "maybe"})
		with data.kubernetes.clusters as registry
	count(exclusions) == 0
}

test_the_decision_carries_no_exclusions if {
	doc := data.io.k8s.federation.admission with input as rs({eu_key: "true", pci_key: "2"})
		with data.kubernetes.clusters as registry
	object.keys(doc) == {"annotations", "errors", "policy_weights"}
	object.keys(doc.annotations) == {prefs_key}
}

# A fixture check: the registry's clusters are what the tests above name.
test_the_fixture_clusters if {
	registry["gce-europe-west1"] == cluster("gce-europe-west1", "europe-west1", pci("2"), "running")
}
