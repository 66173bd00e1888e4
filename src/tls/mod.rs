//! TLS towards clients (`client_tls_*`): the acceptor's configuration, built from the
//! settings at every load (so a reload re-reads the key and certificates, as
//! PgBouncer's does), and the handshakes ([`handshake`]), after which the
//! connection's own stream carries the session (`net/tls.rs`).
//!
//! rustls with the aws-lc-rs provider: TLS 1.2 and 1.3 only, its default cipher suites.

pub mod ciphers;
pub mod handshake;
mod peer;
pub mod server;

pub use peer::{common_name, TlsPeer};

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::aws_lc_rs::{ALL_CIPHER_SUITES, ALL_KX_GROUPS};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ProtocolVersion, RootCertStore, ServerConfig, SupportedProtocolVersion};

use crate::config::{Settings, SslMode};

/// Why the client TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    /// A key, certificate or CA file could not be read.
    #[error("{}: cannot read: {source}", .file.display())]
    Io {
        file: PathBuf,
        source: std::io::Error,
    },
    /// The settings or the files' contents do not make a usable configuration.
    #[error("{0}")]
    Invalid(String),
}

/// The versions `client_tls_protocols` asks for that rustls offers, and whether it
/// asked for older ones too (TLS 1.0 and 1.1, which are not offered). Keywords as in
/// PgBouncer: `tlsv1.0` to `tlsv1.3`, `all`, `legacy`, `secure` and `default` (1.2 and
/// 1.3), separated by `,` or `:`, each one negated by a leading `!` or `-`.
pub fn protocols(v: &str) -> Result<(Vec<&'static SupportedProtocolVersion>, bool), String> {
    // Bits: 1.0, 1.1, 1.2, 1.3.
    let mut set = 0u8;
    for item in v.split([',', ':']).map(str::trim).filter(|i| !i.is_empty()) {
        let (negate, name) = match item.strip_prefix(['!', '-']) {
            Some(rest) => (true, rest),
            None => (false, item),
        };
        let bits = match name.to_ascii_lowercase().as_str() {
            "tlsv1.0" => 0b0001,
            "tlsv1.1" => 0b0010,
            "tlsv1.2" => 0b0100,
            "tlsv1.3" => 0b1000,
            "all" | "legacy" => 0b1111,
            "secure" | "default" => 0b1100,
            _ => return Err(format!("unknown TLS protocol \"{name}\"")),
        };
        if negate {
            set &= !bits;
        } else {
            set |= bits;
        }
    }
    let mut versions = Vec::new();
    if set & 0b1000 != 0 {
        versions.push(&rustls::version::TLS13);
    }
    if set & 0b0100 != 0 {
        versions.push(&rustls::version::TLS12);
    }
    if versions.is_empty() {
        return Err("no TLS version Sluice supports (tlsv1.2, tlsv1.3) is allowed".into());
    }
    Ok((versions, set & 0b0011 != 0))
}

/// The most application data one TLS record carries to a client. libpq reads with
/// room for at least 8 kB and OpenSSL returns one record per read, so a larger record
/// can leave plaintext in OpenSSL's buffer, where an application that waits on the
/// socket (pgbench, or any driver on libpq's asynchronous API) never sees it and
/// hangs; PostgreSQL itself sends records of at most 8 kB. Found by a pgbench pipeline
/// that hung at its end about one run in six with rustls's default of 16 kB.
pub const MAX_RECORD_PLAINTEXT: usize = 8192;
/// A TLS record's header, which rustls counts in its fragment size.
const RECORD_HEADER: usize = 5;

/// The ALPN protocol name of PostgreSQL connections (PostgreSQL 17 on).
pub const ALPN_POSTGRESQL: &[u8] = b"postgresql";

