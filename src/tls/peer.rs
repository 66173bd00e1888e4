//! Who a TLS client is: what its handshake negotiated and the name on the certificate
//! it presented, for `auth_type = cert`.

use x509_cert::der::oid::db::rfc4519::CN;
use x509_cert::der::{Decode, Encode};
use x509_cert::ext::pkix::name::DirectoryString;
use x509_cert::Certificate;

use super::TlsInfo;

/// What a client's TLS session established; all empty for a plaintext client.
#[derive(Debug, Default)]
pub struct TlsPeer {
    pub info: TlsInfo,
    /// The common name of the client's certificate. A certificate is only asked for,
    /// and so only present, when `client_tls_ca_file` is set, and it then verified.
    pub common_name: Option<String>,
}

impl TlsPeer {
    /// The peer of an established server-side session.
    pub fn of(c: &rustls::ServerConnection) -> TlsPeer {
        let cert = c.peer_certificates().and_then(|certs| certs.first());
        TlsPeer {
            info: TlsInfo::of(c),
            common_name: cert.and_then(|der| common_name(der)),
        }
    }
}

/// The first common name in the subject of the DER certificate `der`, as PostgreSQL
/// takes it; None if there is none, it holds a NUL, or the certificate does not parse.
pub fn common_name(der: &[u8]) -> Option<String> {
    let cert = Certificate::from_der(der).ok()?;
    let value = &(cert.tbs_certificate.subject.0.iter())
        .flat_map(|rdn| rdn.0.iter())
        .find(|atv| atv.oid == CN)?
        .value;
    // A CHOICE of string types, decoded from its own encoding.
    let value = DirectoryString::from_der(&value.to_der().ok()?).ok()?;
    let name = match value {
        DirectoryString::PrintableString(s) => s.as_str().to_owned(),
        DirectoryString::TeletexString(s) => s.as_str().to_owned(),
        DirectoryString::Utf8String(s) => s,
    };
    (!name.contains('\0')).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::common_name;
    use rcgen::{CertificateParams, DnType, KeyPair};

    fn cert(names: &[(DnType, &str)]) -> Vec<u8> {
        let key = KeyPair::generate().expect("key");
        let mut p = CertificateParams::new(vec!["localhost".to_string()]).expect("params");
        p.distinguished_name = rcgen::DistinguishedName::new();
        for (t, v) in names {
            p.distinguished_name.push(t.clone(), *v);
        }
        p.self_signed(&key).expect("certificate").der().to_vec()
    }

    #[test]
    fn the_common_name_of_the_subject() {
        let der = cert(&[
            (DnType::OrganizationName, "Sluice"),
            (DnType::CommonName, "app_user"),
        ]);
        assert_eq!(common_name(&der).as_deref(), Some("app_user"));
        assert_eq!(common_name(&cert(&[(DnType::OrganizationName, "x")])), None);
        assert_eq!(common_name(b"not a certificate"), None);
        assert_eq!(common_name(&der[..der.len() / 2]), None);
    }
}
