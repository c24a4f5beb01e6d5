//! Self-managed certificates, as Kyverno and Gatekeeper's cert-controller do
//! them: the webhook keeps its CA and serving certificate in a Secret, creates
//! and renews them there (every replica may; the API server's optimistic
//! concurrency lets one write win), writes the CA bundle into its own webhook
//! configurations, and serves whatever the Secret holds. The renewal rules are
//! [`placement_certs::rotation`]'s.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client};
use placement_certs::rotation::{self, Lifetimes, Material, Plan};
use serde_json::json;

use placement_endpoint::TlsSettings;

use crate::config::{ConfigurationRef, SecretRef, SelfManagedTlsArgs};

/// Errors of self-managed certificates; each names the object and what to do.
#[derive(Debug, thiserror::Error)]
pub enum SelfManagedError {
    #[error("--tls-secret needs access to the Kubernetes API (in a cluster, or --kubeconfig)")]
    NoApi,
    #[error("--tls-secret needs at least one --tls-dns-name (the webhook Service's DNS name)")]
    NoNames,
    #[error("cannot read Secret {secret}: {source}")]
    ReadSecret {
        secret: SecretRef,
        source: kube::Error,
    },
    #[error("cannot write Secret {secret}: {source}")]
    WriteSecret {
        secret: SecretRef,
        source: kube::Error,
    },
    #[error("cannot read {configuration}: {source}")]
    ReadConfiguration {
        configuration: ConfigurationRef,
        source: kube::Error,
    },
    #[error("cannot write the CA bundle into {configuration}: {source}")]
    WriteConfiguration {
        configuration: ConfigurationRef,
        source: kube::Error,
    },
    #[error(
        "--register-configuration {path}: {reason} (expected one MutatingWebhookConfiguration or ValidatingWebhookConfiguration with a name)"
    )]
    Manifest {
        path: std::path::PathBuf,
        reason: String,
    },
    #[error("cannot register {configuration}: {source}")]
    Register {
        configuration: ConfigurationRef,
        source: kube::Error,
    },
    #[error(transparent)]
    Certificate(#[from] placement_certs::CertError),
}

/// A configuration the webhook registers itself.
struct Registration {
    configuration: ConfigurationRef,
    manifest: serde_json::Value,
}

/// Read a `--register-configuration` manifest.
fn registration(path: &std::path::Path) -> Result<Registration, SelfManagedError> {
    let invalid = |reason: String| SelfManagedError::Manifest {
        path: path.to_owned(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| invalid(e.to_string()))?;
    let manifest: serde_json::Value =
        yaml_serde::from_str(&text).map_err(|e| invalid(e.to_string()))?;
    let name = manifest
        .pointer("/metadata/name")
        .and_then(serde_json::Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| invalid("it has no metadata.name".to_owned()))?
        .to_owned();
    let configuration = match manifest.get("kind").and_then(serde_json::Value::as_str) {
        Some("MutatingWebhookConfiguration") => ConfigurationRef::Mutating(name),
        Some("ValidatingWebhookConfiguration") => ConfigurationRef::Validating(name),
        other => return Err(invalid(format!("its kind is {other:?}"))),
    };
    Ok(Registration {
        configuration,
        manifest,
    })
}

/// How often the Secret and the configurations are checked at most apart, and
/// how long a CA must have been in every configuration before a serving
/// certificate signed by it is used (API servers see configuration changes
/// through a watch, a moment later).
const MAX_CHECK_INTERVAL: Duration = Duration::from_secs(60);
const TRUST_SETTLE: Duration = Duration::from_secs(5);
const RETRY: Duration = Duration::from_secs(5);

struct Controller {
    secrets: Api<Secret>,
    secret: SecretRef,
    client: Client,
    names: Vec<String>,
    inject: Vec<ConfigurationRef>,
    /// Configurations created here (their CA bundle is in `inject` too).
    registrations: Vec<Registration>,
    /// Whether this process applied them once (upgrades change them).
    registered: bool,
    lifetimes: Lifetimes,
    /// Since when every configuration has trusted this CA (PEM).
    trusted: Option<(String, Instant)>,
    /// The serving pair in use.
    serving: Option<(String, String)>,
    verifier: ClientVerifier,
}

/// Verifies client certificates (`--client-ca-file`), when set.
type ClientVerifier = Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>;

/// Start self-managed certificates: returns the TLS settings to serve once the
/// Secret holds a working certificate (creating one when it holds none), and
/// keeps them, the Secret and the configurations current in the background.
pub(crate) async fn start(
    args: &SelfManagedTlsArgs,
    secret: SecretRef,
    client: Option<Client>,
    verifier: ClientVerifier,
) -> Result<TlsSettings, SelfManagedError> {
    let client = client.ok_or(SelfManagedError::NoApi)?;
    if args.tls_dns_names.is_empty() {
        return Err(SelfManagedError::NoNames);
    }
    let registrations = args
        .register_configurations
        .iter()
        .map(|path| registration(path))
        .collect::<Result<Vec<_>, _>>()?;
    let mut inject = args.inject_ca_into.clone();
    inject.extend(registrations.iter().map(|r| r.configuration.clone()));
    let mut controller = Controller {
        secrets: Api::namespaced(client.clone(), &secret.namespace),
        secret,
        client,
        names: args.tls_dns_names.clone(),
        inject,
        registrations,
        registered: false,
        lifetimes: Lifetimes {
            ca: args.ca_validity,
            serving: args.cert_validity,
        },
        trusted: None,
        serving: None,
        verifier,
    };
    // Serving needs a certificate: retry until one is there, saying why not.
    // (A replica that lost the race to fill an empty Secret reads the
    // winner's next round.)
    let (material, server_config) = loop {
        match controller.reconcile().await {
            Ok((material, next)) => match controller.server_config(&material) {
                Ok(config) => break (material, config),
                Err(e) => {
                    tracing::info!(error = %e, "no usable certificate in the Secret yet");
                    tokio::time::sleep(next.min(RETRY)).await;
                }
            },
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?RETRY, "self-managed certificates are not ready");
                tokio::time::sleep(RETRY).await;
            }
        }
    };
    let config = TlsSettings::new(Arc::new(server_config));
    controller.serving = Some((material.tls_cert.clone(), material.tls_key.clone()));
    tracing::info!(secret = %controller.secret, names = ?controller.names, "serving the self-managed certificate");
    tokio::spawn(controller.run(config.clone()));
    Ok(config)
}

