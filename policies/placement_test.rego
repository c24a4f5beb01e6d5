# Unit tests of placement.rego: `opa test policies/ -v`.
package io.k8s.federation.admission_test

import data.io.k8s.federation.admission

# ---------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------

eu_key := "policy.federation.alpha.kubernetes.io/eu-jurisdiction-required"

pci_key := "policy.federation.alpha.kubernetes.io/pci-compliance-level"

prefs_key := "federation.kubernetes.io/replica-set-preferences"

cluster(name, region, labels, phase) := {
	"apiVersion": "placement-policy.io/v1alpha1",
	"kind": "Cluster",
	"metadata": {"name": name, "labels": labels},
	"spec": {"address": "https://10.0.0.1", "region": region, "zones": [concat("", [region, "-a"])]},
	"status": {"phase": phase, "capacity": {"cpu": "8", "memory": "32Gi"}},
}

pci(level) := {"placement-policy.io/pci-compliance-level": level}

# The registry of the EU/PCI example (same as kubernetes/clusters/data.json).
registry := {
	"gce-europe-west1": cluster("gce-europe-west1", "europe-west1", pci("2"), "running"),
	"gce-europe-west2": cluster("gce-europe-west2", "europe-west2", pci("3"), "running"),
	"aws-eu-central-1": cluster("aws-eu-central-1", "eu-central-1", pci("1"), "running"),
	"gce-europe-north1": cluster("gce-europe-north1", "europe-north1", pci("3"), "offline"),
	"gce-us-central1": cluster("gce-us-central1", "us-central1", pci("3"), "running"),
	"aws-us-east-1": cluster("aws-us-east-1", "us-east-1", pci("2"), "pending"),
}

running_in_registry := {"gce-europe-west1", "gce-europe-west2", "aws-eu-central-1", "gce-us-central1"}

workload(kind, annotations) := {
	"apiVersion": "apps/v1",
	"kind": kind,
	"metadata": {
		"name": "nginx-eu",
		"namespace": "default",
		"labels": {"app": "nginx-eu"},
		"annotations": annotations,
	},
	"spec": {"replicas": 4},
}

rs(annotations) := workload("ReplicaSet", annotations)

# The expected placement annotation value.
placement(names, rebalance) := {
	"clusters": {name: {"weight": 1} | some name in names},
	"rebalance": rebalance,
}

placed_on(doc) := {name | some name, _ in doc.annotations[prefs_key].clusters}

no_cluster_msg(eu, level) := sprintf(
	"no cluster satisfies the placement requirements (eu-jurisdiction-required=%s, pci-compliance-level>=%s)",
	[eu, level],
)

# ---------------------------------------------------------------------------
# The EU/PCI example and the shape of the decision document
# ---------------------------------------------------------------------------

test_eu_pci2_example_goes_to_west1_and_west2 if {
	doc := admission with input as rs({eu_key: "true", pci_key: "2"})
		with data.kubernetes.clusters as registry
	doc == {
		"policy_weights": false,
		"annotations": {prefs_key: placement({"gce-europe-west1", "gce-europe-west2"}, true)},
		"errors": set(),
	}
}

# The shipped example registry gives the same answer (kubernetes/clusters/data.json).
test_eu_pci2_example_with_shipped_example_registry if {
	doc := admission with input as rs({eu_key: "true", pci_key: "2"})
	doc.annotations[prefs_key] == placement({"gce-europe-west1", "gce-europe-west2"}, true)
	count(doc.errors) == 0
}

# The conflict example: the request is denied (errors), and the decision
# also carries the intersection (the decision document's shape; the webhook and the
# remediator never apply annotations that come with errors).
test_forbidden_example_is_denied_with_the_intersection if {
	doc := admission with input as rs({
		eu_key: "true",
		pci_key: "2",
		prefs_key: `{"clusters":{"gce-us-central1":{"weight":1},"gce-europe-west1":{"weight":1}}}`,
	})
		with data.kubernetes.clusters as registry
	doc == {
		"policy_weights": false,
		"annotations": {prefs_key: placement({"gce-europe-west1"}, true)},
		"errors": {"requested replica-set-preferences includes invalid clusters: gce-us-central1"},
	}
}

