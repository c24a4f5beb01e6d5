use super::*;
use policy_client::embedded::Embedded;
use policy_client::engine::QueryOutcome;
use serde_json::json;
use std::time::Duration;

async fn read(engine: &dyn PolicyEngine, path: &str) -> Option<Value> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    match engine.query(path, &json!({}), deadline).await.unwrap() {
        QueryOutcome::Defined(v) => Some(v),
        QueryOutcome::Undefined => None,
    }
}

/// The shipped packages, owned by the policy namespace; the replicated
/// objects at `kubernetes`.
fn owners() -> PackageOwners {
    PackageOwners::new(
        crate::policies::owners::SHIPPED_PACKAGES.map(str::to_owned),
        ["kube-federation-scheduling-policy".to_owned()],
    )
    .with_documents(["kubernetes".to_owned()])
}

fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[tokio::test]
async fn json_and_yaml_documents_follow_their_configmap() {
    let engine: Arc<dyn PolicyEngine> = Arc::new(Embedded::new());
    let set = DataSet::new(engine.clone(), owners());
    let out = set
        .sync(
            "default/inventory",
            Some(&data(&[
                ("hosts.json", r#"{"a": 1}"#),
                ("zones.yaml", "eu: [west1]\n"),
            ])),
            false,
        )
        .await
        .unwrap();
    assert_eq!(out.status, Some(PolicyStatus::Ok));
    assert_eq!(
        read(engine.as_ref(), "default/inventory/hosts.json/a").await,
        Some(json!(1))
    );
    assert_eq!(
        read(engine.as_ref(), "default/inventory/zones.yaml/eu").await,
        Some(json!(["west1"]))
    );
    // A key that does not parse is reported; the rest stays.
    let out = set
        .sync(
            "default/inventory",
            Some(&data(&[("hosts.json", "{not json")])),
            false,
        )
        .await
        .unwrap();
    assert!(matches!(out.status, Some(PolicyStatus::Error { .. })));
    assert_eq!(
        read(engine.as_ref(), "default/inventory/hosts.json/a").await,
        Some(json!(1))
    );
    assert_eq!(
        read(engine.as_ref(), "default/inventory/zones.yaml").await,
        None,
        "key removed"
    );
    // The ConfigMap goes (or loses its label): its documents go.
    set.sync("default/inventory", None, false).await.unwrap();
    assert_eq!(read(engine.as_ref(), "default/inventory").await, None);
}

/// A namespace named like the replication root, or like the start of an
/// owned package, writes no document there: a `kubernetes` namespace's data
/// ConfigMap `clusters` would add a cluster to the replicated ones.
#[tokio::test]
async fn documents_where_the_namespace_does_not_own_are_not_written() {
    let engine: Arc<dyn PolicyEngine> = Arc::new(Embedded::new());
    let set = DataSet::new(engine.clone(), owners());
    let fake = r#"{"metadata": {"labels": {"placement-policy.io/jurisdiction": "eu"}}, "status": {"phase": "running"}}"#;
    // Everything of namespace `kubernetes` lands among the replicated
    // objects; of namespace `io`, what lands on the owned packages' branch.
    for (configmap, key, refused) in [
        ("kubernetes/clusters", "member-us-1", 2),
        ("io/k8s", "federation", 1),
    ] {
        let out = set
            .sync(
                configmap,
                Some(&data(&[(key, fake), ("other.json", "{}")])),
                false,
            )
            .await
            .unwrap();
        let Some(PolicyStatus::Error { errors }) = &out.status else {
            panic!("expected an error status, got {:?}", out.status);
        };
        assert_eq!(errors.len(), refused, "{errors:?}");
        assert_eq!(errors[0].code.as_deref(), Some("owned_package"));
        assert_eq!(
            errors[0].file.as_deref(),
            Some(&*format!("{configmap}/{key}"))
        );
        assert_eq!(
            read(engine.as_ref(), &format!("{configmap}/{key}")).await,
            None
        );
    }
    assert_eq!(
        read(engine.as_ref(), "io/k8s/other.json").await,
        Some(json!({}))
    );
    // Beside them, and from the owners' namespace, documents are written.
    let out = set
        .sync(
            "kubernetes-tools/inventory",
            Some(&data(&[("hosts.json", "{}")])),
            false,
        )
        .await
        .unwrap();
    assert_eq!(out.status, Some(PolicyStatus::Ok));
    let out = set
        .sync(
            "kube-federation-scheduling-policy/io",
            Some(&data(&[("zones.json", r#"{"eu": 1}"#)])),
            false,
        )
        .await
        .unwrap();
    assert_eq!(out.status, Some(PolicyStatus::Ok));
}