impl Controller {
    /// The server config of the Secret's serving pair.
    fn server_config(&self, material: &Material) -> Result<rustls::ServerConfig, SelfManagedError> {
        let base = placement_certs::server_config(
            material.tls_cert.as_bytes(),
            material.tls_key.as_bytes(),
            "the self-managed Secret",
        )?;
        Ok(match &self.verifier {
            Some(verifier) => crate::tls::with_client_verifier(&base, verifier)
                .map_err(placement_certs::CertError::from)?,
            None => base,
        })
    }

    /// Keep everything current: on every change of the Secret (another replica
    /// renewed it), when the next renewal falls due, and at least every minute.
    async fn run(mut self, config: TlsSettings) {
        let watch = watcher(
            self.secrets.clone(),
            watcher::Config::default().fields(&format!("metadata.name={}", self.secret.name)),
        );
        let mut watch = std::pin::pin!(watch);
        let mut wait = Duration::ZERO;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                event = watch.next() => {
                    if let Some(Err(e)) = event {
                        tracing::debug!(error = %e, "watch of the certificate Secret interrupted");
                        tokio::time::sleep(RETRY).await;
                    }
                }
            }
            wait = match self.reconcile().await {
                Ok((material, next)) => {
                    self.serve(&material, &config);
                    next
                }
                Err(e) => {
                    tracing::warn!(error = %e, "self-managed certificates: will retry");
                    RETRY
                }
            };
        }
    }

    /// Swap the serving certificate when the Secret's changed.
    fn serve(&mut self, material: &Material, config: &TlsSettings) {
        let pair = (material.tls_cert.clone(), material.tls_key.clone());
        if self.serving.as_ref() == Some(&pair) {
            return;
        }
        match self.server_config(material) {
            Ok(new) => {
                config.replace(Arc::new(new));
                self.serving = Some(pair);
                tracing::info!(secret = %self.secret, "serving a renewed certificate");
            }
            Err(e) => {
                tracing::warn!(error = %e, "the Secret's serving certificate does not load; keeping the current one")
            }
        }
    }

    /// One round: renew what is due (one writer wins), inject the bundle.
    /// Returns the material in force and when to look again.
    async fn reconcile(&mut self) -> Result<(Material, Duration), SelfManagedError> {
        let mut secret = self.read_secret().await?;
        let mut material = secret
            .as_ref()
            .map(|s| {
                let data: BTreeMap<String, Vec<u8>> = s
                    .data
                    .iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), v.0.clone()))
                    .collect();
                Material::from_secret_data(&data)
            })
            .unwrap_or_default();
        let ca_trusted = self.ca_trusted(&material).await?;
        if let Plan::Write {
            material: renewed,
            renewal,
        } = rotation::plan(
            &material,
            &self.names,
            self.lifetimes,
            ca_trusted,
            SystemTime::now(),
        )? {
            match self.write_secret(secret.take(), &renewed).await {
                Ok(()) => {
                    tracing::info!(secret = %self.secret, "{renewal}");
                    material = renewed;
                }
                // Another replica wrote first: take theirs next round.
                Err(SelfManagedError::WriteSecret {
                    source: kube::Error::Api(status),
                    ..
                }) if status.code == 409 => {
                    return Ok((material, Duration::from_secs(1)));
                }
                Err(e) => return Err(e),
            }
        }
        self.register(&material).await?;
        self.inject(&material).await?;
        let next = rotation::next_check(
            &material,
            self.lifetimes,
            SystemTime::now(),
            MAX_CHECK_INTERVAL,
        );
        // While a new CA settles, look again soon.
        let next = if self.trusted.is_some() && !ca_trusted {
            next.min(TRUST_SETTLE)
        } else {
            next
        };
        Ok((material, next))
    }

    async fn read_secret(&self) -> Result<Option<Secret>, SelfManagedError> {
        self.secrets
            .get_opt(&self.secret.name)
            .await
            .map_err(|source| SelfManagedError::ReadSecret {
                secret: self.secret.clone(),
                source,
            })
    }

    /// Replace the Secret's data, guarded by the resourceVersion read (or
    /// create it when there was none).
    async fn write_secret(
        &self,
        existing: Option<Secret>,
        material: &Material,
    ) -> Result<(), SelfManagedError> {
        let data = material
            .to_secret_data()
            .into_iter()
            .map(|(k, v)| (k, ByteString(v)))
            .collect();
        let result = match existing {
            Some(mut secret) => {
                secret.data = Some(data);
                secret.string_data = None;
                self.secrets
                    .replace(&self.secret.name, &PostParams::default(), &secret)
                    .await
            }
            None => {
                let secret = Secret {
                    metadata: kube::api::ObjectMeta {
                        name: Some(self.secret.name.clone()),
                        namespace: Some(self.secret.namespace.clone()),
                        ..Default::default()
                    },
                    type_: Some("Opaque".to_owned()),
                    data: Some(data),
                    ..Default::default()
                };
                self.secrets.create(&PostParams::default(), &secret).await
            }
        };
        result
            .map(|_| ())
            .map_err(|source| SelfManagedError::WriteSecret {
                secret: self.secret.clone(),
                source,
            })
    }

    /// Create the configurations to register (with `material`'s CA bundle):
    /// once per process (an upgrade may change them), then whenever one is
    /// missing.
    async fn register(&mut self, material: &Material) -> Result<(), SelfManagedError> {
        if material.ca_cert.is_empty() {
            return Ok(());
        }
        for registration in &self.registrations {
            let configuration = &registration.configuration;
            if self.registered && !self.webhooks(configuration).await?.is_empty() {
                continue;
            }
            let mut manifest = registration.manifest.clone();
            for webhook in manifest
                .get_mut("webhooks")
                .and_then(serde_json::Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                webhook["clientConfig"]["caBundle"] = json!(material.ca_bundle());
            }
            let params = PatchParams::apply("placement-webhook").force();
            let patch = Patch::Apply(&manifest);
            let result = match configuration {
                ConfigurationRef::Mutating(name) => {
                    Api::<MutatingWebhookConfiguration>::all(self.client.clone())
                        .patch(name, &params, &patch)
                        .await
                        .map(|_| ())
                }
                ConfigurationRef::Validating(name) => {
                    Api::<ValidatingWebhookConfiguration>::all(self.client.clone())
                        .patch(name, &params, &patch)
                        .await
                        .map(|_| ())
                }
            };
            result.map_err(|source| SelfManagedError::Register {
                configuration: configuration.clone(),
                source,
            })?;
            tracing::info!(%configuration, "registered the webhook configuration");
        }
        self.registered = true;
        Ok(())
    }

    /// Whether every configuration has trusted the current CA for a while.
    async fn ca_trusted(&mut self, material: &Material) -> Result<bool, SelfManagedError> {
        if material.ca_cert.is_empty() {
            return Ok(false);
        }
        for configuration in &self.inject {
            let webhooks = self.webhooks(configuration).await?;
            let all = !webhooks.is_empty()
                && webhooks
                    .iter()
                    .all(|(_, bundle)| rotation::bundle_trusts(bundle, &material.ca_cert));
            if !all {
                self.trusted = None;
                return Ok(false);
            }
        }
        let since = match &self.trusted {
            Some((ca, since)) if *ca == material.ca_cert => *since,
            _ => {
                let now = Instant::now();
                self.trusted = Some((material.ca_cert.clone(), now));
                now
            }
        };
        // With nothing to inject into, nobody else needs to learn the CA.
        Ok(self.inject.is_empty() || since.elapsed() >= TRUST_SETTLE)
    }

    /// Each webhook of a configuration: its name and `caBundle` (PEM).
    async fn webhooks(
        &self,
        configuration: &ConfigurationRef,
    ) -> Result<Vec<(String, String)>, SelfManagedError> {
        let pem = |bundle: Option<ByteString>| {
            String::from_utf8_lossy(&bundle.map(|b| b.0).unwrap_or_default()).into_owned()
        };
        let webhooks = match configuration {
            ConfigurationRef::Mutating(name) => {
                Api::<MutatingWebhookConfiguration>::all(self.client.clone())
                    .get(name)
                    .await
                    .map(|c| {
                        c.webhooks
                            .unwrap_or_default()
                            .into_iter()
                            .map(|w| (w.name, pem(w.client_config.ca_bundle)))
                            .collect()
                    })
            }
            ConfigurationRef::Validating(name) => {
                Api::<ValidatingWebhookConfiguration>::all(self.client.clone())
                    .get(name)
                    .await
                    .map(|c| {
                        c.webhooks
                            .unwrap_or_default()
                            .into_iter()
                            .map(|w| (w.name, pem(w.client_config.ca_bundle)))
                            .collect()
                    })
            }
        };
        match webhooks {
            // Not registered yet: it trusts nothing.
            Err(kube::Error::Api(status))
                if status.code == 404
                    && self
                        .registrations
                        .iter()
                        .any(|r| r.configuration == *configuration) =>
            {
                Ok(Vec::new())
            }
            other => other.map_err(|source| SelfManagedError::ReadConfiguration {
                configuration: configuration.clone(),
                source,
            }),
        }
    }

    /// Write the bundle into every webhook of every configuration that lacks it.
    async fn inject(&self, material: &Material) -> Result<(), SelfManagedError> {
        for configuration in &self.inject {
            let webhooks = self.webhooks(configuration).await?;
            if webhooks
                .iter()
                .all(|(_, bundle)| *bundle == material.bundle)
            {
                continue;
            }
            // A strategic merge patch keyed by webhook name touches only caBundle.
            let entries: Vec<_> = webhooks
                .iter()
                .map(|(name, _)| {
                    json!({"name": name, "clientConfig": {"caBundle": material.ca_bundle()}})
                })
                .collect();
            let patch = Patch::Strategic(json!({"webhooks": entries}));
            let params = PatchParams::default();
            let result = match configuration {
                ConfigurationRef::Mutating(name) => {
                    Api::<MutatingWebhookConfiguration>::all(self.client.clone())
                        .patch(name, &params, &patch)
                        .await
                        .map(|_| ())
                }
                ConfigurationRef::Validating(name) => {
                    Api::<ValidatingWebhookConfiguration>::all(self.client.clone())
                        .patch(name, &params, &patch)
                        .await
                        .map(|_| ())
                }
            };
            result.map_err(|source| SelfManagedError::WriteConfiguration {
                configuration: configuration.clone(),
                source,
            })?;
            tracing::info!(%configuration, "wrote the CA bundle");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registered_configuration_is_read_from_its_manifest() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let ok = write(
            "ok.yaml",
            "apiVersion: admissionregistration.k8s.io/v1\nkind: MutatingWebhookConfiguration\nmetadata:\n  name: karmada-guardrail\nwebhooks: []\n",
        );
        let read = registration(&ok).unwrap();
        assert_eq!(
            read.configuration,
            ConfigurationRef::Mutating("karmada-guardrail".to_owned())
        );
        for (file, text, reason) in [
            (
                "noname.yaml",
                "kind: MutatingWebhookConfiguration\nmetadata: {}\n",
                "no metadata.name",
            ),
            (
                "kind.yaml",
                "kind: ConfigMap\nmetadata: {name: x}\n",
                "ConfigMap",
            ),
            ("bad.yaml", ": : :\n", ""),
        ] {
            let error = registration(&write(file, text))
                .err()
                .expect(file)
                .to_string();
            assert!(error.contains(reason) && error.contains(file), "{error}");
        }
        let missing = registration(&dir.path().join("absent.yaml")).err().unwrap();
        assert!(missing.to_string().contains("absent.yaml"), "{missing}");
    }
}
