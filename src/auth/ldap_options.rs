//! The options of an LDAP login, as PostgreSQL's pg_hba.conf names them and
//! PgBouncer 1.25 takes them: in `auth_ldap_options` (for `auth_type = ldap`) or
//! after an `ldap` rule's method in `auth_hba_file`.
//!
//! Two modes, never mixed: a *simple bind* as `ldapprefix` + user + `ldapsuffix`, or
//! *search and bind*: bind as `ldapbinddn` (anonymously without one), search
//! `ldapbasedn` for the one entry whose `ldapsearchattribute` (default `uid`) is the
//! user name, or that `ldapsearchfilter` (with `$username` replaced) finds, then bind
//! as that entry. `ldapurl` sets the server, port, base DN, attribute, scope and
//! filter in one. Checked when the configuration loads, so a mistake is an error at
//! its file and line (PgBouncer finds it at the first login).

/// A search's scope (RFC 4511's numbers, which libldap takes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Base = 0,
    OneLevel = 1,
    Subtree = 2,
}

/// One login method's LDAP settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LdapOptions {
    /// `ldap` or `ldaps`.
    pub scheme: String,
    /// Space-separated host names; none: looked up by DNS SRV from the base DN.
    pub server: Option<String>,
    /// 0: the scheme's (389, 636).
    pub port: u16,
    /// StartTLS before binding.
    pub tls: bool,
    pub basedn: Option<String>,
    pub binddn: Option<String>,
    pub bindpasswd: Option<String>,
    pub searchattribute: Option<String>,
    pub searchfilter: Option<String>,
    pub prefix: Option<String>,
    pub suffix: Option<String>,
    pub scope: Scope,
}

impl Default for LdapOptions {
    fn default() -> Self {
        LdapOptions {
            scheme: "ldap".into(),
            server: None,
            port: 0,
            tls: false,
            basedn: None,
            binddn: None,
            bindpasswd: None,
            searchattribute: None,
            searchfilter: None,
            prefix: None,
            suffix: None,
            scope: Scope::Subtree,
        }
    }
}

impl LdapOptions {
    /// Parses `auth_ldap_options`: `key=value` pairs separated by spaces or a
    /// comma; a key or value in double quotes may hold spaces and commas (`""` is a
    /// quote). No space may follow `=`.
    pub fn parse(text: &str) -> Result<LdapOptions, String> {
        LdapOptions::from_pairs(split_pairs(text)?)
    }

    /// Builds and checks the options from `key=value` items.
    pub fn from_pairs<I: IntoIterator<Item = (String, String)>>(
        pairs: I,
    ) -> Result<LdapOptions, String> {
        let mut o = LdapOptions::default();
        for (key, value) in pairs {
            let v = Some(value.clone());
            match key.as_str() {
                "ldaptls" => o.tls = value == "1",
                "ldapscheme" => {
                    if value != "ldap" && value != "ldaps" {
                        return Err(format!("invalid ldapscheme value: \"{value}\""));
                    }
                    o.scheme = value;
                }
                "ldapport" => {
                    o.port = value
                        .parse::<u16>()
                        .ok()
                        .filter(|p| *p != 0)
                        .ok_or_else(|| format!("invalid LDAP port number: \"{value}\""))?;
                }
                "ldapserver" => o.server = v,
                "ldapbinddn" => o.binddn = v,
                "ldapsearchattribute" => o.searchattribute = v,
                "ldapsearchfilter" => o.searchfilter = v,
                "ldapbasedn" => o.basedn = v,
                "ldapbindpasswd" => o.bindpasswd = v,
                "ldapprefix" => o.prefix = v,
                "ldapsuffix" => o.suffix = v,
                "ldapurl" => url(&mut o, &value)?,
                _ => return Err(format!("invalid LDAP key parameter: \"{key}\"")),
            }
        }
        o.check()?;
        Ok(o)
    }

    /// PostgreSQL's rules for which options go together.
    fn check(&self) -> Result<(), String> {
        if self.prefix.is_some() || self.suffix.is_some() {
            if self.basedn.is_some()
                || self.binddn.is_some()
                || self.bindpasswd.is_some()
                || self.searchattribute.is_some()
                || self.searchfilter.is_some()
            {
                return Err("cannot use ldapbasedn, ldapbinddn, ldapbindpasswd, \
                            ldapsearchattribute, ldapsearchfilter, or ldapurl together with \
                            ldapprefix"
                    .into());
            }
        } else if self.basedn.is_none() {
            return Err(
                "authentication method \"ldap\" requires argument \"ldapbasedn\", \
                        \"ldapprefix\", or \"ldapsuffix\" to be set"
                    .into(),
            );
        }
        if self.searchattribute.is_some() && self.searchfilter.is_some() {
            return Err("cannot use ldapsearchattribute together with ldapsearchfilter".into());
        }
        Ok(())
    }

