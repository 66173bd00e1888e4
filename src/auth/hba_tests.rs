use super::*;

fn hba(text: &str) -> Hba {
    match Hba::parse(text, Path::new("/etc/hba.conf"), None) {
        Ok(h) => h,
        Err(e) => panic!("{e}"),
    }
}

fn err(text: &str) -> String {
    match Hba::parse(text, Path::new("/etc/hba.conf"), None) {
        Ok(_) => "parsed".into(),
        Err(e) => e.to_string(),
    }
}

fn tcp<'a>(ip: &str, tls: bool, database: &'a str, user: &'a str) -> HbaLogin<'a> {
    HbaLogin {
        addr: Some(
            ip.parse()
                .unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)),
        ),
        tls,
        physical_replication: false,
        database,
        user,
    }
}

#[test]
fn first_matching_rule_wins() {
    let h = hba("# comment\n\
         local all all trust\n\
         hostssl app alice 10.0.0.0/8 cert   # trailing comment\n\
         hostnossl all bob 10.1.0.0 255.255.0.0 reject\n\
         host \"all\",sameuser all 127.0.0.1/32 scram-sha-256\n\
         host all all ::1/128 password\n\
         host all all all md5\n");
    let unix = HbaLogin {
        addr: None,
        tls: false,
        physical_replication: false,
        database: "app",
        user: "x",
    };
    assert_eq!(h.method(unix), Some(HbaMethod::Trust));
    assert_eq!(
        h.method(tcp("10.2.3.4", true, "app", "alice")),
        Some(HbaMethod::Cert)
    );
    // Without TLS the hostssl line is passed over.
    assert_eq!(
        h.method(tcp("10.2.3.4", false, "app", "alice")),
        Some(HbaMethod::Md5)
    );
    assert_eq!(
        h.method(tcp("10.1.9.9", false, "x", "bob")),
        Some(HbaMethod::Reject)
    );
    assert_eq!(
        h.method(tcp("10.1.9.9", true, "x", "bob")),
        Some(HbaMethod::Md5)
    );
    // "all" quoted is a database named all; sameuser matches a database named as the user.
    assert_eq!(
        h.method(tcp("127.0.0.1", false, "all", "u")),
        Some(HbaMethod::ScramSha256)
    );
    assert_eq!(
        h.method(tcp("127.0.0.1", false, "u", "u")),
        Some(HbaMethod::ScramSha256)
    );
    assert_eq!(
        h.method(tcp("127.0.0.1", false, "db", "u")),
        Some(HbaMethod::Md5)
    );
    assert_eq!(
        h.method(tcp("::1", false, "db", "u")),
        Some(HbaMethod::Password)
    );
    // An IPv4-mapped IPv6 client is matched as IPv4.
    assert_eq!(
        h.method(tcp("::ffff:10.1.0.1", false, "d", "bob")),
        Some(HbaMethod::Reject)
    );
    let none = hba("host all all 192.168.0.0/16 md5\n");
    assert_eq!(none.method(tcp("10.0.0.1", false, "d", "u")), None);
}

#[test]
fn errors_name_the_line() {
    assert_eq!(
        err("local all all trust\nhost all all 1.2.3.4/40 md5\n"),
        "/etc/hba.conf:2: invalid CIDR mask in address \"1.2.3.4/40\""
    );
    for (line, why) in [
        ("hostgssenc all all all md5", "invalid connection type \"hostgssenc\""),
        ("host all all all", "end-of-line before authentication method"),
        ("host all all all ident", "unsupported authentication method \"ident\""),
        ("host all all all peer", "peer authentication is only for local connections"),
        ("host all all all cert map=x", "map=x needs auth_ident_file"),
        ("host all all all md5 map=x", "map= is only for cert and peer rules"),
        ("host all all all cert clientcert=verify-full", "unsupported option \"clientcert=verify-full\""),
        ("host all +admins all md5", "group names (\"+admins\") are not supported"),
        ("host all all db.example.com md5", "invalid IP address \"db.example.com\" (host names, samehost and samenet are not supported)"),
        ("host all all 10.0.0.0 255.0.255.0 md5", "no valid netmask after \"10.0.0.0\""),
        ("host \"all all all md5", "unterminated quoted string"),
        ("local all @missing-users.txt trust", "/etc/missing-users.txt: cannot read: No such file or directory (os error 2)"),
    ] {
        assert_eq!(err(line), format!("/etc/hba.conf:1: {why}"), "{line}");
    }
}

