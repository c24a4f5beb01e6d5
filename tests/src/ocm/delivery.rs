//! The delivery guard on the OCM hub: the webhook's `/validate` registered
//! for ManifestWorks and ManifestWorkReplicaSets, as the chart's
//! `<release>-ocm-delivery` configuration registers it.

use serde_json::{Value, json};

use crate::{ControlPlane, Identity, OpaServer, WebhookProcess};

/// The OCM resources the guard validates: `(version, resource)` of
/// `work.open-cluster-management.io`, as the hub's CRDs serve them (one
/// version each).
pub const GUARDED: [(&str, &str); 2] = [
    ("v1", "manifestworks"),
    ("v1alpha1", "manifestworkreplicasets"),
];

/// The ValidatingWebhookConfiguration `name` of the guard, calling `url`
/// (the webhook's `/validate`) trusting `ca_pem`. One webhook per resource;
/// only writes that change a spec are sent (a CREATE, or an UPDATE whose
/// spec differs: OCM's agents and controllers writing finalizers, labels or
/// status never wait on it), and never one of an object being deleted. The
/// chart's `delivery.yaml` of the OCM webhook has the same webhooks.
pub fn delivery_configuration(name: &str, url: &str, ca_pem: &str) -> Value {
    let webhooks: Vec<Value> = GUARDED
        .iter()
        .map(|(version, resource)| {
            json!({
                "name": format!("{resource}.delivery.placement-policy.io"),
                "admissionReviewVersions": ["v1"],
                "clientConfig": {"url": url, "caBundle": placement_certs::ca_bundle(ca_pem)},
                "rules": [{
                    "apiGroups": ["work.open-cluster-management.io"],
                    "apiVersions": [version],
                    "operations": ["CREATE", "UPDATE"],
                    "resources": [resource],
                    "scope": "Namespaced"
                }],
                "matchConditions": match_conditions(),
                "sideEffects": "NoneOnDryRun",
                "timeoutSeconds": 10,
                "failurePolicy": "Fail"
            })
        })
        .collect();
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": webhooks
    })
}

/// The match conditions of each webhook of the guard (the chart's too).
pub fn match_conditions() -> Value {
    json!([
        {"name": "not-being-deleted",
         "expression": "!has(object.metadata.deletionTimestamp)"},
        {"name": "changes-the-spec",
         "expression": "request.operation != 'UPDATE' || !has(object.spec) || !has(oldObject.spec) || object.spec != oldObject.spec"}
    ])
}

/// The webhook answering for the hub's ManifestWorks and
/// ManifestWorkReplicaSets, registered there; its configuration is removed
/// and the process stopped on drop.
pub struct DeliveryGuard {
    kubeconfig: std::path::PathBuf,
    name: String,
    webhook: WebhookProcess,
}

impl DeliveryGuard {
    /// The webhook against `opa`, with the policies of `policy_namespace`
    /// (fail closed iff there are), as the chart's OCM pods run it: with the
    /// decider's identity on the hub (the chart's RBAC and
    /// `files/ocm-hub-clusterrole.yaml`, which
    /// [`crate::ocm::Ocm::start`] binds), registered as configuration
    /// `name`.
    pub fn start(hub: &ControlPlane, opa: &OpaServer, policy_namespace: &str, name: &str) -> Self {
        let webhook = WebhookProcess::start(&[
            format!("--opa-url={}", opa.url()),
            format!("--opa-token-file={}", opa.token_file().display()),
            format!(
                "--kubeconfig={}",
                hub.kubeconfig(Identity::Sidecar).display()
            ),
            format!("--policy-namespace={policy_namespace}"),
        ]);
        let configuration =
            delivery_configuration(name, &webhook.url("/validate"), &webhook.ca_pem);
        let kubeconfig = hub.kubeconfig(Identity::Admin);
        crate::kubectl::apply_documents(&kubeconfig, vec![configuration]);
        DeliveryGuard {
            kubeconfig,
            name: name.to_owned(),
            webhook,
        }
    }

    pub fn webhook(&self) -> &WebhookProcess {
        &self.webhook
    }
}

impl Drop for DeliveryGuard {
    fn drop(&mut self) {
        let _ = crate::kubectl::kubectl(
            &self.kubeconfig,
            &[
                "delete",
                "validatingwebhookconfiguration",
                &self.name,
                "--ignore-not-found",
            ],
        );
    }
}
