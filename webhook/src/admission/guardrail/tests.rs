use super::*;
use policy_client::karmada::NO_CLUSTER;
use serde_json::json;

fn request(operation: &str, object: &Value, old: Option<&Value>) -> AdmissionRequest {
    serde_json::from_value(json!({
        "uid": "u",
        "kind": {"group": "work.karmada.io", "version": "v1alpha2", "kind": "ResourceBinding"},
        "resource": {"group": "work.karmada.io", "version": "v1alpha2", "resource": "resourcebindings"},
        "operation": operation,
        "object": object,
        "oldObject": old,
    }))
    .unwrap()
}

fn binding(names: &[&str], record: Option<&str>) -> Value {
    let mut b = json!({"metadata": {"name": "web-deployment", "annotations": {}},
                       "spec": {"placement": {"clusterAffinity": {"clusterNames": names}},
                                "clusters": [{"name": "member-eu-1", "replicas": 2}]}});
    if let Some(record) = record {
        b["metadata"]["annotations"][ALLOWED_CLUSTERS_ANNOTATION] = json!(record);
    }
    b
}

fn apply(object: &Value, patch: Option<json_patch::Patch>) -> Value {
    let mut out = object.clone();
    if let Some(p) = patch {
        json_patch::patch(&mut out, &p).unwrap();
    }
    out
}

/// Through `status`, a binding keeps its stored record and narrowed
/// placement: a forged record and a widened placement are put back.
#[test]
fn a_status_update_keeps_the_stored_record_and_placement() {
    let stored = binding(&["member-eu-2"], Some("member-eu-1,member-eu-2"));
    assert_eq!(keep_stored_record(&stored, &stored).unwrap(), None);
    let mut forged = binding(
        &["member-eu-2", "member-us-1"],
        Some("member-eu-1,member-eu-2,member-us-1"),
    );
    forged["status"] = json!({"schedulerObservedGeneration": 3});
    let out = apply(&forged, keep_stored_record(&forged, &stored).unwrap());
    assert_eq!(out["metadata"], stored["metadata"]);
    assert_eq!(out["spec"], stored["spec"]);
    assert_eq!(
        out["status"], forged["status"],
        "the status update itself stays"
    );
    // A record removed is put back; a record added to a binding that had
    // none, and a placement added to one without, are taken away.
    let mut bare = forged.clone();
    bare["metadata"]["annotations"] = json!({});
    assert_eq!(
        apply(&bare, keep_stored_record(&bare, &stored).unwrap())["metadata"],
        stored["metadata"]
    );
    let unplaced = json!({"metadata": {"name": "web-deployment"}, "spec": {}});
    let out = apply(&forged, keep_stored_record(&forged, &unplaced).unwrap());
    assert_eq!(out["metadata"].get("annotations"), None);
    assert_eq!(out["spec"].get("placement"), None);
    assert!(keep_stored_record(&json!(5), &stored).is_err());
}

#[test]
fn a_write_is_narrowed_and_recorded() {
    let object = binding(&["member-eu-2", "member-us-1"], None);
    let allowed = Bound::Clusters(["member-eu-1".into(), "member-eu-2".into()].into());
    let out = apply(&object, patch(&object, &allowed));
    assert_eq!(
        out["spec"]["placement"]["clusterAffinity"]["clusterNames"],
        json!(["member-eu-2"])
    );
    assert_eq!(
        out["metadata"]["annotations"][ALLOWED_CLUSTERS_ANNOTATION],
        "member-eu-1,member-eu-2"
    );
    assert_eq!(patch(&out, &allowed), None, "narrowed already: no patch");
}

#[test]
fn without_a_decision_an_update_keeps_the_stored_bound_and_a_create_gets_none() {
    let old = binding(&["member-eu-1"], Some("member-eu-1"));
    let widened = binding(
        &["member-eu-1", "member-us-1"],
        Some("member-eu-1,member-us-1"),
    );
    let update = request("UPDATE", &widened, Some(&old));
    let out = apply(&widened, patch(&widened, &fallback_bound(&update)));
    assert_eq!(
        out["spec"]["placement"]["clusterAffinity"]["clusterNames"],
        json!(["member-eu-1"]),
        "a user's widening (and a forged record) is narrowed by the stored record"
    );
    assert_eq!(
        out["metadata"]["annotations"][ALLOWED_CLUSTERS_ANNOTATION],
        "member-eu-1"
    );
    let create = request("CREATE", &widened, None);
    let out = apply(&widened, patch(&widened, &fallback_bound(&create)));
    assert_eq!(
        out["spec"]["placement"]["clusterAffinity"]["clusterNames"],
        json!([NO_CLUSTER])
    );
}

#[test]
fn only_writes_that_keep_placement_record_and_template_skip_evaluation() {
    let old = binding(&["member-eu-1"], Some("member-eu-1"));
    let mut scheduled = old.clone();
    scheduled["spec"]["clusters"] = json!([{"name": "member-eu-1", "replicas": 3}]);
    assert!(Guardrail::unchanged(
        &request("UPDATE", &scheduled, Some(&old)),
        &scheduled
    ));
    let rewritten = binding(&["member-eu-1", "member-us-1"], Some("member-eu-1"));
    assert!(!Guardrail::unchanged(
        &request("UPDATE", &rewritten, Some(&old)),
        &rewritten
    ));
    let forged = binding(&["member-eu-1"], Some("member-eu-1,member-us-1"));
    assert!(!Guardrail::unchanged(
        &request("UPDATE", &forged, Some(&old)),
        &forged
    ));
    let unguarded = binding(&["member-eu-1"], None);
    assert!(
        !Guardrail::unchanged(&request("UPDATE", &unguarded, Some(&unguarded)), &unguarded),
        "a binding the guardrail never admitted is evaluated"
    );
    // The detector rewrites a binding with its template's new version (an
    // edit that may add a requirement): decided again.
    let mut edited = old.clone();
    edited["spec"]["resource"] = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "namespace": "shop", "name": "web", "resourceVersion": "2"});
    assert!(!Guardrail::unchanged(
        &request("UPDATE", &edited, Some(&old)),
        &edited
    ));
}

#[test]
fn bindings_of_placement_syncs_own_scheduler_are_left_to_it() {
    let guardrail = Guardrail::new(None, "placement-policy".to_owned());
    let mut ours = binding(&[], None);
    ours["spec"]["schedulerName"] = json!("placement-policy");
    assert!(!guardrail.guards(&ours));
    ours["spec"]["schedulerName"] = json!("default-scheduler");
    assert!(guardrail.guards(&ours));
    assert!(guardrail.guards(&binding(&[], None)));
}
