use super::*;
use crate::reconcile::ocm::placement::tests::placement;

fn decided(names: &[&str]) -> Vec<ClusterDecision> {
    names
        .iter()
        .map(|n| ClusterDecision {
            cluster_name: (*n).to_owned(),
            reason: format!("placement policy: {n} is in the EU"),
        })
        .collect()
}

#[test]
fn a_decision_is_published_with_the_keps_fields_and_labels() {
    let (_, p) = placement(json!({}));
    let write = plan(
        &p,
        &decided(&["ocm-eu-1", "ocm-eu-2"]),
        "placement-policy",
        &[],
    );
    assert_eq!(write.apply.len(), 1);
    let (name, object) = &write.apply[0];
    assert_eq!(name, "web-decision-1");
    assert_eq!(object["apiVersion"], API_VERSION);
    assert_eq!(object["schedulerName"], "placement-policy");
    assert_eq!(
        object["decisions"][0],
        json!({"clusterProfileRef": {"name": "ocm-eu-1"}, "reason": "placement policy: ocm-eu-1 is in the EU"})
    );
    let labels = &object["metadata"]["labels"];
    assert_eq!(labels[DECISION_KEY_LABEL], "web");
    assert_eq!(labels[DECISION_INDEX_LABEL], "0");
    assert_eq!(labels[PLACEMENT_KEY_LABEL], "web");
    assert_eq!(object["metadata"]["ownerReferences"][0]["uid"], "p-uid");
    // Stored as written: nothing to do.
    let stored = Slice {
        name: name.clone(),
        labels: serde_json::from_value(labels.clone()).unwrap(),
        decisions: object["decisions"].clone(),
        scheduler_name: Some("placement-policy".into()),
    };
    assert!(
        plan(
            &p,
            &decided(&["ocm-eu-1", "ocm-eu-2"]),
            "placement-policy",
            std::slice::from_ref(&stored)
        )
        .is_empty()
    );
    // One cluster fewer: rewritten.
    let write = plan(&p, &decided(&["ocm-eu-2"]), "placement-policy", &[stored]);
    assert_eq!(write.apply.len(), 1);
    assert!(write.delete.is_empty());
}

#[test]
fn slices_hold_at_most_a_hundred_and_extra_slices_go() {
    let (_, p) = placement(json!({}));
    let many: Vec<String> = (0..150).map(|i| format!("c{i:03}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let write = plan(&p, &decided(&many), "placement-policy", &[]);
    assert_eq!(write.apply.len(), 2);
    assert_eq!(
        write.apply[1].1["metadata"]["labels"][DECISION_INDEX_LABEL],
        "1"
    );
    assert_eq!(write.apply[1].1["decisions"].as_array().unwrap().len(), 50);
    let second = Slice {
        name: "web-decision-2".into(),
        labels: BTreeMap::new(),
        decisions: json!([]),
        scheduler_name: None,
    };
    let write = plan(&p, &decided(&["ocm-eu-1"]), "placement-policy", &[second]);
    assert_eq!(write.delete, ["web-decision-2"]);
}
