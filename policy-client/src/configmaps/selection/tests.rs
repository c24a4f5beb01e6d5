use super::*;

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[test]
fn the_policy_namespace_and_labelled_configmaps_as_kube_mgmt_finds_them() {
    let selection = ConfigMapSelection {
        policy_namespace: Some("policies".into()),
        namespaces: vec!["default".into()],
        ..Default::default()
    };
    assert_eq!(
        selection.classify("policies", "cm", None),
        Some(ConfigMapKind::Policy)
    );
    let data = labels(&[(DEFAULT_DATA_LABEL, DEFAULT_DATA_VALUE)]);
    assert_eq!(
        selection.classify("policies", "cm", Some(&data)),
        Some(ConfigMapKind::Data)
    );
    let policy = labels(&[(DEFAULT_POLICY_LABEL, "rego")]);
    assert_eq!(
        selection.classify("default", "cm", Some(&policy)),
        Some(ConfigMapKind::Policy)
    );
    assert_eq!(
        selection.classify("default", "cm", Some(&data)),
        Some(ConfigMapKind::Data)
    );
    assert_eq!(
        selection.classify("default", "cm", None),
        None,
        "unlabelled"
    );
    let other = labels(&[(DEFAULT_POLICY_LABEL, "qwerty")]);
    assert_eq!(
        selection.classify("default", "cm", Some(&other)),
        None,
        "other value"
    );
    assert_eq!(
        selection.classify("elsewhere", "cm", Some(&policy)),
        None,
        "not listed"
    );
    let both = labels(&[(DEFAULT_POLICY_LABEL, "rego"), (DEFAULT_DATA_LABEL, "opa")]);
    assert_eq!(
        selection.classify("default", "cm", Some(&both)),
        Some(ConfigMapKind::Data)
    );
    assert_eq!(
        selection.watched_namespaces(),
        Some(vec!["default".to_owned(), "policies".to_owned()])
    );
}

#[test]
fn star_is_every_namespace_and_switches_turn_kinds_off() {
    let selection = ConfigMapSelection {
        namespaces: vec!["*".into()],
        enable_data: false,
        ..Default::default()
    };
    let policy = labels(&[(DEFAULT_POLICY_LABEL, "rego")]);
    let data = labels(&[(DEFAULT_DATA_LABEL, "opa")]);
    assert_eq!(
        selection.classify("any", "cm", Some(&policy)),
        Some(ConfigMapKind::Policy)
    );
    assert_eq!(selection.classify("any", "cm", Some(&data)), None);
    assert_eq!(selection.watched_namespaces(), None);
    let in_ns = ConfigMapSelection {
        policy_namespace: Some("policies".into()),
        ..Default::default()
    };
    assert_eq!(
        in_ns.classify("policies", ROOT_CA_CONFIGMAP, None),
        None,
        "the CA bundle"
    );
    assert!(selection.describe().contains("every namespace"));
}
