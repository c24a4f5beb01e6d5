//! The flags of what goes into the engine and how: replication, OPA, the
//! policy and data ConfigMaps, keeping the engine in sync, and kube-mgmt's
//! bundle flags (refused).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use policy_client::configmaps::{ConfigMapFlags, ConfigMapFlagsEnv, ConfigMapSelection};
use policy_client::opa::Token;

use super::values::{normalize_path, trimmed_list};
use crate::error::SyncError;
use crate::gvr::Gvr;
use crate::policies::owners::{PackageOwners, SHIPPED_PACKAGES};

/// Default engine path below which replicated objects are stored.
const DEFAULT_REPLICATE_PATH: &str = "kubernetes";
/// Default engine document the sidecar uses to notice engine restarts.
const DEFAULT_SENTINEL_PATH: &str = "system/placement-sync/sentinel";

/// Whether a replicated type is namespaced (`--replicate`) or cluster-scoped
/// (`--replicate-cluster`); it decides the engine path layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReplicaScope {
    Namespaced,
    Cluster,
}

/// One `--replicate`/`--replicate-cluster` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReplicateSpec {
    pub(crate) gvr: Gvr,
    pub(crate) scope: ReplicaScope,
}

/// Which objects are replicated into the engine, and where.
#[derive(Debug, Clone, clap::Args)]
pub(super) struct ReplicationArgs {
    /// Namespaced resource type to replicate, `[group/]version/resource`
    /// (repeatable, or comma-separated).
    #[arg(long, env = "PLACEMENT_SYNC_REPLICATE", value_delimiter = ',')]
    pub(crate) replicate: Vec<Gvr>,

    /// Cluster-scoped resource type to replicate, `[group/]version/resource`
    /// (repeatable, or comma-separated).
    #[arg(long, env = "PLACEMENT_SYNC_REPLICATE_CLUSTER", value_delimiter = ',')]
    pub(crate) replicate_cluster: Vec<Gvr>,

    /// Engine data path under which replicated objects are written.
    #[arg(long, env = "PLACEMENT_SYNC_REPLICATE_PATH", default_value = DEFAULT_REPLICATE_PATH)]
    pub(crate) replicate_path: String,

    /// Namespaces whose objects are not replicated (comma-separated).
    #[arg(
        long,
        env = "PLACEMENT_SYNC_REPLICATE_IGNORE_NAMESPACES",
        value_delimiter = ','
    )]
    pub(crate) replicate_ignore_namespaces: Vec<String>,

    /// Write only the replicated types the loaded policies read (found in
    /// their source, e.g. `data.kubernetes.clusters`); the others are watched
    /// but kept out of the engine. A policy that starts reading a type is
    /// loaded only after that type is written.
    #[arg(long, env = "PLACEMENT_SYNC_REPLICATE_ONLY_READ_TYPES")]
    pub(crate) replicate_only_read_types: bool,
}

impl ReplicationArgs {
    /// Every type to replicate, each plural once: the plural names the
    /// type's engine path, so two types with one plural would share it.
    pub(super) fn specs(&self) -> Result<Vec<ReplicateSpec>, SyncError> {
        let mut specs = Vec::new();
        let mut seen = BTreeSet::new();
        let namespaced = self.replicate.iter().map(|g| (g, ReplicaScope::Namespaced));
        let cluster = self
            .replicate_cluster
            .iter()
            .map(|g| (g, ReplicaScope::Cluster));
        for (gvr, scope) in namespaced.chain(cluster) {
            if !seen.insert(gvr.resource.clone()) {
                return Err(SyncError::Config(format!(
                    "resource {:?} is replicated twice; each plural name may appear once because it names the engine path",
                    gvr.resource
                )));
            }
            specs.push(ReplicateSpec {
                gvr: gvr.clone(),
                scope,
            });
        }
        Ok(specs)
    }

