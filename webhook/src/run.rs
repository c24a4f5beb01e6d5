//! The subcommands `serve` and `certs` (`review` is [`crate::offline_review`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kube::{Api, Client, Config};
use placement_endpoint::{ConnectionLimits, Peers, TlsSettings, connection_cap};
use policy_client::configmaps::ConfigMapSelection;
use policy_client::ownership_keys::{KeyError, LoadingKeys, OwnershipKeys, SharedKeys};
use policy_client::ownership_secret::KeySecret;
use policy_client::revision_feed::RememberingEngine;
use reqwest::Url;

use crate::admission::{Admission, AdmissionSettings, Guardrail};
use crate::config::{CertsArgs, ConfigError, EngineKind, ResolvedEngine, ServeArgs};
use crate::events::{EventLimits, EventSink};
use crate::metrics::Metrics;
use crate::presence::PolicyPresence;
use crate::readiness::Readiness;
use crate::server::{
    Listeners, METRICS_MAX_CONNECTIONS, RequestLimits, ServeSettings, ServerError,
    serve as serve_http,
};
use crate::sizing::{MemorySizing, Requested, container_memory_limit};
use crate::tls::{ClientCaError, client_verifier, reloading_tls};

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Certs(#[from] placement_certs::CertError),
    #[error(transparent)]
    Server(#[from] ServerError),
    #[error(transparent)]
    ClientCa(#[from] ClientCaError),
    #[error("Kubernetes client configuration: {0}")]
    Kube(String),
    #[error("cannot read {path}: {source}")]
    Input {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: document {index} is not valid YAML or JSON: {message}")]
    Manifest {
        path: PathBuf,
        index: usize,
        message: String,
    },
    #[error("{path}: document {index}: {message}")]
    Review {
        path: PathBuf,
        index: usize,
        message: String,
    },
    #[error("cannot create directory for generated certificates: {0}")]
    CertDir(std::io::Error),
    #[error("ownership record keys: {0}")]
    Ownership(String),
    #[error("self-managed certificates: {0}")]
    SelfManaged(#[from] crate::self_managed::SelfManagedError),
}

/// Build a Kubernetes client. `explicit` wins; otherwise the usual inference
/// (in-cluster, then `$KUBECONFIG` / `~/.kube/config`) when `infer` is set.
async fn kube_client(explicit: Option<&Path>, infer: bool) -> Result<Option<Client>, RunError> {
    use policy_client::kube_client::{KubeClientError, config};
    let config = match explicit {
        None if !infer => match Config::incluster() {
            Ok(config) => config,
            Err(_) => return Ok(None),
        },
        explicit => match config(explicit).await {
            Ok(config) => config,
            Err(KubeClientError::Infer(e)) => {
                tracing::info!(error = %e, "no Kubernetes API configuration found");
                return Ok(None);
            }
            Err(e) => return Err(RunError::Kube(e.to_string())),
        },
    };
    Client::try_from(config)
        .map(Some)
        .map_err(|e| RunError::Kube(e.to_string()))
}

/// The limits of `serve`, checked against each other.
fn serve_settings(args: &ServeArgs, memory: &MemorySizing) -> Result<ServeSettings, ConfigError> {
    let derived = match memory.container_limit {
        Some(limit) => {
            format!(" (derived from the container's memory limit, {limit} bytes, where not given)")
        }
        None => String::new(),
    };
    // A quarter of the budget is kept for small reviews (`budget.rs`).
    let largest = memory.memory_budget / 4 * 3;
    if memory.max_request_memory > largest {
        return Err(ConfigError::Limits(format!(
            "--max-request-memory ({}) must be at most three quarters of --memory-budget ({}), or no review that large could ever be admitted{derived}",
            memory.max_request_memory, memory.memory_budget
        )));
    }
    if args.max_request_bytes > memory.max_request_memory {
        return Err(ConfigError::Limits(format!(
            "--max-request-bytes ({}) must be at most --max-request-memory ({}){derived}",
            args.max_request_bytes, memory.max_request_memory
        )));
    }
    let mut max_connections = connection_cap(args.max_connections, METRICS_MAX_CONNECTIONS);
    if args.max_connections.is_none()
        && let Some(fits) = memory.max_connections
        && fits < max_connections
    {
        tracing::info!(
            max_connections = fits,
            container_memory_limit = memory.container_limit,
            "connection cap lowered to fit the container's memory limit"
        );
        max_connections = fits;
    }
    let admission = ConnectionLimits {
        max_connections,
        max_per_peer: args
            .max_connections_per_peer
            .unwrap_or_else(|| ConnectionLimits::default_per_peer(max_connections)),
        max_streams: args.max_http2_streams.max(1),
        handshake_timeout: args.tls_handshake_timeout,
        header_timeout: args.header_timeout,
        idle_timeout: args.idle_timeout,
        max_age: args.max_connection_age,
    };
    let metrics = ConnectionLimits {
        max_connections: METRICS_MAX_CONNECTIONS,
        max_per_peer: ConnectionLimits::default_per_peer(METRICS_MAX_CONNECTIONS),
        ..admission.clone()
    };
    Ok(ServeSettings {
        requests: RequestLimits {
            max_body: args.max_request_bytes,
            body_timeout: args.body_timeout,
            memory_budget: memory.memory_budget,
            max_request_memory: memory.max_request_memory,
            require_client_certificate: args.client_ca_file.is_some(),
        },
        admission,
        metrics,
        peers: Peers::new(args.ipv6_peer_prefix).map_err(ConfigError::Limits)?,
        shutdown_delay: args.shutdown_delay,
        readiness: Arc::new(
            Readiness::new(args.engine_ready_url.clone(), args.engine_startup_grace).map_err(
                |e| ConfigError::Limits(format!("HTTP client for --engine-ready-url: {e}")),
            )?,
        ),
    })
}

/// The keys of the ownership record: from the Secret (created when missing,
/// read in the background: the webhook listens meanwhile, failing closed iff
/// policies exist) or the file; else a key of this process only.
fn ownership_keys(args: &ServeArgs, client: Option<&Client>) -> Result<LoadingKeys, RunError> {
    if let Some(secret) = &args.ownership_secret {
        let client = client.ok_or_else(|| {
            RunError::Ownership("--ownership-secret needs access to the Kubernetes API".to_owned())
        })?;
        let secret = KeySecret {
            api: Api::namespaced(client.clone(), &secret.namespace),
            namespace: secret.namespace.clone(),
            name: secret.name.clone(),
            create: true,
        };
        let loading = LoadingKeys::default();
        let filled = loading.clone();
        tokio::spawn(async move { filled.set(secret.keys().await) });
        return Ok(loading);
    }
    if let Some(path) = &args.ownership_key_file {
        let text = std::fs::read_to_string(path).map_err(|source| RunError::Input {
            path: path.clone(),
            source,
        })?;
        return OwnershipKeys::from_text(&text)
            .map(|keys| LoadingKeys::loaded(SharedKeys::new(keys)))
            .map_err(|e| RunError::Ownership(format!("{}: {e}", path.display())));
    }
    tracing::warn!(
        "no --ownership-secret or --ownership-key-file: ownership records are signed with a key of this process only, which no other replica or remediator can verify"
    );
    Ok(LoadingKeys::loaded(SharedKeys::new(
        OwnershipKeys::ephemeral().map_err(ownership_error)?,
    )))
}

pub(crate) fn ownership_error(e: KeyError) -> RunError {
    RunError::Ownership(e.to_string())
}

/// `placement-webhook serve`.
pub async fn serve(args: ServeArgs) -> Result<(), RunError> {
    let memory = MemorySizing::new(
        container_memory_limit(),
        Requested {
            memory_budget: args.memory_budget,
            max_request_memory: args.max_request_memory,
            engine_memory_limit: args.engine_memory_limit,
        },
    );
    let settings = serve_settings(&args, &memory)?;
    let policy_configmaps = args.policies.selection(true).map_err(ConfigError::Flag)?;
    let mut resolved = args.engine.resolve()?;
    if matches!(resolved.kind, EngineKind::Embedded { .. }) {
        let limit = u64::try_from(memory.engine_memory_limit).unwrap_or(u64::MAX);
        policy_client::embedded::set_memory_limit((limit > 0).then_some(limit));
    }
    remember_opa_decisions(&args, &mut resolved)?;
    let mut metrics = Metrics::new();
    metrics.watch_decision_cache(Arc::clone(&resolved.engine));
    let metrics = Arc::new(metrics);
    // The embedded engine needs the API only for Events, so it uses a kubeconfig
    // only when given one (or in a cluster); with OPA the usual inference applies.
    let infer = matches!(resolved.kind, EngineKind::Opa { .. });
    let client = kube_client(args.kubeconfig.as_deref(), infer).await?;
    let presence = policy_presence(&resolved.kind, client.as_ref(), policy_configmaps);
    let events = event_sink(&args, client.as_ref(), &metrics);
    let ownership_keys = ownership_keys(&args, client.as_ref())?;
    let admission = Admission::new(
        resolved.engine,
        AdmissionSettings {
            decision_path: resolved.decision_path.clone(),
            engine_deadline: args.engine.engine_deadline,
            ownership_keys,
        },
        presence,
        events,
        metrics,
        Guardrail::new(client.clone(), args.karmada_scheduler_name.clone()),
    );
    let (tls, ca_note) = admission_tls(&args, &client).await?;
    let listeners = Listeners::bind(args.listen, args.metrics_listen)?;
    announce(
        &listeners,
        &resolved.kind,
        &resolved.decision_path,
        ca_note,
        &settings,
        &memory,
    );
    // Endpoints of a terminating pod take a moment to leave every
    // kube-proxy: the server keeps answering for the shutdown delay, so no
    // write in flight to us fails (then stops accepting and finishes what is
    // running).
    serve_http(
        admission,
        tls,
        listeners,
        settings,
        placement_endpoint::shutdown_signal(),
    )
    .await?;
    Ok(())
}

/// Whether there are policies to answer with: fixed for the embedded engine,
/// the policy ConfigMaps watched for OPA (assumed there without the API).
fn policy_presence(
    kind: &EngineKind,
    client: Option<&Client>,
    policy_configmaps: ConfigMapSelection,
) -> PolicyPresence {
    match (kind, client) {
        (EngineKind::Embedded { dir, modules }, _) => PolicyPresence::fixed(
            *modules > 0,
            format!("{modules} Rego module(s) in {}", dir.display()),
        ),
        (EngineKind::Opa { .. }, Some(client)) => {
            PolicyPresence::watch_config_maps(client.clone(), policy_configmaps)
        }
        (EngineKind::Opa { .. }, None) => {
            tracing::warn!(
                "no Kubernetes API access: cannot see policy ConfigMaps, so policies are assumed to exist (fail closed)"
            );
            PolicyPresence::fixed(
                true,
                "no Kubernetes API access; policies assumed to exist".to_owned(),
            )
        }
    }
}

/// Where the webhook's Events go (nowhere without the API).
fn event_sink(args: &ServeArgs, client: Option<&Client>, metrics: &Arc<Metrics>) -> EventSink {
    match client {
        Some(client) => EventSink::new(
            client.clone(),
            Arc::clone(metrics),
            EventLimits {
                rate: args.event_rate,
                burst: args.event_burst,
                dedupe_window: args.event_dedupe_window,
                // Unverified callers are refused before their review is
                // read; no path of a review of theirs writes an Event either.
                verified_only: args.client_ca_file.is_some(),
            },
        ),
        None => EventSink::disabled(),
    }
}

/// The admission server's TLS: from a self-managed Secret, from the given
/// files, or from a CA and a certificate generated for localhost (then the
/// CA bundle's path comes with it).
async fn admission_tls(
    args: &ServeArgs,
    client: &Option<Client>,
) -> Result<(TlsSettings, Option<PathBuf>), RunError> {
    let verifier = match &args.client_ca_file {
        Some(path) => Some(client_verifier(path)?),
        None => None,
    };
    Ok(
        match (&args.tls_cert, &args.tls_key, &args.self_managed.tls_secret) {
            (_, _, Some(secret)) => (
                crate::self_managed::start(
                    &args.self_managed,
                    secret.clone(),
                    client.clone(),
                    verifier.clone(),
                )
                .await?,
                None,
            ),
            (Some(cert), Some(key), None) => (
                reloading_tls(cert.clone(), key.clone(), verifier.clone())?,
                None,
            ),
            _ => {
                let dir = match &args.cert_dir {
                    Some(dir) => dir.clone(),
                    None => tempfile_dir()?,
                };
                let names = [
                    "localhost".to_owned(),
                    "127.0.0.1".to_owned(),
                    "::1".to_owned(),
                ];
                let paths = placement_certs::generate_to_dir(&dir, &names)?;
                let tls = reloading_tls(paths.cert.clone(), paths.key.clone(), verifier)?;
                (tls, Some(paths.ca))
            }
        },
    )
}

/// Say where the webhook serves, with what, and within which limits.
fn announce(
    listeners: &Listeners,
    kind: &EngineKind,
    decision_path: &str,
    ca_note: Option<PathBuf>,
    settings: &ServeSettings,
    memory: &MemorySizing,
) {
    let engine_note = match kind {
        EngineKind::Opa { url } => format!("OPA at {url}"),
        EngineKind::Embedded { dir, modules } => {
            format!("embedded, {modules} module(s) from {}", dir.display())
        }
    };
    println!(
        "placement-webhook: admission on https://{}, metrics on http://{}/metrics (engine: {engine_note}; decision: data.{})",
        listeners.admission_addr(),
        listeners.metrics_addr(),
        decision_path.replace('/', "."),
    );
    if let Some(ca) = ca_note {
        println!(
            "placement-webhook: generated a CA and a certificate for localhost; CA bundle: {}",
            ca.display()
        );
    }
    tracing::info!(
        admission = %listeners.admission_addr(),
        metrics = %listeners.metrics_addr(),
        max_connections = settings.admission.max_connections,
        max_connections_per_peer = settings.admission.max_per_peer,
        ipv6_peer_prefix = settings.peers.ipv6_prefix(),
        memory_budget = settings.requests.memory_budget,
        max_request_memory = settings.requests.max_request_memory,
        engine_memory_limit = memory.engine_memory_limit,
        container_memory_limit = memory.container_limit,
        client_certificates = settings.requests.require_client_certificate,
        "serving"
    );
}

fn tempfile_dir() -> Result<PathBuf, RunError> {
    let dir = std::env::temp_dir().join(format!("placement-webhook-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(RunError::CertDir)?;
    Ok(dir)
}

/// With OPA and its writer's revisions endpoint: decisions remembered while
/// the endpoint is followed (a task for the life of the process).
fn remember_opa_decisions(args: &ServeArgs, resolved: &mut ResolvedEngine) -> Result<(), RunError> {
    let Some(url) = &args.engine_revisions_url else {
        return Ok(());
    };
    if !matches!(resolved.kind, EngineKind::Opa { .. }) {
        return Err(ConfigError::Flag(
            "--engine-revisions-url is for OPA (--opa-url); the embedded engine knows its own revisions"
                .to_owned(),
        )
        .into());
    }
    let board = Url::parse(url).map_err(|e| {
        ConfigError::Flag(format!("--engine-revisions-url {url:?} is not a URL: {e}"))
    })?;
    let remembering = Arc::new(
        RememberingEngine::new(
            Arc::clone(&resolved.engine),
            args.engine.decision_cache_memory,
            board,
        )
        .map_err(ConfigError::Engine)?,
    );
    let following = Arc::clone(&remembering);
    tokio::spawn(async move { following.follow().await });
    resolved.engine = remembering;
    Ok(())
}

/// `placement-webhook certs`.
pub fn certs(args: CertsArgs) -> Result<(), RunError> {
    let paths = placement_certs::generate_to_dir(&args.out, &args.names)?;
    let ca = std::fs::read_to_string(&paths.ca).map_err(|source| RunError::Input {
        path: paths.ca.clone(),
        source,
    })?;
    eprintln!(
        "wrote {}, {} and {}; the caBundle for the webhook configuration follows",
        paths.ca.display(),
        paths.cert.display(),
        paths.key.display()
    );
    println!("{}", placement_certs::ca_bundle(&ca));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serve_args(flags: &[&str]) -> ServeArgs {
        let cli = <crate::config::Cli as clap::Parser>::parse_from(
            ["placement-webhook", "serve"].iter().chain(flags),
        );
        let crate::config::Command::Serve(args) = cli.command else {
            panic!("serve")
        };
        *args
    }

    #[tokio::test]
    async fn the_revisions_url_is_for_opa_and_turns_remembering_on() {
        let policies = concat!(env!("CARGO_MANIFEST_DIR"), "/../policies");
        let embedded = serve_args(&[
            "--policy-dir",
            policies,
            "--engine-revisions-url",
            "http://127.0.0.1:1/engine/revisions",
        ]);
        let mut resolved = embedded.engine.resolve().unwrap();
        let err = remember_opa_decisions(&embedded, &mut resolved)
            .unwrap_err()
            .to_string();
        assert!(err.contains("--engine-revisions-url is for OPA"), "{err}");

        let bad = serve_args(&[
            "--opa-url",
            "http://127.0.0.1:1",
            "--engine-revisions-url",
            "::",
        ]);
        let mut resolved = bad.engine.resolve().unwrap();
        let err = remember_opa_decisions(&bad, &mut resolved)
            .unwrap_err()
            .to_string();
        assert!(err.contains("is not a URL"), "{err}");
        let https = serve_args(&[
            "--opa-url",
            "http://127.0.0.1:1",
            "--engine-revisions-url",
            "https://127.0.0.1:1/engine/revisions",
        ]);
        let mut resolved = https.engine.resolve().unwrap();
        let err = remember_opa_decisions(&https, &mut resolved)
            .unwrap_err()
            .to_string();
        assert!(err.contains("plain HTTP on the pod's loopback"), "{err}");

        // OPA alone has no decision cache; with its writer's revisions it has
        // one, off until the first revision comes.
        let opa = serve_args(&["--opa-url", "http://127.0.0.1:1"]);
        let mut resolved = opa.engine.resolve().unwrap();
        remember_opa_decisions(&opa, &mut resolved).unwrap();
        assert!(resolved.engine.decision_cache().is_none());
        let followed = serve_args(&[
            "--opa-url",
            "http://127.0.0.1:1",
            "--engine-revisions-url",
            "http://127.0.0.1:1/engine/revisions",
        ]);
        let mut resolved = followed.engine.resolve().unwrap();
        remember_opa_decisions(&followed, &mut resolved).unwrap();
        let stats = resolved.engine.decision_cache().expect("a decision cache");
        assert!(stats.refused.is_some(), "{stats:?}");
    }
}
