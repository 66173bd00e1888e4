//! `client_tls_ciphers`, `server_tls_ciphers` (TLS 1.2) and `client_tls13_ciphers`,
//! `server_tls13_ciphers` (TLS 1.3): which of rustls's cipher suites are offered;
//! and `client_tls_ecdhcurve`: which key exchange groups ([`groups`]).
//!
//! PgBouncer hands these strings to OpenSSL. rustls has no cipher-string language,
//! and offers only AEAD suites with forward secrecy, so a string is read this way:
//! - PgBouncer's keywords (`default`, `secure`, `fast`, `normal`, `all`, `legacy`,
//!   `compat`) and OpenSSL's selectors (`HIGH`, `ECDHE+AESGCM`, `!aNULL`, ...) select
//!   every rustls suite of that TLS version: each of them is within any selection
//!   such a string makes (no export, NULL, RC4, 3DES, CBC or static-RSA suite is
//!   ever offered);
//! - cipher names (`ECDHE-RSA-AES128-GCM-SHA256`, or the IANA `TLS_...` form) select
//!   that suite; a name rustls does not have is left out (it could not be offered);
//! - `!name` or `-name` takes a suite out again.
//!
//! A list of names only offers just those; if none of them is a rustls suite, the
//! setting is an error at its line rather than a silent change of meaning.

use rustls::crypto::aws_lc_rs::{kx_group, ALL_CIPHER_SUITES};
use rustls::crypto::{CryptoProvider, SupportedKxGroup};
use rustls::SupportedCipherSuite;

/// rustls's TLS 1.2 suites by OpenSSL's names.
const OPENSSL_TLS12: [(&str, &str); 6] = [
    (
        "ECDHE-ECDSA-AES256-GCM-SHA384",
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    ),
    (
        "ECDHE-ECDSA-AES128-GCM-SHA256",
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    ),
    (
        "ECDHE-ECDSA-CHACHA20-POLY1305",
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
    ),
    (
        "ECDHE-RSA-AES256-GCM-SHA384",
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    ),
    (
        "ECDHE-RSA-AES128-GCM-SHA256",
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    ),
    (
        "ECDHE-RSA-CHACHA20-POLY1305",
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
    ),
];

/// A suite's IANA name (rustls calls TLS 1.3's `TLS13_*`).
fn iana(s: &SupportedCipherSuite) -> String {
    let name = format!("{:?}", s.suite());
    match name.strip_prefix("TLS13_") {
        Some(rest) => format!("TLS_{rest}"),
        None => name,
    }
}

fn is_tls13(s: &SupportedCipherSuite) -> bool {
    matches!(s, SupportedCipherSuite::Tls13(_))
}

/// The rustls suite a cipher name means, if it has one.
fn by_name(name: &str, tls13: bool) -> Option<SupportedCipherSuite> {
    let upper = name.to_ascii_uppercase();
    let iana_name = OPENSSL_TLS12
        .iter()
        .find(|(o, _)| *o == upper)
        .map_or(upper.as_str(), |(_, i)| i);
    ALL_CIPHER_SUITES
        .iter()
        .find(|s| is_tls13(s) == tls13 && iana(s) == iana_name)
        .copied()
}

