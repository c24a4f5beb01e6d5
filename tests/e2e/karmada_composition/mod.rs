//! Karmada users keep Karmada: the placements Karmada users write, on the
//! real federation with karmada-scheduler running, in both of
//! placement-policy's modes.
//!
//! - **Guardrail** (karmada-scheduler decides): the webhook, registered with
//!   Karmada's API server for templates and ResourceBindings, narrows every
//!   binding write to the clusters the policy allows; placement-sync
//!   (`--guard-karmada-bindings`) admits bindings again when the answer
//!   changes. karmada-scheduler keeps cluster names, weights, fall-back
//!   groups, spread constraints and failover.
//! - **Scheduler** (`schedulerName: <placement-policy's>`): placement-sync
//!   honours the user's cluster affinity, affinity terms and static weights
//!   within the policy's answer, and names what it does not implement.
//!
//! Every Deployment asks for EU jurisdiction and PCI level 2 (the shipped
//! policy then allows `member-eu-1` and `member-eu-2`, never `member-us-1`);
//! replicas are read from each member's own API server. Every test name
//! starts with `karmada_` (skipped by name where Karmada's source is absent).

use placement_tests::karmada::scenario::{
    EU_KEY, PCI_KEY, binding_clusters, create, deployment, propagation_policy, split,
};
use placement_tests::karmada::{
    MemberKind, MemberSpec, delivery_configuration, guardrail_match_conditions, guardrail_rules,
};
use placement_tests::{
    Karmada, OpaServer, SidecarProcess, WebhookProcess, current_thread_runtime, restoring, serial,
    shipped_policy_modules, unique_name, wait_or_explain,
};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::Duration;

mod changes;
mod delivery;
mod modes;

const ALLOWED: &str = "placement-policy.io/allowed-clusters";

/// OPA, placement-sync and the webhook as the guardrail of one namespace of
/// their own (the webhook registered for its templates and bindings,
/// placement-sync scoped to it), with `modules` as the policy.
struct Guardrail {
    karmada: &'static Karmada,
    namespace: String,
    policy_namespace: String,
    sync: Option<SidecarProcess>,
    webhook: WebhookProcess,
    _opa: OpaServer,
}

impl Guardrail {
    fn start(karmada: &Karmada, modules: &[(String, String)]) -> Guardrail {
        Guardrail::of(karmada, &unique_name("karmada-guard"), modules)
    }

    /// The guardrail of `namespace` (labelled `placement-test=<namespace>`).
    fn of(karmada: &Karmada, namespace: &str, modules: &[(String, String)]) -> Guardrail {
        Guardrail::of_with(karmada, namespace, modules, &[])
    }

    /// [`Guardrail::of`], placement-sync with `extra` flags.
    fn of_with(
        karmada: &Karmada,
        namespace: &str,
        modules: &[(String, String)],
        extra: &[&str],
    ) -> Guardrail {
        let namespace = namespace.to_owned();
        karmada.create_namespace(&namespace);
        let policy_namespace = karmada.policy_namespace_with(modules);
        let opa = OpaServer::start();
        let scope = format!("--scope-namespace-selector=placement-test={namespace}");
        let mut args = vec![scope.as_str()];
        args.extend_from_slice(extra);
        let sync = karmada.start_guardrail_sync(&opa, &policy_namespace, &args);
        current_thread_runtime().block_on(sync.wait_ready(Duration::from_secs(60)));
        let webhook = WebhookProcess::start(&[
            format!("--opa-url={}", opa.url()),
            format!("--opa-token-file={}", opa.token_file().display()),
            format!("--kubeconfig={}", karmada.karmada_kubeconfig().display()),
            format!("--policy-namespace={policy_namespace}"),
        ]);
        karmada.register_webhook_for(
            &namespace,
            &webhook.url("/mutate"),
            &webhook.ca_pem,
            &policy_namespace,
            guardrail_rules(),
            guardrail_match_conditions(),
        );
        let delivery = delivery_configuration(
            &format!("{namespace}-delivery"),
            &webhook.url("/validate"),
            &webhook.ca_pem,
            json!({"matchLabels": {"placement-test": namespace}}),
            false,
            Some(&namespace),
        );
        let out = karmada.kubectl_stdin(&["apply", "-f", "-"], &delivery.to_string());
        assert!(
            out.status.success(),
            "register the delivery guard: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Guardrail {
            karmada: Karmada::shared(),
            namespace,
            policy_namespace,
            sync: Some(sync),
            webhook,
            _opa: opa,
        }
    }

