# Unit tests of the placement policy over Open Cluster Management's
# ManagedClusters (cluster.open-cluster-management.io/v1), of a Placement's own
# annotations and of the reasons placement-sync writes into PlacementDecisions:
# `opa test policies/ -v`.
package io.k8s.federation.ocm_test

import data.io.k8s.federation.admission

eu_key := "policy.federation.alpha.kubernetes.io/eu-jurisdiction-required"

pci_key := "policy.federation.alpha.kubernetes.io/pci-compliance-level"

prefs_key := "federation.kubernetes.io/replica-set-preferences"

reasons_key := "placement-policy.io/cluster-reasons"

# A ManagedCluster as the hub has it: labelled on the hub (PCI level and
# jurisdiction, as the OCM test bed labels its clusters), with the region its
# agent claims.
managed(name, region, level) := object.union(claimed(name, region, level), {"metadata": {"labels": {"placement-policy.io/jurisdiction": jurisdiction(region)}}})

jurisdiction(region) := "eu" if startswith(region, "europe-")

else := "non-eu"

# The same without a jurisdiction label: only its own claim says where it is.
claimed(name, region, level) := {
	"apiVersion": "cluster.open-cluster-management.io/v1",
	"kind": "ManagedCluster",
	"metadata": {"name": name, "labels": {"placement-policy.io/pci-compliance-level": level}},
	"spec": {"hubAcceptsClient": true, "leaseDurationSeconds": 60},
	"status": {
		"conditions": [
			{"type": "ManagedClusterJoined", "status": "True"},
			{"type": "ManagedClusterConditionAvailable", "status": "True"},
		],
		"clusterClaims": [{"name": "region.open-cluster-management.io", "value": region}],
	},
}

# The OCM test bed's clusters.
clusters := {
	"ocm-eu-1": managed("ocm-eu-1", "europe-west1", "2"),
	"ocm-eu-2": managed("ocm-eu-2", "europe-west2", "3"),
	"ocm-us-1": managed("ocm-us-1", "us-central1", "3"),
}

# The same clusters unlabelled: ocm-us-1's administrator claims an EU region.
claimed_only := {
	"ocm-eu-1": claimed("ocm-eu-1", "europe-west1", "2"),
	"ocm-eu-2": claimed("ocm-eu-2", "europe-west2", "3"),
	"ocm-us-1": claimed("ocm-us-1", "europe-west3", "3"),
}

deployment(annotations) := {
	"apiVersion": "apps/v1",
	"kind": "Deployment",
	"metadata": {"name": "web", "namespace": "shop", "annotations": annotations},
	"spec": {"replicas": 1},
}

placement(annotations) := {
	"apiVersion": "cluster.open-cluster-management.io/v1beta1",
	"kind": "Placement",
	"metadata": {"name": "web", "namespace": "shop", "annotations": annotations},
	"spec": {},
}

eu_pci2 := deployment({eu_key: "true", pci_key: "2"})

# A workload as placement-sync asks for it: the Placement under _placement.
asked_for(workload) := object.union(workload, {"_placement": placement({})})

placed_on(doc) := {name | some name, _ in doc.annotations[prefs_key].clusters}

with_cluster(name, patch) := object.union(clusters, {name: object.union(clusters[name], patch)})

decide(input_doc, managed_clusters) := doc if {
	doc := admission with input as input_doc
		with data.kubernetes.clusters as {}
		with data.kubernetes.managedclusters as managed_clusters
}

test_eu_pci2_goes_to_both_eu_clusters_by_their_hub_labels if {
	doc := decide(eu_pci2, clusters)
	placed_on(doc) == {"ocm-eu-1", "ocm-eu-2"}
	doc.errors == set()
}

# What a cluster reports about itself is not trusted by default: a claimed
# region makes no cluster an EU one (the hub's label does).
test_a_claimed_region_alone_places_nothing_in_the_eu if {
	doc := decide(eu_pci2, claimed_only)
	placed_on(doc) == set()
	doc.errors == {"no cluster satisfies the placement requirements (eu-jurisdiction-required=true, pci-compliance-level>=2)"}
}

# Trusted by the settings, the claim is the region of an unlabelled cluster:
# also the one whose administrator claims an EU region for it.
test_trusted_claims_are_the_region_of_unlabelled_clusters if {
	doc := decide(eu_pci2, claimed_only) with data.io.k8s.federation.settings.trust_cluster_claims as true
	placed_on(doc) == {"ocm-eu-1", "ocm-eu-2", "ocm-us-1"}
}

