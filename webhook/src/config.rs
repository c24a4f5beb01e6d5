//! Command line and configuration file: the bottom of the crate, reaching
//! no other module of it (every other module may read its flags).

mod self_managed;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use policy_client::DEFAULT_DECISION_PATH;
use policy_client::configmaps::{ConfigMapFlags, ConfigMapFlagsEnv};
use policy_client::embedded::Embedded;
use policy_client::engine::PolicyEngine;
use policy_client::opa::{Opa, OpaConfig, Token};
use policy_client::text::parse_bytes;
use reqwest::Url;
use serde::Deserialize;

pub(crate) use self::self_managed::{ConfigurationRef, SecretRef, SelfManagedTlsArgs};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {what} {path}: {source}")]
    Read {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "config file {path} is not in the expected format {{\"EnforceSchedulingPolicy\": {{\"url\": ..., \"token\": ...}}}}: {message}"
    )]
    ConfigFile { path: PathBuf, message: String },
    #[error("invalid OPA URL {url:?}: {message}")]
    Url { url: String, message: String },
    #[error("token file {0} is empty")]
    EmptyToken(PathBuf),
    #[error("loading policies from {}: {message}{}", dir.display(), relative_hint(dir))]
    Policies { dir: PathBuf, message: String },
    #[error("policy engine: {0}")]
    Engine(#[from] policy_client::engine::EngineError),
    #[error("{0}")]
    Limits(String),
    #[error("{0}")]
    Flag(String),
}

#[derive(Debug, Parser)]
#[command(
    name = "placement-webhook",
    version,
    about = "Kubernetes admission webhook that places workloads by Rego policy"
)]
pub struct Cli {
    /// Log format.
    #[arg(long, global = true, env = "PLACEMENT_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve AdmissionReviews over TLS.
    Serve(Box<ServeArgs>),
    /// Evaluate one AdmissionReview or manifest offline and print the answer.
    Review(ReviewArgs),
    /// Generate a CA and a serving certificate, and print the caBundle.
    Certs(CertsArgs),
}

/// Which engine to ask, and how.
#[derive(Args, Clone)]
pub(crate) struct EngineArgs {
    /// OPA base URL (e.g. http://127.0.0.1:8181). Without it the embedded engine
    /// evaluates --policy-dir.
    #[arg(long, env = "PLACEMENT_OPA_URL")]
    pub(crate) opa_url: Option<String>,
    /// File holding the bearer token for OPA.
    #[arg(long, env = "PLACEMENT_OPA_TOKEN_FILE")]
    pub(crate) opa_token_file: Option<PathBuf>,
    /// PEM CA to trust for an https OPA.
    #[arg(long, env = "PLACEMENT_OPA_CA_FILE")]
    pub(crate) opa_ca_file: Option<PathBuf>,
    /// Admission config file: {"EnforceSchedulingPolicy": {"url": ..., "token": ...}}.
    /// Flags take precedence over it.
    #[arg(long, env = "PLACEMENT_CONFIG")]
    pub(crate) config: Option<PathBuf>,
    /// Rego and data.json files for the embedded engine.
    #[arg(long, env = "PLACEMENT_POLICY_DIR", default_value = "policies")]
    pub(crate) policy_dir: PathBuf,
    /// Decision path below `data` [default: io/k8s/federation/admission].
    #[arg(long, env = "PLACEMENT_DECISION")]
    pub(crate) decision: Option<String>,
    /// Limit for one request to OPA.
    #[arg(long, env = "PLACEMENT_ENGINE_TIMEOUT", value_parser = humantime::parse_duration, default_value = "2s")]
    pub(crate) engine_timeout: Duration,
    /// Total time for the engine, retries included; keep it below the webhook
    /// configuration's timeoutSeconds.
    #[arg(long, env = "PLACEMENT_ENGINE_DEADLINE", value_parser = humantime::parse_duration, default_value = "8s")]
    pub(crate) engine_deadline: Duration,
    /// Memory for remembered decisions (0: none); with OPA only together
    /// with --engine-revisions-url. A review that agrees with an earlier one
    /// at every input path the policies read gets its answer; any policy or
    /// data change forgets them all. A policy set that reads the whole input
    /// or calls time, random, network or print builtins is never cached (said
    /// in the log and the decision_cache_enabled metric).
    #[arg(long, env = "PLACEMENT_DECISION_CACHE_MEMORY", value_parser = parse_bytes, default_value = "16Mi")]
    pub(crate) decision_cache_memory: usize,
}

