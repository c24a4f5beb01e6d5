use std::collections::BTreeSet;

use serde_json::json;

use super::*;

fn decision(preferences: Option<&str>, errors: &[&str]) -> Decision {
    Decision {
        annotations: preferences
            .map(|p| {
                [(
                    "federation.kubernetes.io/replica-set-preferences".to_owned(),
                    p.to_owned(),
                )]
                .into()
            })
            .unwrap_or_default(),
        errors: errors.iter().map(|e| (*e).to_owned()).collect(),
        policy_weights: false,
    }
}

fn eu_statefulset() -> Value {
    json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
           "metadata": {"name": "db", "namespace": "shop", "annotations": {
               "policy.federation.alpha.kubernetes.io/eu-jurisdiction-required": "true"}}})
}

#[test]
fn carriers_are_known_by_group_and_kind_and_name_their_member() {
    assert_eq!(
        Carrier::of("work.karmada.io", "Work"),
        Some(Carrier::KarmadaWork)
    );
    assert_eq!(
        Carrier::of("work.open-cluster-management.io", "ManifestWork"),
        Some(Carrier::ManifestWork)
    );
    assert_eq!(Carrier::of("apps", "Deployment"), None);
    assert_eq!(
        Carrier::KarmadaWork
            .member("karmada-es-member-us-1")
            .as_deref(),
        Some("member-us-1")
    );
    assert_eq!(Carrier::KarmadaWork.member("shop"), None);
    assert_eq!(Carrier::KarmadaWork.member("karmada-es-"), None);
    assert_eq!(
        Carrier::ManifestWork.member("ocm-us-1").as_deref(),
        Some("ocm-us-1")
    );
    assert_eq!(Carrier::ManifestWorkReplicaSet.member("shop"), None);
}

#[test]
fn only_new_or_changed_manifests_are_delivered_anew() {
    let web = json!({"kind": "Deployment", "metadata": {"name": "web"}, "spec": {"replicas": 2}});
    let cm = json!({"kind": "ConfigMap", "metadata": {"name": "cfg"}});
    let stored = json!({"spec": {"workload": {"manifests": [web, cm]}}});
    let mut relabelled = stored.clone();
    relabelled["metadata"] = json!({"labels": {"a": "b"}, "finalizers": ["x"]});
    relabelled["status"] = json!({"conditions": []});
    assert!(
        Carrier::KarmadaWork
            .changed_manifests(&relabelled, Some(&stored))
            .is_empty()
    );
    let mut scaled = stored.clone();
    scaled["spec"]["workload"]["manifests"][0]["spec"]["replicas"] = json!(3);
    let changed = Carrier::KarmadaWork.changed_manifests(&scaled, Some(&stored));
    assert_eq!(changed.len(), 1);
    assert_eq!(changed[0]["kind"], "Deployment");
    assert_eq!(
        Carrier::ManifestWork.changed_manifests(&stored, None).len(),
        2
    );
    let set = json!({"spec": {"manifestWorkTemplate": {"workload": {"manifests": [cm]}}}});
    assert_eq!(
        Carrier::ManifestWorkReplicaSet
            .changed_manifests(&set, None)
            .len(),
        1
    );
}

