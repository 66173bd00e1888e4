//! `ldap` logins against a real OpenLDAP server (Debian's slapd, started by the test
//! in a temp dir on its own port): `auth_type = ldap` with `auth_ldap_options` in
//! simple-bind mode, and an `ldap` rule of `auth_hba_file` in search-and-bind mode.
//! The password the directory accepted is what the server connection logs in with.

use std::process::Command;
use std::time::Duration;

use crate::support::probe::within;
use crate::support::wire::RawClient;
use crate::support::{
    self, wait_until, Sluice, SluiceBuilder, TempDir, MD5_PASSWORD, MD5_USER, SCRAM_PASSWORD,
    SCRAM_USER, TEST_DB,
};
use crate::tls::Certs;

const T: Duration = Duration::from_secs(30);
const SUFFIX: &str = "dc=example,dc=net";

/// A slapd with `ou=people` holding MD5_USER and SCRAM_USER (uid, cleartext
/// userPassword: their PostgreSQL passwords) and two entries sharing cn `twin`.
struct Slapd {
    dir: TempDir,
    port: u16,
    /// With TLS: the port of its `ldaps` listener (its `ldap` one takes StartTLS).
    ldaps_port: u16,
}

impl Slapd {
    fn start() -> Slapd {
        Slapd::launch(None)
    }