/// Shows `--opa-url` without its credentials.
impl std::fmt::Debug for EngineArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineArgs")
            .field("opa_url", &self.opa_url.as_deref().map(shown_url))
            .field("opa_token_file", &self.opa_token_file)
            .field("opa_ca_file", &self.opa_ca_file)
            .field("config", &self.config)
            .field("policy_dir", &self.policy_dir)
            .field("decision", &self.decision)
            .field("engine_timeout", &self.engine_timeout)
            .field("engine_deadline", &self.engine_deadline)
            .field("decision_cache_memory", &self.decision_cache_memory)
            .finish()
    }
}

/// A URL as it may be printed: without credentials.
fn shown_url(url: &str) -> String {
    match Url::parse(url) {
        Ok(parsed) => policy_client::opa::redacted_url(&parsed),
        Err(_) => redact_userinfo(url),
    }
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub(crate) engine: EngineArgs,
    /// Address of the TLS admission server.
    #[arg(long, env = "PLACEMENT_LISTEN", default_value = "0.0.0.0:8443")]
    pub(crate) listen: SocketAddr,
    /// Address of the plain-HTTP metrics server.
    #[arg(long, env = "PLACEMENT_METRICS_LISTEN", default_value = "0.0.0.0:9090")]
    pub(crate) metrics_listen: SocketAddr,
    /// Serving certificate (PEM); reloaded when it changes. Without it a CA and
    /// a certificate for localhost are generated.
    #[arg(long, env = "PLACEMENT_TLS_CERT", requires = "tls_key")]
    pub(crate) tls_cert: Option<PathBuf>,
    /// Serving key (PEM).
    #[arg(long, env = "PLACEMENT_TLS_KEY", requires = "tls_cert")]
    pub(crate) tls_key: Option<PathBuf>,
    /// Where generated certificates go [default: a new temporary directory].
    #[arg(long, env = "PLACEMENT_CERT_DIR")]
    pub(crate) cert_dir: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) policies: PolicySelectionArgs,
    /// Kubeconfig for Events and the policy ConfigMap watch [default: in-cluster
    /// or $KUBECONFIG]; registered with Karmada's API server, Karmada's (the
    /// guardrail reads bindings' resource templates there).
    #[arg(long, env = "PLACEMENT_KUBECONFIG")]
    pub(crate) kubeconfig: Option<PathBuf>,
    /// Karmada bindings naming this scheduler (`spec.schedulerName`) are
    /// placement-sync's to schedule: the guardrail leaves them alone and
    /// narrows every other binding to the clusters the policy allows.
    #[arg(
        long,
        env = "PLACEMENT_KARMADA_SCHEDULER_NAME",
        default_value = "placement-policy"
    )]
    pub(crate) karmada_scheduler_name: String,
    /// Largest AdmissionReview accepted (bytes; `Ki`/`Mi`/`Gi` suffixes).
    #[arg(long, env = "PLACEMENT_MAX_REQUEST_BYTES", value_parser = parse_bytes, default_value = "6Mi")]
    pub(crate) max_request_bytes: usize,
    /// Memory all reviews in progress may hold: their bodies and what parsing
    /// and converting them builds. Reviews beyond it get a 503 at once; a
    /// quarter is kept for reviews under 1 MiB. [default: 256Mi; under a
    /// container memory limit L, (L - 64Mi) / 2 when that is less]
    #[arg(long, env = "PLACEMENT_MEMORY_BUDGET", value_parser = parse_bytes)]
    pub(crate) memory_budget: Option<usize>,
    /// Memory one review may need (body, parsed review, policy input); more
    /// gets a 413 naming the estimate. [default: 64Mi, or three quarters of
    /// the memory budget when that is less]
    #[arg(long, env = "PLACEMENT_MAX_REQUEST_MEMORY", value_parser = parse_bytes)]
    pub(crate) max_request_memory: Option<usize>,
    /// Embedded engine: an evaluation stops when the process's heap exceeds
    /// this (0: no limit). [default: 1Gi; under a container memory limit L,
    /// seven eighths of L when that is less]
    #[arg(long, env = "PLACEMENT_ENGINE_MEMORY_LIMIT", value_parser = parse_bytes)]
    pub(crate) engine_memory_limit: Option<usize>,
    /// Open connections on the admission port [default: 1024, lowered to fit
    /// the open-files limit, and under a container memory limit to what an
    /// eighth of it holds at 96 KiB each]. When all are taken, a new connection from a peer
    /// holding at least two fewer than the largest holder closes the oldest
    /// idle connection of that holder; otherwise it is closed at once.
    #[arg(long, env = "PLACEMENT_MAX_CONNECTIONS")]
    pub(crate) max_connections: Option<usize>,
    /// Open connections on the admission port from one peer (an address; an
    /// IPv6 prefix, --ipv6-peer-prefix) [default: a quarter of
    /// --max-connections]. Connections whose client certificate verified
    /// (--client-ca-file: the API server) count toward no peer's share.
    #[arg(long, env = "PLACEMENT_MAX_CONNECTIONS_PER_PEER", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub(crate) max_connections_per_peer: Option<usize>,
    /// IPv6 callers count as one peer per prefix of this many bits (for
    /// connection shares, the memory budget's and Events): 64 by default, as
    /// one host picks addresses in its /64 at will; 128 counts each address
    /// apart, for clusters whose pods share the API server's /64.
    #[arg(long, env = "PLACEMENT_IPV6_PEER_PREFIX", default_value_t = placement_endpoint::Peers::DEFAULT_IPV6_PREFIX, value_parser = clap::value_parser!(u8).range(1..=128))]
    pub(crate) ipv6_peer_prefix: u8,
    /// A connection this old is closed after its next response (HTTP/1 with
    /// `Connection: close`, HTTP/2 with GOAWAY), so that no client holds one
    /// for ever and clients spread over replicas.
    #[arg(long, env = "PLACEMENT_MAX_CONNECTION_AGE", value_parser = humantime::parse_duration, default_value = "10m")]
    pub(crate) max_connection_age: Duration,
    /// Concurrent HTTP/2 streams (reviews) per connection.
    #[arg(long, env = "PLACEMENT_MAX_HTTP2_STREAMS", default_value_t = 32)]
    pub(crate) max_http2_streams: u32,
    /// Time from accept to the end of the TLS handshake.
    #[arg(long, env = "PLACEMENT_TLS_HANDSHAKE_TIMEOUT", value_parser = humantime::parse_duration, default_value = "5s")]
    pub(crate) tls_handshake_timeout: Duration,
    /// Time to receive an HTTP/1 request's headers (from the connection's
    /// start or the previous response).
    #[arg(long, env = "PLACEMENT_HEADER_TIMEOUT", value_parser = humantime::parse_duration, default_value = "10s")]
    pub(crate) header_timeout: Duration,
    /// Time to receive a whole request body.
    #[arg(long, env = "PLACEMENT_BODY_TIMEOUT", value_parser = humantime::parse_duration, default_value = "10s")]
    pub(crate) body_timeout: Duration,
    /// A connection with no request in progress for this long is closed.
    /// Longer than the API server keeps an idle connection (90 s), so that it
    /// closes them first: a server closing a kept-alive HTTP/1 connection
    /// races the client's next request on it, which then fails with EOF.
    #[arg(long, env = "PLACEMENT_IDLE_TIMEOUT", value_parser = humantime::parse_duration, default_value = "120s")]
    pub(crate) idle_timeout: Duration,
    /// PEM CA whose client certificates may post reviews (the API server's,
    /// configured through its AdmissionConfiguration). Without one, any client
    /// that reaches the port may.
    #[arg(long, env = "PLACEMENT_CLIENT_CA_FILE")]
    pub(crate) client_ca_file: Option<PathBuf>,
    /// Events per second, over all objects.
    #[arg(long, env = "PLACEMENT_EVENT_RATE", default_value_t = 5.0)]
    pub(crate) event_rate: f64,
    /// Events allowed in a burst above --event-rate.
    #[arg(long, env = "PLACEMENT_EVENT_BURST", default_value_t = 20)]
    pub(crate) event_burst: u32,
    /// At most one Event per object and reason within this window.
    #[arg(long, env = "PLACEMENT_EVENT_DEDUPE_WINDOW", value_parser = humantime::parse_duration, default_value = "5m")]
    pub(crate) event_dedupe_window: Duration,
    /// Ready (taking traffic) only once this URL answers 2xx, when policies
    /// exist: the sync sidecar's `/readyz` beside OPA, so a new pod takes no
    /// reviews before its engine holds the policies. Once ready, ready for good.
    #[arg(long, env = "PLACEMENT_ENGINE_READY_URL")]
    pub(crate) engine_ready_url: Option<String>,
    /// With OPA: the revisions endpoint of the engine's only writer (the sync
    /// sidecar beside OPA: `http://127.0.0.1:8182/engine/revisions`). It
    /// announces every write before making it and waits for this webhook to
    /// stop answering from remembered decisions, so decisions are remembered
    /// (--decision-cache-memory) only with it, and only while it answers.
    #[arg(long, env = "PLACEMENT_ENGINE_REVISIONS_URL")]
    pub(crate) engine_revisions_url: Option<String>,
    /// Ready after this long even if --engine-ready-url never answers (the
    /// webhook then fails closed with its own message naming the engine).
    #[arg(long, env = "PLACEMENT_ENGINE_STARTUP_GRACE", default_value = "60s", value_parser = humantime::parse_duration)]
    pub(crate) engine_startup_grace: Duration,
    /// Secret (`NAMESPACE/NAME`) holding the keys that sign the ownership
    /// record, shared with the remediator; created when it holds none.
    #[arg(
        long,
        env = "PLACEMENT_OWNERSHIP_SECRET",
        conflicts_with = "ownership_key_file"
    )]
    pub(crate) ownership_secret: Option<SecretRef>,
    /// File holding those keys (one base64 key per line, the signing key
    /// first). Without this or --ownership-secret a key of this process only
    /// is used.
    #[arg(long, env = "PLACEMENT_OWNERSHIP_KEY_FILE")]
    pub(crate) ownership_key_file: Option<PathBuf>,
    /// On SIGTERM, keep serving this long before stopping (so that a pod
    /// leaving the Service's endpoints loses no request).
    #[arg(long, env = "PLACEMENT_SHUTDOWN_DELAY", default_value = "5s", value_parser = humantime::parse_duration)]
    pub(crate) shutdown_delay: Duration,
    #[command(flatten)]
    pub(crate) self_managed: SelfManagedTlsArgs,
}

