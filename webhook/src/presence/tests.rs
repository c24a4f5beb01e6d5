use super::*;
use kube::api::ObjectMeta;
use policy_client::configmaps::ROOT_CA_CONFIGMAP;

fn cm(namespace: &str, name: &str, labels: &[(&str, &str)], data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).into(), (*v).into()))
                    .collect(),
            ),
            ..Default::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
        ),
        ..Default::default()
    }
}

#[test]
fn policies_are_what_the_sidecar_loads() {
    let selection = ConfigMapSelection::resolve(
        Some("policies".into()),
        vec!["team-a".into()],
        ConfigMapSelection::default(),
    );
    let rego = [("main.rego", "package x")];
    assert!(is_policy(
        &selection,
        &cm("policies", "placement", &[], &rego)
    ));
    assert!(!is_policy(
        &selection,
        &cm("policies", ROOT_CA_CONFIGMAP, &[], &[("ca.crt", "...")])
    ));
    assert!(!is_policy(&selection, &cm("policies", "empty", &[], &[])));
    let data_label = [("openpolicyagent.org/data", "opa")];
    assert!(!is_policy(
        &selection,
        &cm("policies", "clusters", &data_label, &[("c.json", "{}")])
    ));
    let policy_label = [("openpolicyagent.org/policy", "rego")];
    assert!(is_policy(
        &selection,
        &cm("team-a", "p", &policy_label, &rego)
    ));
    assert!(!is_policy(&selection, &cm("team-a", "p", &[], &rego)));
    assert!(!is_policy(
        &selection,
        &cm("team-b", "p", &policy_label, &rego)
    ));
}

#[test]
fn fixed_presence() {
    let p = PolicyPresence::fixed(true, "2 modules in policies/");
    assert!(p.policies_exist());
    assert!(p.is_synced());
    assert_eq!(p.describe(), "2 modules in policies/");
}
