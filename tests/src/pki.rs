//! Client certificates for the test bed (rcgen), beside the serving
//! certificates of `placement-certs`.

use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

/// A CA and one client certificate it signed for `common_name`, as PEM files
/// in `dir`: `{name}-ca.crt`, `{name}.crt`, `{name}.key`.
pub fn client_pki(dir: &Path, name: &str, common_name: &str) {
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, format!("{name} client CA"));
    ca.distinguished_name = dn;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = KeyPair::generate().expect("CA key");
    let ca_cert = ca.self_signed(&ca_key).expect("CA certificate");
    let issuer = Issuer::new(ca, ca_key);
    let mut client = CertificateParams::new(Vec::<String>::new()).expect("client parameters");
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    client.distinguished_name = dn;
    client.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let client_key = KeyPair::generate().expect("client key");
    let client_cert = client
        .signed_by(&client_key, &issuer)
        .expect("client certificate");
    let write = |file: String, pem: String| {
        let path = dir.join(file);
        std::fs::write(&path, pem).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    };
    write(format!("{name}-ca.crt"), ca_cert.pem());
    write(format!("{name}.crt"), client_cert.pem());
    write(format!("{name}.key"), client_key.serialize_pem());
}