/// The acceptor's configuration for `client_tls_*`; None when `client_tls_sslmode` is
/// `disable`. A CA file makes client certificates checked: required from
/// `verify-ca` on, optional below it (a certificate offered must still verify).
pub fn acceptor(s: &Settings) -> Result<Option<Arc<ServerConfig>>, TlsSetupError> {
    if s.client_tls_sslmode == SslMode::Disable {
        return Ok(None);
    }
    let (Some(key_file), Some(cert_file)) = (&s.client_tls_key_file, &s.client_tls_cert_file)
    else {
        return Err(TlsSetupError::Invalid(
            "client_tls_sslmode other than disable needs client_tls_key_file and client_tls_cert_file".into(),
        ));
    };
    let mut provider = ciphers::provider(&s.client_tls_ciphers, &s.client_tls13_ciphers);
    // Checked at the setting's line; the default (all groups) stays otherwise.
    if let Ok(groups) = ciphers::groups(&s.client_tls_ecdhcurve) {
        provider.kx_groups = groups;
    }
    let provider = Arc::new(provider);
    let (versions, _) = protocols(&s.client_tls_protocols).map_err(TlsSetupError::Invalid)?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .map_err(|e| TlsSetupError::Invalid(format!("client_tls_protocols: {e}")))?;
    let builder = match &s.client_tls_ca_file {
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for c in certificates(ca)? {
                roots.add(c).map_err(|e| invalid(ca, e))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = if s.client_tls_sslmode >= SslMode::VerifyCa {
                verifier.build()
            } else {
                verifier.allow_unauthenticated().build()
            };
            builder.with_client_cert_verifier(verifier.map_err(|e| invalid(ca, e))?)
        }
        None if s.client_tls_sslmode >= SslMode::VerifyCa => {
            return Err(TlsSetupError::Invalid(
                "client_tls_sslmode verify-ca and verify-full need client_tls_ca_file".into(),
            ))
        }
        None => builder.with_no_client_auth(),
    };
    let key = PrivateKeyDer::from_pem_file(key_file).map_err(|e| pem_error(key_file, e))?;
    let mut config = builder
        .with_single_cert(certificates(cert_file)?, key)
        .map_err(|e| invalid(key_file, e))?;
    config.max_fragment_size = Some(MAX_RECORD_PLAINTEXT + RECORD_HEADER);
    // No session resumption, as PostgreSQL's own server: libpq never resumes, so
    // tickets (two per handshake by default) and a session cache would be work and
    // bytes for nothing at every login.
    config.send_tls13_tickets = 0;
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    // PostgreSQL 17's protocol name. A client that offers ALPN must offer it (the
    // handshake fails otherwise, as with PostgreSQL); one that offers none is still
    // served after an SSLRequest, and refused on a direct TLS connection.
    config.alpn_protocols = vec![ALPN_POSTGRESQL.to_vec()];
    Ok(Some(Arc::new(config)))
}

/// The certificates in a PEM file; at least one.
fn certificates(file: &Path) -> Result<Vec<CertificateDer<'static>>, TlsSetupError> {
    let certs = CertificateDer::pem_file_iter(file)
        .map_err(|e| pem_error(file, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(file, e))?;
    if certs.is_empty() {
        return Err(TlsSetupError::Invalid(format!(
            "{}: no certificate found",
            file.display()
        )));
    }
    Ok(certs)
}

fn pem_error(file: &Path, e: rustls::pki_types::pem::Error) -> TlsSetupError {
    match e {
        rustls::pki_types::pem::Error::Io(source) => TlsSetupError::Io {
            file: file.to_path_buf(),
            source,
        },
        rustls::pki_types::pem::Error::NoItemsFound => {
            TlsSetupError::Invalid(format!("{}: no PEM item found", file.display()))
        }
        other => invalid(file, other),
    }
}

fn invalid(file: &Path, e: impl std::fmt::Display) -> TlsSetupError {
    TlsSetupError::Invalid(format!("{}: {e}", file.display()))
}

/// What a client's TLS session negotiated, for the log and SHOW CLIENTS; all zero
/// for a plaintext client. Three bytes, which fit in what was padding in every
/// client's console entry: the version's minor number, and the cipher suite and key
/// exchange group as 1-based positions in the provider's lists; named only when
/// shown.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TlsInfo {
    version: u8,
    suite: u8,
    group: u8,
}

impl TlsInfo {
    /// The parameters of an established connection.
    pub fn of(c: &rustls::CommonState) -> TlsInfo {
        let position = |found: Option<usize>| found.map_or(0, |i| (i + 1) as u8);
        let suite = c.negotiated_cipher_suite().map(|s| s.suite());
        let group = c.negotiated_key_exchange_group().map(|g| g.name());
        TlsInfo {
            version: match c.protocol_version() {
                Some(ProtocolVersion::TLSv1_3) => 4,
                Some(ProtocolVersion::TLSv1_2) => 3,
                // rustls speaks no other, but a connection must never read as plaintext.
                _ => 0xff,
            },
            suite: position(
                ALL_CIPHER_SUITES
                    .iter()
                    .position(|s| Some(s.suite()) == suite),
            ),
            group: position(ALL_KX_GROUPS.iter().position(|g| Some(g.name()) == group)),
        }
    }

    pub fn is_tls(&self) -> bool {
        self.version != 0
    }
}