test_a_requested_cluster_gone_offline_leaves_the_rest if {
	offline := object.union(registry, {"gce-europe-west2": cluster("gce-europe-west2", "europe-west2", pci("3"), "offline")})
	doc := admission with input as rs({
		eu_key: "true",
		pci_key: "2",
		prefs_key: `{"clusters":{"gce-europe-west1":{"weight":1},"gce-europe-west2":{"weight":1}}}`,
	})
		with data.kubernetes.clusters as offline
	doc.errors == {"requested replica-set-preferences includes invalid clusters: gce-europe-west2"}
	placed_on(doc) == {"gce-europe-west1"}
}

test_no_intersection_gives_no_annotation if {
	doc := admission with input as rs({eu_key: "true", prefs_key: `{"clusters":{"gce-us-central1":{}}}`})
		with data.kubernetes.clusters as registry
	doc == {
		"policy_weights": false,
		"annotations": {},
		"errors": {"requested replica-set-preferences includes invalid clusters: gce-us-central1"},
	}
}

# A policy set missing the rules package is not "nothing to place": the
# decision is undefined, so the webhook fails closed iff policies exist.
test_decision_is_undefined_without_its_rules_package if {
	doc := admission with input as rs({eu_key: "true"})
		with data.kubernetes.clusters as registry
		with data.io.k8s.federation.placement as {}
	not "annotations" in object.keys(doc)
	not "errors" in object.keys(doc)
	not "policy_weights" in object.keys(doc)
}

test_decision_for_other_kinds_is_defined_and_empty if {
	doc := admission with input as {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}
		with data.kubernetes.clusters as registry
	doc == {"policy_weights": false, "annotations": {}, "errors": set()}
}

test_document_has_exactly_annotations_errors_and_policy_weights if {
	doc := admission with input as rs({}) with data.kubernetes.clusters as registry
	{key | some key, _ in doc} == {"annotations", "errors", "policy_weights"}
}

test_request_metadata_under_admission_key_is_ignored if {
	obj := object.union(rs({eu_key: "true", pci_key: "2"}), {"_admission": {
		"operation": "CREATE",
		"userInfo": {"username": "dev"},
	}})
	doc := admission with input as obj with data.kubernetes.clusters as registry
	placed_on(doc) == {"gce-europe-west1", "gce-europe-west2"}
	count(doc.errors) == 0
}

# ---------------------------------------------------------------------------
# Rule: ReplicaSet and Deployment are placed, and any object with a requirement
# ---------------------------------------------------------------------------

test_every_kind_with_a_requirement_is_bounded_to_the_allowed_clusters if {
	every kind in {"Pod", "StatefulSet", "DaemonSet", "Job", "CronJob", "Service", "CustomWorkload"} {
		doc := admission with input as workload(kind, {eu_key: "true", pci_key: "2"})
			with data.kubernetes.clusters as registry
		placed_on(doc) == {"gce-europe-west1", "gce-europe-west2"}
		count(doc.errors) == 0
	}
}

test_a_pci_requirement_alone_bounds_any_kind if {
	doc := admission with input as workload("StatefulSet", {pci_key: "3"})
		with data.kubernetes.clusters as registry
	placed_on(doc) == {"gce-europe-west2", "gce-us-central1"}
}

test_other_kind_without_a_requirement_gets_empty_document if {
	doc := admission with input as workload("StatefulSet", {prefs_key: "{}"})
		with data.kubernetes.clusters as registry
	doc == {"policy_weights": false, "annotations": {}, "errors": set()}
}

test_other_kind_with_an_invalid_requirement_is_refused if {
	svc := workload("Service", {eu_key: "maybe"})
	doc := admission with input as svc with data.kubernetes.clusters as registry
	doc.errors == {"policy.federation.alpha.kubernetes.io/eu-jurisdiction-required must be \"true\" or \"false\", got \"maybe\""}
	doc.annotations == {}
}

