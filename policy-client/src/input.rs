//! The policy input, built by one function for the webhook and the remediator
//! alike: a policy that reads the request metadata gives both the same answer,
//! so remediation and admission never disagree (and never loop on PATCHes).
//!
//! The object is the input root, in the developer's view (see
//! [`crate::placement::developer_view`]); the admission request's metadata is
//! under [`ADMISSION_INPUT_KEY`]. The remediator describes the request its
//! PATCH will be: an `UPDATE` by its own identity, whose `oldObject` is the
//! object as stored.

use serde_json::{Value, json};

use crate::ownership_keys::OwnershipKeys;
use crate::placement::developer_view;

/// Key of the request metadata in the policy input.
pub const ADMISSION_INPUT_KEY: &str = "_admission";

/// Key of the Karmada binding in the policy input when a binding's resource
/// template is placed (its identity and spec; the template is the root).
pub const BINDING_INPUT_KEY: &str = "_binding";

/// Key of the OCM Placement in the policy input when placement-sync decides
/// it: for each workload its ManifestWorkReplicaSets deliver (the workload is
/// the root) and for the Placement itself (its identity and spec).
pub const PLACEMENT_INPUT_KEY: &str = "_placement";

/// The request metadata a policy may read, as `admission.k8s.io/v1` names it.
#[derive(Debug, Clone, Copy)]
pub struct RequestMeta<'a> {
    pub uid: &'a str,
    pub operation: &'a str,
    /// `{"group", "version", "kind"}`.
    pub kind: &'a Value,
    /// `{"group", "version", "resource"}`.
    pub resource: &'a Value,
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
    pub user_info: &'a Value,
    pub dry_run: bool,
    pub old_object: Option<&'a Value>,
    /// Verify the ownership records of the object and `oldObject`.
    pub keys: &'a OwnershipKeys,
}

/// The input of the placement query for `object`.
pub fn policy_input(object: &Value, meta: &RequestMeta<'_>) -> Value {
    let mut input = developer_view(object, meta.keys);
    if let Value::Object(map) = &mut input {
        let mut admission = json!({
            "uid": meta.uid,
            "operation": meta.operation,
            "kind": meta.kind,
            "resource": meta.resource,
            "namespace": meta.namespace,
            "name": meta.name,
            "userInfo": meta.user_info,
            "dryRun": meta.dry_run,
        });
        if let Some(old) = meta.old_object {
            admission["oldObject"] = developer_view(old, meta.keys);
        }
        map.insert(ADMISSION_INPUT_KEY.to_owned(), admission);
    }
    input
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_object_is_the_root_and_the_request_is_under_admission() {
        let object = json!({"kind": "ReplicaSet", "metadata": {"name": "rs", "namespace": "ns"}});
        let kind = json!({"group": "apps", "version": "v1", "kind": "ReplicaSet"});
        let resource = json!({"group": "apps", "version": "v1", "resource": "replicasets"});
        let user = json!({"username": "alice"});
        let keys = OwnershipKeys::ephemeral().unwrap();
        let input = policy_input(
            &object,
            &RequestMeta {
                uid: "u",
                operation: "UPDATE",
                kind: &kind,
                resource: &resource,
                namespace: Some("ns"),
                name: Some("rs"),
                user_info: &user,
                dry_run: false,
                old_object: Some(&object),
                keys: &keys,
            },
        );
        assert_eq!(input["kind"], "ReplicaSet");
        assert_eq!(input[ADMISSION_INPUT_KEY]["operation"], "UPDATE");
        assert_eq!(input[ADMISSION_INPUT_KEY]["userInfo"]["username"], "alice");
        assert_eq!(
            input[ADMISSION_INPUT_KEY]["resource"]["resource"],
            "replicasets"
        );
        assert_eq!(
            input[ADMISSION_INPUT_KEY]["oldObject"]["metadata"]["name"],
            "rs"
        );
    }
}