#[derive(Debug, Args)]
pub struct ReviewArgs {
    #[command(flatten)]
    pub(crate) engine: EngineArgs,
    /// Output format.
    #[arg(long, short, value_enum, default_value_t = OutputFormat::Yaml)]
    pub(crate) output: OutputFormat,
    /// An AdmissionReview, or a manifest (YAML or JSON) to review as a CREATE;
    /// `-` reads standard input.
    pub(crate) file: PathBuf,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum OutputFormat {
    Yaml,
    Json,
}

#[derive(Debug, Args)]
pub struct CertsArgs {
    /// Directory for ca.crt, tls.crt and tls.key.
    #[arg(long)]
    pub(crate) out: PathBuf,
    /// DNS names and IP addresses of the serving certificate.
    #[arg(long = "name", default_values = ["localhost", "127.0.0.1"])]
    pub(crate) names: Vec<String>,
}

/// Which ConfigMaps are policies (fail closed iff one exists): the same flags,
/// with the same meaning, as placement-sync's (and kube-mgmt's), read from
/// the webhook's environment variables.
pub(crate) type PolicySelectionArgs = ConfigMapFlags<WebhookEnv>;

/// The webhook's environment variables of the ConfigMap selection flags.
#[derive(Debug, Clone)]
pub(crate) struct WebhookEnv;

impl ConfigMapFlagsEnv for WebhookEnv {
    const POLICY_NAMESPACE: &'static str = "PLACEMENT_POLICY_NAMESPACE";
    const NAMESPACES: &'static str = "PLACEMENT_NAMESPACES";
    const ENABLE_POLICIES: &'static str = "PLACEMENT_ENABLE_POLICIES";
    const POLICY_LABEL: &'static str = "PLACEMENT_POLICY_LABEL";
    const POLICY_VALUE: &'static str = "PLACEMENT_POLICY_VALUE";
    const DATA_LABEL: &'static str = "PLACEMENT_DATA_LABEL";
    const DATA_VALUE: &'static str = "PLACEMENT_DATA_VALUE";
}

/// The admission config file (`--config`):
/// `{"EnforceSchedulingPolicy": {"url": ..., "token": ...}}`.
#[derive(Debug, Deserialize)]
struct AdmissionConfigFile {
    #[serde(rename = "EnforceSchedulingPolicy")]
    enforce: EnforceSchedulingPolicy,
}

/// The file's one section: where the policy engine is and its token.
#[derive(Debug, Deserialize)]
struct EnforceSchedulingPolicy {
    url: Option<String>,
    token: Option<String>,
}

/// The engine to use, resolved from flags and the config file.
#[derive(Debug)]
pub(crate) struct ResolvedEngine {
    pub(crate) engine: Arc<dyn PolicyEngine>,
    pub(crate) decision_path: String,
    pub(crate) kind: EngineKind,
}

#[derive(Debug, Clone)]
pub(crate) enum EngineKind {
    Opa { url: String },
    Embedded { dir: PathBuf, modules: usize },
}

impl EngineArgs {
    pub(crate) fn resolve(&self) -> Result<ResolvedEngine, ConfigError> {
        let file = match &self.config {
            Some(path) => Some(read_admission_config_file(path)?),
            None => None,
        };
        let (file_url, file_token) = match file {
            Some(AdmissionConfigFile { enforce }) => (enforce.url, enforce.token),
            None => (None, None),
        };
        let url = self.opa_url.clone().or(file_url);
        let Some(url) = url else {
            let engine = Embedded::from_dir(&self.policy_dir)
                .map_err(|e| ConfigError::Policies {
                    dir: self.policy_dir.clone(),
                    message: e.to_string(),
                })?
                .with_decision_cache(self.decision_cache_memory);
            let modules = engine.module_count();
            return Ok(ResolvedEngine {
                engine: Arc::new(engine),
                decision_path: self
                    .decision
                    .clone()
                    .unwrap_or_else(|| DEFAULT_DECISION_PATH.to_owned()),
                kind: EngineKind::Embedded {
                    dir: self.policy_dir.clone(),
                    modules,
                },
            });
        };
        let (base, url_decision) = split_decision_url(&url)?;
        let token = match &self.opa_token_file {
            Some(path) => Some(read_token(path)?),
            None => file_token.map(Token::new),
        };
        let mut config = OpaConfig::new(base.clone());
        config.token = token;
        config.request_timeout = self.engine_timeout;
        if let Some(path) = &self.opa_ca_file {
            config.ca_pem = Some(std::fs::read(path).map_err(|source| ConfigError::Read {
                what: "OPA CA file",
                path: path.clone(),
                source,
            })?);
        }
        let opa = Opa::new(config)?;
        Ok(ResolvedEngine {
            engine: Arc::new(opa),
            decision_path: self
                .decision
                .clone()
                .or(url_decision)
                .unwrap_or_else(|| DEFAULT_DECISION_PATH.to_owned()),
            kind: EngineKind::Opa {
                url: policy_client::opa::redacted_url(&base),
            },
        })
    }
}

/// For a relative policy folder: where it was looked for, and what to do.
fn relative_hint(dir: &Path) -> String {
    if dir.is_absolute() {
        return String::new();
    }
    let cwd = std::env::current_dir()
        .map(|d| d.display().to_string())
        .unwrap_or_else(|_| "(unknown)".to_owned());
    format!(
        " (the path is relative to the working directory {cwd}; run from the folder that holds it, e.g. the repository root, or give --policy-dir with its path)"
    )
}

fn read_admission_config_file(path: &Path) -> Result<AdmissionConfigFile, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        what: "config file",
        path: path.to_owned(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| ConfigError::ConfigFile {
        path: path.to_owned(),
        message: e.to_string(),
    })
}