test_other_kind_that_no_cluster_can_run_is_refused if {
	doc := admission with input as workload("Job", {eu_key: "true", pci_key: "9"})
		with data.kubernetes.clusters as registry
	count(doc.errors) == 1
	doc.annotations == {}
}

test_other_kind_with_no_clusters_is_not_an_error if {
	doc := admission with input as workload("ConfigMap", {}) with data.kubernetes.clusters as {}
	doc == {"policy_weights": false, "annotations": {}, "errors": set()}
}

test_object_without_kind_gets_empty_document if {
	doc := admission with input as {"metadata": {"name": "x"}} with data.kubernetes.clusters as registry
	doc == {"policy_weights": false, "annotations": {}, "errors": set()}
}

test_kind_is_case_sensitive if {
	doc := admission with input as workload("replicaset", {}) with data.kubernetes.clusters as registry
	doc == {"policy_weights": false, "annotations": {}, "errors": set()}
}

test_deployment_is_placed if {
	doc := admission with input as workload("Deployment", {eu_key: "true", pci_key: "2"})
		with data.kubernetes.clusters as registry
	placed_on(doc) == {"gce-europe-west1", "gce-europe-west2"}
	count(doc.errors) == 0
}

test_any_api_version_is_placed if {
	old := object.union(rs({eu_key: "true", pci_key: "2"}), {"apiVersion": "extensions/v1beta1"})
	doc := admission with input as old with data.kubernetes.clusters as registry
	placed_on(doc) == {"gce-europe-west1", "gce-europe-west2"}
}

# ---------------------------------------------------------------------------
# Rule: only running clusters are eligible
# ---------------------------------------------------------------------------

test_only_running_clusters_without_requirements if {
	doc := admission with input as rs({}) with data.kubernetes.clusters as registry
	doc.annotations[prefs_key] == placement(running_in_registry, true)
	count(doc.errors) == 0
}

test_workload_without_annotations_map_is_placed if {
	obj := {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "plain"}}
	doc := admission with input as obj with data.kubernetes.clusters as registry
	placed_on(doc) == running_in_registry
}

test_pending_offline_terminated_and_phaseless_clusters_are_never_used if {
	clusters := {
		"up": cluster("up", "europe-west1", pci("3"), "running"),
		"pending": cluster("pending", "europe-west1", pci("3"), "pending"),
		"offline": cluster("offline", "europe-west1", pci("3"), "offline"),
		"terminated": cluster("terminated", "europe-west1", pci("3"), "terminated"),
		"unknown": cluster("unknown", "europe-west1", pci("3"), "Running"),
		"no-status": object.remove(cluster("no-status", "europe-west1", pci("3"), "running"), {"status"}),
	}
	doc := admission with input as rs({eu_key: "true", pci_key: "3"}) with data.kubernetes.clusters as clusters
	placed_on(doc) == {"up"}
}

test_only_non_running_clusters_is_no_cluster if {
	clusters := {
		"pending": cluster("pending", "europe-west1", pci("3"), "pending"),
		"offline": cluster("offline", "europe-west1", pci("3"), "offline"),
	}
	doc := admission with input as rs({}) with data.kubernetes.clusters as clusters
	doc == {"policy_weights": false, "annotations": {}, "errors": {no_cluster_msg("false", "0")}}
}

# ---------------------------------------------------------------------------
# Rule: EU jurisdiction
# ---------------------------------------------------------------------------

eu_test_clusters := {
	"gce-europe": cluster("gce-europe", "europe-west3", {}, "running"),
	"aws-eu": cluster("aws-eu", "eu-west-1", {}, "running"),
	"us": cluster("us", "us-east-1", {}, "running"),
	"labelled-eu": cluster("labelled-eu", "onprem-frankfurt", {"placement-policy.io/jurisdiction": "eu"}, "running"),
	"labelled-non-eu": cluster("labelled-non-eu", "europe-west2", {"placement-policy.io/jurisdiction": "non-eu"}, "running"),
	"other-label": cluster("other-label", "eu-north-1", {"placement-policy.io/jurisdiction": "EU"}, "running"),
	"other-label-us": cluster("other-label-us", "us-west-2", {"placement-policy.io/jurisdiction": "EU"}, "running"),
	"prefix-only": cluster("prefix-only", "europewest", {}, "running"),
	"bare-eu": cluster("bare-eu", "eu", {}, "running"),
	"no-region": object.remove(cluster("no-region", "x", {}, "running"), {"spec"}),
}