    /// With `certs`' server certificate (for localhost and 127.0.0.1).
    fn launch(certs: Option<&Certs>) -> Slapd {
        let dir = TempDir::new("sluice-slapd");
        std::fs::create_dir(dir.join("db")).expect("db dir");
        let schema = |s: &str| format!("include /etc/ldap/schema/{s}.schema\n");
        let tls = certs.map_or(String::new(), |c| {
            format!(
                "TLSCACertificateFile {}\nTLSCertificateFile {}\nTLSCertificateKeyFile {}\n",
                c.path("ca.pem"),
                c.path("server.pem"),
                c.path("server.key")
            )
        });
        let conf = format!(
            "{}{}{}{}{tls}pidfile {pid}\nmodulepath /usr/lib/ldap\nmoduleload back_mdb\n\
             database mdb\nsuffix \"{SUFFIX}\"\nrootdn \"cn=admin,{SUFFIX}\"\nrootpw adminpw\n\
             directory {db}\n",
            schema("core"),
            schema("cosine"),
            schema("inetorgperson"),
            schema("nis"),
            pid = dir.join("slapd.pid").display(),
            db = dir.join("db").display(),
        );
        let conf = dir.write("slapd.conf", &conf);
        let person = |uid: &str, cn: &str, pw: &str| {
            format!(
                "dn: uid={uid},ou=people,{SUFFIX}\nobjectClass: inetOrgPerson\nuid: {uid}\n\
                 cn: {cn}\nsn: {uid}\nuserPassword: {pw}\n\n"
            )
        };
        let ldif = format!(
            "dn: {SUFFIX}\nobjectClass: dcObject\nobjectClass: organization\no: Example\n\
             dc: example\n\ndn: ou=people,{SUFFIX}\nobjectClass: organizationalUnit\n\
             ou: people\n\n{}{}{}{}",
            person(MD5_USER, MD5_USER, MD5_PASSWORD),
            person(SCRAM_USER, SCRAM_USER, SCRAM_PASSWORD),
            person("twin1", "twin", "x"),
            person("twin2", "twin", "x"),
        );
        let ldif = dir.write("data.ldif", &ldif);
        run(Command::new("/usr/sbin/slapadd")
            .arg("-f")
            .arg(&conf)
            .arg("-l")
            .arg(&ldif));
        let port = support::free_port();
        let ldaps_port = support::free_port();
        let mut urls = format!("ldap://127.0.0.1:{port}/");
        if certs.is_some() {
            urls.push_str(&format!(" ldaps://127.0.0.1:{ldaps_port}/"));
        }
        run(Command::new("/usr/sbin/slapd")
            .arg("-f")
            .arg(&conf)
            .arg("-h")
            .arg(&urls));
        let up = wait_until(Duration::from_secs(10), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        assert!(up, "slapd did not come up on {port}");
        Slapd {
            dir,
            port,
            ldaps_port,
        }
    }
}

impl Drop for Slapd {
    fn drop(&mut self) {
        if let Ok(pid) = std::fs::read_to_string(self.dir.join("slapd.pid")) {
            if let Ok(pid) = pid.trim().parse::<i32>() {
                // SAFETY: a plain kill(2) of the slapd this test started.
                unsafe { libc::kill(pid, libc::SIGTERM) };
            }
        }
    }
}

fn run(cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e} (is slapd installed?)"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The SQLSTATE a login fails with, or "logged in".
async fn outcome(s: &Sluice, user: &str, password: &str) -> String {
    let cfg = s.config(user, password, TEST_DB);
    match within(T, "login", cfg.connect(tokio_postgres::NoTls)).await {
        Ok((c, conn)) => {
            tokio::spawn(conn);
            let who: String = c
                .query_one("SELECT current_user::text", &[])
                .await
                .expect("query")
                .get(0);
            assert_eq!(who, user);
            "logged in".into()
        }
        Err(e) => e
            .code()
            .map(|c| c.code().to_owned())
            .unwrap_or_else(|| format!("no SQLSTATE: {e}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_type_ldap_binds_as_the_user() {
    let ldap = Slapd::start();
    let options = format!(
        "ldapserver=127.0.0.1 ldapport={} ldapprefix=\"uid=\" ldapsuffix=\",ou=people,{SUFFIX}\"",
        ldap.port
    );
    // The users are in no auth file: the server (md5 for MD5_USER) gets the
    // password the directory accepted.
    let s = SluiceBuilder::new()
        .setting("auth_type", "ldap")
        .setting("auth_ldap_options", &options)
        .start();
    assert_eq!(outcome(&s, MD5_USER, MD5_PASSWORD).await, "logged in");
    assert_eq!(outcome(&s, MD5_USER, "wrong").await, "28P01");
    assert_eq!(outcome(&s, "nobody_here", "x").await, "28P01");
    // An empty password would be an unauthenticated bind, which slapd accepts:
    // never tried (tokio-postgres will not send one; the raw client does).
    let empty = RawClient::login(s.port(), MD5_USER, "", TEST_DB, &[]).await;
    // PgBouncer's words, which name the method.
    assert_eq!(empty.err().as_deref(), Some("LDAP authentication failed"));
    let log = s.log();
    assert!(
        log.contains("LDAP refused user sluice_md5: empty password"),
        "{log}"
    );
    assert!(log.contains("LDAP refused user sluice_md5"), "{log}");
    assert!(log.contains("Invalid credentials"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ldap_rule_searches_then_binds() {
    let ldap = Slapd::start();
    let dir = TempDir::new("sluice-ldap-hba");
    let rules = dir.write(
        "hba.conf",
        &format!(
            "host all {MD5_USER},{SCRAM_USER} 127.0.0.1/32 ldap \
             ldapurl=\"ldap://127.0.0.1:{port}/ou=people,{SUFFIX}?uid?sub\" \
             ldapbinddn=\"cn=admin,{SUFFIX}\" ldapbindpasswd=adminpw\n\
             host all twin 127.0.0.1/32 ldap ldapserver=127.0.0.1 ldapport={port} \
             ldapbasedn=\"{SUFFIX}\" ldapsearchattribute=cn\n",
            port = ldap.port
        ),
    );
    let s = SluiceBuilder::new()
        .setting("auth_type", "hba")
        .setting("auth_hba_file", &rules.display().to_string())
        .start();
    // SCRAM_USER's server login is SCRAM, with the password LDAP accepted.
    assert_eq!(outcome(&s, SCRAM_USER, SCRAM_PASSWORD).await, "logged in");
    assert_eq!(outcome(&s, MD5_USER, MD5_PASSWORD).await, "logged in");
    assert_eq!(outcome(&s, SCRAM_USER, MD5_PASSWORD).await, "28P01");
    // Two entries match `cn=twin` (an anonymous search): no login.
    assert_eq!(outcome(&s, "twin", "x").await, "28P01");
    let log = s.log();
    assert!(log.contains("returned 2 entries"), "{log}");
}

#[test]
fn ldap_settings_are_checked_at_load() {
    let (_, out) = SluiceBuilder::new()
        .setting("auth_type", "ldap")
        .start_expect_failure();
    assert!(
        out.contains("auth_type ldap needs auth_ldap_options"),
        "{out}"
    );
    let (_, out) = SluiceBuilder::new()
        .setting("auth_type", "ldap")
        .setting(
            "auth_ldap_options",
            "ldapserver=h ldapprefix=cn= ldapbasedn=dc=x",
        )
        .start_expect_failure();
    assert!(out.contains("together with ldapprefix"), "{out}");
    let dir = TempDir::new("sluice-ldap-bare");
    let rules = dir.write("hba.conf", "local all all trust\nhost all all all ldap\n");
    let (_, out) = SluiceBuilder::new()
        .setting("auth_type", "hba")
        .setting("auth_hba_file", &rules.display().to_string())
        .start_expect_failure();
    let want = format!("{}:2", rules.display());
    assert!(out.contains(&want), "{out}");
    assert!(out.contains("needs auth_ldap_options"), "{out}");
}

/// The directory over TLS: StartTLS (`ldaptls=1`) and `ldaps`, the server's
/// certificate checked against the CA libldap is given (`LDAPTLS_CACERT`); without
/// that CA the login is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ldap_over_tls() {
    let certs = Certs::new();
    let ldap = Slapd::launch(Some(&certs));
    let bind = format!("ldapprefix=\"uid=\" ldapsuffix=\",ou=people,{SUFFIX}\"");
    for (server, checked) in [
        (
            format!("ldapserver=127.0.0.1 ldapport={} ldaptls=1", ldap.port),
            true,
        ),
        (
            format!(
                "ldapscheme=ldaps ldapserver=127.0.0.1 ldapport={}",
                ldap.ldaps_port
            ),
            true,
        ),
        (
            format!("ldapserver=127.0.0.1 ldapport={} ldaptls=1", ldap.port),
            false,
        ),
    ] {
        let mut b = SluiceBuilder::new()
            .setting("auth_type", "ldap")
            .setting("auth_ldap_options", &format!("{server} {bind}"));
        b = if checked {
            b.env("LDAPTLS_CACERT", &certs.path("ca.pem"))
        } else {
            // A CA that did not sign the server's certificate.
            b.env("LDAPTLS_CACERT", &certs.path("other-ca.pem"))
        };
        let s = b.start();
        let want = if checked { "logged in" } else { "28P01" };
        assert_eq!(
            outcome(&s, MD5_USER, MD5_PASSWORD).await,
            want,
            "{server}\n{}",
            s.log()
        );
        if !checked {
            assert!(
                s.log().contains("could not start LDAP TLS session"),
                "{}",
                s.log()
            );
        }
    }
}