fn read_token(path: &Path) -> Result<Token, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        what: "token file",
        path: path.to_owned(),
        source,
    })?;
    if text.trim().is_empty() {
        return Err(ConfigError::EmptyToken(path.to_owned()));
    }
    Ok(Token::new(text))
}

/// The admission config file's `url` names the decision itself
/// (`https://opa:8181/v1/data/io/k8s/federation/annotations`); split it into the
/// base URL and the decision path.
pub(crate) fn split_decision_url(url: &str) -> Result<(Url, Option<String>), ConfigError> {
    let mut parsed = Url::parse(url).map_err(|e| ConfigError::Url {
        url: redact_userinfo(url),
        message: e.to_string(),
    })?;
    let path = parsed.path().to_owned();
    let Some(index) = path.find("/v1/data") else {
        return Ok((parsed, None));
    };
    let decision = path[index + "/v1/data".len()..]
        .trim_matches('/')
        .to_owned();
    parsed.set_path(&path[..index]);
    Ok((parsed, (!decision.is_empty()).then_some(decision)))
}

fn redact_userinfo(url: &str) -> String {
    match (url.find("://"), url.find('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://<redacted>@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `serve` run from another folder than the repository's: the message
    /// says the default `policies` is relative to the working directory, and
    /// names the flag that fixes it.
    #[test]
    fn a_missing_relative_policy_folder_says_where_it_was_looked_for() {
        let relative = ConfigError::Policies {
            dir: PathBuf::from("policies"),
            message: "cannot read policies: No such file or directory (os error 2)".to_owned(),
        }
        .to_string();
        let cwd = std::env::current_dir().unwrap();
        assert!(
            relative.contains(&format!(
                "relative to the working directory {}",
                cwd.display()
            )) && relative.contains("--policy-dir"),
            "{relative}"
        );
        let absolute = ConfigError::Policies {
            dir: PathBuf::from("/etc/placement/policies"),
            message: "cannot read /etc/placement/policies".to_owned(),
        }
        .to_string();
        assert!(!absolute.contains("relative"), "{absolute}");
    }

    #[test]
    fn a_decision_url_splits_into_base_and_decision() {
        let (base, decision) = split_decision_url(
            "https://opa.federation.svc.cluster.local:8181/v1/data/io/k8s/federation/annotations",
        )
        .unwrap();
        assert_eq!(
            base.as_str(),
            "https://opa.federation.svc.cluster.local:8181/"
        );
        assert_eq!(decision.as_deref(), Some("io/k8s/federation/annotations"));
        let (base, decision) = split_decision_url("http://127.0.0.1:8181").unwrap();
        assert_eq!(base.as_str(), "http://127.0.0.1:8181/");
        assert_eq!(decision, None);
        let err = split_decision_url("http://user:secret@[bad")
            .unwrap_err()
            .to_string();
        assert!(!err.contains("secret"), "{err}");
    }

    #[test]
    fn opa_url_credentials_are_never_shown() {
        let cli = Cli::parse_from([
            "placement-webhook",
            "review",
            "--opa-url",
            "http://opa-user:hunter2-secret@127.0.0.1:1/v1/data/io/k8s/federation/admission",
            "x.yaml",
        ]);
        let Command::Review(args) = cli.command else {
            panic!()
        };
        assert!(!format!("{args:?}").contains("hunter2"), "{args:?}");
        let resolved = args.engine.resolve().unwrap();
        assert!(!format!("{resolved:?}").contains("hunter2"), "{resolved:?}");
        let EngineKind::Opa { url } = &resolved.kind else {
            panic!()
        };
        assert_eq!(url, "http://redacted@127.0.0.1:1/");
    }

    #[test]
    fn the_admission_config_file_is_read_and_flags_win() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("admission.json");
        std::fs::write(
            &path,
            r#"{"EnforceSchedulingPolicy": {"url": "http://127.0.0.1:1/v1/data/io/k8s/federation/annotations", "token": "super-secret-token-value"}}"#,
        )
        .unwrap();
        let cli = Cli::parse_from([
            "placement-webhook",
            "review",
            "--config",
            path.to_str().unwrap(),
            "x.yaml",
        ]);
        let Command::Review(args) = cli.command else {
            panic!()
        };
        let resolved = args.engine.resolve().unwrap();
        assert_eq!(resolved.decision_path, "io/k8s/federation/annotations");
        assert!(matches!(resolved.kind, EngineKind::Opa { .. }));
        assert!(!format!("{resolved:?}").contains("super-secret"));

        let cli = Cli::parse_from([
            "placement-webhook",
            "review",
            "--config",
            path.to_str().unwrap(),
            "--decision",
            "x/y",
            "x.yaml",
        ]);
        let Command::Review(args) = cli.command else {
            panic!()
        };
        assert_eq!(args.engine.resolve().unwrap().decision_path, "x/y");

        std::fs::write(&path, r#"{"url": "x"}"#).unwrap();
        let cli = Cli::parse_from([
            "placement-webhook",
            "review",
            "--config",
            path.to_str().unwrap(),
            "x.yaml",
        ]);
        let Command::Review(args) = cli.command else {
            panic!()
        };
        let err = args.engine.resolve().unwrap_err().to_string();
        assert!(err.contains("EnforceSchedulingPolicy"), "{err}");
    }

    #[test]
    fn empty_token_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "\n").unwrap();
        let cli = Cli::parse_from([
            "placement-webhook",
            "review",
            "--opa-url",
            "http://127.0.0.1:1",
            "--opa-token-file",
            token.to_str().unwrap(),
            "x",
        ]);
        let Command::Review(args) = cli.command else {
            panic!()
        };
        assert!(matches!(
            args.engine.resolve(),
            Err(ConfigError::EmptyToken(_))
        ));
    }
}