eu_test_expected := {"gce-europe", "aws-eu", "labelled-eu", "other-label"}

test_eu_required_keeps_europe_and_eu_regions_and_eu_label if {
	doc := admission with input as rs({eu_key: "true"}) with data.kubernetes.clusters as eu_test_clusters
	placed_on(doc) == eu_test_expected
	count(doc.errors) == 0
}

# spec.region is set on the control plane: it counts whether or not the
# settings trust what clusters report about themselves (they do not by
# default; placement_ocm_test.rego has the claims).
test_the_settings_trust_no_cluster_claims_by_default if {
	data.io.k8s.federation.settings.trust_cluster_claims == false
	doc := admission with input as rs({eu_key: "true"}) with data.kubernetes.clusters as eu_test_clusters
	placed_on(doc) == eu_test_expected
}

test_eu_false_is_no_restriction if {
	doc := admission with input as rs({eu_key: "false"}) with data.kubernetes.clusters as eu_test_clusters
	placed_on(doc) == {name | some name, _ in eu_test_clusters}
}

test_eu_absent_is_no_restriction if {
	doc := admission with input as rs({}) with data.kubernetes.clusters as eu_test_clusters
	placed_on(doc) == {name | some name, _ in eu_test_clusters}
}

test_non_eu_label_overrides_eu_region if {
	clusters := {"labelled-non-eu": eu_test_clusters["labelled-non-eu"]}
	doc := admission with input as rs({eu_key: "true"}) with data.kubernetes.clusters as clusters
	doc == {"policy_weights": false, "annotations": {}, "errors": {no_cluster_msg("true", "0")}}
}

test_eu_label_overrides_non_eu_region if {
	clusters := {"labelled-eu": eu_test_clusters["labelled-eu"], "us": eu_test_clusters.us}
	doc := admission with input as rs({eu_key: "true"}) with data.kubernetes.clusters as clusters
	placed_on(doc) == {"labelled-eu"}
}

test_eu_invalid_value_is_an_error if {
	doc := admission with input as rs({eu_key: "yes"}) with data.kubernetes.clusters as registry
	doc == {
		"policy_weights": false,
		"annotations": {},
		"errors": {`policy.federation.alpha.kubernetes.io/eu-jurisdiction-required must be "true" or "false", got "yes"`},
	}
}

test_eu_value_is_case_sensitive if {
	doc := admission with input as rs({eu_key: "True"}) with data.kubernetes.clusters as registry
	doc.errors == {`policy.federation.alpha.kubernetes.io/eu-jurisdiction-required must be "true" or "false", got "True"`}
	doc.annotations == {}
}

test_eu_empty_value_is_an_error if {
	doc := admission with input as rs({eu_key: ""}) with data.kubernetes.clusters as registry
	doc.errors == {`policy.federation.alpha.kubernetes.io/eu-jurisdiction-required must be "true" or "false", got ""`}
}

test_eu_non_string_value_is_an_error if {
	doc := admission with input as rs({eu_key: true}) with data.kubernetes.clusters as registry
	doc.errors == {`policy.federation.alpha.kubernetes.io/eu-jurisdiction-required must be "true" or "false", got true`}
}

# ---------------------------------------------------------------------------
# Rule: PCI compliance level
# ---------------------------------------------------------------------------

pci_test_clusters := {
	"l0": cluster("l0", "us-east-1", pci("0"), "running"),
	"l1": cluster("l1", "us-east-1", pci("1"), "running"),
	"l2": cluster("l2", "us-east-1", pci("2"), "running"),
	"l3": cluster("l3", "us-east-1", pci("3"), "running"),
	"l10": cluster("l10", "us-east-1", pci("10"), "running"),
	"l02": cluster("l02", "us-east-1", pci("02"), "running"),
	"unlabelled": cluster("unlabelled", "us-east-1", {}, "running"),
	"text": cluster("text", "us-east-1", pci("high"), "running"),
	"negative": cluster("negative", "us-east-1", pci("-5"), "running"),
	"fraction": cluster("fraction", "us-east-1", pci("2.5"), "running"),
}

