//! Scenario 10: policy at federation scale. A Karmada bed of N members (the
//! test bed's three and N-3 light ones sharing one API server, Karmada's
//! execution of Works off: `Karmada::start_with`), and M Deployments created
//! through Karmada's API server for each of three contenders, each in a
//! namespace of its own: karmada-scheduler alone, karmada-scheduler with
//! placement-policy's guardrail (the webhook narrowing bindings and checking
//! Works, placement-sync guarding), and placement-policy as the scheduler.
//!
//! The Deployments mix every combination of EU jurisdiction (required or not)
//! and PCI level (none, 1 to 4) with the user placements of docs/karmada.md's
//! composition table: names divided evenly, static weights, fall-back groups
//! (`clusterAffinities`) and a spread over two regions (which scheduler mode
//! does not do: its namespace gets the policy's own choice there), in 160
//! PropagationPolicies per namespace (a policy per workload would measure
//! Karmada's detector matching 10,000 policies). Three of the four kinds
//! name `member-us-1`, which the policy allows the workloads without EU
//! jurisdiction of PCI level 3 or less (two in five).
//!
//! Measured: for each contender the time from the first create until every
//! binding is scheduled with a Work for each of its members, and the CPU of
//! the scheduling processes meanwhile; a binding write's added admission
//! latency; the peak memory of placement-sync and the webhook; then failover:
//! `member-us-1` tainted NoExecute while not Ready and its API server killed,
//! the time until no binding of each contender names it, and whether any
//! binding of the policy's contenders was ever seen on a member the policy
//! forbids it (EU jurisdiction, PCI level).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kube::runtime::watcher;
use placement_tests::Identity;
use placement_tests::karmada::{Karmada, MEMBERS, light_members};
use serde_json::{Value, json};

use crate::common::{Bins, Contending, CpuSince, poll, vm_kib};
use crate::karmada::{Contenders, GUARD_LABEL};
use crate::report::{Report, Status};

const NATIVE: &str = "fed-native";
const GUARDED: &str = "fed-guardrail";
const OURS: &str = "fed-placement-policy";
const VICTIM: &str = "member-us-1";
const EU_KEY: &str = "policy.federation.alpha.kubernetes.io/eu-jurisdiction-required";
const PCI_KEY: &str = "policy.federation.alpha.kubernetes.io/pci-compliance-level";
const GROUP_LABEL: &str = "bench-group";
/// PropagationPolicies per namespace: four placement kinds, forty groups of
/// members each.
const GROUPS: usize = 160;
const KINDS: [&str; 4] = ["names", "weights", "fall-back", "spread"];
/// How long one contender may take to deliver every Deployment.
const DELIVERY_LIMIT: Duration = Duration::from_secs(1800);
const FAILOVER_LIMIT: Duration = Duration::from_secs(600);

pub(crate) struct Settings {
    pub(crate) members: usize,
    pub(crate) deployments: usize,
}

/// What the policy knows of a member: its region and PCI level.
#[derive(Debug, Clone)]
struct Member {
    eu: bool,
    pci: u8,
}

/// The members of the bed by name, and the names the placements pick from.
struct Fleet {
    members: BTreeMap<String, Member>,
    light: Vec<String>,
    /// EU members of PCI level 4: allowed for every requirement, so every
    /// placement names one and none is left without an allowed member.
    anchors: Vec<String>,
}

impl Fleet {
    fn of(count: usize) -> Result<Fleet> {
        let light = light_members(count);
        let mut members = BTreeMap::new();
        for spec in MEMBERS.iter().chain(&light) {
            members.insert(
                spec.name.to_owned(),
                Member {
                    eu: spec.region.starts_with("europe-"),
                    pci: spec.pci_level.parse()?,
                },
            );
        }
        let anchors: Vec<String> = members
            .iter()
            .filter(|(_, m)| m.eu && m.pci == 4)
            .map(|(name, _)| name.clone())
            .collect();
        if anchors.is_empty() {
            bail!(
                "scenario 10 needs an EU member of PCI level 4 (BENCH_FEDERATION_MEMBERS=24 or more)"
            );
        }
        Ok(Fleet {
            members,
            light: light.iter().map(|s| s.name.to_owned()).collect(),
            anchors,
        })
    }

