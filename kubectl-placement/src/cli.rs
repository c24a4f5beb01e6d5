//! The command line (kubectl passes everything after `kubectl placement`).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use policy_client::configmaps::{ConfigMapFlags, ConfigMapFlagsEnv};

/// Why a workload may run where, whether the policy set is in force, and the
/// held changes to confirm.
#[derive(Debug, Parser)]
#[command(name = "kubectl placement", version, about)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

/// Flags of every command.
#[derive(Debug, Args)]
pub struct Global {
    /// kubeconfig file [default: KUBECONFIG, else ~/.kube/config, else in-cluster].
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,

    /// Output format.
    #[arg(short = 'o', long, global = true, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Text,
    Json,
}

/// The environment variables of the ConfigMap flags.
#[derive(Debug)]
pub struct PluginEnv;

impl ConfigMapFlagsEnv for PluginEnv {
    const POLICY_NAMESPACE: &'static str = "PLACEMENT_POLICY_NAMESPACE";
    const NAMESPACES: &'static str = "PLACEMENT_NAMESPACES";
    const ENABLE_POLICIES: &'static str = "PLACEMENT_ENABLE_POLICIES";
    const POLICY_LABEL: &'static str = "PLACEMENT_POLICY_LABEL";
    const POLICY_VALUE: &'static str = "PLACEMENT_POLICY_VALUE";
    const DATA_LABEL: &'static str = "PLACEMENT_DATA_LABEL";
    const DATA_VALUE: &'static str = "PLACEMENT_DATA_VALUE";
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Per cluster: may OBJECT run there, and the policy's reason.
    Explain(Box<ExplainArgs>),
    /// Whether the policy set is loaded and in force, the last good set, and
    /// each engine's sync.
    Status(StatusArgs),
    /// The changes held by the blast-radius guard, with what they would move.
    Held(HeldArgs),
    /// Let one held change through.
    Confirm(ConfirmArgs),
}

#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// Which ConfigMaps are policies and data: placement-sync's flags.
    #[command(flatten)]
    pub configmaps: ConfigMapFlags<PluginEnv>,

    /// The object, as kubectl names it: `rs/web`, `deployment.apps/web`,
    /// `placement/web-eu` (an OCM Placement: its workloads too),
    /// `resourcebinding/web-deployment` (its template). Not with --filename.
    pub object: Option<String>,

    /// Namespace of the object [default: the kubeconfig context's, else default].
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,

    /// Explain the object of this manifest (`-`: standard input) instead of
    /// one read from the API server.
    #[arg(short = 'f', long)]
    pub filename: Option<PathBuf>,

    /// Evaluate the Rego modules and data files of this folder (as `opa run
    /// DIR` reads it, and `placement-webhook review`), offline, instead of
    /// the cluster's policy set and data. The path is relative to the
    /// working directory.
    #[arg(long)]
    pub policy_dir: Option<PathBuf>,

    /// The decision path the webhook queries.
    #[arg(long, default_value = policy_client::DEFAULT_DECISION_PATH)]
    pub decision: String,

    /// The package whose `reasons`, `exclusions` and `selected` explain the
    /// decision (the shipped policy's rules package).
    #[arg(long, default_value = "io/k8s/federation/placement")]
    pub explain_package: String,

    /// Cluster-scoped types replicated into the engine, as placement-sync's
    /// --replicate-cluster [default: the cluster types the API server serves
    /// of placement-policy.io, Karmada and Open Cluster Management].
    #[arg(long, value_delimiter = ',')]
    pub replicate_cluster: Vec<String>,

    /// The data path of replicated objects, as placement-sync's.
    #[arg(long, default_value = "kubernetes")]
    pub replicate_path: String,

    /// The last good policy set (NAMESPACE/NAME), as placement-sync's
    /// --last-good-policies [default: found by the chart's labels]; when
    /// found, its modules are the set in force.
    #[arg(long)]
    pub last_good_policies: Option<String>,

    /// The Secret (NAMESPACE/NAME) with the ownership keys, to read objects
    /// in the developer's view as the webhook does [default: found by the
    /// chart's labels].
    #[arg(long, conflicts_with = "ownership_key_file")]
    pub ownership_secret: Option<String>,

    /// A file with the ownership keys (one base64 key per line).
    #[arg(long)]
    pub ownership_key_file: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Which ConfigMaps are policies and data: placement-sync's flags.
    #[command(flatten)]
    pub configmaps: ConfigMapFlags<PluginEnv>,

    /// The last good policy set (NAMESPACE/NAME) [default: found by the
    /// chart's labels].
    #[arg(long)]
    pub last_good_policies: Option<String>,

    /// A placement-sync to ask for its sync (its `--listen` address, e.g.
    /// http://127.0.0.1:8182); repeatable. Without it, the pods of the
    /// chart's components are asked through the API server.
    #[arg(long)]
    pub sync_url: Vec<String>,
}

#[derive(Debug, Args)]
pub struct HeldArgs {
    /// Which ConfigMaps are policies and data: placement-sync's flags.
    #[command(flatten)]
    pub configmaps: ConfigMapFlags<PluginEnv>,
}

#[derive(Debug, Args)]
pub struct ConfirmArgs {
    /// Which ConfigMaps are policies and data: placement-sync's flags.
    #[command(flatten)]
    pub configmaps: ConfigMapFlags<PluginEnv>,

    /// The id of the held change (`kubectl placement held`).
    pub id: String,
}