/// PgBouncer's form, `TLSv1.3/TLS_AES_256_GCM_SHA384/ECDH=X25519`; empty for plaintext.
impl std::fmt::Display for TlsInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.version {
            0 => return Ok(()),
            4 => f.write_str("TLSv1.3")?,
            3 => f.write_str("TLSv1.2")?,
            _ => f.write_str("TLS")?,
        }
        let nth = |i: u8| usize::from(i).checked_sub(1);
        if let Some(s) = nth(self.suite).and_then(|i| ALL_CIPHER_SUITES.get(i)) {
            let name = format!("{:?}", s.suite());
            // rustls names TLS 1.3's suites TLS13_*; IANA (and OpenSSL) say TLS_*.
            match name.strip_prefix("TLS13_") {
                Some(rest) => write!(f, "/TLS_{rest}")?,
                None => write!(f, "/{name}")?,
            }
        }
        if let Some(g) = nth(self.group).and_then(|i| ALL_KX_GROUPS.get(i)) {
            write!(f, "/ECDH={:?}", g.name())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_keywords() {
        let names = |v| {
            protocols(v).map(|(vs, dropped)| {
                let vs: Vec<_> = vs.iter().map(|v| v.version).collect();
                (vs, dropped)
            })
        };
        let both = vec![ProtocolVersion::TLSv1_3, ProtocolVersion::TLSv1_2];
        assert_eq!(names("secure"), Ok((both.clone(), false)));
        assert_eq!(names("default"), Ok((both.clone(), false)));
        assert_eq!(names("all"), Ok((both.clone(), true)));
        assert_eq!(names("tlsv1.2:TLSv1.3"), Ok((both, false)));
        assert_eq!(
            names("all,!tlsv1.0,-tlsv1.1,-tlsv1.2"),
            Ok((vec![ProtocolVersion::TLSv1_3], false))
        );
        assert_eq!(
            names("tlsv1.2"),
            Ok((vec![ProtocolVersion::TLSv1_2], false))
        );
        assert!(names("tlsv1.0").unwrap_err().contains("no TLS version"));
        assert!(names("").is_err());
        assert_eq!(
            names("sslv3").unwrap_err(),
            "unknown TLS protocol \"sslv3\""
        );
    }

    #[test]
    fn info_is_shown_as_pgbouncer_shows_it() {
        assert_eq!(TlsInfo::default().to_string(), "");
        assert!(!TlsInfo::default().is_tls());
        let info = |version, suite: rustls::CipherSuite, group: rustls::NamedGroup| {
            let s = ALL_CIPHER_SUITES.iter().position(|s| s.suite() == suite);
            let g = ALL_KX_GROUPS.iter().position(|g| g.name() == group);
            TlsInfo {
                version,
                suite: (s.unwrap() + 1) as u8,
                group: (g.unwrap() + 1) as u8,
            }
        };
        use rustls::{CipherSuite as S, NamedGroup as G};
        let i = info(4, S::TLS13_AES_256_GCM_SHA384, G::X25519);
        assert!(i.is_tls());
        assert_eq!(i.to_string(), "TLSv1.3/TLS_AES_256_GCM_SHA384/ECDH=X25519");
        let i = info(3, S::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384, G::secp256r1);
        assert_eq!(
            i.to_string(),
            "TLSv1.2/TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384/ECDH=secp256r1"
        );
        // It takes what was padding: a client's console entry is no larger.
        assert_eq!(std::mem::size_of::<TlsInfo>(), 3);
        assert_eq!(std::mem::size_of::<crate::stats::conns::ClientMeta>(), 128);
    }

    fn settings(mode: SslMode) -> Settings {
        Settings {
            client_tls_sslmode: mode,
            ..Settings::default()
        }
    }

    #[test]
    fn acceptor_needs_its_files() {
        assert!(acceptor(&settings(SslMode::Disable)).unwrap().is_none());
        let e = acceptor(&settings(SslMode::Require)).unwrap_err();
        assert!(e.to_string().contains("needs client_tls_key_file"), "{e}");
        let s = Settings {
            client_tls_key_file: Some("/nonexistent/k.pem".into()),
            client_tls_cert_file: Some("/nonexistent/c.pem".into()),
            ..settings(SslMode::VerifyCa)
        };
        let e = acceptor(&s).unwrap_err();
        assert!(e.to_string().contains("need client_tls_ca_file"), "{e}");
        let s = Settings {
            client_tls_sslmode: SslMode::Prefer,
            ..s
        };
        let e = acceptor(&s).unwrap_err();
        assert_eq!(
            e.to_string(),
            "/nonexistent/k.pem: cannot read: No such file or directory (os error 2)"
        );
    }
}
