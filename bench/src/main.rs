//! `placement-bench`: placement-policy side by side with the ceiling of its own
//! stack and with OPA answering admission itself, on this machine, in one run.
//! `scripts/bench` builds everything and runs it; see BENCHMARKS.md.
//!
//! Scenarios:
//! 1. admission over TLS (four contenders, concurrency 1 and 32; oha, and vegeta
//!    for the ceiling and the embedded webhook);
//! 2. creates through kube-apiserver with and without the webhook;
//! 3. replication of 10,000 and 100,000 objects into OPA, placement-sync beside
//!    kube-mgmt;
//! 4. remediation of 1,000 ReplicaSets after one policy edit;
//! 5. recovery after an OPA restart with those objects, beside kube-mgmt;
//! 6. hostile clients: memory, connections and normal reviews under attack;
//! 7. churn: 10,000 remediated ReplicaSets under status updates no policy
//!    reads, then one Cluster offline;
//! 8. scheduling 1,000 Deployments through a real Karmada federation,
//!    placement-policy beside karmada-scheduler, and failover;
//! 9. deciding 500 Placements on a real Open Cluster Management hub,
//!    placement-policy beside OCM's placement controller;
//! 10. policy at federation scale: 10,000 Deployments through Karmada on 100
//!     members, karmada-scheduler alone, with the guardrail and
//!     placement-policy as the scheduler, and failover of a member carrying
//!     3,000 bindings.

mod admission;
mod apiserver;
mod churn;
mod common;
mod federation;
mod hostile;
mod karmada;
mod kube_mgmt;
mod load;
mod ocm;
mod opa_probe;
mod profile;
mod remediation;
mod replication;
mod report;
mod review;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;

use crate::common::{Bins, release_bin, require, version_of};
use crate::report::Report;