/// The suites of one TLS version (`tls13`) that `v` selects; see the module's doc.
pub fn select(v: &str, tls13: bool) -> Result<Vec<SupportedCipherSuite>, String> {
    let all: Vec<SupportedCipherSuite> = ALL_CIPHER_SUITES
        .iter()
        .filter(|s| is_tls13(s) == tls13)
        .copied()
        .collect();
    let (mut named, mut out, mut keyword, mut any_name) = (Vec::new(), Vec::new(), false, false);
    for item in v
        .split([':', ',', ' '])
        .map(str::trim)
        .filter(|i| !i.is_empty())
    {
        let (negate, name) = match item.strip_prefix(['!', '-']) {
            Some(rest) => (true, rest),
            None => (false, item.strip_prefix('+').unwrap_or(item)),
        };
        // OpenSSL's cipher names hold a dash or start with TLS_; its selectors
        // (HIGH, aNULL, ECDHE+AESGCM, @STRENGTH) and PgBouncer's keywords do not.
        let is_name = name.contains('-') || name.to_ascii_uppercase().starts_with("TLS_");
        match (is_name, negate) {
            (true, false) => {
                any_name = true;
                named.extend(by_name(name, tls13));
            }
            (true, true) => out.extend(by_name(name, tls13)),
            (false, false) => keyword = true,
            (false, true) => {}
        }
    }
    let picked: Vec<SupportedCipherSuite> = if keyword || !any_name {
        all
    } else if named.is_empty() {
        return Err(format!(
            "none of the ciphers in \"{v}\" is one Sluice offers; it offers {}",
            all.iter().map(iana).collect::<Vec<_>>().join(", ")
        ));
    } else {
        // In rustls's order of preference, not the list's.
        all.into_iter()
            .filter(|s| named.iter().any(|n| n.suite() == s.suite()))
            .collect()
    };
    let left: Vec<SupportedCipherSuite> = picked
        .into_iter()
        .filter(|s| !out.iter().any(|o| o.suite() == s.suite()))
        .collect();
    if left.is_empty() {
        return Err(format!("\"{v}\" takes out every cipher Sluice offers"));
    }
    Ok(left)
}

/// rustls's aws-lc-rs provider offering the suites `tls12` and `tls13` select (their
/// errors were reported at the settings' lines, so none is left here) and the
/// classic key exchange groups. aws-lc-rs rather than ring: an RSA-2048 signature,
/// the bulk of a TLS login's CPU with an RSA certificate, takes it about half
/// ring's time here (docs/performance.md, fifty-seventh round).
pub fn provider(tls12: &str, tls13: &str) -> CryptoProvider {
    let mut p = rustls::crypto::aws_lc_rs::default_provider();
    p.kx_groups = classic_groups();
    let mut suites = select(tls13, true).unwrap_or_default();
    suites.extend(select(tls12, false).unwrap_or_default());
    if !suites.is_empty() {
        p.cipher_suites = suites;
    }
    p
}

/// X25519, P-256 and P-384, in that order. The provider's post-quantum hybrids are
/// left out: OpenSSL, which PgBouncer offers through, has them only from 3.5, and a
/// client offering one should meet what PgBouncer would answer.
fn classic_groups() -> Vec<&'static dyn SupportedKxGroup> {
    vec![kx_group::X25519, kx_group::SECP256R1, kx_group::SECP384R1]
}

/// A curve's names (OpenSSL's, the RFC's, NIST's) and rustls's group.
fn group_by_name(name: &str) -> Option<&'static dyn SupportedKxGroup> {
    match name.to_ascii_lowercase().as_str() {
        "x25519" => Some(kx_group::X25519),
        "prime256v1" | "secp256r1" | "p-256" => Some(kx_group::SECP256R1),
        "secp384r1" | "p-384" => Some(kx_group::SECP384R1),
        _ => None,
    }
}

