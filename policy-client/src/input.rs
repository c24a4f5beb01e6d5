//! The policy input, built by one function for the webhook and the remediator
//! alike: a policy that reads the request metadata gives both the same answer,
//! so remediation and admission never disagree (and never loop on PATCHes).
//!
//! The object is the input root, in the developer's view (see
//! [`crate::placement::developer_view`]); the admission request's metadata is
//! under [`ADMISSION_INPUT_KEY`]. The remediator describes the request its
//! PATCH will be: an `UPDATE` by its own identity, whose `oldObject` is the
//! object as stored.
//!
//! [`PolicyInput`] holds the input as those two parts, so that an engine that
//! reads only some paths of it (the embedded one, and the decision memory)
//! reads them there, without a copy of the object ([`policy_input`] puts the
//! parts together).

use std::borrow::Cow;

use serde_json::{Map, Value, json};

use crate::ownership_keys::OwnershipKeys;
use crate::placement::borrowed_developer_view;

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

/// The input of the placement query for an object, in its two parts.
#[derive(Debug, Clone)]
pub struct PolicyInput<'a> {
    /// The object in the developer's view (the object itself, borrowed,
    /// when it carries no ownership record).
    object: Cow<'a, Value>,
    /// The request metadata, under [`ADMISSION_INPUT_KEY`] when the object
    /// is a JSON object (otherwise the input is the object alone); none when
    /// the object is the whole input already.
    admission: Option<Value>,
}

impl From<Value> for PolicyInput<'static> {
    /// An input built whole (a binding's template with its binding beside it).
    fn from(input: Value) -> Self {
        PolicyInput {
            object: Cow::Owned(input),
            admission: None,
        }
    }
}

impl<'a> PolicyInput<'a> {
    /// The input for `object` under `meta`.
    pub fn new(object: &'a Value, meta: &RequestMeta<'_>) -> Self {
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
            admission["oldObject"] = borrowed_developer_view(old, meta.keys).into_owned();
        }
        PolicyInput {
            object: borrowed_developer_view(object, meta.keys),
            admission: Some(admission),
        }
    }

    /// The input as one JSON value.
    pub fn into_value(self) -> Value {
        let mut input = self.object.into_owned();
        if let (Value::Object(map), Some(admission)) = (&mut input, self.admission) {
            map.insert(ADMISSION_INPUT_KEY.to_owned(), admission);
        }
        input
    }

    /// The input's root, read in place.
    pub(crate) fn root(&self) -> InputRoot<'_> {
        match (&*self.object, &self.admission) {
            (Value::Object(fields), Some(admission)) => InputRoot::Parts { fields, admission },
            (whole, _) => InputRoot::Value(whole),
        }
    }
}

/// The root of a policy input, read in place: one JSON value, or an object's
/// fields with the request metadata beside them.
#[derive(Debug, Clone, Copy)]
pub(crate) enum InputRoot<'a> {
    Value(&'a Value),
    Parts {
        fields: &'a Map<String, Value>,
        admission: &'a Value,
    },
}

impl<'a> InputRoot<'a> {
    /// The root's member `key`; `Err` with the root itself when it is not an
    /// object.
    pub(crate) fn member(&self, key: &str) -> Result<Option<&'a Value>, &'a Value> {
        match *self {
            InputRoot::Value(Value::Object(map)) => Ok(map.get(key)),
            InputRoot::Value(other) => Err(other),
            InputRoot::Parts { admission, .. } if key == ADMISSION_INPUT_KEY => Ok(Some(admission)),
            InputRoot::Parts { fields, .. } => Ok(fields.get(key)),
        }
    }

    /// The whole root as the engine's value.
    pub(crate) fn to_rego(self) -> regorus::Value {
        match self {
            InputRoot::Value(value) => crate::rego_value::to_rego(value),
            InputRoot::Parts { fields, admission } => {
                let mut map: std::collections::BTreeMap<regorus::Value, regorus::Value> = fields
                    .iter()
                    .map(|(k, v)| {
                        (
                            regorus::Value::from(k.as_str()),
                            crate::rego_value::to_rego(v),
                        )
                    })
                    .collect();
                map.insert(
                    regorus::Value::from(ADMISSION_INPUT_KEY),
                    crate::rego_value::to_rego(admission),
                );
                regorus::Value::from(map)
            }
        }
    }
}

/// The input of the placement query for `object`, as one JSON value.
pub fn policy_input(object: &Value, meta: &RequestMeta<'_>) -> Value {
    PolicyInput::new(object, meta).into_value()
}

/// The input for `object` (of type `resource`) as it is stored, where no
/// request is being admitted: an `UPDATE` of itself by `user_info` (a
/// reconciler's own identity, or `{}` where the writer is not known), so
/// the answer is the one the webhook gives when the object is next written
/// unchanged. A binding's template, a delivered manifest and a workload
/// being remediated are asked about so.
pub fn stored_input(
    object: &Value,
    resource: &kube::api::ApiResource,
    user_info: &Value,
    keys: &OwnershipKeys,
) -> Value {
    object_input(object, resource, "UPDATE", user_info, false, keys)
}

/// The input for `object` (of type `resource`) written outside admission:
/// an `operation` (`CREATE`, or `UPDATE` of itself) by `user_info`.
pub fn object_input(
    object: &Value,
    resource: &kube::api::ApiResource,
    operation: &str,
    user_info: &Value,
    dry_run: bool,
    keys: &OwnershipKeys,
) -> Value {
    let kind = json!({"group": resource.group, "version": resource.version, "kind": resource.kind});
    let gvr =
        json!({"group": resource.group, "version": resource.version, "resource": resource.plural});
    policy_input(
        object,
        &RequestMeta {
            uid: "",
            operation,
            kind: &kind,
            resource: &gvr,
            namespace: object
                .pointer("/metadata/namespace")
                .and_then(Value::as_str),
            name: object.pointer("/metadata/name").and_then(Value::as_str),
            user_info,
            dry_run,
            old_object: (operation == "UPDATE").then_some(object),
            keys,
        },
    )
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
