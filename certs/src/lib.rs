//! Certificates for the placement webhook: a CA and serving certificates (rcgen),
//! the `caBundle` for webhook configurations, rustls server configs from PEM
//! files, reloading those files when they change, and the renewal plan of
//! self-managed certificates ([`rotation`]).

pub mod rotation;

use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("generating certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("invalid subject alternative name {name:?}: {reason}")]
    InvalidName { name: String, reason: String },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} holds no PEM certificate")]
    NoCertificate { path: String },
    #[error("{path} holds no PEM private key (expected PKCS#8, PKCS#1 or SEC1)")]
    NoKey { path: String },
    #[error("invalid PEM in {path}: {reason}")]
    Pem { path: String, reason: String },
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
}

/// A certificate authority that issues serving certificates.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
}

impl fmt::Debug for Ca {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

/// A certificate and its private key, PEM encoded. `Debug` hides the key.
#[derive(Clone)]
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

impl fmt::Debug for Issued {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Issued")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

impl Ca {
    /// A new self-signed CA valid for ten years.
    pub fn generate(common_name: &str) -> Result<Self, CertError> {
        let not_before = rcgen::date_time_ymd(2025, 1, 1);
        Self::generate_between(
            common_name,
            not_before,
            not_before + Duration::from_secs(10 * 365 * 24 * 3600),
        )
    }

    /// A new self-signed CA valid for `lifetime` from `now` (backdated a few
    /// minutes for clock skew).
    pub fn generate_at(
        common_name: &str,
        now: SystemTime,
        lifetime: Duration,
    ) -> Result<Self, CertError> {
        let now = date_time(now);
        Self::generate_between(common_name, now - CLOCK_SKEW, now + lifetime)
    }

    fn generate_between(
        common_name: &str,
        not_before: time::OffsetDateTime,
        not_after: time::OffsetDateTime,
    ) -> Result<Self, CertError> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, common_name);
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.not_before = not_before;
        params.not_after = not_after;
        let key = KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        Ok(Ca {
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        })
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA's private key (PEM), for keeping it in a Secret.
    pub fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    /// Issue a serving certificate for `names`: DNS names or IP addresses.
    pub fn issue_serving(&self, names: &[String]) -> Result<Issued, CertError> {
        let not_before = rcgen::date_time_ymd(2025, 1, 1);
        self.issue_serving_between(
            names,
            not_before,
            not_before + Duration::from_secs(5 * 365 * 24 * 3600),
        )
    }

    /// Issue a serving certificate valid for `lifetime` from `now`, but never
    /// beyond the CA's own end.
    pub fn issue_serving_at(
        &self,
        names: &[String],
        now: SystemTime,
        lifetime: Duration,
    ) -> Result<Issued, CertError> {
        let mut end = now + lifetime;
        if let Some(ca_end) = rotation::not_after(&self.cert_pem) {
            end = end.min(ca_end);
        }
        let now = date_time(now);
        self.issue_serving_between(names, now - CLOCK_SKEW, date_time(end))
    }

