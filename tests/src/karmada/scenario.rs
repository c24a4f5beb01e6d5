//! What the Karmada tests do as a user does, and read back as a user reads
//! it: Deployments and PropagationPolicies created with kubectl, the policy
//! ConfigMap, the replicas each member's own API server holds, Works, Events.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};

use super::{Karmada, WORKLOAD_IMAGE};
use crate::wait_or_explain;

/// The workload annotation asking for EU jurisdiction.
pub const EU_KEY: &str = "policy.federation.alpha.kubernetes.io/eu-jurisdiction-required";
/// The workload annotation asking for a PCI compliance level.
pub const PCI_KEY: &str = "policy.federation.alpha.kubernetes.io/pci-compliance-level";

/// A Deployment of `replicas` pods of [`WORKLOAD_IMAGE`] with `annotations`.
pub fn deployment(namespace: &str, name: &str, replicas: i64, annotations: Value) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": WORKLOAD_IMAGE}]}
            }
        }
    })
}

/// A PropagationPolicy for Deployment `name` with `placement`, handed to
/// `scheduler` (`None`: karmada-scheduler).
pub fn propagation_policy(
    namespace: &str,
    name: &str,
    scheduler: Option<&str>,
    placement: Value,
) -> Value {
    let mut policy = json!({
        "apiVersion": "policy.karmada.io/v1alpha1",
        "kind": "PropagationPolicy",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": name}],
            "placement": placement,
        }
    });
    if let Some(scheduler) = scheduler {
        policy["spec"]["schedulerName"] = json!(scheduler);
    }
    policy
}

/// `kubectl create` each object, which must succeed.
pub fn create(karmada: &Karmada, objects: &[&Value]) {
    for object in objects {
        let out = karmada.kubectl_stdin(&["create", "-f", "-"], &object.to_string());
        assert!(
            out.status.success(),
            "create {} {}: {}",
            object["kind"],
            object["metadata"]["name"],
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `{member: replicas}` from pairs.
pub fn split(pairs: &[(&str, i64)]) -> BTreeMap<String, i64> {
    pairs.iter().map(|(n, r)| ((*n).to_owned(), *r)).collect()
}

/// A binding's `spec.clusters` as `{member: replicas}`.
pub fn binding_clusters(binding: &Value) -> BTreeMap<String, i64> {
    binding["spec"]["clusters"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            (
                c["name"].as_str().unwrap_or_default().to_owned(),
                c["replicas"].as_i64().unwrap_or(0),
            )
        })
        .collect()
}

impl Karmada {
    /// The replicas of Deployment `namespace/name` in each Work Karmada made
    /// for it, by member.
    pub fn deployment_works(&self, namespace: &str, name: &str) -> BTreeMap<String, i64> {
        self.works_for(namespace, "Deployment", name)
            .into_iter()
            .map(|(member, manifest)| (member, manifest["spec"]["replicas"].as_i64().unwrap_or(-1)))
            .collect()
    }

    /// The replicas of Deployment `namespace/name` in each member's own API
    /// server (`None`: the member has no such Deployment).
    pub fn member_replicas(&self, namespace: &str, name: &str) -> BTreeMap<String, Option<i64>> {
        self.members()
            .iter()
            .map(|member| {
                let out = member.kubectl(&[
                    "get",
                    "deployment",
                    name,
                    "-n",
                    namespace,
                    "-o",
                    "jsonpath={.spec.replicas}",
                ]);
                let replicas = out
                    .status
                    .success()
                    .then(|| String::from_utf8_lossy(&out.stdout).trim().parse().ok())
                    .flatten();
                (member.name().to_owned(), replicas)
            })
            .collect()
    }

    /// Wait until each member's API server holds exactly its share of
    /// Deployment `namespace/name` (and the others none).
    pub fn wait_member_replicas(
        &self,
        namespace: &str,
        name: &str,
        expected: &BTreeMap<String, i64>,
    ) {
        let want: BTreeMap<String, Option<i64>> = self
            .members()
            .iter()
            .map(|m| (m.name().to_owned(), expected.get(m.name()).copied()))
            .collect();
        wait_or_explain(
            &format!(
                "each member's API server to hold its share of {namespace}/{name} (and only those)"
            ),
            Duration::from_secs(120),
            || (self.member_replicas(namespace, name) == want).then_some(()),
            || {
                format!(
                    "members: {:?}, expected {want:?}\nbinding: {}\n{}",
                    self.member_replicas(namespace, name),
                    self.resource_binding(namespace, "Deployment", name)
                        .map(|b| serde_json::to_string_pretty(&b["spec"]).unwrap_or_default())
                        .unwrap_or_else(|| "none".to_owned()),
                    self.diagnostics()
                )
            },
        );
    }

    /// A policy namespace of its own (unique) holding `modules` (file name,
    /// Rego) as the policy ConfigMap `placement`; its name.
    pub fn policy_namespace_with(&self, modules: &[(String, String)]) -> String {
        let policy_namespace = crate::unique_name("karmada-policy");
        self.create_policy_namespace(&policy_namespace);
        let mut args = vec![
            "create".to_owned(),
            "configmap".to_owned(),
            "placement".to_owned(),
            "-n".to_owned(),
            policy_namespace.clone(),
        ];
        let dir = crate::scratch_dir("karmada-policy");
        for (file, source) in modules {
            let path = dir.join(file);
            std::fs::write(&path, source).expect("write policy module");
            args.push(format!("--from-file={}", path.display()));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.kubectl_ok(&args);
        policy_namespace
    }
}
