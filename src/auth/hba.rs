//! `auth_type = hba`: the rules of `auth_hba_file`, in pg_hba.conf's format as
//! PgBouncer reads it. The first rule that matches a login's connection type,
//! database, user and address names the method; no match refuses the login.
//!
//! Supported as in PgBouncer: `local`, `host`, `hostssl`, `hostnossl`; databases `all`,
//! `sameuser`, `replication`, names and `@file`; users `all`, names and `@file`;
//! addresses `all`, CIDR (IPv4 and IPv6) or an address with a netmask; methods
//! `trust`, `reject`, `md5`, `password`, `scram-sha-256`, `cert`, `ldap` (its
//! options PostgreSQL's, `auth/ldap_options.rs`), `peer` (`local` only), and the
//! option `map=NAME` on `cert` and `peer` rules, a user-name map of
//! `auth_ident_file` (`auth/ident.rs`). Not supported (an error at load, naming file
//! and line): `+group` users, `samehost`/`samenet`, host names, other methods, and
//! other options.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use super::ident::IdentMap;
use super::LdapOptions;
use crate::config::ConfigError;

/// What a rule lets a login do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HbaMethod {
    Trust,
    Reject,
    Md5,
    Password,
    ScramSha256,
    Cert,
    Peer,
    Ldap,
}

/// The loaded rules, and the user-name maps their `map=` options name.
#[derive(Debug, Clone, Default)]
pub struct Hba {
    rules: Vec<Rule>,
    ident: IdentMap,
}

/// What the first matching rule says: the method, and for `cert` and `peer` the
/// user-name map to check the name by (None: it must be the user name itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chosen<'a> {
    pub method: HbaMethod,
    pub map: Option<&'a str>,
    /// An `ldap` rule's own options (None: `auth_ldap_options`).
    pub ldap: Option<&'a LdapOptions>,
}

