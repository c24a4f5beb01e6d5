//! The Karmada test bed itself: a real Karmada control plane (built from
//! `../shared/peers/karmada`) with three members registered in Push mode,
//! driven as a Karmada user drives it, with Karmada's own scheduler.
//!
//! Every test name starts with `karmada_`: where Karmada's source is absent (and
//! `PLACEMENT_KARMADA_BIN` unset), `scripts/test` runs this binary with
//! `--skip karmada_` and says so; run anyway, the tests fail and say why.

use placement_tests::karmada::scenario::{
    EU_KEY, PCI_KEY, binding_clusters, create, deployment, propagation_policy, split,
};
use placement_tests::karmada::{MEMBERS, MemberKind, PCI_LABEL, WORKLOAD_IMAGE, cluster_ready};
use placement_tests::{
    Karmada, OpaServer, SidecarProcess, WebhookProcess, current_thread_runtime, repo_root,
    restoring, shipped_policy_modules, unique_name, wait_for, wait_or_explain,
};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::Duration;
// One test at a time: they share one federation, and one stops a member.
use placement_tests::serial;

mod federation;
mod scheduler;
mod webhook;

// ---------------------------------------------------------------------------
// placement-policy as Karmada's scheduler
// ---------------------------------------------------------------------------

/// OPA and placement-sync scheduling the bindings named `scheduler_name`,
/// with `modules` (file name, Rego) as the policy ConfigMap of a policy
/// namespace of their own.
struct Scheduler {
    name: String,
    policy_namespace: String,
    opa: OpaServer,
    sync: Option<SidecarProcess>,
}

impl Scheduler {
    fn start(karmada: &Karmada, modules: &[(String, String)]) -> Scheduler {
        Scheduler::named(karmada, modules, &unique_name("pp-sched"))
    }

    /// Scheduling the bindings named `name` (the examples' use the default,
    /// `placement-policy`; the tests run one at a time).
    fn named(karmada: &Karmada, modules: &[(String, String)], name: &str) -> Scheduler {
        Scheduler::with_flags(karmada, modules, name, &[])
    }

    /// [`Scheduler::named`], placement-sync given `extra` flags too.
    fn with_flags(
        karmada: &Karmada,
        modules: &[(String, String)],
        name: &str,
        extra: &[&str],
    ) -> Scheduler {
        let name = name.to_owned();
        let policy_namespace = karmada.policy_namespace_with(modules);
        let opa = OpaServer::start();
        let scheduler_name = format!("--scheduler-name={name}");
        let mut flags = vec![scheduler_name.as_str()];
        flags.extend(extra);
        let sync = karmada.start_placement_sync(&opa, &policy_namespace, &flags);
        Scheduler {
            name,
            policy_namespace,
            opa,
            sync: Some(sync),
        }
    }

    fn shipped(karmada: &Karmada) -> Scheduler {
        Scheduler::start(karmada, &shipped_policy_modules())
    }

    fn log_tail(&self) -> String {
        self.sync
            .as_ref()
            .map(SidecarProcess::log_tail)
            .unwrap_or_default()
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        if let Some(sync) = self.sync.take() {
            sync.stop();
        }
    }
}

/// A PropagationPolicy handing Deployment `name` to `scheduler`, its replicas
/// divided (by the policy's weights).
fn handed_to(namespace: &str, name: &str, scheduler: &str) -> Value {
    propagation_policy(
        namespace,
        name,
        Some(scheduler),
        json!({"replicaScheduling": {
            "replicaSchedulingType": "Divided",
            "replicaDivisionPreference": "Weighted"
        }}),
    )
}

/// The ResourceBinding of Deployment `namespace/name`, when it exists.
fn binding(karmada: &Karmada, namespace: &str, name: &str) -> Option<Value> {
    karmada.resource_binding(namespace, "Deployment", name)
}

fn scheduled_condition(binding: &Value) -> Option<&Value> {
    binding["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Scheduled")
}

/// Wait until the binding of `namespace/name` is `Scheduled=True` for its
/// current generation with `expected` clusters, and its Works say the same.
fn wait_scheduled(
    karmada: &Karmada,
    scheduler: &Scheduler,
    namespace: &str,
    name: &str,
    expected: &BTreeMap<String, i64>,
) -> Value {
    wait_or_explain(
        &format!("{namespace}/{name} scheduled onto {expected:?}, its Works alike"),
        Duration::from_secs(120),
        || {
            karmada.check_components();
            let binding = binding(karmada, namespace, name)?;
            let condition = scheduled_condition(&binding)?;
            let current = condition["status"] == "True"
                && binding["status"]["schedulerObservedGeneration"]
                    == binding["metadata"]["generation"]
                && binding_clusters(&binding) == *expected
                && karmada.deployment_works(namespace, name) == *expected;
            current.then_some(binding)
        },
        || {
            format!(
                "binding: {}\nWorks: {:?}\nplacement-sync:\n{}\n{}",
                binding(karmada, namespace, name)
                    .map(
                        |b| serde_json::to_string_pretty(&b["spec"]["clusters"]).unwrap()
                            + &serde_json::to_string_pretty(&b["status"]).unwrap()
                    )
                    .unwrap_or_else(|| "none".into()),
                karmada.deployment_works(namespace, name),
                scheduler.log_tail(),
                karmada.diagnostics()
            )
        },
    )
}