    /// The `n`th light member after `seed`, never `avoid`.
    fn pick(&self, seed: usize, avoid: &str) -> String {
        (0..self.light.len())
            .map(|k| &self.light[(seed + k) % self.light.len()])
            .find(|name| name.as_str() != avoid)
            .cloned()
            .unwrap_or_else(|| avoid.to_owned())
    }

    /// Whether the policy allows `member` for a workload of these requirements.
    fn allows(&self, member: &str, requirement: Requirement) -> bool {
        self.members
            .get(member)
            .is_some_and(|m| (m.eu || !requirement.eu) && m.pci >= requirement.pci)
    }
}

/// A Deployment's requirements: EU jurisdiction, PCI level (0: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Requirement {
    eu: bool,
    pci: u8,
}

/// Deployment `i`'s group and requirements: every group meets every
/// combination of requirements.
fn workload(i: usize) -> (usize, Requirement) {
    let group = i % GROUPS;
    let requirement = Requirement {
        eu: (i / GROUPS).is_multiple_of(2),
        pci: ((i / (2 * GROUPS)) % 5) as u8,
    };
    (group, requirement)
}

/// The placement of group `group` (kind `group % 4`), as the user writes it.
/// `handed`: placement-policy schedules it (no spread: its namespace gets the
/// policy's choice for that kind).
fn placement(fleet: &Fleet, group: usize, handed: bool) -> Value {
    let g = group / KINDS.len();
    let anchor = &fleet.anchors[g % fleet.anchors.len()];
    let pick = fleet.pick(g * 7 + 1, anchor);
    let second = fleet.pick(g * 13 + 5, &pick);
    let divided =
        json!({"replicaSchedulingType": "Divided", "replicaDivisionPreference": "Weighted"});
    match KINDS[group % KINDS.len()] {
        "names" => json!({
            "clusterAffinity": {"clusterNames": [VICTIM, anchor, pick]},
            "replicaScheduling": divided,
        }),
        "weights" => json!({
            "clusterAffinity": {"clusterNames": [VICTIM, anchor, pick]},
            "replicaScheduling": {
                "replicaSchedulingType": "Divided",
                "replicaDivisionPreference": "Weighted",
                "weightPreference": {"staticWeightList": [
                    {"targetCluster": {"clusterNames": [VICTIM]}, "weight": 2},
                    {"targetCluster": {"clusterNames": [anchor]}, "weight": 1},
                    {"targetCluster": {"clusterNames": [pick]}, "weight": 1}
                ]}
            },
        }),
        "fall-back" => json!({
            "clusterAffinities": [
                {"affinityName": "primary", "clusterNames": [VICTIM, pick]},
                {"affinityName": "backup", "clusterNames": [anchor, second]}
            ],
            "replicaScheduling": divided,
        }),
        _ if handed => json!({"replicaScheduling": divided}),
        _ => json!({
            "spreadConstraints": [
                {"spreadByField": "region", "minGroups": 2, "maxGroups": 2},
                {"spreadByField": "cluster", "minGroups": 2, "maxGroups": 4}
            ],
            "replicaScheduling": divided,
        }),
    }
}

fn propagation_policy(fleet: &Fleet, namespace: &str, group: usize, handed: bool) -> Value {
    let mut spec = json!({
        "resourceSelectors": [{
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "labelSelector": {"matchLabels": {GROUP_LABEL: group.to_string()}}
        }],
        "placement": placement(fleet, group, handed),
    });
    if handed {
        spec["schedulerName"] = json!("placement-policy");
    }
    json!({
        "apiVersion": "policy.karmada.io/v1alpha1",
        "kind": "PropagationPolicy",
        "metadata": {"name": format!("group-{group:03}"), "namespace": namespace},
        "spec": spec,
    })
}

fn deployment(namespace: &str, i: usize) -> Deployment {
    let (group, requirement) = workload(i);
    let mut annotations = serde_json::Map::new();
    if requirement.eu {
        annotations.insert(EU_KEY.into(), json!("true"));
    }
    if requirement.pci > 0 {
        annotations.insert(PCI_KEY.into(), json!(requirement.pci.to_string()));
    }
    let name = format!("d{i:05}");
    serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {GROUP_LABEL: group.to_string()}, "annotations": annotations},
        "spec": {
            "replicas": 4,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": placement_tests::karmada::WORKLOAD_IMAGE}]}
            }
        }
    }))
    .expect("a Deployment")
}