    fn issue_serving_between(
        &self,
        names: &[String],
        not_before: time::OffsetDateTime,
        not_after: time::OffsetDateTime,
    ) -> Result<Issued, CertError> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        let mut dn = DistinguishedName::new();
        dn.push(
            DnType::CommonName,
            names
                .first()
                .map(String::as_str)
                .unwrap_or("placement-webhook"),
        );
        params.distinguished_name = dn;
        params.subject_alt_names = names
            .iter()
            .map(|name| san(name))
            .collect::<Result<_, _>>()?;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.not_before = not_before;
        params.not_after = not_after;
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// How far new certificates are backdated, for clocks a little behind ours.
const CLOCK_SKEW: Duration = Duration::from_secs(300);

/// `SystemTime` as rcgen's date type.
fn date_time(at: SystemTime) -> time::OffsetDateTime {
    time::OffsetDateTime::from(at)
}

fn san(name: &str) -> Result<SanType, CertError> {
    if let Ok(ip) = name.parse::<IpAddr>() {
        return Ok(SanType::IpAddress(ip));
    }
    let dns = name
        .try_into()
        .map_err(|e: rcgen::Error| CertError::InvalidName {
            name: name.to_owned(),
            reason: e.to_string(),
        })?;
    Ok(SanType::DnsName(dns))
}

/// Paths of a written certificate set.
#[derive(Debug, Clone)]
pub struct CertPaths {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Generate a CA and a serving certificate for `names`, and write `ca.crt`,
/// `tls.crt` and `tls.key` (mode 0600) into `dir`.
pub fn generate_to_dir(dir: &Path, names: &[String]) -> Result<CertPaths, CertError> {
    let ca = Ca::generate("placement-webhook-ca")?;
    let serving = ca.issue_serving(names)?;
    std::fs::create_dir_all(dir).map_err(|source| CertError::Write {
        path: dir.to_owned(),
        source,
    })?;
    let paths = CertPaths {
        ca: dir.join("ca.crt"),
        cert: dir.join("tls.crt"),
        key: dir.join("tls.key"),
    };
    write_file(&paths.ca, ca.cert_pem().as_bytes(), 0o644)?;
    write_file(&paths.cert, serving.cert_pem.as_bytes(), 0o644)?;
    write_file(&paths.key, serving.key_pem.as_bytes(), 0o600)?;
    Ok(paths)
}

fn write_file(path: &Path, contents: &[u8], mode: u32) -> Result<(), CertError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let err = |source| CertError::Write {
        path: path.to_owned(),
        source,
    };
    // Write beside the target and rename, so a reader never sees half a file.
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .map_err(err)?;
    file.write_all(contents).map_err(err)?;
    file.sync_all().map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

/// The `caBundle` value of a webhook configuration: base64 of the CA's PEM.
pub fn ca_bundle(ca_pem: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(ca_pem.as_bytes())
}

/// A rustls server config (ring provider; HTTP/2 and HTTP/1.1) from PEM text.
pub fn server_config(
    cert_pem: &[u8],
    key_pem: &[u8],
    origin: &str,
) -> Result<ServerConfig, CertError> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CertError::Pem {
            path: origin.to_owned(),
            reason: e.to_string(),
        })?;
    if chain.is_empty() {
        return Err(CertError::NoCertificate {
            path: origin.to_owned(),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| match e {
        rustls_pki_types::pem::Error::NoItemsFound => CertError::NoKey {
            path: origin.to_owned(),
        },
        other => CertError::Pem {
            path: origin.to_owned(),
            reason: other.to_string(),
        },
    })?;
    let mut config =
        ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// Read a certificate and key pair from files and build a server config.
pub fn load_server_config(cert: &Path, key: &Path) -> Result<ServerConfig, CertError> {
    let (cert_pem, key_pem) = read_pair(cert, key)?;
    server_config(&cert_pem, &key_pem, &cert.display().to_string())
}

fn read_pair(cert: &Path, key: &Path) -> Result<(Vec<u8>, Vec<u8>), CertError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| CertError::Read {
            path: path.to_owned(),
            source,
        })
    };
    Ok((read(cert)?, read(key)?))
}

/// Watch a certificate/key pair and call `on_change` with a new server config
/// whenever their contents change. The files are polled, which also catches the
/// symlink swaps of mounted Secrets. A pair that does not load (for example
/// half-updated) is logged and retried on the next tick; the old config stays.
pub fn spawn_reloader(
    cert: PathBuf,
    key: PathBuf,
    interval: Duration,
    on_change: impl Fn(Arc<ServerConfig>) + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut last = read_pair(&cert, &key).ok();
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let current = match read_pair(&cert, &key) {
                Ok(pair) => pair,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read serving certificate; keeping the current one");
                    continue;
                }
            };
            if last.as_ref() == Some(&current) {
                continue;
            }
            match server_config(&current.0, &current.1, &cert.display().to_string()) {
                Ok(config) => {
                    tracing::info!(cert = %cert.display(), "serving certificate changed; reloaded");
                    on_change(Arc::new(config));
                    last = Some(current);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "new serving certificate does not load; keeping the current one");
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issues_a_serving_certificate_that_loads() {
        let ca = Ca::generate("test-ca").unwrap();
        let issued = ca
            .issue_serving(&[
                "localhost".into(),
                "127.0.0.1".into(),
                "webhook.ns.svc".into(),
            ])
            .unwrap();
        assert!(issued.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(!format!("{issued:?}").contains("PRIVATE KEY"));
        let config = server_config(
            issued.cert_pem.as_bytes(),
            issued.key_pem.as_bytes(),
            "test",
        )
        .unwrap();
        assert_eq!(config.alpn_protocols[1], b"http/1.1");
    }

    #[test]
    fn writes_files_with_private_key_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let paths = generate_to_dir(dir.path(), &["localhost".into()]).unwrap();
        let mode = std::fs::metadata(&paths.key).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        load_server_config(&paths.cert, &paths.key).unwrap();
        let ca = std::fs::read_to_string(&paths.ca).unwrap();
        assert!(ca_bundle(&ca).starts_with("LS0tLS1CRUdJTi")); // base64 of "-----BEGIN"
    }

    #[test]
    fn bad_pem_is_a_named_error() {
        let err = server_config(b"not pem", b"", "x.crt").unwrap_err();
        assert!(matches!(err, CertError::NoCertificate { .. }), "{err:?}");
        let ca = Ca::generate("ca").unwrap();
        let issued = ca.issue_serving(&["localhost".into()]).unwrap();
        let err = server_config(issued.cert_pem.as_bytes(), b"", "x.crt").unwrap_err();
        assert!(matches!(err, CertError::NoKey { .. }), "{err:?}");
    }

    #[tokio::test]
    async fn reloads_when_files_change() {
        let dir = tempfile::tempdir().unwrap();
        let paths = generate_to_dir(dir.path(), &["localhost".into()]).unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let handle = spawn_reloader(
            paths.cert.clone(),
            paths.key.clone(),
            Duration::from_millis(20),
            move |c| {
                let _ = tx.send(c);
            },
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(rx.try_recv().is_err(), "no reload without a change");
        generate_to_dir(dir.path(), &["localhost".into()]).unwrap();
        let reloaded = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
        assert!(matches!(reloaded, Ok(Some(_))));
        handle.abort();
    }
}
