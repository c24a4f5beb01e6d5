//! Self-managed webhook certificates: a CA and a serving certificate kept in one
//! Secret, renewed before they expire.
//!
//! A new serving certificate is only used once the API server trusts its CA, or
//! admission would fail in between: a renewed CA first joins the CA bundle (the
//! old CA stays in it until it expires) while the old serving certificate keeps
//! serving; the caller writes that bundle into the webhook configurations and
//! only then ([`plan`] with `ca_trusted`) is a serving certificate signed by the
//! new CA issued.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{Issuer, KeyPair};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use crate::{Ca, CertError};

/// Secret keys of the material.
const CA_CERT: &str = "ca.crt";
const CA_KEY: &str = "ca.key";
const TLS_CERT: &str = "tls.crt";
const TLS_KEY: &str = "tls.key";
const BUNDLE: &str = "ca-bundle.crt";

/// The certificates of a self-managed webhook, as kept in its Secret (PEM).
/// `Debug` hides the keys.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Material {
    pub ca_cert: String,
    pub ca_key: String,
    pub tls_cert: String,
    pub tls_key: String,
    /// Every CA the API server is to trust: the current one and, during a
    /// rotation, the previous one.
    pub bundle: String,
}

impl fmt::Debug for Material {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Material")
            .field("ca_cert", &self.ca_cert)
            .field("tls_cert", &self.tls_cert)
            .field("bundle", &self.bundle)
            .field("keys", &"<redacted>")
            .finish()
    }
}

impl Material {
    /// From a Secret's data; missing or non-UTF-8 keys read as empty.
    pub fn from_secret_data(data: &BTreeMap<String, Vec<u8>>) -> Material {
        let get = |key: &str| {
            data.get(key)
                .and_then(|v| String::from_utf8(v.clone()).ok())
                .unwrap_or_default()
        };
        Material {
            ca_cert: get(CA_CERT),
            ca_key: get(CA_KEY),
            tls_cert: get(TLS_CERT),
            tls_key: get(TLS_KEY),
            bundle: get(BUNDLE),
        }
    }

    /// As a Secret's data.
    pub fn to_secret_data(&self) -> BTreeMap<String, Vec<u8>> {
        [
            (CA_CERT, &self.ca_cert),
            (CA_KEY, &self.ca_key),
            (TLS_CERT, &self.tls_cert),
            (TLS_KEY, &self.tls_key),
            (BUNDLE, &self.bundle),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.clone().into_bytes()))
        .collect()
    }

    /// The `caBundle` of the webhook configurations (base64 of the bundle).
    pub fn ca_bundle(&self) -> String {
        crate::ca_bundle(&self.bundle)
    }
}

/// How long new certificates are valid. Each is renewed when a third of its
/// lifetime is left.
#[derive(Debug, Clone, Copy)]
pub struct Lifetimes {
    pub ca: Duration,
    pub serving: Duration,
}

/// Why the material changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// Nothing usable was there.
    Created,
    /// The CA was due; the bundle trusts the old and the new one.
    CaRenewed,
    /// The serving certificate was due, or did not match the CA or the names.
    ServingRenewed,
    /// The bundle lacked the current CA or held expired ones.
    BundleRepaired,
}

impl fmt::Display for Renewal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Renewal::Created => "created a CA and a serving certificate",
            Renewal::CaRenewed => "renewed the CA (the bundle trusts the old and the new one)",
            Renewal::ServingRenewed => "renewed the serving certificate",
            Renewal::BundleRepaired => "repaired the CA bundle",
        })
    }
}

/// What to do with the current material.
#[derive(Debug)]
pub enum Plan {
    Keep,
    Write {
        material: Material,
        renewal: Renewal,
    },
}