    /// The port to use.
    pub fn port(&self) -> u16 {
        match (self.port, self.scheme.as_str()) {
            (0, "ldaps") => 636,
            (0, _) => 389,
            (p, _) => p,
        }
    }

    /// The space-separated URIs libldap is to try, from `ldapserver`; None when the
    /// servers are to be found by DNS SRV.
    pub fn uris(&self) -> Option<String> {
        let hosts = self.server.as_deref().filter(|s| !s.trim().is_empty())?;
        let uris: Vec<String> = hosts
            .split(' ')
            .filter(|h| !h.is_empty())
            .map(|h| format!("{}://{h}:{}", self.scheme, self.port()))
            .collect();
        Some(uris.join(" "))
    }

    /// The search filter for `user`.
    pub fn filter(&self, user: &str) -> String {
        match &self.searchfilter {
            Some(f) => f.replace("$username", user),
            None => format!("({}={user})", self.attribute()),
        }
    }

    /// The attribute a search asks for (and matches, without a filter).
    pub fn attribute(&self) -> &str {
        self.searchattribute.as_deref().unwrap_or("uid")
    }
}

/// Splits `auth_ldap_options` into its pairs (PgBouncer's reading of the string).
fn split_pairs(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        rest = rest.trim_start();
        rest = rest.strip_prefix(',').unwrap_or(rest).trim_start();
        if rest.is_empty() {
            break;
        }
        let (key, after) = if rest.starts_with('"') {
            let (k, after) = quoted(rest)?;
            (k, after)
        } else {
            let end = rest.find('=').unwrap_or(rest.len());
            (rest[..end].to_string(), &rest[end..])
        };
        let Some(after) = after.strip_prefix('=') else {
            return Err(format!("expected key=value at \"{rest}\""));
        };
        if after.starts_with(char::is_whitespace) || after.is_empty() {
            return Err(format!("no value for LDAP option \"{key}\""));
        }
        let (value, after) = if after.starts_with('"') {
            quoted(after)?
        } else {
            let end = after
                .find(|c: char| c.is_whitespace() || c == ',')
                .unwrap_or(after.len());
            (after[..end].to_string(), &after[end..])
        };
        if key.is_empty() || value.is_empty() {
            return Err(format!("empty key or value in LDAP option at \"{rest}\""));
        }
        out.push((key, value));
        rest = after;
    }
    Ok(out)
}

/// A double-quoted string at the start of `s` (`""` inside is a quote), and what
/// follows it.
fn quoted(s: &str) -> Result<(String, &str), String> {
    let mut out = String::new();
    let mut chars = s.char_indices().skip(1).peekable();
    while let Some((i, c)) = chars.next() {
        if c == '"' {
            if chars.peek().map(|&(_, c)| c) == Some('"') {
                chars.next();
                out.push('"');
                continue;
            }
            return Ok((out, &s[i + 1..]));
        }
        out.push(c);
    }
    Err("unterminated quoted string in LDAP options".into())
}

/// Reads an `ldapurl` (RFC 4516: `ldap[s]://host[:port]/basedn[?attr[?scope[?filter]]]`)
/// into `o`. As with libldap's reading, a URL without a scope searches the base only.
fn url(o: &mut LdapOptions, value: &str) -> Result<(), String> {
    let bad = |why: &str| format!("could not parse LDAP URL \"{value}\": {why}");
    let (scheme, rest) = value.split_once("://").ok_or_else(|| bad("no scheme"))?;
    if scheme != "ldap" && scheme != "ldaps" {
        return Err(format!("unsupported LDAP URL scheme: {scheme}"));
    }
    o.scheme = scheme.to_string();
    let (hostport, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (host, port) = match hostport.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || hostport.starts_with('[') => {
            let port = p.parse::<u16>().map_err(|_| bad("bad port"))?;
            (h, port)
        }
        _ => (hostport, 0),
    };
    if !host.is_empty() {
        o.server = Some(decode(host).ok_or_else(|| bad("bad escape"))?);
    }
    o.port = port;
    let mut parts = path.splitn(5, '?');
    let field = |p: Option<&str>| -> Result<Option<String>, String> {
        match p.filter(|s| !s.is_empty()) {
            Some(s) => decode(s).map(Some).ok_or_else(|| bad("bad escape")),
            None => Ok(None),
        }
    };
    o.basedn = field(parts.next())?;
    // Only the first attribute is used, as in PostgreSQL.
    o.searchattribute = field(parts.next())?.map(|a| a.split(',').next().unwrap_or("").to_string());
    o.scope = match field(parts.next())?.as_deref() {
        None | Some("base") => Scope::Base,
        Some("one") => Scope::OneLevel,
        Some("sub") => Scope::Subtree,
        Some(other) => return Err(bad(&format!("bad scope \"{other}\""))),
    };
    o.searchfilter = field(parts.next())?;
    Ok(())
}

