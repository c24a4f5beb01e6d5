use super::*;
use serde_json::json;

fn cluster(name: &str, region: &str, labels: Value) -> Value {
    json!({"metadata": {"name": name, "labels": labels},
           "spec": {"region": region, "provider": "gce", "zones": ["z1", "z2"]}})
}

#[test]
fn names_exclusions_and_selectors_all_have_to_match() {
    let eu = cluster(
        "member-eu-1",
        "europe-west1",
        json!({"tier": "gold", "placement-policy.io/pci-compliance-level": "2"}),
    );
    assert!(matches(&eu, &json!({})), "an empty affinity matches all");
    assert!(matches(&eu, &json!({"clusterNames": ["member-eu-1"]})));
    assert!(!matches(&eu, &json!({"clusterNames": ["member-eu-2"]})));
    assert!(!matches(&eu, &json!({"exclude": ["member-eu-1"]})));
    assert!(matches(
        &eu,
        &json!({"labelSelector": {"matchLabels": {"tier": "gold"}}})
    ));
    assert!(!matches(
        &eu,
        &json!({"labelSelector": {"matchExpressions": [
            {"key": "tier", "operator": "NotIn", "values": ["gold"]}]}})
    ));
    assert!(
        !matches(
            &eu,
            &json!({"labelSelector": {"matchExpressions": [
            {"key": "tier", "operator": "Bogus"}]}})
        ),
        "a selector Karmada cannot parse matches nothing"
    );
    assert!(matches(
        &eu,
        &json!({"fieldSelector": {"matchExpressions": [
            {"key": "region", "operator": "In", "values": ["europe-west1", "europe-west2"]},
            {"key": "provider", "operator": "Exists"},
            {"key": "zone", "operator": "In", "values": ["z2"]}]}})
    ));
    assert!(!matches(
        &eu,
        &json!({"fieldSelector": {"matchExpressions": [
            {"key": "region", "operator": "NotIn", "values": ["europe-west1"]}]}})
    ));
    assert!(!matches(
        &eu,
        &json!({"fieldSelector": {"matchExpressions": [
            {"key": "zone", "operator": "DoesNotExist"}]}})
    ));
    assert!(
        !matches(
            &eu,
            &json!({"fieldSelector": {"matchExpressions": [
            {"key": "name", "operator": "In", "values": ["member-eu-1"]}]}})
        ),
        "no cluster has a field other than provider and region"
    );
    assert!(matches(
        &eu,
        &json!({"fieldSelector": {"matchExpressions": [
            {"key": "name", "operator": "NotIn", "values": ["member-eu-1"]}]}})
    ));
}

#[test]
fn taints_are_tolerated_as_kubernetes_tolerates_them() {
    let tainted = json!({"metadata": {"name": "c"}, "spec": {"taints": [
        {"key": "maintenance", "value": "yes", "effect": "NoSchedule"},
        {"key": "soft", "effect": "PreferNoSchedule"}]}});
    assert_eq!(
        untolerated_taint(&tainted, &[]),
        Some("maintenance=yes:NoSchedule".to_owned())
    );
    for toleration in [
        json!({"key": "maintenance", "operator": "Equal", "value": "yes"}),
        json!({"key": "maintenance", "value": "yes", "effect": "NoSchedule"}),
        json!({"key": "maintenance", "operator": "Exists"}),
        json!({"operator": "Exists"}),
    ] {
        assert_eq!(
            untolerated_taint(&tainted, std::slice::from_ref(&toleration)),
            None,
            "{toleration}"
        );
    }
    for toleration in [
        json!({"key": "maintenance", "value": "no"}),
        json!({"key": "maintenance", "operator": "Exists", "effect": "NoExecute"}),
        json!({"key": "other", "operator": "Exists"}),
    ] {
        assert!(
            untolerated_taint(&tainted, std::slice::from_ref(&toleration)).is_some(),
            "{toleration}"
        );
    }
    assert_eq!(untolerated_taint(&json!({"spec": {}}), &[]), None);
}
