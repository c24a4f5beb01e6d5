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

fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[tokio::test]
async fn json_and_yaml_documents_follow_their_configmap() {
    let engine: Arc<dyn PolicyEngine> = Arc::new(Embedded::new());
    let set = DataSet::new(engine.clone());
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
