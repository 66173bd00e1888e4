//! TLS towards servers (`server_tls_*`): the connector's configuration, built from the
//! settings at every load, and how far a server's certificate is checked.
//!
//! As libpq and PgBouncer: `allow`, `prefer` and `require` encrypt without checking
//! who answers; `verify-ca` checks the chain against `server_tls_ca_file` (or the
//! system's CA bundle without it); `verify-full` checks the host name too.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore};
use rustls::{Error, SignatureScheme};

use super::{certificates, invalid, pem_error, protocols, TlsSetupError};
use crate::config::{Settings, SslMode};

/// What server connections use: the mode and the connector built for it. Two are
/// equal when built from the same settings, so a reload that leaves `server_tls_*`
/// alone keeps the pools' connections (as PgBouncer 1.24), though every load reads
/// the files again.
#[derive(Debug, Clone)]
pub struct ServerTls {
    pub mode: SslMode,
    pub config: Arc<ClientConfig>,
    /// The files and strings it was built from (ca, key, cert; protocols, ciphers,
    /// TLS 1.3 ciphers).
    from: (
        Option<PathBuf>,
        Option<PathBuf>,
        Option<PathBuf>,
        [String; 3],
    ),
}

impl PartialEq for ServerTls {
    fn eq(&self, other: &ServerTls) -> bool {
        self.mode == other.mode && self.from == other.from
    }
}