/// Percent-decoding; None for a malformed escape or bytes that are not UTF-8.
fn decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simple_bind_options() {
        let o = LdapOptions::parse(
            r#"ldapserver=ldap.example.net ldapprefix="cn=" ldapsuffix=", dc=example, dc=net""#,
        )
        .expect("parse");
        assert_eq!(o.server.as_deref(), Some("ldap.example.net"));
        assert_eq!(o.prefix.as_deref(), Some("cn="));
        assert_eq!(o.suffix.as_deref(), Some(", dc=example, dc=net"));
        assert_eq!(o.uris().as_deref(), Some("ldap://ldap.example.net:389"));
    }

    #[test]
    fn search_options_with_commas_and_quotes() {
        let o = LdapOptions::parse(
            r#"ldapserver="a b", ldapport=3890,ldapbasedn="dc=x" ldapsearchfilter="(|(uid=$username)(mail=$username))" ldapbinddn="cn=""q""""#,
        )
        .expect("parse");
        assert_eq!(o.uris().as_deref(), Some("ldap://a:3890 ldap://b:3890"));
        assert_eq!(o.filter("bob"), "(|(uid=bob)(mail=bob))");
        assert_eq!(o.binddn.as_deref(), Some("cn=\"q\""));
        assert_eq!(o.scope, Scope::Subtree);
        let plain = LdapOptions::parse("ldapbasedn=dc=x ldapsearchattribute=cn").expect("parse");
        assert_eq!(plain.filter("bob"), "(cn=bob)");
        assert_eq!(plain.uris(), None);
    }

    #[test]
    fn urls() {
        let o = LdapOptions::parse("ldapurl=ldaps://h:1636/ou=p%2Cdc=x??sub?(o=1)").expect("url");
        assert_eq!(o.scheme, "ldaps");
        assert_eq!(o.uris().as_deref(), Some("ldaps://h:1636"));
        assert_eq!(o.basedn.as_deref(), Some("ou=p,dc=x"));
        assert_eq!(o.searchfilter.as_deref(), Some("(o=1)"));
        assert_eq!(o.scope, Scope::Subtree);
        let o = LdapOptions::parse("ldapurl=\"ldap://h/dc=x?cn,sn?one\"").expect("url");
        assert_eq!(o.searchattribute.as_deref(), Some("cn"));
        assert_eq!(o.scope, Scope::OneLevel);
        let o = LdapOptions::parse("ldapurl=ldap://h/dc=x").expect("url");
        assert_eq!((o.port(), o.scope), (389, Scope::Base));
        for bad in [
            "ldapurl=http://h/dc=x",
            "ldapurl=ldap://h:x/dc=x",
            "ldapurl=ldap://h/dc=x??bad",
        ] {
            assert!(LdapOptions::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn refused_combinations_and_values() {
        for (text, want) in [
            ("ldapserver=h", "requires argument"),
            ("ldapprefix=cn= ldapbasedn=dc=x", "together with ldapprefix"),
            (
                "ldapbasedn=dc=x ldapsearchattribute=a ldapsearchfilter=(a=1)",
                "together with",
            ),
            ("ldapbasedn=dc=x ldapport=0", "invalid LDAP port"),
            ("ldapbasedn=dc=x ldapscheme=http", "invalid ldapscheme"),
            ("ldapbasedn=dc=x ldapfoo=1", "invalid LDAP key"),
            ("ldapbasedn= dc=x", "no value"),
            ("ldapbasedn=\"dc=x", "unterminated"),
            ("ldapbasedn", "expected key=value"),
        ] {
            let e = LdapOptions::parse(text).expect_err(text);
            assert!(e.contains(want), "{text}: {e}");
        }
    }
}