/// Decide what the material needs at `now`. `ca_trusted`: every webhook
/// configuration already trusts the current CA (its bundle is injected), so a
/// serving certificate signed by it may be used.
pub fn plan(
    current: &Material,
    names: &[String],
    lifetimes: Lifetimes,
    ca_trusted: bool,
    now: SystemTime,
) -> Result<Plan, CertError> {
    let ca = current_ca(current, lifetimes, now);
    let serving_works = serving_valid(current, names, now, Duration::ZERO);
    let Some(ca) = ca else {
        let new_ca = Ca::generate_at("placement-webhook-ca", now, lifetimes.ca)?;
        let mut bundle = vec![new_ca.cert_pem().to_owned()];
        let old_ca_alive =
            !current.ca_cert.is_empty() && not_after(&current.ca_cert).is_some_and(|end| end > now);
        if old_ca_alive {
            bundle.push(current.ca_cert.clone());
        }
        let mut material = Material {
            ca_cert: new_ca.cert_pem().to_owned(),
            ca_key: new_ca.key_pem(),
            tls_cert: current.tls_cert.clone(),
            tls_key: current.tls_key.clone(),
            bundle: bundle.join(""),
        };
        // With a serving certificate that still works, keep it until the API
        // server trusts the new CA; without one there is nothing to lose.
        let renewal = if serving_works {
            Renewal::CaRenewed
        } else {
            let serving = new_ca.issue_serving_at(names, now, lifetimes.serving)?;
            material.tls_cert = serving.cert_pem;
            material.tls_key = serving.key_pem;
            if old_ca_alive {
                Renewal::CaRenewed
            } else {
                Renewal::Created
            }
        };
        return Ok(Plan::Write { material, renewal });
    };

    let bundle = repaired_bundle(current, now);
    let margin = lifetimes.serving / 3;
    let serving_current = serving_valid(
        &Material {
            bundle: current.ca_cert.clone(),
            ..current.clone()
        },
        names,
        now,
        margin,
    );
    if !serving_current && (ca_trusted || !serving_works) {
        let serving = ca.issue_serving_at(names, now, lifetimes.serving)?;
        return Ok(Plan::Write {
            material: Material {
                tls_cert: serving.cert_pem,
                tls_key: serving.key_pem,
                bundle,
                ..current.clone()
            },
            renewal: Renewal::ServingRenewed,
        });
    }
    if bundle != current.bundle {
        return Ok(Plan::Write {
            material: Material {
                bundle,
                ..current.clone()
            },
            renewal: Renewal::BundleRepaired,
        });
    }
    Ok(Plan::Keep)
}

/// When to look at the material again: when the first renewal falls due (at
/// most `cap` from now, at least a second).
pub fn next_check(
    current: &Material,
    lifetimes: Lifetimes,
    now: SystemTime,
    cap: Duration,
) -> Duration {
    let due = |pem: &str, lifetime: Duration| {
        not_after(pem)
            .and_then(|end| (end - lifetime / 3).duration_since(now).ok())
            .unwrap_or(Duration::ZERO)
    };
    due(&current.ca_cert, lifetimes.ca)
        .min(due(&current.tls_cert, lifetimes.serving))
        .min(cap)
        .max(Duration::from_secs(1))
}

/// Whether the certificates of `bundle_pem` include `ca_pem`'s.
pub fn bundle_trusts(bundle_pem: &str, ca_pem: &str) -> bool {
    let Some(Ok(ca)) = CertificateDer::pem_slice_iter(ca_pem.as_bytes()).next() else {
        return false;
    };
    CertificateDer::pem_slice_iter(bundle_pem.as_bytes())
        .filter_map(Result::ok)
        .any(|cert| cert == ca)
}

/// The current CA, if it loads and is not yet due for renewal.
fn current_ca(current: &Material, lifetimes: Lifetimes, now: SystemTime) -> Option<Ca> {
    let end = not_after(&current.ca_cert)?;
    if end < now + lifetimes.ca / 3 {
        return None;
    }
    let key = KeyPair::from_pem(&current.ca_key).ok()?;
    let issuer = Issuer::from_ca_cert_pem(&current.ca_cert, key).ok()?;
    Some(Ca {
        issuer,
        cert_pem: current.ca_cert.clone(),
    })
}

/// The bundle with the current CA first and no expired CA.
fn repaired_bundle(current: &Material, now: SystemTime) -> String {
    let mut bundle = current.ca_cert.clone();
    for pem in pem_certificates(&current.bundle) {
        let alive = not_after(&pem).is_some_and(|end| end > now);
        if alive && !bundle_trusts(&bundle, &pem) {
            bundle.push_str(&pem);
        }
    }
    if bundle_order_equal(&bundle, &current.bundle) {
        current.bundle.clone()
    } else {
        bundle
    }
}

