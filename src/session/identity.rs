//! Logins proved by who the client is rather than by a password: `cert` (its TLS
//! certificate's name), `peer` (its OS user), and `hba`, which picks a method by
//! `auth_hba_file`'s rules from how the client came in.

use super::ClientError;
use crate::config::{AuthType, Config, DatabaseEntry};
use crate::net::Stream;
use crate::protocol::sqlstate::INVALID_AUTHORIZATION;
use crate::tls::TlsPeer;

/// How a client came in: its address (None on the UNIX socket) and its TLS session.
#[derive(Debug, Clone, Copy)]
pub struct Came<'a> {
    pub addr: Option<std::net::IpAddr>,
    pub tls: &'a TlsPeer,
}

fn refuse(message: &str) -> ClientError {
    ClientError::fatal(INVALID_AUTHORIZATION, message.into())
}

/// `cert`, as PgBouncer: the user name must be the certificate's common name. Only a
/// certificate that verified against client_tls_ca_file is ever present.
pub fn cert(tls: &TlsPeer, user: &str) -> Result<(), ClientError> {
    match (&tls.common_name, tls.info.is_tls()) {
        (_, false) => Err(refuse("TLS connection required")),
        (None, true) => Err(refuse("TLS client certificate required")),
        (Some(name), true) if name != user => Err(refuse("TLS certificate name mismatch")),
        (Some(_), true) => Ok(()),
    }
}

/// `peer`: the OS user at the other end of the UNIX socket must be the user name.
/// Only for clients that came in on it (checked twice: a TCP client has no peer uid).
pub fn peer(stream: &Stream, came: Came<'_>, user: &str) -> Result<(), ClientError> {
    let uid = stream.peer_uid().filter(|_| came.addr.is_none());
    let os_user = uid.and_then(crate::lifecycle::os::user_name);
    if os_user.as_deref() == Some(user) {
        Ok(())
    } else {
        Err(refuse("peer authentication failed"))
    }
}

/// `auth_type = hba`: the auth type the first matching rule names; `reject`, or no
/// rule, refuses the login (`login rejected`, as PgBouncer).
pub fn hba_method(
    cfg: &Config,
    db: &DatabaseEntry,
    user: &str,
    came: Came<'_>,
) -> Result<AuthType, ClientError> {
    use crate::auth::hba::{HbaLogin, HbaMethod};
    let login = HbaLogin {
        addr: came.addr,
        tls: came.tls.info.is_tls(),
        database: &db.name,
        user,
    };
    let method = cfg.hba.as_deref().and_then(|h| h.method(login));
    match method {
        Some(HbaMethod::Trust) => Ok(AuthType::Trust),
        Some(HbaMethod::Md5) => Ok(AuthType::Md5),
        Some(HbaMethod::Password) => Ok(AuthType::Plain),
        Some(HbaMethod::ScramSha256) => Ok(AuthType::ScramSha256),
        Some(HbaMethod::Cert) => Ok(AuthType::Cert),
        Some(HbaMethod::Peer) => Ok(AuthType::Peer),
        Some(HbaMethod::Reject) | None => Err(refuse("login rejected")),
    }
}