test_pci_keeps_levels_at_or_above if {
	doc := admission with input as rs({pci_key: "2"}) with data.kubernetes.clusters as pci_test_clusters
	placed_on(doc) == {"l2", "l3", "l10", "l02"}
	count(doc.errors) == 0
}

test_pci_compares_numbers_not_strings if {
	doc := admission with input as rs({pci_key: "3"}) with data.kubernetes.clusters as pci_test_clusters
	placed_on(doc) == {"l3", "l10"}
}

test_pci_missing_or_invalid_cluster_label_is_level_0 if {
	doc := admission with input as rs({pci_key: "1"}) with data.kubernetes.clusters as pci_test_clusters
	not "unlabelled" in placed_on(doc)
	not "text" in placed_on(doc)
	not "negative" in placed_on(doc)
	not "fraction" in placed_on(doc)
	"l1" in placed_on(doc)
}

test_pci_zero_and_absent_keep_every_cluster if {
	all := {name | some name, _ in pci_test_clusters}
	zero := admission with input as rs({pci_key: "0"}) with data.kubernetes.clusters as pci_test_clusters
	absent := admission with input as rs({}) with data.kubernetes.clusters as pci_test_clusters
	placed_on(zero) == all
	placed_on(absent) == all
}

test_pci_leading_zeros_are_accepted if {
	doc := admission with input as rs({pci_key: "003"}) with data.kubernetes.clusters as pci_test_clusters
	placed_on(doc) == {"l3", "l10"}
}

test_pci_too_high_is_no_cluster if {
	doc := admission with input as rs({pci_key: "11"}) with data.kubernetes.clusters as pci_test_clusters
	doc == {"policy_weights": false, "annotations": {}, "errors": {no_cluster_msg("false", "11")}}
}

pci_error(shown) := sprintf(
	"policy.federation.alpha.kubernetes.io/pci-compliance-level must be a non-negative integer, got %s",
	[shown],
)

test_pci_invalid_values_are_errors if {
	every value in ["abc", "-1", "1.5", "", " 2", "2 ", "+2", "1e3", "0x2"] {
		doc := admission with input as rs({pci_key: value}) with data.kubernetes.clusters as registry
		doc == {"policy_weights": false, "annotations": {}, "errors": {pci_error(sprintf("%q", [value]))}}
	}
}

test_pci_non_string_value_is_an_error if {
	doc := admission with input as rs({pci_key: 2}) with data.kubernetes.clusters as registry
	doc.errors == {pci_error("2")}
}

test_eu_and_pci_both_invalid_report_both if {
	doc := admission with input as rs({eu_key: "1", pci_key: "two"}) with data.kubernetes.clusters as registry
	doc == {"policy_weights": false, "annotations": {}, "errors": {
		`policy.federation.alpha.kubernetes.io/eu-jurisdiction-required must be "true" or "false", got "1"`,
		pci_error(`"two"`),
	}}
}

# ---------------------------------------------------------------------------
# Rule: the developer's requested clusters
# ---------------------------------------------------------------------------

test_requested_allowed_clusters_are_the_selection if {
	doc := admission with input as rs({
		eu_key: "true",
		prefs_key: `{"rebalance": false, "clusters": {"aws-eu-central-1": {"weight": 3}, "gce-europe-west2": {"weight": 1}}}`,
	})
		with data.kubernetes.clusters as registry
	doc == {
		"policy_weights": false,
		"annotations": {prefs_key: placement({"aws-eu-central-1", "gce-europe-west2"}, false)},
		"errors": set(),
	}
}

test_requested_single_cluster if {
	doc := admission with input as rs({prefs_key: `{"clusters": {"gce-us-central1": {}}}`})
		with data.kubernetes.clusters as registry
	doc.annotations[prefs_key] == placement({"gce-us-central1"}, true)
}