#[derive(Debug, Parser)]
#[command(about = "Benchmarks of placement-policy; run through scripts/bench")]
struct Args {
    /// Scenarios to run (comma-separated numbers 1-10).
    #[arg(
        long,
        env = "BENCH_SCENARIOS",
        default_value = "1,2,3,4,5,6,7,8,9,10",
        value_delimiter = ','
    )]
    scenarios: Vec<u8>,
    /// Length of each load run of scenario 1, in seconds.
    #[arg(long, env = "BENCH_DURATION", default_value_t = 20.0)]
    duration: f64,
    /// Runs of every measurement; the report gives medians.
    #[arg(long, env = "BENCH_RUNS", default_value_t = 3)]
    runs: usize,
    /// Concurrency levels of scenario 1.
    #[arg(
        long,
        env = "BENCH_CONCURRENCY",
        default_value = "1,32",
        value_delimiter = ','
    )]
    concurrency: Vec<usize>,
    /// ReplicaSet creates per contender and run in scenario 2.
    #[arg(long, env = "BENCH_CREATES", default_value_t = 1000)]
    creates: usize,
    /// Replicated objects in scenarios 3 and 5: each size in turn (comma-separated).
    #[arg(
        long,
        env = "BENCH_OBJECTS",
        default_value = "10000,100000",
        value_delimiter = ','
    )]
    objects: Vec<usize>,
    /// ReplicaSets remediated in scenario 4.
    #[arg(long, env = "BENCH_WORKLOADS", default_value_t = 1000)]
    workloads: usize,
    /// ReplicaSets replicated and remediated in scenario 7.
    #[arg(long, env = "BENCH_CHURN_WORKLOADS", default_value_t = 10_000)]
    churn_workloads: usize,
    /// Status updates per second in scenario 7.
    #[arg(long, env = "BENCH_CHURN_RATE", default_value_t = 100.0)]
    churn_rate: f64,
    /// Seconds of status updates in scenario 7.
    #[arg(long, env = "BENCH_CHURN_SECONDS", default_value_t = 60.0)]
    churn_seconds: f64,
    /// Deployments scheduled through Karmada in scenario 8, by each scheduler.
    #[arg(long, env = "BENCH_KARMADA_DEPLOYMENTS", default_value_t = 1000)]
    karmada_deployments: usize,
    /// Why scenario 8 is skipped (scripts/bench passes the reason when
    /// Karmada's source is absent).
    #[arg(long, env = "BENCH_KARMADA_SKIPPED")]
    karmada_skipped: Option<String>,
    /// Members of the Karmada bed of scenario 10.
    #[arg(long, env = "BENCH_FEDERATION_MEMBERS", default_value_t = 100)]
    federation_members: usize,
    /// Deployments scheduled in scenario 10, by each contender.
    #[arg(long, env = "BENCH_FEDERATION_DEPLOYMENTS", default_value_t = 10_000)]
    federation_deployments: usize,
    /// Placements decided on the OCM hub in scenario 9, by each decider.
    #[arg(long, env = "BENCH_OCM_PLACEMENTS", default_value_t = 500)]
    ocm_placements: usize,
    /// Why scenario 9 is skipped (scripts/bench passes the reason when OCM's
    /// source is absent).
    #[arg(long, env = "BENCH_OCM_SKIPPED")]
    ocm_skipped: Option<String>,
    /// kube-mgmt for scenarios 3 and 5: the binary or its folder (scripts/bench
    /// passes what `scripts/testbed kube-mgmt-assets` built); without it and
    /// without --kube-mgmt-skipped, that command is run.
    #[arg(long, env = "BENCH_KUBE_MGMT")]
    kube_mgmt: Option<PathBuf>,
    /// Why the kube-mgmt contender is skipped (scripts/bench passes the reason).
    #[arg(long, env = "BENCH_KUBE_MGMT_SKIPPED")]
    kube_mgmt_skipped: Option<String>,
    /// Where the Markdown report goes.
    #[arg(long, env = "BENCH_OUT", default_value = "BENCHMARKS.md")]
    out: PathBuf,
    /// The command line to print in the report (scripts/bench passes its own).
    #[arg(long, env = "BENCH_COMMAND", default_value = "scripts/bench")]
    command: String,
    /// A note put under the report's title (e.g. that this was a short run).
    #[arg(long, env = "BENCH_NOTE", default_value = "")]
    note: String,
    /// The load generator written in Rust.
    #[arg(long, env = "BENCH_OHA", default_value = "oha")]
    oha: PathBuf,
    /// The load generator written in Go.
    #[arg(long, env = "BENCH_VEGETA", default_value = "vegeta")]
    vegeta: PathBuf,
    /// Scratch directory for logs, certificates and policy trees.
    #[arg(long, env = "BENCH_DIR")]
    dir: Option<PathBuf>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    placement_tests::install_crypto();
    let started = Instant::now();
    let uses = |numbers: &[u8]| args.scenarios.iter().any(|s| numbers.contains(s));
    let bins = Bins {
        webhook: release_bin("placement-webhook"),
        sync: release_bin("placement-sync"),
        noop: release_bin("noop-webhook"),
        oha: which(&args.oha),
        vegeta: which(&args.vegeta),
        opa: placement_tests::peer("opa"),
        kube_mgmt: if uses(&[3, 5]) {
            kube_mgmt::resolve(args.kube_mgmt.as_deref(), args.kube_mgmt_skipped.as_deref())
        } else {
            Err("scenarios 3 and 5 were not run".to_owned())
        },
    };
    let hint = "build with `cargo build --release --bins` (scripts/bench does)";
    require(&bins.webhook, hint)?;
    if uses(&[3, 4, 5, 7, 8]) {
        require(&bins.sync, hint)?;
    }
    if uses(&[1, 2]) {
        require(&bins.noop, hint)?;
    }
    if uses(&[1]) {
        require(&bins.oha, "scripts/bench installs oha")?;
        require(&bins.vegeta, "scripts/bench builds vegeta")?;
    }
    let dir = args.dir.clone().unwrap_or_else(|| {
        placement_tests::repo_root()
            .join("target/bench")
            .join(format!("run-{}", std::process::id()))
    });
    std::fs::create_dir_all(&dir)?;
    eprintln!("placement-bench: logs and files in {}", dir.display());

    let mut report = Report::default();
    header(&mut report, &args, &bins);

    let duration = Duration::from_secs_f64(args.duration);
    let run_counters = cpu_counters();
    let mut steal_per_scenario = Vec::new();
    for scenario in &args.scenarios {
        if *scenario == 5 && args.scenarios.contains(&3) {
            // Runs inside scenario 3: same objects, same contenders.
            continue;
        }
        let t = Instant::now();
        let counters = cpu_counters();
        eprintln!("\n==> scenario {scenario}");
        let dir = dir.join(format!("scenario-{scenario}"));
        match scenario {
            1 => admission::run(
                &bins,
                &dir,
                &admission::Settings {
                    duration,
                    warmup: duration.min(Duration::from_secs(2)),
                    concurrency: args.concurrency.clone(),
                    runs: args.runs,
                },
                &mut report,
            )?,
            2 => apiserver::run(&bins, &dir, args.creates, args.runs, &mut report)?,
            3 | 5 => replication::run(
                &bins,
                &dir,
                &replication::Settings {
                    sizes: &args.objects,
                    runs: args.runs,
                    recovery: args.scenarios.contains(&5),
                },
                &mut report,
            )?,
            4 => remediation::run(&bins, &dir, args.workloads, args.runs, &mut report)?,
            6 => hostile::run(&bins, &dir, &mut report)?,
            7 => churn::run(
                &bins,
                &dir,
                &churn::Settings {
                    workloads: args.churn_workloads,
                    rate: args.churn_rate,
                    seconds: args.churn_seconds,
                    runs: args.runs,
                },
                &mut report,
            )?,
            8 => match args.karmada_skipped.as_deref().filter(|r| !r.is_empty()) {
                Some(reason) => karmada::skipped(reason, &mut report),
                None => karmada::run(
                    &bins,
                    &dir,
                    &karmada::Settings {
                        deployments: args.karmada_deployments,
                        replicas: 2,
                        runs: args.runs.max(1),
                    },
                    &mut report,
                )?,
            },
            9 => match args.ocm_skipped.as_deref().filter(|r| !r.is_empty()) {
                Some(reason) => ocm::skipped(reason, &mut report),
                None => ocm::run(
                    &bins,
                    &dir,
                    &ocm::Settings {
                        placements: args.ocm_placements,
                        runs: args.runs.max(1),
                    },
                    &mut report,
                )?,
            },
            10 => match args.karmada_skipped.as_deref().filter(|r| !r.is_empty()) {
                Some(reason) => federation::skipped(reason, &mut report),
                None => federation::run(
                    &bins,
                    &dir,
                    &federation::Settings {
                        members: args.federation_members,
                        deployments: args.federation_deployments,
                    },
                    &mut report,
                )?,
            },
            other => anyhow::bail!("no scenario {other}"),
        }
        eprintln!(
            "scenario {scenario} took {:.0} s",
            t.elapsed().as_secs_f64()
        );
        if let Some(steal) = steal_since(counters) {
            steal_per_scenario.push(format!("scenario {scenario} {:.0}%", steal * 100.0));
        }
    }
    if let Some(steal) = steal_since(run_counters) {
        report.header(format!(
            "CPU time taken by the hypervisor from this virtual machine (steal, `/proc/stat`) during the run: {:.0}% ({}). \
             Steal slows every contender, unevenly over time; the ratios within a scenario are steadier than the absolute figures.",
            steal * 100.0,
            steal_per_scenario.join(", ")
        ));
    }
    report.header(format!(
        "Whole run: {:.0} s. Logs of this run: `{}`.",
        started.elapsed().as_secs_f64(),
        dir.strip_prefix(placement_tests::repo_root())
            .unwrap_or(&dir)
            .display()
    ));
    let md = report.render(&args.note);
    std::fs::write(&args.out, &md).with_context(|| format!("write {}", args.out.display()))?;
    eprintln!("placement-bench: wrote {}", args.out.display());
    Ok(())
}

