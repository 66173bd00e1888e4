//! The little of a pgbouncer.ini that floor reads.

use crate::die;

/// What floor reads of a pgbouncer.ini: the listeners, the pool size, and where the
/// first database lives. Everything else is ignored.
pub(crate) struct Settings {
    pub(crate) port: u16,
    pub(crate) unix_dir: Option<String>,
    pub(crate) pool: usize,
    /// `{host}/.s.PGSQL.{port}` of the first `[databases]` entry (a socket directory).
    pub(crate) pg_path: String,
    pub(crate) dbname: String,
    /// The entry's `user`, else the first client's.
    pub(crate) user: Option<String>,
}

pub(crate) fn read_ini(path: &str) -> Settings {
    let text = std::fs::read_to_string(path).unwrap_or_else(|_| die("read the ini"));
    let (mut section, mut port, mut unix_dir, mut pool) = (String::new(), 6432, None, 20);
    let mut db = None;
    for line in text.lines().map(str::trim) {
        if line.starts_with([';', '#']) || line.is_empty() {
            continue;
        }
        if let Some(name) = line.strip_prefix('[') {
            section = name.trim_end_matches(']').to_string();
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        match (section.as_str(), key) {
            ("pgbouncer", "listen_port") => {
                port = value.parse().unwrap_or_else(|_| die("listen_port"))
            }
            ("pgbouncer", "unix_socket_dir") if !value.is_empty() => {
                unix_dir = Some(value.to_string())
            }
            ("pgbouncer", "default_pool_size") => {
                pool = value.parse().unwrap_or_else(|_| die("pool size"))
            }
            ("databases", name) if db.is_none() => {
                let (mut host, mut pgport, mut dbname) = ("/tmp", "5432", name);
                let mut user = None;
                for kv in value.split_whitespace() {
                    match kv.split_once('=') {
                        Some(("host", v)) => host = v,
                        Some(("port", v)) => pgport = v,
                        Some(("dbname", v)) => dbname = v,
                        Some(("user", v)) => user = Some(v.to_string()),
                        _ => {}
                    }
                }
                db = Some((
                    format!("{host}/.s.PGSQL.{pgport}"),
                    dbname.to_string(),
                    user,
                ));
            }
            _ => {}
        }
    }
    let (pg_path, dbname, user) = db.unwrap_or_else(|| die("no [databases] entry"));
    Settings {
        user,
        port,
        unix_dir,
        pool,
        pg_path,
        dbname,
    }
}