    pub(super) fn path(&self) -> Result<String, SyncError> {
        normalize_path(&self.replicate_path)
            .ok_or_else(|| SyncError::Config("--replicate-path must not be empty".to_owned()))
    }

    pub(super) fn ignore_namespaces(&self) -> BTreeSet<String> {
        trimmed_list(&self.replicate_ignore_namespaces)
    }
}

/// How to reach OPA.
#[derive(Debug, Clone, clap::Args)]
pub(super) struct OpaArgs {
    /// Base URL of OPA (a trailing `/v1`, as kube-mgmt takes it, is accepted).
    #[arg(
        long,
        env = "PLACEMENT_SYNC_OPA_URL",
        default_value = "http://127.0.0.1:8181"
    )]
    pub(crate) opa_url: String,

    /// File holding the bearer token for OPA (never logged). kube-mgmt's
    /// `--opa-auth-token-file` is the same flag.
    #[arg(
        long,
        env = "PLACEMENT_SYNC_OPA_TOKEN_FILE",
        alias = "opa-auth-token-file"
    )]
    pub(crate) opa_token_file: Option<PathBuf>,

    /// The bearer token for OPA itself (kube-mgmt's flag; prefer the file,
    /// which keeps it out of the process list). Never logged.
    #[arg(
        long,
        env = "PLACEMENT_SYNC_OPA_AUTH_TOKEN",
        conflicts_with = "opa_token_file",
        hide_env_values = true
    )]
    pub(crate) opa_auth_token: Option<String>,

    /// Accept any certificate from an https OPA (kube-mgmt's flag; for tests).
    #[arg(long, env = "PLACEMENT_SYNC_OPA_ALLOW_INSECURE")]
    pub(crate) opa_allow_insecure: bool,

    /// PEM file of a CA to trust for an https OPA.
    #[arg(long, env = "PLACEMENT_SYNC_OPA_CA_FILE")]
    pub(crate) opa_ca_file: Option<PathBuf>,

    /// Limit for one request to OPA, e.g. `5s`.
    #[arg(long, env = "PLACEMENT_SYNC_OPA_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub(crate) opa_timeout: Duration,

    /// Memory for remembered decisions (0: none), as the webhook's flag: the
    /// reconcilers ask once per workload and binding, most of which share a
    /// decision. Sound because this process writes the engine: every policy
    /// or data write forgets them all before it reaches the engine.
    #[arg(long, env = "PLACEMENT_SYNC_DECISION_CACHE_MEMORY", value_parser = policy_client::text::parse_bytes, default_value = "16Mi")]
    pub(crate) decision_cache_memory: usize,
}

impl OpaArgs {
    pub(super) fn url(&self) -> Result<reqwest::Url, SyncError> {
        parse_opa_url(&self.opa_url)
    }

    /// The token from its file (read now, so a missing file fails at start),
    /// else the one given inline.
    pub(super) fn token(&self) -> Result<Option<Token>, SyncError> {
        let Some(path) = &self.opa_token_file else {
            return Ok(self
                .opa_auth_token
                .as_deref()
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(Token::new));
        };
        let raw = std::fs::read_to_string(path).map_err(|e| {
            SyncError::Config(format!(
                "cannot read --opa-token-file {}: {e}",
                path.display()
            ))
        })?;
        let token = raw.trim();
        if token.is_empty() {
            return Err(SyncError::Config(format!(
                "--opa-token-file {} is empty",
                path.display()
            )));
        }
        Ok(Some(Token::new(token)))
    }

    pub(super) fn ca_pem(&self) -> Result<Option<Vec<u8>>, SyncError> {
        self.opa_ca_file
            .as_ref()
            .map(|path| {
                std::fs::read(path).map_err(|e| {
                    SyncError::Config(format!("cannot read --opa-ca-file {}: {e}", path.display()))
                })
            })
            .transpose()
    }
}