/// (steal, total) jiffies of all CPUs, from the first line of `/proc/stat`.
fn cpu_counters() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    (fields.len() == 8).then(|| (fields[7], fields.iter().sum()))
}

/// The share of CPU time stolen since `before`.
fn steal_since(before: Option<(u64, u64)>) -> Option<f64> {
    let (steal0, total0) = before?;
    let (steal1, total1) = cpu_counters()?;
    let total = total1.checked_sub(total0)?;
    (total > 0).then(|| steal1.saturating_sub(steal0) as f64 / total as f64)
}

fn which(program: &std::path::Path) -> PathBuf {
    if program.components().count() > 1 {
        return program.to_owned();
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(program))
        .find(|p| p.exists())
        .unwrap_or_else(|| program.to_owned())
}

fn header(report: &mut Report, args: &Args, bins: &Bins) {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".to_owned());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map(|kb| format!("{:.0} GiB", kb / 1024.0 / 1024.0))
        .unwrap_or_else(|| "unknown".to_owned());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    report.header(format!("Command: `{}`", args.command));
    report.header(format!(
        "Settings: scenarios {:?}, {} run(s) per measurement (medians reported), {} s per load run, concurrency {:?}, {} creates per contender, {} replicated objects, {} remediated workloads, churn of {} workloads at {} status updates/s for {} s, {} Deployments through Karmada, {} Placements on an OCM hub, {} Deployments per contender on {} Karmada members.",
        args.scenarios,
        args.runs,
        args.duration,
        args.concurrency,
        args.creates,
        args.objects
            .iter()
            .map(|n| report::fmt_count(*n))
            .collect::<Vec<_>>()
            .join(" and "),
        args.workloads,
        args.churn_workloads,
        args.churn_rate,
        args.churn_seconds,
        args.karmada_deployments,
        args.ocm_placements,
        args.federation_deployments,
        args.federation_members,
    ));
    report.header(format!(
        "Machine: {cores} cores ({cpu}), {mem} memory; load average at start: {}. Everything (servers, peers, load generator) shares these cores.",
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    ));
    let assets = placement_tests::assets();
    report.header(format!(
        "Peers: {}; {}; {}.",
        version_of(&assets.join("kube-apiserver"), &["--version"]),
        version_of(&assets.join("etcd"), &["--version"]),
        version_of(&bins.opa, &["version"]).replace("Version: ", "OPA "),
    ));
    if let Ok(kube_mgmt) = &bins.kube_mgmt {
        report.header(format!(
            "kube-mgmt: {} (built by `scripts/testbed kube-mgmt-assets` from the source kept in `../shared/peers/kube-mgmt`, `{}`).",
            version_of(kube_mgmt, &["--version"]).replace("Version: ", "snapshot "),
            kube_mgmt.display()
        ));
    }
    report.header(format!(
        "Load generators: {}, vegeta {}; {}.",
        version_of(&bins.oha, &["--version"]),
        version_of(&bins.vegeta, &["-version"]).replace("Version: ", ""),
        version_of(std::path::Path::new("rustc"), &["--version"]),
    ));
    report.header(format!(
        "placement-policy: release build of `{}`{}.",
        git(&["rev-parse", "--short", "HEAD"]),
        // The report being rewritten is no change to what was measured.
        if git(&["status", "--porcelain", "--untracked-files=no"])
            .lines()
            .all(|line| std::path::Path::new(line.get(3..).unwrap_or_default()) == args.out)
        {
            ""
        } else {
            " with uncommitted changes"
        }
    ));
}

fn git(args: &[&str]) -> String {
    std::process::Command::new("git")
        .args(args)
        .current_dir(placement_tests::repo_root())
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}