/// Where the system keeps its bundle of trusted CAs (Debian's first), for
/// `verify-ca`/`verify-full` without `server_tls_ca_file`.
const SYSTEM_BUNDLES: [&str; 4] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// The system's CA bundle: `SSL_CERT_FILE` if set (as OpenSSL, which PgBouncer and
/// libpq use, reads it), else the first of `SYSTEM_BUNDLES` that exists.
pub fn system_bundle() -> Option<PathBuf> {
    if let Some(f) = std::env::var_os("SSL_CERT_FILE").filter(|f| !f.is_empty()) {
        return Some(PathBuf::from(f));
    }
    SYSTEM_BUNDLES
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// The connector for `server_tls_*`; None when `server_tls_sslmode` is `disable`.
/// `verify-ca`/`verify-full` without `server_tls_ca_file` trust the system's CA
/// bundle, as PgBouncer does with OpenSSL's default.
pub fn connector(s: &Settings) -> Result<Option<ServerTls>, TlsSetupError> {
    let system = match (&s.server_tls_ca_file, s.server_tls_sslmode) {
        (None, SslMode::VerifyCa | SslMode::VerifyFull) => system_bundle(),
        _ => None,
    };
    connector_with(s, system)
}

/// [`connector`] with the system bundle given (`system`), so tests need no
/// environment.
fn connector_with(
    s: &Settings,
    system: Option<PathBuf>,
) -> Result<Option<ServerTls>, TlsSetupError> {
    let mode = s.server_tls_sslmode;
    if mode == SslMode::Disable {
        return Ok(None);
    }
    let provider = Arc::new(super::ciphers::provider(
        &s.server_tls_ciphers,
        &s.server_tls13_ciphers,
    ));
    let (versions, _) = protocols(&s.server_tls_protocols).map_err(TlsSetupError::Invalid)?;
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .map_err(|e| TlsSetupError::Invalid(format!("server_tls_protocols: {e}")))?;
    let webpki = match (&s.server_tls_ca_file, mode) {
        (Some(ca), SslMode::VerifyCa | SslMode::VerifyFull) => {
            Some(roots_verifier(ca, false, &provider)?)
        }
        (None, SslMode::VerifyCa | SslMode::VerifyFull) => {
            let Some(bundle) = system else {
                return Err(TlsSetupError::Invalid(
                    "server_tls_sslmode verify-ca and verify-full need server_tls_ca_file \
                     (no system CA bundle found)"
                        .into(),
                ));
            };
            Some(roots_verifier(&bundle, true, &provider)?)
        }
        _ => None,
    };
    let verifier = Arc::new(Judge {
        webpki,
        names: mode == SslMode::VerifyFull,
        provider,
    });
    let builder = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let config = match (&s.server_tls_key_file, &s.server_tls_cert_file) {
        (Some(key_file), Some(cert_file)) => {
            let key = PrivateKeyDer::from_pem_file(key_file).map_err(|e| pem_error(key_file, e))?;
            builder
                .with_client_auth_cert(certificates(cert_file)?, key)
                .map_err(|e| invalid(key_file, e))?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => {
            return Err(TlsSetupError::Invalid(
                "server_tls_key_file and server_tls_cert_file go together".into(),
            ))
        }
    };
    Ok(Some(ServerTls {
        mode,
        config: Arc::new(config),
        from: (
            s.server_tls_ca_file.clone(),
            s.server_tls_key_file.clone(),
            s.server_tls_cert_file.clone(),
            [
                s.server_tls_protocols.clone(),
                s.server_tls_ciphers.clone(),
                s.server_tls13_ciphers.clone(),
            ],
        ),
    }))
}

/// A chain verifier trusting the certificates of `file`. Each must be usable, unless
/// `lenient` (a system bundle may hold some webpki cannot use: those are skipped, as
/// OpenSSL would, and the rest must not be empty).
fn roots_verifier(
    file: &Path,
    lenient: bool,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<WebPkiServerVerifier>, TlsSetupError> {
    let mut roots = RootCertStore::empty();
    if lenient {
        let (_, _) = roots.add_parsable_certificates(certificates(file)?);
        if roots.is_empty() {
            return Err(invalid(file, "no usable CA certificate"));
        }
    } else {
        for c in certificates(file)? {
            roots.add(c).map_err(|e| invalid(file, e))?;
        }
    }
    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| invalid(file, e))
}

/// The name a server is checked against (and sent as SNI, when it is a DNS name).
pub fn server_name(host: &str) -> Result<ServerName<'static>, String> {
    ServerName::try_from(host.to_owned()).map_err(|e| format!("{host}: {e}"))
}

/// How a server's certificate is judged. With `webpki` (`verify-ca`, `verify-full`)
/// the chain must lead to a root in the CA file, and the host name must match only
/// if `names`; without (`allow`, `prefer`, `require`) any certificate is taken, as
/// libpq does without a root file. The handshake's signature is always checked
/// against the certificate presented.
#[derive(Debug)]
struct Judge {
    webpki: Option<Arc<WebPkiServerVerifier>>,
    names: bool,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Judge {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let Some(webpki) = &self.webpki else {
            return Ok(ServerCertVerified::assertion());
        };
        match webpki.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            // rustls checks the name last, once the chain is known good.
            Err(Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if !self.names => Ok(ServerCertVerified::assertion()),
            r => r,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        let algorithms = &self.provider.signature_verification_algorithms;
        verify_tls12_signature(message, cert, dss, algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        let algorithms = &self.provider.signature_verification_algorithms;
        verify_tls13_signature(message, cert, dss, algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        (self.provider.signature_verification_algorithms).supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(pairs: &[(&str, &str)]) -> Settings {
        let mut s = Settings::default();
        for (k, v) in pairs {
            match *k {
                "mode" => s.server_tls_sslmode = SslMode::parse(v).unwrap_or(SslMode::Disable),
                "ca" => s.server_tls_ca_file = Some(PathBuf::from(v)),
                "key" => s.server_tls_key_file = Some(PathBuf::from(v)),
                "protocols" => s.server_tls_protocols = v.to_string(),
                _ => unreachable!("{k}"),
            }
        }
        s
    }

    fn error(pairs: &[(&str, &str)]) -> String {
        match connector_with(&with(pairs), None) {
            Err(e) => e.to_string(),
            Ok(_) => "built".into(),
        }
    }

    #[test]
    fn modes_and_their_needs() {
        assert!(matches!(connector(&with(&[("mode", "disable")])), Ok(None)));
        let prefer = connector(&with(&[])).ok().flatten();
        assert_eq!(prefer.map(|t| t.mode), Some(SslMode::Prefer));
        assert_eq!(
            error(&[("mode", "verify-full")]),
            "server_tls_sslmode verify-ca and verify-full need server_tls_ca_file \
             (no system CA bundle found)"
        );
        assert_eq!(
            error(&[("key", "/k.pem")]),
            "server_tls_key_file and server_tls_cert_file go together"
        );
        assert!(error(&[("protocols", "tlsv1.1")]).contains("no TLS version"));
        assert!(
            error(&[("mode", "verify-ca"), ("ca", "/nonexistent/ca.pem")])
                .starts_with("/nonexistent/ca.pem: cannot read")
        );
    }

    #[test]
    fn equal_when_built_from_the_same_settings() {
        let a = connector(&with(&[("mode", "require")])).ok().flatten();
        let b = connector(&with(&[("mode", "require")])).ok().flatten();
        let c = connector(&with(&[("mode", "require"), ("protocols", "tlsv1.3")]))
            .ok()
            .flatten();
        assert!(a.is_some() && a == b, "rebuilt, still equal");
        assert_ne!(a, c);
        assert_ne!(a, connector(&with(&[])).ok().flatten());
    }
}