/// Which ConfigMaps hold policies and which data: kube-mgmt's flags, with
/// kube-mgmt's meaning (the webhook's too, but for `--enable-data`).
#[derive(Debug, Clone, clap::Args)]
pub(super) struct ConfigMapArgs {
    #[command(flatten)]
    pub(crate) selection: ConfigMapFlags<SyncEnv>,

    /// Load JSON/YAML data from ConfigMaps.
    #[arg(long, env = "PLACEMENT_SYNC_ENABLE_DATA", default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub(crate) enable_data: bool,

    /// Namespaces, besides `--policy-namespace`, whose ConfigMaps may write
    /// the owned packages and placement-sync's own documents (the replicated
    /// objects, the sentinel), comma-separated: a module or data document
    /// from any other namespace that would write there is refused.
    #[arg(
        long,
        env = "PLACEMENT_SYNC_PACKAGE_OWNER_NAMESPACES",
        value_delimiter = ','
    )]
    pub(crate) package_owner_namespaces: Vec<String>,

    /// Packages that only the owners' namespaces write, each with the
    /// packages under it, besides the decision's package and the shipped
    /// policy's (comma-separated, `a.b` or `a/b`).
    #[arg(long, env = "PLACEMENT_SYNC_OWNED_PACKAGES", value_delimiter = ',')]
    pub(crate) owned_packages: Vec<String>,
}

/// The sidecar's environment variables of the ConfigMap selection flags.
#[derive(Debug, Clone)]
pub(super) struct SyncEnv;

impl ConfigMapFlagsEnv for SyncEnv {
    const POLICY_NAMESPACE: &'static str = "PLACEMENT_SYNC_POLICY_NAMESPACE";
    const NAMESPACES: &'static str = "PLACEMENT_SYNC_NAMESPACES";
    const ENABLE_POLICIES: &'static str = "PLACEMENT_SYNC_ENABLE_POLICIES";
    const POLICY_LABEL: &'static str = "PLACEMENT_SYNC_POLICY_LABEL";
    const POLICY_VALUE: &'static str = "PLACEMENT_SYNC_POLICY_VALUE";
    const DATA_LABEL: &'static str = "PLACEMENT_SYNC_DATA_LABEL";
    const DATA_VALUE: &'static str = "PLACEMENT_SYNC_DATA_VALUE";
}

impl ConfigMapArgs {
    pub(super) fn selection(&self) -> Result<ConfigMapSelection, SyncError> {
        self.selection
            .selection(self.enable_data)
            .map_err(SyncError::Config)
    }

    /// Who may write which packages: the decision's package (`decision`,
    /// a path), the shipped policy's and `--owned-packages` are written from
    /// the policy namespace and `--package-owner-namespaces` only.
    pub(super) fn owners(
        &self,
        selection: &ConfigMapSelection,
        decision: &str,
    ) -> Result<PackageOwners, SyncError> {
        let mut packages = vec![decision.replace('/', ".")];
        packages.extend(SHIPPED_PACKAGES.iter().map(|p| (*p).to_owned()));
        for text in trimmed_list(&self.owned_packages) {
            packages.push(package_name(&text)?);
        }
        let namespaces = trimmed_list(&self.package_owner_namespaces)
            .into_iter()
            .chain(selection.policy_namespace.clone());
        Ok(PackageOwners::new(packages, namespaces))
    }
}

/// A package named by `--owned-packages`, dotted: `a.b`, `a/b` or
/// `data.a.b`, each component a Rego identifier.
fn package_name(text: &str) -> Result<String, SyncError> {
    let dotted = text.trim_matches('/').replace('/', ".");
    let dotted = dotted.strip_prefix("data.").unwrap_or(&dotted);
    let identifier = |c: &str| {
        c.chars()
            .next()
            .is_some_and(|f| f.is_ascii_alphabetic() || f == '_')
            && c.chars().all(|ch| ch.is_ascii_alphanumeric() || ch == '_')
    };
    if dotted.split('.').all(identifier) {
        Ok(dotted.to_owned())
    } else {
        Err(SyncError::Config(format!(
            "--owned-packages: {text:?} is not a package name (dotted Rego identifiers, e.g. acme.placement)"
        )))
    }
}