/// One binding as the tracker keeps it.
#[derive(Debug, Clone, Default)]
struct Binding {
    scheduled: bool,
    clusters: Vec<String>,
    requirement: Option<Requirement>,
}

/// Every ResourceBinding and Work of the bed, by watches (a poll listing tens
/// of thousands would load the API server the contenders share): which
/// bindings are delivered, which name a member, and every member a binding of
/// the policy's contenders was seen on that the policy forbids it.
#[derive(Default)]
struct Seen {
    /// (namespace, name) -> binding.
    bindings: HashMap<(String, String), Binding>,
    /// (binding namespace, binding name, member) of every Work.
    works: HashSet<(String, String, String)>,
    /// Bindings of the policy's contenders seen on a forbidden member.
    forbidden: HashSet<(String, String, String)>,
}

struct Tracker {
    seen: Arc<Mutex<Seen>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

fn requirement_of(binding: &DynamicObject) -> Option<Requirement> {
    // The binding's name is `<deployment>-deployment`; its number gives the
    // requirements the Deployment was created with.
    let name = binding.metadata.name.as_deref()?;
    let i: usize = name.strip_prefix('d')?.split('-').next()?.parse().ok()?;
    Some(workload(i).1)
}

fn binding_of(object: &DynamicObject) -> Binding {
    let clusters = object
        .data
        .pointer("/spec/clusters")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("name")?.as_str().map(str::to_owned))
        .collect();
    let scheduled = object
        .data
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Scheduled" && c["status"] == "True");
    Binding {
        scheduled,
        clusters,
        requirement: requirement_of(object),
    }
}

fn key_of(object: &DynamicObject) -> (String, String) {
    (
        object.metadata.namespace.clone().unwrap_or_default(),
        object.metadata.name.clone().unwrap_or_default(),
    )
}

fn work_key(work: &DynamicObject) -> Option<(String, String, String)> {
    let annotations = work.metadata.annotations.as_ref()?;
    let member = work
        .metadata
        .namespace
        .as_deref()?
        .strip_prefix("karmada-es-")?;
    Some((
        annotations
            .get("resourcebinding.karmada.io/namespace")?
            .clone(),
        annotations.get("resourcebinding.karmada.io/name")?.clone(),
        member.to_owned(),
    ))
}

impl Tracker {
    fn start(
        runtime: &tokio::runtime::Runtime,
        client: &kube::Client,
        fleet: Arc<Fleet>,
    ) -> Tracker {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let gvk = |group: &str, version: &str, kind: &str| {
            ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind))
        };
        let bindings: Api<DynamicObject> = Api::all_with(
            client.clone(),
            &gvk("work.karmada.io", "v1alpha2", "ResourceBinding"),
        );
        let works: Api<DynamicObject> =
            Api::all_with(client.clone(), &gvk("work.karmada.io", "v1alpha1", "Work"));
        let on_binding = {
            let seen = seen.clone();
            move |object: &DynamicObject, present: bool| {
                let key = key_of(object);
                let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                if !present {
                    seen.bindings.remove(&key);
                    return;
                }
                let binding = binding_of(object);
                if key.0 != NATIVE
                    && let Some(requirement) = binding.requirement
                {
                    for member in &binding.clusters {
                        if !fleet.allows(member, requirement) {
                            seen.forbidden
                                .insert((key.0.clone(), key.1.clone(), member.clone()));
                        }
                    }
                }
                seen.bindings.insert(key, binding);
            }
        };
        let on_work = {
            let seen = seen.clone();
            move |object: &DynamicObject, present: bool| {
                let Some(key) = work_key(object) else { return };
                let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                if present {
                    seen.works.insert(key);
                } else {
                    seen.works.remove(&key);
                }
            }
        };
        let tasks = vec![
            runtime.spawn(follow(bindings, on_binding)),
            runtime.spawn(follow(works, on_work)),
        ];
        Tracker { seen, tasks }
    }

    /// Bindings of `namespace` delivered: scheduled, with a Work on each of
    /// their members.
    fn delivered(&self, namespace: &str) -> usize {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.bindings
            .iter()
            .filter(|((ns, name), b)| {
                ns == namespace
                    && b.scheduled
                    && !b.clusters.is_empty()
                    && b.clusters.iter().all(|member| {
                        seen.works
                            .contains(&(ns.clone(), name.clone(), member.clone()))
                    })
            })
            .count()
    }

    /// Bindings of `namespace` that name `member`.
    fn naming(&self, namespace: &str, member: &str) -> usize {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.bindings
            .iter()
            .filter(|((ns, _), b)| ns == namespace && b.clusters.iter().any(|c| c == member))
            .count()
    }

    /// Bindings of `namespace` ever seen on a member the policy forbids them.
    fn forbidden(&self, namespace: &str) -> usize {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.forbidden
            .iter()
            .filter(|(ns, ..)| ns == namespace)
            .count()
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Follow `api`'s objects: `on(object, true)` for each present, `on(object,
/// false)` for each deleted. A re-list replays every object present (a
/// deletion missed meanwhile is not seen: the scenario deletes nothing).
async fn follow(api: Api<DynamicObject>, on: impl Fn(&DynamicObject, bool)) {
    let mut events = std::pin::pin!(watcher(api, watcher::Config::default()));
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => on(&o, true),
            Ok(watcher::Event::Delete(o)) => on(&o, false),
            Ok(_) => {}
            Err(e) => eprintln!("scenario 10: watch: {e}"),
        }
    }
}