fn bundle_order_equal(a: &str, b: &str) -> bool {
    let ders = |pem: &str| -> Vec<CertificateDer<'static>> {
        CertificateDer::pem_slice_iter(pem.as_bytes())
            .filter_map(Result::ok)
            .collect()
    };
    ders(a) == ders(b)
}

/// Each certificate of a PEM bundle, as its own PEM text.
fn pem_certificates(bundle: &str) -> Vec<String> {
    const END: &str = "-----END CERTIFICATE-----";
    bundle
        .split_inclusive(END)
        .filter(|part| part.contains("-----BEGIN CERTIFICATE-----"))
        .map(|part| format!("{}\n", part.trim_start()))
        .collect()
}

/// Whether the serving certificate verifies against the bundle for every name,
/// at `now + margin` (so one due for renewal within `margin` does not).
fn serving_valid(current: &Material, names: &[String], now: SystemTime, margin: Duration) -> bool {
    if current.tls_cert.is_empty()
        || current.tls_key.is_empty()
        || crate::server_config(
            current.tls_cert.as_bytes(),
            current.tls_key.as_bytes(),
            TLS_CERT,
        )
        .is_err()
    {
        return false;
    }
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(current.bundle.as_bytes()).filter_map(Result::ok) {
        let _ = roots.add(cert);
    }
    if roots.is_empty() {
        return false;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let Ok(verifier) =
        WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider).build()
    else {
        return false;
    };
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(current.tls_cert.as_bytes())
            .filter_map(Result::ok)
            .collect();
    let Some((end_entity, intermediates)) = chain.split_first() else {
        return false;
    };
    let at = UnixTime::since_unix_epoch(
        (now + margin)
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO),
    );
    names.iter().all(|name| {
        ServerName::try_from(name.clone()).is_ok_and(|server_name| {
            verifier
                .verify_server_cert(end_entity, intermediates, &server_name, &[], at)
                .is_ok()
        })
    })
}

