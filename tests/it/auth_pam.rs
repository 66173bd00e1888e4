//! `auth_type = pam`: PAM (service `pgbouncer`) checks the client's cleartext
//! password, and the password it accepted logs in to the server. The service file
//! is the test's own (`SLUICE_PAM_CONFDIR`), built from Linux-PAM's standard
//! modules: `pam_exec` runs a script that is given the password (`expose_authtok`),
//! once for authentication and once for the account check.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use crate::support::probe::within;
use crate::support::{
    self, Sluice, SluiceBuilder, TempDir, MD5_PASSWORD, MD5_USER, SCRAM_PASSWORD, SCRAM_USER,
    TEST_DB,
};

const T: Duration = Duration::from_secs(30);

/// A PAM service `pgbouncer` in `dir`: the password script knows MD5_USER's and
/// SCRAM_USER's passwords; the account script locks SCRAM_USER out.
fn pam_service(dir: &TempDir) {
    let script = |name: &str, body: &str| {
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}")).expect("write script");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        path.to_str().expect("utf-8 path").to_owned()
    };
    // pam_exec writes the password and a NUL byte to the script's standard input.
    let auth = script(
        "auth.sh",
        &format!(
            "pw=$(tr -d '\\000')\n\
             [ \"$PAM_USER\" = {MD5_USER} ] && [ \"$pw\" = {MD5_PASSWORD} ] && exit 0\n\
             [ \"$PAM_USER\" = {SCRAM_USER} ] && [ \"$pw\" = {SCRAM_PASSWORD} ] && exit 0\n\
             exit 1\n"
        ),
    );
    let account = script(
        "account.sh",
        &format!("[ \"$PAM_USER\" = {SCRAM_USER} ] && exit 1\nexit 0\n"),
    );
    let service = format!(
        "auth required pam_exec.so quiet expose_authtok {auth}\n\
         account required pam_exec.so quiet {account}\n"
    );
    std::fs::write(dir.join("pgbouncer"), service).expect("write service");
}

fn start(dir: &TempDir) -> Sluice {
    SluiceBuilder::new()
        .setting("auth_type", "pam")
        .env(
            "SLUICE_PAM_CONFDIR",
            dir.path().to_str().expect("utf-8 path"),
        )
        .start()
}

/// The SQLSTATE a login fails with.
async fn refused(s: &Sluice, user: &str, password: &str) -> String {
    match within(
        T,
        "login",
        s.config(user, password, TEST_DB)
            .connect(tokio_postgres::NoTls),
    )
    .await
    {
        Ok(_) => "logged in".into(),
        Err(e) => e
            .code()
            .map(|c| c.code().to_owned())
            .unwrap_or_else(|| format!("no SQLSTATE: {e}")),
    }
}

#[tokio::test]
async fn pam_checks_the_password_and_the_server_login_uses_it() {
    let dir = TempDir::new("sluice-pam");
    pam_service(&dir);
    // The user is in no auth file: only PAM knows the password, and the server
    // (md5 for this user) gets it from the login PAM accepted.
    let s = start(&dir);
    let c = within(
        T,
        "connect",
        support::connect(&s.config(MD5_USER, MD5_PASSWORD, TEST_DB)),
    )
    .await;
    let who: String = within(T, "query", c.query_one("SELECT current_user::text", &[]))
        .await
        .expect("query")
        .get(0);
    assert_eq!(who, MD5_USER);

    assert_eq!(refused(&s, MD5_USER, "wrong").await, "28P01");
    assert_eq!(refused(&s, "nobody_here", MD5_PASSWORD).await, "28P01");
    // The right password, but the account check says no.
    assert_eq!(refused(&s, SCRAM_USER, SCRAM_PASSWORD).await, "28P01");
    // PgBouncer's words, which name the method.
    let (_, told) = crate::auth::login_error(&s.config(MD5_USER, "wrong", TEST_DB)).await;
    assert_eq!(told, "PAM authentication failed");
    let log = s.log();
    assert!(log.contains("pam_authenticate() failed"), "{log}");
    assert!(log.contains("pam_acct_mgmt() failed"), "{log}");
    // The one logged in was never disturbed.
    let one: i32 = within(T, "query", c.query_one("SELECT 1::int4", &[]))
        .await
        .expect("query after refusals")
        .get(0);
    assert_eq!(one, 1);
}