/// kube-mgmt's replication driven by bundles, which placement-sync does not
/// do: its flags are refused with a message rather than ignored.
#[derive(Debug, Clone, clap::Args)]
pub(super) struct BundleArgs {
    /// kube-mgmt's bundle-driven replication (`--opa-config`), which
    /// placement-sync does not do: refused with a message rather than ignored.
    #[arg(long, hide = true)]
    pub(crate) opa_config: Option<PathBuf>,

    /// kube-mgmt's decision analysed for that replication; refused likewise.
    #[arg(long, hide = true)]
    pub(crate) analysis_entrypoint: Option<String>,
}

impl BundleArgs {
    pub(super) fn refuse(&self) -> Result<(), SyncError> {
        if self.opa_config.is_some() || self.analysis_entrypoint.is_some() {
            return Err(SyncError::Config(
                "--opa-config and --analysis-entrypoint (kube-mgmt's replication driven by bundles) are not supported; replicate types with --replicate and --replicate-cluster".to_owned(),
            ));
        }
        Ok(())
    }
}

/// Keeping the engine in sync: noticing its restarts, and how many writes
/// go to it at once.
#[derive(Debug, Clone, clap::Args)]
pub(super) struct EngineSyncArgs {
    /// How often the engine is checked for a restart, e.g. `2s`.
    #[arg(long, env = "PLACEMENT_SYNC_ENGINE_CHECK_INTERVAL", default_value = "2s", value_parser = humantime::parse_duration)]
    pub(crate) engine_check_interval: Duration,

    /// Engine data path of the sentinel document used to notice engine restarts.
    #[arg(long, env = "PLACEMENT_SYNC_SENTINEL_PATH", default_value = DEFAULT_SENTINEL_PATH)]
    pub(crate) sentinel_path: String,

    /// Engine writes in flight at once.
    #[arg(long, env = "PLACEMENT_SYNC_WORKERS", default_value_t = 16)]
    pub(crate) workers: usize,
}

impl EngineSyncArgs {
    /// The sentinel's path; never under the replicated data, which a full
    /// sync of a type replaces.
    pub(super) fn sentinel_path(&self, replicate_path: &str) -> Result<String, SyncError> {
        let sentinel_path = normalize_path(&self.sentinel_path)
            .ok_or_else(|| SyncError::Config("--sentinel-path must not be empty".to_owned()))?;
        if sentinel_path == replicate_path
            || sentinel_path.starts_with(&format!("{replicate_path}/"))
        {
            return Err(SyncError::Config(
                "--sentinel-path must not lie under --replicate-path".to_owned(),
            ));
        }
        Ok(sentinel_path)
    }

    pub(super) fn workers(&self) -> Result<usize, SyncError> {
        match self.workers {
            0 => Err(SyncError::Config("--workers must be at least 1".to_owned())),
            n => Ok(n),
        }
    }

    pub(super) fn check_interval(&self) -> Result<Duration, SyncError> {
        if self.engine_check_interval.is_zero() {
            return Err(SyncError::Config(
                "--engine-check-interval must be positive".to_owned(),
            ));
        }
        Ok(self.engine_check_interval)
    }
}

/// The OPA base URL; kube-mgmt users pass `http://host:8181/v1`, which is accepted.
pub(super) fn parse_opa_url(raw: &str) -> Result<reqwest::Url, SyncError> {
    let mut url = reqwest::Url::parse(raw.trim())
        .map_err(|e| SyncError::Config(format!("--opa-url {raw:?} is not a URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(SyncError::Config(format!(
            "--opa-url must be http or https, got {:?}",
            url.scheme()
        )));
    }
    let path = url.path().trim_end_matches('/').to_owned();
    if let Some(base) = path.strip_suffix("/v1") {
        url.set_path(if base.is_empty() { "/" } else { base });
    }
    Ok(url)
}