/// One contender's delivery: its time and CPU until every binding was
/// delivered or [`DELIVERY_LIMIT`] passed (`complete` false), and how many
/// were.
struct Delivery {
    contending: Contending,
    complete: bool,
    delivered: usize,
}

#[allow(clippy::too_many_arguments)]
fn deliver_all(
    runtime: &tokio::runtime::Runtime,
    client: &kube::Client,
    karmada: &Karmada,
    tracker: &Tracker,
    fleet: &Fleet,
    namespace: &str,
    settings: &Settings,
    pids: &[u32],
) -> Result<Delivery> {
    let handed = namespace == OURS;
    karmada.create_namespace(namespace);
    if namespace == GUARDED {
        karmada.kubectl_ok(&[
            "label",
            "namespace",
            namespace,
            &format!("{GUARD_LABEL}=true"),
        ]);
    }
    let policies = (0..GROUPS)
        .map(|group| propagation_policy(fleet, namespace, group, handed))
        .collect();
    placement_tests::kubectl::apply_documents(&karmada.karmada_kubeconfig(), policies);
    let cpu = CpuSince::start(pids)?;
    let started = Instant::now();
    runtime.block_on(async {
        let api: Api<Deployment> = Api::namespaced(client.clone(), namespace);
        let creates = futures::stream::iter(0..settings.deployments).map(|i| {
            let api = api.clone();
            async move {
                api.create(&PostParams::default(), &deployment(namespace, i))
                    .await
            }
        });
        let results: Vec<_> = creates.buffer_unordered(16).collect().await;
        results.into_iter().collect::<Result<Vec<_>, _>>()
    })?;
    let created = started.elapsed().as_secs_f64();
    let complete = poll(
        &format!("every binding of {namespace} delivered"),
        DELIVERY_LIMIT,
        Duration::from_secs(1),
        || {
            karmada.check_components();
            Ok((tracker.delivered(namespace) >= settings.deployments).then_some(()))
        },
    )
    .is_ok();
    let contending = cpu.contending(started.elapsed().as_secs_f64())?;
    let delivered = tracker.delivered(namespace);
    eprintln!(
        "{namespace}: {delivered} of {} bindings delivered after {:.1} s (created in {created:.1} s), CPU {:.2} s ({:.2?})",
        settings.deployments, contending.seconds, contending.cpu, contending.parts
    );
    Ok(Delivery {
        contending,
        complete,
        delivered,
    })
}

/// Per contender's namespace: the bindings on [`VICTIM`] at the kill, and
/// the seconds until none named it (`None`: not within [`FAILOVER_LIMIT`]).
type Failovers = BTreeMap<&'static str, (usize, Option<f64>)>;

