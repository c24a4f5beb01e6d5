//! The benchmark's workload: the EU/PCI ReplicaSet of `examples/replicaset-eu-pci.yaml`
//! as the API server would send it (defaults filled in, managedFields, a realistic
//! pod template), wrapped in an AdmissionReview of about 4 KB.

use anyhow::{Context, Result};
use serde_json::{Value, json};

pub(crate) const PREFS: &str = "federation.kubernetes.io/replica-set-preferences";

/// The example ReplicaSet, fleshed out to the size of a real workload.
pub(crate) fn replicaset(name: &str, namespace: &str) -> Result<Value> {
    let path = placement_tests::repo_root().join("examples/replicaset-eu-pci.yaml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    let mut rs: Value = yaml_serde::from_str(&text).context("examples/replicaset-eu-pci.yaml")?;
    rs["metadata"]["name"] = json!(name);
    rs["metadata"]["namespace"] = json!(namespace);
    let labels = json!({
        "app": name,
        "team": "payments",
        "tier": "frontend",
        "app.kubernetes.io/name": "nginx",
        "app.kubernetes.io/version": "1.27.3",
        "app.kubernetes.io/part-of": "checkout",
    });
    rs["metadata"]["labels"] = labels.clone();
    rs["metadata"]["annotations"]["owner"] = json!("payments-team@example.com");
    rs["metadata"]["annotations"]["description"] =
        json!("Checkout front end; cardholder data in transit, EU customers only");
    rs["spec"]["selector"] = json!({"matchLabels": {"app": name}});
    rs["spec"]["template"] = json!({
        "metadata": {"labels": labels, "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "9113"}},
        "spec": {
            "containers": [
                {
                    "name": "nginx",
                    "image": "nginx:1.27.3",
                    "imagePullPolicy": "IfNotPresent",
                    "ports": [{"name": "http", "containerPort": 80, "protocol": "TCP"}],
                    "env": [
                        {"name": "REGION", "value": "europe-west1"},
                        {"name": "PCI_SCOPE", "value": "true"},
                        {"name": "UPSTREAM", "value": "http://checkout-api.payments.svc:8080"},
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}}
                    ],
                    "resources": {"requests": {"cpu": "250m", "memory": "128Mi"}, "limits": {"cpu": "1", "memory": "256Mi"}},
                    "readinessProbe": {"httpGet": {"path": "/healthz", "port": 80, "scheme": "HTTP"}, "periodSeconds": 5, "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3},
                    "livenessProbe": {"httpGet": {"path": "/healthz", "port": 80, "scheme": "HTTP"}, "initialDelaySeconds": 10, "periodSeconds": 10, "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3},
                    "volumeMounts": [{"name": "config", "mountPath": "/etc/nginx/conf.d", "readOnly": true}],
                    "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true, "runAsNonRoot": true, "capabilities": {"drop": ["ALL"]}},
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File"
                },
                {
                    "name": "exporter",
                    "image": "nginx/nginx-prometheus-exporter:1.3.0",
                    "imagePullPolicy": "IfNotPresent",
                    "args": ["--nginx.scrape-uri=http://127.0.0.1:80/stub_status"],
                    "ports": [{"name": "metrics", "containerPort": 9113, "protocol": "TCP"}],
                    "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"cpu": "100m", "memory": "32Mi"}},
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File"
                }
            ],
            "volumes": [{"name": "config", "configMap": {"name": "nginx-eu-config", "defaultMode": 420}}],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "schedulerName": "default-scheduler",
            "securityContext": {"runAsUser": 101, "fsGroup": 101},
            "serviceAccountName": "checkout"
        }
    });
    Ok(rs)
}

/// The object as it arrives in an AdmissionReview (server-set fields added).
fn admitted_object(name: &str, namespace: &str) -> Result<Value> {
    let mut rs = replicaset(name, namespace)?;
    let meta = &mut rs["metadata"];
    meta["uid"] = json!("5d3f2a8e-1c4b-4e8f-9a7d-2b6c8e0f1a3d");
    meta["creationTimestamp"] = json!("2026-11-20T10:15:30Z");
    meta["generation"] = json!(1);
    meta["managedFields"] = json!([{
        "manager": "kubectl-create",
        "operation": "Update",
        "apiVersion": "apps/v1",
        "time": "2026-11-20T10:15:30Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": {
            "f:annotations": {".": {}, "f:description": {}, "f:owner": {},
                "f:policy.federation.alpha.kubernetes.io/eu-jurisdiction-required": {},
                "f:policy.federation.alpha.kubernetes.io/pci-compliance-level": {}},
            "f:labels": {".": {}, "f:app": {}, "f:team": {}, "f:tier": {}}},
            "f:spec": {"f:replicas": {}, "f:selector": {}, "f:template": {"f:metadata": {}, "f:spec": {}}}}
    }]);
    Ok(rs)
}

/// The AdmissionReview request body for a CREATE of the benchmark ReplicaSet.
pub(crate) fn admission_review() -> Result<Value> {
    let gvk = json!({"group": "apps", "version": "v1", "kind": "ReplicaSet"});
    let gvr = json!({"group": "apps", "version": "v1", "resource": "replicasets"});
    Ok(json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0f9d6c1e-7b2a-4c3d-8e5f-6a7b8c9d0e1f",
            "kind": gvk,
            "resource": gvr,
            "requestKind": gvk,
            "requestResource": gvr,
            "name": "nginx-eu",
            "namespace": "payments",
            "operation": "CREATE",
            "userInfo": {
                "username": "alice@example.com",
                "uid": "2b1d9f0e-3c4a-4b5c-8d6e-7f8091a2b3c4",
                "groups": ["system:authenticated", "payments-developers"]
            },
            "object": admitted_object("nginx-eu", "payments")?,
            "oldObject": null,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions", "fieldManager": "kubectl-create"}
        }
    }))
}