/// The key exchange groups `client_tls_ecdhcurve` selects, in its order of
/// preference. PgBouncer passes the value to OpenSSL: `auto` (its default) lets the
/// library choose, a curve name (or a list, `:` or `,` between) names the curves.
/// rustls has X25519, P-256 and P-384; a list naming none of them is an error rather
/// than a silent change of meaning. `none` (no ECDH) is an error too: every suite
/// rustls has exchanges keys by ECDHE, so no client could complete a handshake.
pub fn groups(v: &str) -> Result<Vec<&'static dyn SupportedKxGroup>, String> {
    let all = classic_groups;
    let items: Vec<&str> = v
        .split([':', ','])
        .map(str::trim)
        .filter(|i| !i.is_empty())
        .collect();
    if items.is_empty() {
        return Ok(all());
    }
    let mut picked: Vec<&'static dyn SupportedKxGroup> = Vec::new();
    for item in &items {
        match item.to_ascii_lowercase().as_str() {
            "auto" | "default" => return Ok(all()),
            "none" => {
                return Err(
                    "\"none\" leaves no key exchange: Sluice's TLS suites all use ECDHE".into(),
                )
            }
            _ => {}
        }
        if let Some(g) = group_by_name(item) {
            if !picked.iter().any(|p| p.name() == g.name()) {
                picked.push(g);
            }
        }
    }
    if picked.is_empty() {
        return Err(format!(
            "none of the curves in \"{v}\" is one Sluice offers; it offers X25519, prime256v1 (P-256), secp384r1 (P-384)"
        ));
    }
    Ok(picked)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &str, tls13: bool) -> Result<Vec<String>, String> {
        select(v, tls13).map(|s| s.iter().map(iana).collect())
    }

    #[test]
    fn keywords_and_selectors_take_every_suite() {
        for v in [
            "default",
            "secure",
            "fast",
            "HIGH:!aNULL:!MD5",
            "ECDHE+AESGCM",
            "",
        ] {
            assert_eq!(names(v, false).map(|n| n.len()), Ok(6), "{v}");
            assert_eq!(names(v, true).map(|n| n.len()), Ok(3), "{v}");
        }
    }

    #[test]
    fn names_take_only_those() {
        assert_eq!(
            names(
                "ECDHE-RSA-AES128-GCM-SHA256:AES256-SHA:DHE-RSA-AES256-GCM-SHA384",
                false
            ),
            Ok(vec!["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256".to_string()])
        );
        assert_eq!(
            names("TLS_CHACHA20_POLY1305_SHA256", true),
            Ok(vec!["TLS_CHACHA20_POLY1305_SHA256".to_string()])
        );
        // A name with a selector: every suite, less the one taken out.
        let n = names("HIGH:!ECDHE-ECDSA-CHACHA20-POLY1305", false).unwrap_or_default();
        assert_eq!(n.len(), 5);
        assert!(!n.contains(&"TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256".to_string()));
        // TLS 1.2 names mean nothing for TLS 1.3, and the reverse.
        assert!(names("TLS_AES_128_GCM_SHA256", false).is_err());
    }

    #[test]
    fn the_provider_offers_the_classic_groups_only() {
        let p = provider("default", "default");
        let names: Vec<String> = p
            .kx_groups
            .iter()
            .map(|g| format!("{:?}", g.name()))
            .collect();
        assert_eq!(names, ["X25519", "secp256r1", "secp384r1"]);
        assert_eq!(p.cipher_suites.len(), 9);
    }

    fn curves(v: &str) -> Result<Vec<String>, String> {
        groups(v).map(|g| g.iter().map(|g| format!("{:?}", g.name())).collect())
    }

    #[test]
    fn curves_by_their_names() {
        assert_eq!(curves("auto").map(|g| g.len()), Ok(3));
        assert_eq!(curves("").map(|g| g.len()), Ok(3));
        assert_eq!(curves("secp384r1"), Ok(vec!["secp384r1".to_string()]));
        // In the list's order; names Sluice lacks are passed over.
        assert_eq!(
            curves("P-384:secp521r1, prime256v1:x25519"),
            Ok(vec![
                "secp384r1".to_string(),
                "secp256r1".to_string(),
                "X25519".to_string()
            ])
        );
        let e = curves("secp521r1:X448").err().unwrap_or_default();
        assert!(
            e.starts_with("none of the curves in \"secp521r1:X448\""),
            "{e}"
        );
        assert!(curves("none").is_err_and(|e| e.contains("no key exchange")));
    }

    #[test]
    fn a_list_of_unknown_names_is_an_error() {
        let e = names("AES256-SHA:DES-CBC3-SHA", false)
            .err()
            .unwrap_or_default();
        assert!(
            e.starts_with("none of the ciphers in \"AES256-SHA:DES-CBC3-SHA\""),
            "{e}"
        );
        assert!(e.contains("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"), "{e}");
        assert!(names("TLS_AES_128_CCM_SHA256", true).is_err());
        let all_out =
            "HIGH:!TLS_AES_256_GCM_SHA384:!TLS_AES_128_GCM_SHA256:!TLS_CHACHA20_POLY1305_SHA256";
        assert!(names(all_out, true).is_err_and(|e| e.contains("takes out every cipher")));
    }
}