test_requested_invalid_clusters_are_denied_sorted if {
	doc := admission with input as rs({
		eu_key: "true",
		pci_key: "2",
		prefs_key: `{"clusters": {"gce-us-central1": {}, "aws-eu-central-1": {}, "gce-europe-north1": {}, "nowhere": {}, "gce-europe-west1": {}}}`,
	})
		with data.kubernetes.clusters as registry
	doc == {"policy_weights": false, "annotations": {prefs_key: placement({"gce-europe-west1"}, true)}, "errors": {
		"requested replica-set-preferences includes invalid clusters: aws-eu-central-1, gce-europe-north1, gce-us-central1, nowhere",
	}}
}

test_requested_pending_cluster_is_invalid if {
	doc := admission with input as rs({prefs_key: `{"clusters": {"aws-us-east-1": {"weight": 1}}}`})
		with data.kubernetes.clusters as registry
	doc.errors == {"requested replica-set-preferences includes invalid clusters: aws-us-east-1"}
	doc.annotations == {}
}

test_requested_empty_clusters_means_all_allowed if {
	doc := admission with input as rs({eu_key: "true", pci_key: "2", prefs_key: `{"rebalance": false, "clusters": {}}`})
		with data.kubernetes.clusters as registry
	doc.annotations[prefs_key] == placement({"gce-europe-west1", "gce-europe-west2"}, false)
	count(doc.errors) == 0
}

prefs_json_error(shown) := sprintf("federation.kubernetes.io/replica-set-preferences must be a JSON object, got %s", [shown])

prefs_clusters_error(shown) := sprintf(
	"federation.kubernetes.io/replica-set-preferences must have an object \"clusters\", got %s",
	[shown],
)

test_preferences_not_json_is_an_error if {
	every raw in ["{", "clusters: a", "", "{\"clusters\": {}"] {
		doc := admission with input as rs({prefs_key: raw}) with data.kubernetes.clusters as registry
		doc == {"policy_weights": false, "annotations": {}, "errors": {prefs_json_error(sprintf("%q", [raw]))}}
	}
}

test_preferences_without_clusters_object_is_an_error if {
	every raw in [`{}`, `{"rebalance": true}`, `{"clusters": ["a"]}`, `{"clusters": "a"}`, `{"clusters": null}`, `["a"]`, `"a"`, `7`] {
		doc := admission with input as rs({prefs_key: raw}) with data.kubernetes.clusters as registry
		doc == {"policy_weights": false, "annotations": {}, "errors": {prefs_clusters_error(sprintf("%q", [raw]))}}
	}
}

test_preferences_non_string_value_is_an_error if {
	doc := admission with input as rs({prefs_key: {"clusters": {}}}) with data.kubernetes.clusters as registry
	doc.errors == {prefs_json_error(`{"clusters": {}}`)}
}

test_preferences_error_and_requirement_error_are_both_reported if {
	doc := admission with input as rs({pci_key: "x", prefs_key: "nope"}) with data.kubernetes.clusters as registry
	doc.errors == {pci_error(`"x"`), prefs_json_error(`"nope"`)}
}

# ---------------------------------------------------------------------------
# Rule: even spreading and the answer annotation
# ---------------------------------------------------------------------------

test_all_selected_clusters_get_weight_1 if {
	doc := admission with input as rs({}) with data.kubernetes.clusters as registry
	every _, pref in doc.annotations[prefs_key].clusters {
		pref == {"weight": 1}
	}
}

test_developer_weights_and_limits_are_replaced if {
	doc := admission with input as rs({prefs_key: `{"clusters": {"gce-europe-west1": {"weight": 7, "minReplicas": 2}}}`})
		with data.kubernetes.clusters as registry
	doc.annotations[prefs_key] == {"clusters": {"gce-europe-west1": {"weight": 1}}, "rebalance": true}
}

test_rebalance_defaults_to_true if {
	doc := admission with input as rs({eu_key: "true"}) with data.kubernetes.clusters as registry
	doc.annotations[prefs_key].rebalance == true
}

