//! The admission server's TLS: serving certificates that follow their files,
//! and client certificates verified against `--client-ca-file`. A leaf: the
//! server, the self-managed certificates and `run` use it; it uses none of
//! them.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use placement_endpoint::TlsSettings;
use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

/// The client CA file cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("client CA file {path}: {reason}")]
pub struct ClientCaError {
    path: PathBuf,
    reason: String,
}

/// Client certificates signed by the CA in `path` are verified; clients
/// without one still complete the handshake (the kubelet's HTTPS probes carry
/// none) and are refused by the review endpoints.
pub(crate) fn client_verifier(
    path: &Path,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, ClientCaError> {
    let error = |reason: String| ClientCaError {
        path: path.to_owned(),
        reason,
    };
    let pem = std::fs::read(path).map_err(|e| error(e.to_string()))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| error(e.to_string()))?;
        roots.add(cert).map_err(|e| error(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(error("holds no PEM certificate".to_owned()));
    }
    WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .allow_unauthenticated()
    .build()
    .map_err(|e| error(e.to_string()))
}

/// `base` (a server certificate, no client authentication) verifying client
/// certificates with `verifier`.
pub(crate) fn with_client_verifier(
    base: &ServerConfig,
    verifier: &Arc<dyn rustls::server::danger::ClientCertVerifier>,
) -> Result<ServerConfig, rustls::Error> {
    let mut config =
        ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(Arc::clone(verifier))
            .with_cert_resolver(Arc::clone(&base.cert_resolver));
    config.alpn_protocols = base.alpn_protocols.clone();
    Ok(config)
}

/// TLS settings that follow certificate file changes, verifying client
/// certificates with `verifier` when given.
pub(crate) fn reloading_tls(
    cert: PathBuf,
    key: PathBuf,
    verifier: Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>,
) -> Result<TlsSettings, placement_certs::CertError> {
    let finish = move |base: ServerConfig| match &verifier {
        Some(verifier) => with_client_verifier(&base, verifier),
        None => Ok(base),
    };
    let initial = finish(placement_certs::load_server_config(&cert, &key)?)?;
    let settings = TlsSettings::new(Arc::new(initial));
    let target = settings.clone();
    placement_certs::spawn_reloader(cert, key, Duration::from_secs(2), move |new| {
        match finish((*new).clone()) {
            Ok(config) => target.replace(Arc::new(config)),
            Err(e) => {
                tracing::warn!(error = %e, "reloaded certificate does not load; keeping the current one")
            }
        }
    });
    Ok(settings)
}
