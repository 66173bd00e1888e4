//! Session parameters that follow the client from server to server: the values it
//! asked for at startup or later SET, re-applied when it gets a server whose values
//! differ (PgBouncer's "varcache").

use crate::pool::ServerConn;

/// Parameters always tracked, in PostgreSQL's spelling.
pub const BASE_TRACKED: [&str; 5] = [
    "client_encoding",
    "DateStyle",
    "TimeZone",
    "standard_conforming_strings",
    "application_name",
];

/// The tracked parameters as one client wants them.
#[derive(Debug, Default, Clone)]
pub struct ClientParams {
    values: Vec<(String, String)>,
    /// `track_extra_parameters`, in their configured spelling.
    extra: Vec<String>,
}

impl ClientParams {
    pub fn new(extra: &[String]) -> ClientParams {
        ClientParams {
            values: Vec::new(),
            extra: extra.to_vec(),
        }
    }

    /// The canonical spelling of `name` if it is tracked.
    pub fn tracked_name(&self, name: &str) -> Option<String> {
        BASE_TRACKED
            .iter()
            .copied()
            .chain(self.extra.iter().map(String::as_str))
            .find(|t| t.eq_ignore_ascii_case(name))
            .map(str::to_owned)
    }

    /// The client's value for a tracked parameter, if it has one.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.values
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Records the client's value for a tracked parameter; untracked names are ignored.
    pub fn set(&mut self, name: &str, value: &str) {
        let Some(name) = self.tracked_name(name) else {
            return;
        };
        match self.values.iter_mut().find(|(k, _)| *k == name) {
            Some((_, v)) => {
                if v != value {
                    v.clear();
                    v.push_str(value);
                }
            }
            None => self.values.push((name, value.to_owned())),
        }
    }

    /// Fills the tracked parameters the client did not set from the server's initial
    /// values, so a server another client changed is set back (PgBouncer does the same).
    pub fn fill_unset(&mut self, welcome: &[(String, String)]) {
        for (k, v) in welcome {
            if let Some(name) = self.tracked_name(k) {
                if !self.values.iter().any(|(n, _)| *n == name) {
                    self.values.push((name, v.clone()));
                }
            }
        }
        // Kept for the client's whole life: no spare capacity per idle client.
        self.values.shrink_to_fit();
    }

    /// Whether `server` has some tracked parameter at another value than this client.
    pub fn differs(&self, server: &ServerConn) -> bool {
        self.values
            .iter()
            .any(|(k, v)| server.param(k) != Some(v.as_str()))
    }

    /// The SET statements that make `server` match this client, or None if it does.
    pub fn sync_sql(&self, server: &ServerConn) -> Option<String> {
        let mut sql = String::new();
        for (k, v) in &self.values {
            if server.param(k) != Some(v.as_str()) {
                sql.push_str("SET ");
                sql.push_str(k);
                sql.push_str(" = ");
                push_literal(&mut sql, v);
                sql.push(';');
            }
        }
        (!sql.is_empty()).then_some(sql)
    }

    /// The server's welcome parameters with this client's own values laid over them.
    pub fn overlay(&self, welcome: &[(String, String)]) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = welcome.to_vec();
        for (k, v) in &self.values {
            match out.iter_mut().find(|(n, _)| n.eq_ignore_ascii_case(k)) {
                Some((_, old)) => old.clone_from(v),
                None => out.push((k.clone(), v.clone())),
            }
        }
        out
    }
}

/// Appends `v` as a SQL string literal.
fn push_literal(sql: &mut String, v: &str) {
    if v.contains('\\') {
        sql.push('E');
    }
    sql.push('\'');
    for c in v.chars() {
        match c {
            '\'' => sql.push_str("''"),
            '\\' => sql.push_str("\\\\"),
            c => sql.push(c),
        }
    }
    sql.push('\'');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracks_case_insensitively_in_canonical_spelling() {
        let mut p = ClientParams::new(&["IntervalStyle".to_owned()]);
        p.set("datestyle", "ISO, DMY");
        p.set("intervalstyle", "iso_8601");
        p.set("work_mem", "1MB");
        assert_eq!(
            p.values,
            vec![
                ("DateStyle".into(), "ISO, DMY".into()),
                ("IntervalStyle".into(), "iso_8601".into())
            ]
        );
    }

    #[test]
    fn literal_escaping() {
        let mut s = String::new();
        push_literal(&mut s, "it's a\\b");
        assert_eq!(s, "E'it''s a\\\\b'");
    }

    #[test]
    fn overlay_replaces_and_adds() {
        let mut p = ClientParams::new(&[]);
        p.set("application_name", "app");
        let w = vec![
            ("application_name".to_owned(), "".to_owned()),
            ("server_version".to_owned(), "15".to_owned()),
        ];
        let o = p.overlay(&w);
        assert_eq!(o[0].1, "app");
        assert_eq!(o.len(), 2);
    }
}