/// The end of a certificate's validity.
pub(crate) fn not_after(pem: &str) -> Option<SystemTime> {
    let der = CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()?
        .ok()?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).ok()?;
    let seconds = cert.validity().not_after.timestamp();
    Some(UNIX_EPOCH + Duration::from_secs(u64::try_from(seconds).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAME: &str = "placement-webhook.placement-system.svc";
    const DAY: Duration = Duration::from_secs(24 * 3600);

    fn names() -> Vec<String> {
        vec![NAME.to_owned()]
    }

    fn lifetimes() -> Lifetimes {
        Lifetimes {
            ca: 300 * DAY,
            serving: 90 * DAY,
        }
    }

    fn written(plan: Plan) -> (Material, Renewal) {
        match plan {
            Plan::Write { material, renewal } => (material, renewal),
            Plan::Keep => panic!("expected a write"),
        }
    }

    fn start() -> (Material, SystemTime) {
        let now = SystemTime::now();
        let (material, renewal) =
            written(plan(&Material::default(), &names(), lifetimes(), false, now).unwrap());
        assert_eq!(renewal, Renewal::Created);
        (material, now)
    }

    #[test]
    fn empty_secret_gets_a_ca_and_a_working_serving_certificate() {
        let (material, now) = start();
        assert!(serving_valid(&material, &names(), now, Duration::ZERO));
        assert!(bundle_trusts(&material.bundle, &material.ca_cert));
        assert!(!format!("{material:?}").contains("PRIVATE KEY"));
        // Stable afterwards, whatever the API server trusts.
        assert!(matches!(
            plan(&material, &names(), lifetimes(), false, now).unwrap(),
            Plan::Keep
        ));
        let round_trip = Material::from_secret_data(&material.to_secret_data());
        assert_eq!(round_trip, material);
    }

    #[test]
    fn serving_certificate_is_renewed_a_third_before_expiry() {
        let (material, now) = start();
        let early = now + 50 * DAY;
        assert!(matches!(
            plan(&material, &names(), lifetimes(), true, early).unwrap(),
            Plan::Keep
        ));
        let due = now + 61 * DAY;
        let (renewed, renewal) =
            written(plan(&material, &names(), lifetimes(), true, due).unwrap());
        assert_eq!(renewal, Renewal::ServingRenewed);
        assert_eq!(renewed.ca_cert, material.ca_cert, "same CA");
        assert_ne!(renewed.tls_cert, material.tls_cert);
        assert!(serving_valid(&renewed, &names(), due, 60 * DAY));
    }

    #[test]
    fn a_renewed_ca_is_trusted_before_it_signs_the_serving_certificate() {
        let (material, now) = start();
        let due = now + 201 * DAY;
        // Phase 1: new CA in the bundle beside the old; the old serving
        // certificate (renewed meanwhile, still valid) keeps serving.
        // (Serving renewed at day 61 and day 130, valid until day 220.)
        let (material, _) =
            written(plan(&material, &names(), lifetimes(), true, now + 61 * DAY).unwrap());
        let (material, _) =
            written(plan(&material, &names(), lifetimes(), true, now + 130 * DAY).unwrap());
        let (rotated, renewal) =
            written(plan(&material, &names(), lifetimes(), true, due).unwrap());
        assert_eq!(renewal, Renewal::CaRenewed);
        assert_ne!(rotated.ca_cert, material.ca_cert);
        assert_eq!(rotated.tls_cert, material.tls_cert, "old serving cert kept");
        assert!(bundle_trusts(&rotated.bundle, &rotated.ca_cert));
        assert!(bundle_trusts(&rotated.bundle, &material.ca_cert));
        // Not yet trusted by the API server: no new serving certificate.
        assert!(matches!(
            plan(&rotated, &names(), lifetimes(), false, due).unwrap(),
            Plan::Keep
        ));
        // Phase 2: once trusted, a serving certificate from the new CA.
        let (phase2, renewal) = written(plan(&rotated, &names(), lifetimes(), true, due).unwrap());
        assert_eq!(renewal, Renewal::ServingRenewed);
        let only_new = Material {
            bundle: phase2.ca_cert.clone(),
            ..phase2.clone()
        };
        assert!(serving_valid(&only_new, &names(), due, Duration::ZERO));
        // The old CA leaves the bundle once it has expired.
        let later = now + 301 * DAY;
        let repaired = match plan(&phase2, &names(), lifetimes(), true, later).unwrap() {
            Plan::Write { material, .. } => material,
            Plan::Keep => panic!("the expired CA must leave the bundle"),
        };
        assert!(!bundle_trusts(&repaired.bundle, &material.ca_cert));
    }

    #[test]
    fn a_serving_certificate_for_other_names_or_another_ca_is_replaced() {
        let (material, now) = start();
        let other = vec!["other.placement-system.svc".to_owned()];
        let (renamed, renewal) = written(plan(&material, &other, lifetimes(), true, now).unwrap());
        assert_eq!(renewal, Renewal::ServingRenewed);
        assert!(serving_valid(&renamed, &other, now, Duration::ZERO));
        // Someone put a certificate of a different CA in the Secret.
        let (foreign, _) = {
            let (m, _) =
                written(plan(&Material::default(), &names(), lifetimes(), false, now).unwrap());
            (m, ())
        };
        let mixed = Material {
            tls_cert: foreign.tls_cert,
            tls_key: foreign.tls_key,
            ..material.clone()
        };
        let (fixed, renewal) = written(plan(&mixed, &names(), lifetimes(), true, now).unwrap());
        assert_eq!(renewal, Renewal::ServingRenewed);
        assert!(serving_valid(
            &Material {
                bundle: fixed.ca_cert.clone(),
                ..fixed
            },
            &names(),
            now,
            Duration::ZERO
        ));
    }

    #[test]
    fn next_check_is_the_first_renewal_point() {
        let (material, now) = start();
        let wait = next_check(&material, lifetimes(), now, 365 * DAY);
        // Serving: 90 days, renewed at 60 (give or take the backdating).
        assert!(wait > 59 * DAY && wait <= 60 * DAY, "{wait:?}");
        assert_eq!(
            next_check(&material, lifetimes(), now, Duration::from_secs(30)),
            Duration::from_secs(30)
        );
    }
}