    fn shipped(karmada: &Karmada) -> Guardrail {
        Guardrail::start(karmada, &shipped_policy_modules())
    }

    /// The shipped policy's guardrail, placement-sync with `extra` flags.
    fn shipped_with(karmada: &Karmada, extra: &[&str]) -> Guardrail {
        Guardrail::of_with(
            karmada,
            &unique_name("karmada-guard"),
            &shipped_policy_modules(),
            extra,
        )
    }

    fn log_tail(&self) -> String {
        self.sync
            .as_ref()
            .map(SidecarProcess::log_tail)
            .unwrap_or_default()
    }

    /// A Deployment of `replicas` asking for EU and PCI 2, propagated by a
    /// PropagationPolicy of `placement` for karmada-scheduler.
    fn propagate(&self, karmada: &Karmada, name: &str, replicas: i64, placement: Value) {
        let ns = &self.namespace;
        create(
            karmada,
            &[
                &propagation_policy(ns, name, None, placement),
                &deployment(ns, name, replicas, eu_pci2()),
            ],
        );
    }

    /// Wait until each member holds `expected` of Deployment `name` (and
    /// the others none), saying what placement-sync did when it does not.
    fn wait_replicas(&self, karmada: &Karmada, name: &str, expected: &BTreeMap<String, i64>) {
        let want: BTreeMap<String, Option<i64>> = karmada
            .members()
            .iter()
            .map(|m| (m.name().to_owned(), expected.get(m.name()).copied()))
            .collect();
        wait_or_explain(
            &format!("the members to hold {expected:?} of {name}"),
            Duration::from_secs(180),
            || (karmada.member_replicas(&self.namespace, name) == want).then_some(()),
            || {
                format!(
                    "members: {:?}\nbinding: {:?}\nplacement-sync:\n{}\n{}",
                    karmada.member_replicas(&self.namespace, name),
                    binding(karmada, &self.namespace, name).map(|b| b["spec"].clone()),
                    self.log_tail(),
                    karmada.diagnostics()
                )
            },
        );
    }
}

impl Drop for Guardrail {
    fn drop(&mut self) {
        // Its webhook stops with it: a configuration left behind would fail
        // every later binding write of the namespace.
        self.karmada.kubectl(&[
            "delete",
            "mutatingwebhookconfiguration",
            &self.namespace,
            "--ignore-not-found",
        ]);
        self.karmada.kubectl(&[
            "delete",
            "validatingwebhookconfiguration",
            &format!("{}-delivery", self.namespace),
            "--ignore-not-found",
        ]);
        if let Some(sync) = self.sync.take() {
            sync.stop();
        }
    }
}

fn eu_pci2() -> Value {
    json!({EU_KEY: "true", PCI_KEY: "2"})
}

fn divided(extra: Value) -> Value {
    let mut placement = json!({"replicaScheduling": {
        "replicaSchedulingType": "Divided",
        "replicaDivisionPreference": "Weighted"
    }});
    for (k, v) in extra.as_object().expect("an object") {
        placement[k] = v.clone();
    }
    placement
}

fn binding(karmada: &Karmada, namespace: &str, name: &str) -> Option<Value> {
    karmada.resource_binding(namespace, "Deployment", name)
}