#[test]
fn names_from_a_file() {
    let dir = crate::config::testdir::TempDir::new("hba", "names");
    let users = dir.write("users.txt", "alice, bob # the admins\ncarol\n");
    let path = users.with_file_name("hba.conf");
    let h = match Hba::parse("host all @users.txt all trust\n", &path, None) {
        Ok(h) => h,
        Err(e) => panic!("{e}"),
    };
    for u in ["alice", "bob", "carol"] {
        assert_eq!(
            h.method(tcp("1.2.3.4", false, "d", u)),
            Some(HbaMethod::Trust),
            "{u}"
        );
    }
    assert_eq!(h.method(tcp("1.2.3.4", false, "d", "dave")), None);
}

#[test]
fn map_options_name_user_name_maps() {
    let ident = crate::auth::ident::IdentMap::parse(
        "certs ops alice\nlocals root bob\n",
        Path::new("/etc/ident.conf"),
    )
    .unwrap_or_default();
    let text = "hostssl all all all cert map=certs\nlocal all all peer map=\"locals\"\nhost all all all cert\n";
    let h = match Hba::parse(text, Path::new("/etc/hba.conf"), Some(ident)) {
        Ok(h) => h,
        Err(e) => panic!("{e}"),
    };
    let chosen = h.choose(tcp("10.0.0.1", true, "db", "alice"));
    assert_eq!(chosen.and_then(|c| c.map), Some("certs"));
    assert_eq!(chosen.map(|c| c.method), Some(HbaMethod::Cert));
    let local = HbaLogin {
        addr: None,
        tls: false,
        physical_replication: false,
        database: "db",
        user: "bob",
    };
    assert_eq!(h.choose(local).and_then(|c| c.map), Some("locals"));
    // Without TLS the third rule: no map.
    assert_eq!(
        h.choose(tcp("10.0.0.1", false, "db", "alice"))
            .and_then(|c| c.map),
        None
    );
    assert!(h.name_allowed(Some("certs"), "ops", "alice"));
    assert!(!h.name_allowed(Some("certs"), "alice", "alice"));
    assert!(!h.name_allowed(Some("locals"), "ops", "alice"));
    assert!(h.name_allowed(None, "alice", "alice"));
    assert!(!h.name_allowed(None, "ops", "alice"));
}

#[test]
fn ldap_rules_carry_their_options() {
    let h = hba(concat!(
        "host all a all ldap ldapserver=\"h1 h2\",ldapport=3890 ldapprefix=\"uid=\" ",
        "ldapsuffix=\", dc=x, dc=y\"\n",
        "host all all all ldap\n",
    ));
    let chosen = h.choose(tcp("10.0.0.1", false, "db", "a")).expect("rule 1");
    assert_eq!(chosen.method, HbaMethod::Ldap);
    let o = chosen.ldap.expect("options");
    assert_eq!(o.uris().as_deref(), Some("ldap://h1:3890 ldap://h2:3890"));
    assert_eq!(o.suffix.as_deref(), Some(", dc=x, dc=y"));
    // The second rule gives none: it takes auth_ldap_options, and says where it is.
    assert_eq!(
        h.choose(tcp("10.0.0.1", false, "db", "b"))
            .expect("rule 2")
            .ldap,
        None
    );
    assert_eq!(h.first_bare_ldap_rule(), Some(2));
    assert!(err("host all all all ldap ldapserver=h\n").contains("requires argument"));
    assert!(err("host all all all ldap ldaptls\n").contains("key=value"));
    assert!(err("host all all all md5 ldapserver=h\n").contains("unsupported option"));
}

#[test]
fn physical_replication_matches_the_replication_keyword_only() {
    let h = hba("host replication repl 10.0.0.0/8 md5\nhost all all all trust\n");
    let mut l = tcp("10.0.0.1", false, "db", "repl");
    assert_eq!(h.method(l), Some(HbaMethod::Trust), "a plain login");
    l.physical_replication = true;
    assert_eq!(h.method(l), Some(HbaMethod::Md5));
    l.user = "other";
    assert_eq!(h.method(l), None, "`all` matches no physical replication");
}