#[test]
fn a_decision_allows_its_preferences_clusters() {
    let bound = allowed(
        &eu_statefulset(),
        &decision(Some(r#"{"clusters":{"eu-1":{"weight":1}}}"#), &[]),
    )
    .unwrap();
    assert_eq!(bound, Bound::Clusters(BTreeSet::from(["eu-1".to_owned()])));
    assert!(allows(&bound, "eu-1"));
    assert!(!allows(&bound, "us-1"));
}

#[test]
fn a_decision_with_errors_allows_nothing() {
    let refusal = allowed(&eu_statefulset(), &decision(None, &["no cluster"])).unwrap_err();
    assert_eq!(refusal, Refusal::Errors(vec!["no cluster".to_owned()]));
    assert!(refusal.to_string().contains("no cluster"));
}

#[test]
fn a_requirement_the_policy_does_not_place_is_refused_never_unbounded() {
    let refusal = allowed(&eu_statefulset(), &decision(None, &[])).unwrap_err();
    let message = refusal.to_string();
    assert!(
        message.contains("eu-jurisdiction-required") && message.contains("StatefulSet"),
        "{message}"
    );
    // Without a requirement, a decision naming no clusters bounds nothing.
    let plain = json!({"kind": "ConfigMap", "metadata": {"name": "cfg"}});
    assert_eq!(allowed(&plain, &decision(None, &[])), Ok(Bound::Any));
    // A requirement that requires nothing is none.
    let relaxed = json!({"kind": "Job", "metadata": {"annotations": {
        "policy.federation.alpha.kubernetes.io/eu-jurisdiction-required": "false",
        "policy.federation.alpha.kubernetes.io/pci-compliance-level": "0"}}});
    assert_eq!(allowed(&relaxed, &decision(None, &[])), Ok(Bound::Any));
}

#[test]
fn a_manifest_is_asked_about_as_a_template_is() {
    let keys = OwnershipKeys::ephemeral().unwrap();
    let input = manifest_input(&eu_statefulset(), &keys);
    assert_eq!(input["kind"], "StatefulSet");
    let admission = &input[crate::input::ADMISSION_INPUT_KEY];
    assert_eq!(admission["operation"], "UPDATE");
    assert_eq!(admission["resource"]["resource"], "statefulsets");
    assert_eq!(admission["kind"]["group"], "apps");
    assert_eq!(admission["namespace"], "shop");
    assert_eq!(admission["oldObject"]["metadata"]["name"], "db");
    let core = manifest_type(&json!({"apiVersion": "v1", "kind": "Pod"}));
    assert_eq!((core.group.as_str(), core.plural.as_str()), ("", "pods"));
}

#[test]
fn manifests_are_named_by_kind_and_namespace() {
    assert_eq!(describe(&eu_statefulset()), "StatefulSet shop/db");
    assert_eq!(
        describe(&json!({"kind": "Namespace", "metadata": {"name": "shop"}})),
        "Namespace shop"
    );
}

#[test]
fn a_delivered_copy_is_asked_where_it_may_run_not_where_it_asked_to() {
    // A Deployment placed by the policy, copied into a Work: its placement
    // annotation and record came with it.
    let mut copy = eu_statefulset();
    copy["metadata"]["annotations"]["federation.kubernetes.io/replica-set-preferences"] =
        json!(r#"{"clusters":{"eu-1":{"weight":1},"eu-2":{"weight":1}}}"#);
    copy["metadata"]["annotations"]["placement-policy.io/policy-owned"] = json!("{}");
    let keys = OwnershipKeys::ephemeral().unwrap();
    let input = manifest_input(&copy, &keys);
    let annotations = input["metadata"]["annotations"].as_object().unwrap();
    assert!(!annotations.contains_key("federation.kubernetes.io/replica-set-preferences"));
    assert!(!annotations.contains_key("placement-policy.io/policy-owned"));
    assert_eq!(
        annotations["policy.federation.alpha.kubernetes.io/eu-jurisdiction-required"], "true",
        "its requirements stay"
    );
    assert!(matches!(as_template(&eu_statefulset()), Cow::Borrowed(_)));
}

#[test]
fn karmadas_copies_of_a_template_are_asked_as_the_template_is() {
    // What Karmada's binding controller writes into each member's Work: the
    // template with marks naming the binding, the Work and its execution
    // namespace, different for every member.
    let copy_for = |member: &str| {
        let mut copy = eu_statefulset();
        let annotations = copy["metadata"]["annotations"].as_object_mut().unwrap();
        annotations.insert(
            "resourcebinding.karmada.io/name".into(),
            json!("db-statefulset"),
        );
        annotations.insert(
            "work.karmada.io/namespace".into(),
            json!(format!("karmada-es-{member}")),
        );
        annotations.insert("resourcetemplate.karmada.io/uid".into(), json!("0b7e"));
        copy["metadata"]["labels"] = json!({
            "app": "db",
            "propagationpolicy.karmada.io/permanent-id": "5c1d",
            "karmada.io/managed": "true",
        });
        copy
    };
    let keys = OwnershipKeys::ephemeral().unwrap();
    let template = manifest_input(&eu_statefulset(), &keys);
    for member in ["member-eu-1", "member-eu-2"] {
        let input = manifest_input(&copy_for(member), &keys);
        assert_eq!(
            input["metadata"]["annotations"], template["metadata"]["annotations"],
            "{member}: the requirements and nothing of Karmada's"
        );
        assert_eq!(
            input["metadata"]["labels"],
            json!({"app": "db"}),
            "{member}: the template's own labels stay"
        );
    }
    // A requirement is never mistaken for a mark.
    assert!(!karmadas_mark(
        "policy.federation.alpha.kubernetes.io/eu-jurisdiction-required"
    ));
    assert!(!karmadas_mark("notkarmada.io/x"));
    assert!(karmadas_mark("karmada.io/managed"));
}
