use bytes::Bytes;
use serde_json::json;

use super::*;
use crate::reconcile::karmada::binding::Binding;
use crate::replication::document::ObjectKey;

fn binding(name: &str, mode: Mode, clusters: &[&str]) -> Item {
    let clusters: Vec<_> = clusters
        .iter()
        .map(|c| json!({"name": c, "replicas": 1}))
        .collect();
    let raw = json!({
        "metadata": {"name": name, "namespace": "shop", "resourceVersion": "1"},
        "spec": {
            "resource": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop", "name": name},
            "clusters": clusters,
        },
    });
    let json = Bytes::from(raw.to_string());
    let parsed = Binding::parse(&json).unwrap();
    let key = ObjectKey {
        namespace: Some("shop".into()),
        name: name.into(),
    };
    Item::Binding(0, Arc::new(BindingItem::new(key, json, parsed, mode)))
}

fn name(item: &Item) -> &str {
    match item {
        Item::Binding(_, item) => &item.key.name,
        _ => "",
    }
}

/// While a member is unhealthy, a pass evaluates first the bindings we
/// schedule that it delivers to (their moves are the pass's first writes),
/// then the guarded ones on it, then the rest, each in the order listed.
#[test]
fn a_failover_pass_evaluates_our_bindings_on_the_failed_member_first() {
    let mut items = [
        binding("guarded-elsewhere", Mode::Guard, &["member-eu-1"]),
        binding(
            "guarded-on-it",
            Mode::Guard,
            &["member-us-1", "member-eu-1"],
        ),
        binding("ours-elsewhere", Mode::Schedule, &["member-eu-1"]),
        binding("ours-on-it", Mode::Schedule, &["member-us-1"]),
        binding("ours-unplaced", Mode::Schedule, &[]),
        binding(
            "ours-also-on-it",
            Mode::Schedule,
            &["member-eu-2", "member-us-1"],
        ),
    ];
    let unhealthy = BTreeSet::from(["member-us-1".to_owned()]);
    items.sort_by_cached_key(|item| failover_rank(item, &unhealthy));
    let order: Vec<&str> = items.iter().map(name).collect();
    assert_eq!(
        order,
        [
            "ours-on-it",
            "ours-also-on-it",
            "guarded-on-it",
            "guarded-elsewhere",
            "ours-elsewhere",
            "ours-unplaced",
        ]
    );
}
