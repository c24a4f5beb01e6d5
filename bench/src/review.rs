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

/// The object as it arrives in a CREATE's AdmissionReview: with the
/// managedFields the API server adds before admission, and without the uid,
/// creation time and generation it sets only once admission is done (when
/// it stores the object).
fn admitted_object(name: &str, namespace: &str) -> Result<Value> {
    admitted(replicaset(name, namespace)?)
}

fn admitted(mut rs: Value) -> Result<Value> {
    let meta = &mut rs["metadata"];
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
    review(
        "0f9d6c1e-7b2a-4c3d-8e5f-6a7b8c9d0e1f",
        admitted_object("nginx-eu", "payments")?,
    )
}

/// Annotation values of the varied stream, cycled at co-prime periods so
/// that the combinations spread over the whole set.
const EU_VALUES: [Option<&str>; 3] = [None, Some("true"), Some("false")];
const PCI_VALUES: [Option<&str>; 5] = [None, Some("0"), Some("1"), Some("2"), Some("3")];
const PREFERENCES: [&str; 3] = [
    r#"{"rebalance":true,"clusters":{"gce-europe-west1":{"weight":2},"gce-europe-west2":{"weight":1}}}"#,
    r#"{"clusters":{"gce-us-central1":{"minReplicas":1,"weight":1},"gce-europe-north1":{"weight":3}}}"#,
    r#"{"clusters":{"gce-europe-west1":{"weight":1,"maxReplicas":4}}}"#,
];

/// `count` CREATE reviews of distinct ReplicaSets and Deployments in 50
/// namespaces: names, request uids, images, replicas and labels all differ; the EU
/// and PCI annotations take every combination; a third request clusters of
/// their own (replica-set preferences).
pub(crate) fn varied_reviews(count: usize) -> Result<Vec<Value>> {
    let template = replicaset("app", "team")?;
    (0..count)
        .map(|i| {
            let name = format!("app-{i}");
            let namespace = format!("team-{}", i % 50);
            let mut object = template.clone();
            let deployment = i % 2 == 1;
            if deployment {
                object["kind"] = json!("Deployment");
                object["spec"]["strategy"] =
                    json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}});
            }
            let meta = &mut object["metadata"];
            meta["name"] = json!(name);
            meta["namespace"] = json!(namespace);
            meta["labels"]["app"] = json!(name);
            let annotations = meta["annotations"]
                .as_object_mut()
                .context("the example has annotations")?;
            for (key, value) in [
                ("policy.federation.alpha.kubernetes.io/eu-jurisdiction-required", EU_VALUES[i % 3]),
                ("policy.federation.alpha.kubernetes.io/pci-compliance-level", PCI_VALUES[i % 5]),
                (PREFS, (i % 3 == 0).then(|| PREFERENCES[i / 3 % 3])),
            ] {
                match value {
                    Some(v) => annotations.insert(key.to_owned(), json!(v)),
                    None => annotations.remove(key),
                };
            }
            object["spec"]["replicas"] = json!(1 + i % 9);
            object["spec"]["selector"] = json!({"matchLabels": {"app": name}});
            object["spec"]["template"]["metadata"]["labels"]["app"] = json!(name);
            object["spec"]["template"]["spec"]["containers"][0]["image"] =
                json!(format!("registry.example/{namespace}/app:1.{}.{}", i % 17, i % 5));
            let object = admitted(object)?;
            let mut review = review(&format!("0f9d6c1e-7b2a-4c3d-8e5f-{i:012x}"), object)?;
            if deployment {
                let gvk = json!({"group": "apps", "version": "v1", "kind": "Deployment"});
                let gvr = json!({"group": "apps", "version": "v1", "resource": "deployments"});
                let request = &mut review["request"];
                request["kind"] = gvk.clone();
                request["requestKind"] = gvk;
                request["resource"] = gvr.clone();
                request["requestResource"] = gvr;
            }
            review["request"]["name"] = json!(name);
            review["request"]["namespace"] = json!(namespace);
            Ok(review)
        })
        .collect()
}

/// A CREATE review of `object` (a ReplicaSet until the caller says otherwise).
fn review(uid: &str, object: Value) -> Result<Value> {
    let gvk = json!({"group": "apps", "version": "v1", "kind": "ReplicaSet"});
    let gvr = json!({"group": "apps", "version": "v1", "resource": "replicasets"});
    Ok(json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
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
            "object": object,
            "oldObject": null,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions", "fieldManager": "kubectl-create"}
        }
    }))
}
