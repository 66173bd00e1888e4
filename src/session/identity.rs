//! Logins proved by who the client is rather than by a password: `cert` (its TLS
//! certificate's name), `peer` (its OS user), and `hba`, which picks a method by
//! `auth_hba_file`'s rules from how the client came in.

use super::ClientError;
use crate::auth::hba::Hba;
use crate::auth::LdapOptions;
use crate::config::{AuthType, Config, DatabaseEntry};
use crate::net::Stream;
use crate::protocol::sqlstate::INVALID_AUTHORIZATION;
use crate::tls::TlsPeer;

/// How a client came in: its address (None on the UNIX socket) and its TLS session.
#[derive(Debug, Clone, Copy)]
pub struct Came<'a> {
    pub addr: Option<std::net::IpAddr>,
    pub tls: &'a TlsPeer,
    /// A physical replication connection, which only hba rules for the
    /// `replication` database match.
    pub physical_replication: bool,
    /// Its `C-<id>` and peer, for the log lines of its login.
    pub id: u64,
    pub peer: &'a crate::net::PeerAddr,
}

fn refuse(message: &str) -> ClientError {
    ClientError::fatal(INVALID_AUTHORIZATION, message.into())
}

/// How a `cert` or `peer` login's outside name must relate to the user name: equal
/// (`auth_type = cert`, or a rule without `map=`), or allowed by a user-name map of
/// `auth_ident_file` (a rule's `map=`).
#[derive(Debug, Clone, Copy)]
pub struct NameCheck<'a> {
    pub hba: Option<&'a Hba>,
    pub map: Option<&'a str>,
}

impl NameCheck<'_> {
    /// The user name itself, no map.
    pub const SAME: NameCheck<'static> = NameCheck {
        hba: None,
        map: None,
    };

    fn allows(&self, system: &str, user: &str) -> bool {
        match (self.hba, self.map) {
            (Some(hba), map) => hba.name_allowed(map, system, user),
            // A map without rules cannot be; no map: the same name.
            (None, Some(_)) => false,
            (None, None) => system == user,
        }
    }
}

/// `cert`, as PgBouncer: the certificate's common name must be the user name, or map
/// to it. Only a certificate that verified against client_tls_ca_file is present.
/// A user neither `auth_file` nor `auth_query` knows is refused, whatever its
/// certificate says. The client is told only PgBouncer's words,
/// `certificate authentication failed`; the log has why.
pub fn cert(
    tls: &TlsPeer,
    user: &str,
    known: bool,
    names: NameCheck<'_>,
    came: Came<'_>,
) -> Result<(), ClientError> {
    let why = match (&tls.common_name, tls.info.is_tls()) {
        (_, false) => "TLS connection required",
        (None, true) => "TLS client certificate required",
        (Some(_), true) if !known => "no such user",
        (Some(name), true) if !names.allows(name, user) => "TLS certificate name mismatch",
        (Some(_), true) => return Ok(()),
    };
    let Came { id, peer, .. } = came;
    tracing::warn!("C-{id}: {user}@{peer} certificate login of user {user}: {why}");
    Err(refuse("certificate authentication failed"))
}

/// `peer`: the OS user at the other end of the UNIX socket must be the user name, or
/// map to it. Only for clients that came in on it (checked twice: a TCP client has
/// no peer uid).
/// A user neither `auth_file` nor `auth_query` knows is refused, as PgBouncer
/// refuses it, in its words (`unix socket login rejected`).
pub fn peer(
    stream: &Stream,
    came: Came<'_>,
    user: &str,
    known: bool,
    names: NameCheck<'_>,
) -> Result<(), ClientError> {
    let uid = stream.peer_uid().filter(|_| came.addr.is_none());
    let os_user = uid.and_then(crate::lifecycle::os::user_name);
    match os_user {
        Some(os_user) if known && names.allows(&os_user, user) => Ok(()),
        _ => Err(refuse("unix socket login rejected")),
    }
}

/// `auth_type = hba`: the auth type the first matching rule names, how a `cert`
/// or `peer` login checks its name, and an `ldap` rule's own options; `reject`, or no rule, refuses the login
/// (`login rejected`, as PgBouncer).
pub fn hba_method<'c>(
    cfg: &'c Config,
    db: &DatabaseEntry,
    user: &str,
    came: Came<'_>,
) -> Result<(AuthType, NameCheck<'c>, Option<&'c LdapOptions>), ClientError> {
    use crate::auth::hba::{HbaLogin, HbaMethod};
    let login = HbaLogin {
        addr: came.addr,
        tls: came.tls.info.is_tls(),
        physical_replication: came.physical_replication,
        database: &db.name,
        user,
    };
    let hba = cfg.hba.as_deref();
    let Some(chosen) = hba.and_then(|h| h.choose(login)) else {
        return Err(refuse("no authentication method is found"));
    };
    let names = NameCheck {
        hba,
        map: chosen.map,
    };
    let auth_type = match chosen.method {
        HbaMethod::Trust => AuthType::Trust,
        HbaMethod::Md5 => AuthType::Md5,
        HbaMethod::Password => AuthType::Plain,
        HbaMethod::ScramSha256 => AuthType::ScramSha256,
        HbaMethod::Cert => AuthType::Cert,
        HbaMethod::Peer => AuthType::Peer,
        HbaMethod::Ldap => AuthType::Ldap,
        HbaMethod::Reject => return Err(refuse("login rejected")),
    };
    Ok((auth_type, names, chosen.ldap))
}