test_rebalance_false_from_developer_is_kept if {
	doc := admission with input as rs({prefs_key: `{"rebalance": false, "clusters": {}}`})
		with data.kubernetes.clusters as registry
	doc.annotations[prefs_key].rebalance == false
}

test_rebalance_true_from_developer_is_kept if {
	doc := admission with input as rs({prefs_key: `{"rebalance": true, "clusters": {"gce-us-central1": {}}}`})
		with data.kubernetes.clusters as registry
	doc.annotations[prefs_key] == placement({"gce-us-central1"}, true)
}

test_rebalance_non_boolean_is_true if {
	every raw in [`{"rebalance": "false", "clusters": {}}`, `{"rebalance": 0, "clusters": {}}`, `{"rebalance": null, "clusters": {}}`] {
		doc := admission with input as rs({prefs_key: raw}) with data.kubernetes.clusters as registry
		doc.annotations[prefs_key].rebalance == true
	}
}

test_answer_is_the_only_annotation_and_an_object if {
	doc := admission with input as rs({eu_key: "true", pci_key: "2"}) with data.kubernetes.clusters as registry
	object.keys(doc.annotations) == {prefs_key}
	is_object(doc.annotations[prefs_key])
}

test_new_running_cluster_is_picked_up if {
	grown := object.union(registry, {"gce-europe-west4": cluster("gce-europe-west4", "europe-west4", pci("4"), "running")})
	doc := admission with input as rs({eu_key: "true", pci_key: "2"}) with data.kubernetes.clusters as grown
	placed_on(doc) == {"gce-europe-west1", "gce-europe-west2", "gce-europe-west4"}
}

# ---------------------------------------------------------------------------
# Rule: no allowed cluster
# ---------------------------------------------------------------------------

test_no_allowed_cluster_is_an_error_without_annotation if {
	doc := admission with input as rs({eu_key: "true", pci_key: "4"}) with data.kubernetes.clusters as registry
	doc == {"policy_weights": false, "annotations": {}, "errors": {no_cluster_msg("true", "4")}}
}

test_no_allowed_cluster_message_normalizes_level if {
	doc := admission with input as rs({eu_key: "false", pci_key: "07"}) with data.kubernetes.clusters as registry
	doc.errors == {no_cluster_msg("false", "7")}
}

test_empty_registry_is_no_cluster if {
	doc := admission with input as rs({}) with data.kubernetes.clusters as {}
	doc == {"policy_weights": false, "annotations": {}, "errors": {no_cluster_msg("false", "0")}}
}

test_missing_registry_is_no_cluster if {
	doc := admission with input as rs({}) with data.kubernetes as {}
	doc == {"policy_weights": false, "annotations": {}, "errors": {no_cluster_msg("false", "0")}}
}

test_request_with_no_allowed_cluster_reports_both if {
	doc := admission with input as rs({eu_key: "true", prefs_key: `{"clusters": {"gce-us-central1": {}}}`})
		with data.kubernetes.clusters as {"gce-us-central1": registry["gce-us-central1"]}
	doc == {"policy_weights": false, "annotations": {}, "errors": {
		"requested replica-set-preferences includes invalid clusters: gce-us-central1",
		no_cluster_msg("true", "0"),
	}}
}

test_invalid_requirement_skips_no_cluster_and_request_checks if {
	doc := admission with input as rs({pci_key: "x", prefs_key: `{"clusters": {"nowhere": {}}}`})
		with data.kubernetes.clusters as {}
	doc.errors == {pci_error(`"x"`)}
}

test_no_allowed_cluster_message_shows_huge_level_digits if {
	doc := admission with input as rs({pci_key: "000123456789012345678901234567890"})
		with data.kubernetes.clusters as registry
	doc.errors == {no_cluster_msg("false", "123456789012345678901234567890")}
}

test_no_allowed_cluster_message_level_all_zeros if {
	doc := admission with input as rs({pci_key: "000"}) with data.kubernetes.clusters as {}
	doc.errors == {no_cluster_msg("false", "0")}
}