/// Failover: [`VICTIM`] tainted NoExecute while not Ready, its API server
/// killed; seconds from the kill until no binding of each namespace names it,
/// and the seconds until Karmada tainted it.
fn failover(karmada: &Karmada, tracker: &Tracker) -> Result<(Failovers, f64)> {
    crate::karmada::create_failover_taint_policy(karmada, "bench-federation-failover", VICTIM)?;
    let mut results: Failovers = [NATIVE, GUARDED, OURS]
        .into_iter()
        .map(|ns| (ns, (tracker.naming(ns, VICTIM), None)))
        .collect();
    let member = karmada.member(VICTIM);
    let killed = Instant::now();
    member.stop_apiserver();
    let mut tainted = None;
    while killed.elapsed() < FAILOVER_LIMIT && results.values().any(|(_, t)| t.is_none()) {
        if tainted.is_none() && crate::karmada::failover_tainted(karmada, VICTIM)? {
            tainted = Some(killed.elapsed().as_secs_f64());
        }
        for (namespace, (_, after)) in results.iter_mut() {
            if after.is_none() && tracker.naming(namespace, VICTIM) == 0 {
                *after = Some(killed.elapsed().as_secs_f64());
            }
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    member.start_apiserver();
    karmada.kubectl(&["delete", "clustertaintpolicy", "bench-federation-failover"]);
    Ok((results, tainted.unwrap_or(f64::NAN)))
}

pub(crate) fn run(bins: &Bins, dir: &Path, settings: &Settings, report: &mut Report) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let fleet = Arc::new(Fleet::of(settings.members)?);
    let started = Instant::now();
    let count = settings.members;
    let karmada = std::panic::catch_unwind(|| Karmada::start_with(count))
        .map_err(|_| anyhow!("the Karmada test bed did not start (see the output above)"))?;
    let bed_ready = started.elapsed().as_secs_f64();
    eprintln!("scenario 10: {count} members Ready after {bed_ready:.0} s");
    let mut contenders = Contenders::start(bins, dir, &karmada, GUARDED)?;
    let runtime = tokio::runtime::Runtime::new()?;
    let client = runtime.block_on(karmada.client(Identity::Admin));
    let tracker = Tracker::start(&runtime, &client, fleet.clone());

    let mut deliveries = BTreeMap::new();
    for (namespace, pids) in [
        (NATIVE, vec![contenders.scheduler_pid]),
        (GUARDED, contenders.guarded_pids()),
        (OURS, contenders.ours_pids()),
    ] {
        let delivery = deliver_all(
            &runtime, &client, &karmada, &tracker, &fleet, namespace, settings, &pids,
        )?;
        deliveries.insert(namespace, delivery);
    }
    let latency =
        crate::karmada::binding_admission_latency(&runtime, &client, &contenders, GUARDED, NATIVE)?;
    eprintln!("scenario 10: a binding write's admission: {latency}");
    let peak = |pid: u32| vm_kib(pid, "VmHWM").map(|k| k as f64 / 1024.0);
    let sync_peak = peak(contenders.sync.pid())?;
    let webhook_peak = peak(contenders.webhook_pid())?;
    let (failover, tainted) = failover(&karmada, &tracker)?;
    contenders.sync.check_alive()?;
    // The failover's pass evaluates every binding in scope at once: its own
    // peak, read apart from the delivery's.
    let failover_peak = (
        peak(contenders.sync.pid())?,
        peak(contenders.webhook_pid())?,
    );
    let forbidden: BTreeMap<&str, usize> = [GUARDED, OURS]
        .into_iter()
        .map(|ns| (ns, tracker.forbidden(ns)))
        .collect();

    write_report(
        report,
        settings,
        bed_ready,
        &deliveries,
        &latency,
        [(sync_peak, webhook_peak), failover_peak],
        (&failover, tainted),
        &forbidden,
    );
    drop(tracker);
    drop(contenders);
    drop(karmada);
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn write_report(
    report: &mut Report,
    settings: &Settings,
    bed_ready: f64,
    deliveries: &BTreeMap<&str, Delivery>,
    latency: &crate::karmada::AdmissionLatency,
    [(sync_peak, webhook_peak), (sync_after, webhook_after)]: [(f64, f64); 2],
    (failover, tainted): (&Failovers, f64),
    forbidden: &BTreeMap<&str, usize>,
) {
    let (n, m) = (settings.deployments, settings.members);
    let native = &deliveries[NATIVE].contending;
    let mut section = format!(
        "## 10. Policy at federation scale ({m} members, {n} Deployments per contender)\n\n\
         A Karmada bed of {m} members (`scripts/testbed up --karmada --members {m}`: the three of scenario 8 and {} light \
         members sharing one API server, Karmada's execution of Works off; ready in {bed_ready:.0} s). For each contender, \
         {n} Deployments through Karmada's API server in a namespace of its own, every combination of EU jurisdiction and \
         PCI level (none, 1-4) over {GROUPS} PropagationPolicies of four kinds from docs/karmada.md's composition table \
         (names divided evenly, static weights, fall-back groups, a spread over two regions; placement-policy as the \
         scheduler gets the policy's own choice instead of the spread). Time: from the first create until every binding \
         is scheduled with a Work on each of its members; CPU: the scheduling processes meanwhile. One run each, \
         karmada-scheduler alone first. Karmada's controller manager and scheduler run with `--kube-api-qps={qps}`, \
         placement-sync with `--remediation-rate={qps}`.\n\n\
         | contender | delivered | time | CPU | time ratio | CPU ratio |\n|---|---|---|---|---|---|\n",
        m - MEMBERS.len(),
        qps = placement_tests::karmada::COMPONENT_QPS,
    );
    for (name, namespace) in [
        ("karmada-scheduler alone", NATIVE),
        ("karmada-scheduler with the guardrail", GUARDED),
        ("placement-policy as the scheduler", OURS),
    ] {
        let d = &deliveries[namespace];
        section.push_str(&format!(
            "| {name} | {}{} of {n} | {:.1} s | {:.2} s | {:.2} | {:.2} |\n",
            d.delivered,
            if d.complete { "" } else { " (cut)" },
            d.contending.seconds,
            d.contending.cpu,
            d.contending.seconds / native.seconds,
            d.contending.cpu / native.cpu.max(0.001),
        ));
    }
    let guarded = &deliveries[GUARDED].contending;
    let ours = &deliveries[OURS].contending;
    section.push_str(&format!(
        "\nThe guardrail's CPU: karmada-scheduler {:.2} s, the webhook {:.2} s, placement-sync {:.2} s, OPA {:.2} s. \
         placement-policy as the scheduler: placement-sync {:.2} s, OPA {:.2} s. Peak memory (VmHWM) at the end of \
         the three runs ({} Deployments in the plane): placement-sync {sync_peak:.0} MiB, the webhook {webhook_peak:.0} MiB; \
         after the failover below (placement-sync's pass over every binding in scope): placement-sync {sync_after:.0} MiB, \
         the webhook {webhook_after:.0} MiB.\n\n\
         A binding write's admission (as in scenario 8): {latency}.\n\n\
         Failover: {VICTIM} tainted NoExecute while not Ready and its API server killed; Karmada tainted it {tainted:.1} s \
         after the kill. Until no binding names it:",
        guarded.parts.first().copied().unwrap_or(0.0),
        guarded.parts.get(1).copied().unwrap_or(0.0),
        guarded.parts.get(2).copied().unwrap_or(0.0),
        guarded.parts.get(3).copied().unwrap_or(0.0),
        ours.parts.first().copied().unwrap_or(0.0),
        ours.parts.get(1).copied().unwrap_or(0.0),
        3 * n,
    ));
    for (name, namespace) in [
        ("karmada-scheduler alone", NATIVE),
        ("with the guardrail", GUARDED),
        ("placement-policy", OURS),
    ] {
        let (bindings, after) = failover[namespace];
        section.push_str(&format!(
            " {name} ({bindings} bindings on it) {};",
            shown(after)
        ));
    }
    section.push_str(&format!(
        " bindings of the policy's contenders ever seen on a member the policy forbids them: guardrail {}, \
         placement-policy {}.\n",
        forbidden[GUARDED], forbidden[OURS]
    ));
    report.section(section);
    let ratio = |ns: &str, of: fn(&Contending) -> f64| {
        of(&deliveries[ns].contending) / of(native).max(0.001)
    };
    let complete = |ns: &str| deliveries[ns].complete && deliveries[NATIVE].complete;
    let met = |ns: &str, ok: bool| Status::from_bool(complete(ns) && ok);
    let time = |ns: &str| ratio(ns, |c| c.seconds);
    let cpu = |ns: &str| ratio(ns, |c| c.cpu);
    report.target(
        format!("Federation ({m} members, {n} Deployments): the guardrail's time at most 1.1x karmada-scheduler's"),
        format!("{:.2}x", time(GUARDED)),
        met(GUARDED, time(GUARDED) <= 1.1),
    );
    report.target(
        format!("Federation ({m} members, {n} Deployments): the guardrail's CPU at most 1.5x karmada-scheduler's"),
        format!("{:.2}x", cpu(GUARDED)),
        met(GUARDED, cpu(GUARDED) <= 1.5),
    );
    report.target(
        format!("Federation ({m} members, {n} Deployments): placement-policy's time at most karmada-scheduler's"),
        format!("{:.2}x", time(OURS)),
        met(OURS, time(OURS) <= 1.0),
    );
    report.target(
        "Federation: a binding write's added admission latency at most 5 ms (median)",
        format!(
            "+{:.2} ms (the API server's calls: of the guardrail's webhook {}, of Karmada's own webhook of bindings {})",
            latency.guarded_ms - latency.plain_ms,
            latency.call("placement.placement-policy.io"),
            latency.call("resourcebinding.karmada.io"),
        ),
        Status::from_bool(latency.guarded_ms - latency.plain_ms <= 5.0),
    );
    let native_failover = failover[NATIVE].1;
    report.target(
        format!(
            "Federation failover: placement-policy moves every binding off {VICTIM} within 30 s"
        ),
        shown(failover[OURS].1),
        Status::from_bool(failover[OURS].1.is_some_and(|s| s < 30.0)),
    );
    report.target(
        "Federation failover: the guardrail within karmada-scheduler's own time plus 10%, never on a forbidden member",
        format!("{} vs {}; {} forbidden", shown(failover[GUARDED].1), shown(native_failover), forbidden[GUARDED]),
        Status::from_bool(
            forbidden[GUARDED] == 0
                && match (failover[GUARDED].1, native_failover) {
                    (Some(g), Some(n)) => g <= 1.1 * n,
                    (Some(_), None) => true,
                    (None, _) => false,
                },
        ),
    );
}

fn shown(seconds: Option<f64>) -> String {
    match seconds {
        Some(s) => format!("{s:.1} s"),
        None => format!("not within {} s", FAILOVER_LIMIT.as_secs()),
    }
}

/// Scenario 10 without Karmada: said in the report, never counted as met.
pub(crate) fn skipped(reason: &str, report: &mut Report) {
    report.section(format!(
        "## 10. Policy at federation scale\n\nNot run: {reason}\n"
    ));
    report.target(
        "Federation: 100 members, 10,000 Deployments",
        format!("not run: {reason}"),
        Status::Blocked,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_group_meets_every_combination_of_requirements() {
        let mut seen: HashMap<usize, HashSet<Requirement>> = HashMap::new();
        for i in 0..10_000 {
            let (group, requirement) = workload(i);
            seen.entry(group).or_default().insert(requirement);
        }
        assert_eq!(seen.len(), GROUPS);
        for (group, requirements) in seen {
            assert_eq!(requirements.len(), 10, "group {group}");
        }
    }

    #[test]
    fn every_placement_names_a_member_allowed_for_every_requirement() {
        let fleet = Fleet::of(100).expect("a fleet");
        let strictest = Requirement { eu: true, pci: 4 };
        for group in 0..GROUPS {
            let placement = placement(&fleet, group, false).to_string();
            assert!(
                fleet
                    .anchors
                    .iter()
                    .any(|a| placement.contains(&format!("\"{a}\"")))
                    || KINDS[group % KINDS.len()] == "spread",
                "group {group}: {placement}"
            );
        }
        assert!(fleet.anchors.iter().all(|a| fleet.allows(a, strictest)));
        assert!(!fleet.allows(VICTIM, strictest));
        // The victim has an API server of its own: killing it leaves the
        // light members' shared one alone.
        assert!(matches!(
            MEMBERS[2].kind,
            placement_tests::karmada::MemberKind::Plain { .. }
        ));
        assert_eq!(MEMBERS[2].name, VICTIM);
    }
}