/// A login as the rules see it.
#[derive(Debug, Clone, Copy)]
pub struct HbaLogin<'a> {
    /// None for a UNIX-socket client.
    pub addr: Option<IpAddr>,
    pub tls: bool,
    /// A physical replication connection: only `replication` matches its database.
    pub physical_replication: bool,
    pub database: &'a str,
    pub user: &'a str,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Local,
    Host,
    HostSsl,
    HostNoSsl,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Name {
    All,
    SameUser,
    Replication,
    Literal(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Addr {
    All,
    Net(IpAddr, u8),
}

#[derive(Debug, Clone)]
struct Rule {
    kind: Kind,
    databases: Vec<Name>,
    users: Vec<Name>,
    addr: Addr,
    method: HbaMethod,
    /// `map=`: the user-name map of `auth_ident_file` (cert and peer only).
    map: Option<String>,
    /// An `ldap` rule's options, when it gives any.
    ldap: Option<LdapOptions>,
    /// Its line in the file.
    line: usize,
}

impl Hba {
    /// Reads and parses `file` (`@file` lists are read relative to its directory),
    /// and `ident`, the `auth_ident_file` its `map=` options refer to.
    pub fn load(file: &Path, ident: Option<&Path>) -> Result<Hba, ConfigError> {
        let ident = ident.map(IdentMap::load).transpose()?;
        let text = std::fs::read_to_string(file).map_err(|e| ConfigError::io(file, e))?;
        Hba::parse(&text, file, ident)
    }

    /// Parses the rules in `text`, read from `file`; `ident` is the loaded
    /// `auth_ident_file`, if one is set.
    pub fn parse(text: &str, file: &Path, ident: Option<IdentMap>) -> Result<Hba, ConfigError> {
        let dir = file.parent().unwrap_or(Path::new("."));
        let mut rules = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let at = |m: String| ConfigError::at(file, i + 1, m);
            let fields = tokens(line).map_err(at)?;
            if fields.is_empty() {
                continue;
            }
            let mut rule = rule(&fields, dir).map_err(at)?;
            rule.line = i + 1;
            if let (Some(map), None) = (&rule.map, &ident) {
                return Err(at(format!("map={map} needs auth_ident_file")));
            }
            rules.push(rule);
        }
        Ok(Hba {
            rules,
            ident: ident.unwrap_or_default(),
        })
    }

    /// The line of the first `ldap` rule that gives no options (it takes
    /// `auth_ldap_options`).
    pub fn first_bare_ldap_rule(&self) -> Option<usize> {
        self.rules
            .iter()
            .find(|r| r.method == HbaMethod::Ldap && r.ldap.is_none())
            .map(|r| r.line)
    }

    /// The method of the first rule matching `login`; None if none does.
    pub fn method(&self, login: HbaLogin<'_>) -> Option<HbaMethod> {
        self.choose(login).map(|c| c.method)
    }

    /// What the first rule matching `login` says; None if none does.
    pub fn choose(&self, login: HbaLogin<'_>) -> Option<Chosen<'_>> {
        let rule = self.rules.iter().find(|r| r.matches(login))?;
        Some(Chosen {
            method: rule.method,
            map: rule.map.as_deref(),
            ldap: rule.ldap.as_ref(),
        })
    }

    /// Whether `system` (a certificate's name, an OS user) may log in as `user`:
    /// the same name without a map, a line of map `map` with one.
    pub fn name_allowed(&self, map: Option<&str>, system: &str, user: &str) -> bool {
        match map {
            None => system == user,
            Some(map) => self.ident.allows(map, system, user),
        }
    }
}

impl Rule {
    fn matches(&self, l: HbaLogin<'_>) -> bool {
        let kind = match (self.kind, l.addr) {
            (Kind::Local, None) => true,
            (Kind::Host, Some(_)) => true,
            (Kind::HostSsl, Some(_)) => l.tls,
            (Kind::HostNoSsl, Some(_)) => !l.tls,
            _ => false,
        };
        let addr = match (&self.addr, l.addr) {
            (Addr::All, _) => true,
            (Addr::Net(net, bits), Some(ip)) => in_net(ip, *net, *bits),
            (Addr::Net(..), None) => false,
        };
        // As in PostgreSQL: a physical replication connection matches `replication`
        // alone; a logical one, like any other, its database (`all` included).
        let database = self.databases.iter().any(|n| match n {
            Name::Replication => l.physical_replication,
            _ if l.physical_replication => false,
            Name::All => true,
            Name::SameUser => l.database == l.user,
            Name::Literal(d) => d == l.database,
        });
        let user = self.users.iter().any(|n| match n {
            Name::Literal(u) => u == l.user,
            _ => true,
        });
        kind && addr && database && user
    }
}

/// Whether `ip` is in `net`/`bits` (an IPv4-mapped IPv6 client counts as IPv4).
fn in_net(ip: IpAddr, net: IpAddr, bits: u8) -> bool {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

/// A field's items: (text, whether it was quoted).
pub(super) type Field = Vec<(String, bool)>;

/// Splits a line into fields of comma-separated items, as pg_hba.conf: `#` starts a
/// comment, double quotes keep spaces, commas and keywords literal.
pub(super) fn tokens(line: &str) -> Result<Vec<Field>, String> {
    let mut fields: Vec<Field> = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        match chars.peek() {
            None | Some('#') => return Ok(fields),
            _ => {}
        }
        let mut field = Vec::new();
        loop {
            let (mut item, mut quoted, mut in_quotes) = (String::new(), false, false);
            while let Some(&c) = chars.peek() {
                if !in_quotes && (c.is_whitespace() || c == ',' || c == '#') {
                    break;
                }
                chars.next();
                if c == '"' {
                    in_quotes = !in_quotes;
                    quoted = true;
                } else {
                    item.push(c);
                }
            }
            if in_quotes {
                return Err("unterminated quoted string".into());
            }
            field.push((item, quoted));
            if chars.next_if_eq(&',').is_none() {
                break;
            }
        }
        fields.push(field);
    }
}

fn rule(fields: &[Field], dir: &Path) -> Result<Rule, String> {
    let word = |f: &Field| match f.as_slice() {
        [(w, false)] => Ok(w.to_ascii_lowercase()),
        _ => Err(format!("expected one word, got {}", join(f))),
    };
    let kind = match word(&fields[0])?.as_str() {
        "local" => Kind::Local,
        "host" => Kind::Host,
        "hostssl" => Kind::HostSsl,
        "hostnossl" => Kind::HostNoSsl,
        other => return Err(format!("invalid connection type \"{other}\"")),
    };
    let need = if kind == Kind::Local { 4 } else { 5 };
    if fields.len() < need {
        return Err("end-of-line before authentication method".into());
    }
    let databases = names(&fields[1], dir, true)?;
    let users = names(&fields[2], dir, false)?;
    let (addr, rest) = if kind == Kind::Local {
        (Addr::All, &fields[3..])
    } else {
        address(&fields[3..])?
    };
    let method = match rest.first().map(word).transpose()?.as_deref() {
        Some("trust") => HbaMethod::Trust,
        Some("reject") => HbaMethod::Reject,
        Some("md5") => HbaMethod::Md5,
        Some("password") => HbaMethod::Password,
        Some("scram-sha-256") => HbaMethod::ScramSha256,
        Some("cert") => HbaMethod::Cert,
        Some("ldap") => HbaMethod::Ldap,
        Some("peer") if kind == Kind::Local => HbaMethod::Peer,
        Some("peer") => return Err("peer authentication is only for local connections".into()),
        Some(other) => return Err(format!("unsupported authentication method \"{other}\"")),
        None => return Err("end-of-line before authentication method".into()),
    };
    let (mut map, mut ldap) = (None, None);
    if method == HbaMethod::Ldap {
        // Every option is the server's (`ldapserver=...`), PostgreSQL's names.
        let mut pairs = Vec::new();
        for (item, _) in rest[1..].iter().flatten() {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| format!("expected an LDAP option as key=value, got \"{item}\""))?;
            pairs.push((k.to_owned(), v.to_owned()));
        }
        if !pairs.is_empty() {
            ldap = Some(LdapOptions::from_pairs(pairs)?);
        }
    }
    let others = if method == HbaMethod::Ldap {
        &[][..]
    } else {
        &rest[1..]
    };
    for option in others {
        match option.as_slice() {
            [(o, _)] if o.starts_with("map=") => {
                if !matches!(method, HbaMethod::Cert | HbaMethod::Peer) {
                    return Err("map= is only for cert and peer rules".into());
                }
                let name = &o["map=".len()..];
                if name.is_empty() || name.starts_with('/') {
                    return Err(format!("invalid map name in {}", join(option)));
                }
                map = Some(name.to_owned());
            }
            _ => return Err(format!("unsupported option {}", join(option))),
        }
    }
    Ok(Rule {
        kind,
        databases,
        users,
        addr,
        method,
        map,
        ldap,
        line: 0,
    })
}

/// A database or user field.
fn names(field: &Field, dir: &Path, database: bool) -> Result<Vec<Name>, String> {
    let mut out = Vec::new();
    for (item, quoted) in field {
        let name = match (item.as_str(), quoted) {
            (n, true) => Name::Literal(n.to_owned()),
            ("all", false) => Name::All,
            ("sameuser", false) if database => Name::SameUser,
            ("replication", false) if database => Name::Replication,
            (n, false) if n.starts_with('@') => {
                let path: PathBuf = dir.join(&n[1..]);
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
                for line in text.lines() {
                    let line = line.split('#').next().unwrap_or("");
                    let listed = line.split(|c: char| c == ',' || c.is_whitespace());
                    for n in listed.filter(|n| !n.is_empty()) {
                        out.push(Name::Literal(n.to_owned()));
                    }
                }
                continue;
            }
            (n, false) if n.starts_with('+') => {
                return Err(format!("group names (\"{n}\") are not supported"));
            }
            ("samerole" | "samegroup", false) => {
                return Err(format!("\"{item}\" is not supported"));
            }
            (n, false) => Name::Literal(n.to_owned()),
        };
        out.push(name);
    }
    Ok(out)
}

/// The address field (`all`, CIDR, or an address and a mask in the next field);
/// returns it and the fields after it.
fn address(fields: &[Field]) -> Result<(Addr, &[Field]), String> {
    let [(text, false)] = fields[0].as_slice() else {
        return Err(format!("invalid address {}", join(&fields[0])));
    };
    if text == "all" {
        return Ok((Addr::All, &fields[1..]));
    }
    if let Some((ip, bits)) = text.split_once('/') {
        let ip: IpAddr = ip
            .parse()
            .map_err(|_| format!("invalid IP address \"{ip}\""))?;
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let bits = (bits.parse::<u8>().ok())
            .filter(|b| *b <= max)
            .ok_or_else(|| format!("invalid CIDR mask in address \"{text}\""))?;
        return Ok((Addr::Net(ip, bits), &fields[1..]));
    }
    let Ok(ip) = text.parse::<IpAddr>() else {
        return Err(format!(
            "invalid IP address \"{text}\" (host names, samehost and samenet are not supported)"
        ));
    };
    let mask = match fields.get(1).map(|f| f.as_slice()) {
        Some([(m, false)]) => m.parse::<IpAddr>().ok(),
        _ => None,
    };
    let bits = match mask {
        Some(IpAddr::V4(m)) if ip.is_ipv4() => prefix(u128::from(u32::from(m)) << 96),
        Some(IpAddr::V6(m)) if ip.is_ipv6() => prefix(u128::from(m)),
        _ => None,
    };
    let bits = bits.ok_or_else(|| format!("no valid netmask after \"{text}\""))?;
    let bits = if ip.is_ipv4() { bits.min(32) } else { bits };
    Ok((Addr::Net(ip, bits), &fields[2..]))
}

/// The prefix length of a contiguous netmask (left-aligned in 128 bits).
fn prefix(mask: u128) -> Option<u8> {
    let ones = mask.leading_ones();
    (mask.checked_shl(ones).unwrap_or(0) == 0).then_some(ones as u8)
}

fn join(f: &Field) -> String {
    let items: Vec<&str> = f.iter().map(|(s, _)| s.as_str()).collect();
    format!("\"{}\"", items.join(","))
}

#[cfg(test)]
#[path = "hba_tests.rs"]
mod tests;