test_the_jurisdiction_label_overrides_a_trusted_claim if {
	relabelled := with_cluster("ocm-eu-1", {"metadata": {"labels": {
		"placement-policy.io/pci-compliance-level": "2",
		"placement-policy.io/jurisdiction": "non-eu",
	}}})
	placed_on(decide(eu_pci2, relabelled)) == {"ocm-eu-2"} with data.io.k8s.federation.settings.trust_cluster_claims as true
	us_in_eu := with_cluster("ocm-us-1", {"metadata": {"labels": {
		"placement-policy.io/pci-compliance-level": "3",
		"placement-policy.io/jurisdiction": "eu",
	}}})
	placed_on(decide(eu_pci2, us_in_eu)) == {"ocm-eu-1", "ocm-eu-2", "ocm-us-1"} with data.io.k8s.federation.settings.trust_cluster_claims as true
}

test_an_unavailable_cluster_takes_no_workloads if {
	some status in ["False", "Unknown"]
	lost := with_cluster("ocm-eu-2", {"status": {
		"conditions": [{"type": "ManagedClusterConditionAvailable", "status": status}],
		"clusterClaims": [{"name": "region.open-cluster-management.io", "value": "europe-west2"}],
	}})
	placed_on(decide(eu_pci2, lost)) == {"ocm-eu-1"}
}

test_a_cluster_without_conditions_takes_no_workloads if {
	joining := with_cluster("ocm-eu-2", {"status": {"conditions": []}})
	placed_on(decide(deployment({}), joining)) == {"ocm-eu-1", "ocm-us-1"}
}

test_pci_level_3_keeps_only_level_3_clusters if {
	doc := decide(deployment({pci_key: "3"}), clusters)
	placed_on(doc) == {"ocm-eu-2", "ocm-us-1"}
}

test_no_eu_pci4_cluster_is_an_error if {
	doc := decide(deployment({eu_key: "true", pci_key: "4"}), clusters)
	doc.annotations == {}
	doc.errors == {"no cluster satisfies the placement requirements (eu-jurisdiction-required=true, pci-compliance-level>=4)"}
}

test_managed_clusters_and_karmada_clusters_are_read_side_by_side if {
	karmada := {"member-eu-1": {
		"apiVersion": "cluster.karmada.io/v1alpha1",
		"kind": "Cluster",
		"metadata": {"name": "member-eu-1", "labels": {"placement-policy.io/pci-compliance-level": "2"}},
		"spec": {"region": "europe-west1"},
		"status": {"conditions": [{"type": "Ready", "status": "True"}]},
	}}
	doc := admission with input as eu_pci2
		with data.kubernetes.clusters as karmada
		with data.kubernetes.managedclusters as clusters
	placed_on(doc) == {"member-eu-1", "ocm-eu-1", "ocm-eu-2"}
}

test_a_placements_own_annotations_are_requirements if {
	doc := decide(placement({eu_key: "true", pci_key: "3"}), clusters)
	placed_on(doc) == {"ocm-eu-2"}
	bad := decide(placement({eu_key: "maybe"}), clusters)
	bad.errors == {"policy.federation.alpha.kubernetes.io/eu-jurisdiction-required must be \"true\" or \"false\", got \"maybe\""}
}

test_a_placement_of_another_api_group_is_placed_only_for_its_requirements if {
	other := object.union(placement({}), {"apiVersion": "example.com/v1"})
	doc := decide(other, clusters)
	doc == {"policy_weights": false, "annotations": {}, "errors": set()}

	# Like any object, one that carries a requirement is bounded by it.
	required := object.union(placement({eu_key: "true"}), {"apiVersion": "example.com/v1"})
	placed_on(decide(required, clusters)) == {"ocm-eu-1", "ocm-eu-2"}
}

test_asked_for_a_placement_the_reasons_name_the_rules if {
	doc := decide(asked_for(eu_pci2), clusters)
	placed_on(doc) == {"ocm-eu-1", "ocm-eu-2"}
	doc.annotations[reasons_key] == {
		"ocm-eu-1": "running, in the EU (eu-jurisdiction-required), PCI compliance level 2 >= 2 (pci-compliance-level)",
		"ocm-eu-2": "running, in the EU (eu-jurisdiction-required), PCI compliance level 3 >= 2 (pci-compliance-level)",
	}
}

test_without_requirements_the_reason_is_running if {
	doc := decide(asked_for(deployment({})), clusters)
	doc.annotations[reasons_key] == {"ocm-eu-1": "running", "ocm-eu-2": "running", "ocm-us-1": "running"}
}

test_a_request_is_a_reason_too if {
	prefs := "{\"clusters\": {\"ocm-eu-2\": {\"weight\": 1}}}"
	doc := decide(asked_for(deployment({prefs_key: prefs})), clusters)
	doc.annotations[reasons_key] == {"ocm-eu-2": "running, requested (replica-set-preferences)"}
}

test_the_webhook_gets_no_reasons if {
	doc := decide(eu_pci2, clusters)
	object.keys(doc.annotations) == {prefs_key}
}

test_errors_come_without_reasons if {
	doc := decide(asked_for(deployment({eu_key: "true", pci_key: "4"})), clusters)
	doc.annotations == {}
	count(doc.errors) == 1
}
