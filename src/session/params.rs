//! Session parameters that follow the client from server to server: the values it
//! asked for at startup or later SET, re-applied when it gets a server whose values
//! differ (PgBouncer's "varcache").

use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};

use crate::pool::ServerConn;
use crate::protocol::backend;

/// Parameters always tracked, in PostgreSQL's spelling.
pub const BASE_TRACKED: [&str; 5] = [
    "client_encoding",
    "DateStyle",
    "TimeZone",
    "standard_conforming_strings",
    "application_name",
];

/// The tracked parameters as one client wants them.
///
/// The values live in a shared, copy-on-write set: clients of a pool that want the
/// same values hold one copy (an idle client keeps a pointer, not a dozen strings),
/// and a server remembers the set it was last found to match, so the check at each
/// checkout is a pointer compare.
#[derive(Debug, Clone)]
pub struct ClientParams {
    set: Arc<ParamSet>,
}

/// The canonical spelling of `name` if it is tracked, given `track_extra_parameters`.
pub fn canonical<'a>(extra: &'a [String], name: &str) -> Option<&'a str> {
    BASE_TRACKED
        .iter()
        .copied()
        .chain(extra.iter().map(String::as_str))
        .find(|t| t.eq_ignore_ascii_case(name))
}

/// The tracked parameters of a startup packet, borrowed from it, in the order and
/// spelling [`ClientParams::set`] would give them: most clients of a pool give the
/// same ones as the last, and then share its set without building one of their own
/// ([`SharedParams::reuse`]).
#[derive(Debug, Default)]
pub struct StartupTracked<'a> {
    pairs: [(&'a str, &'a str); 8],
    len: usize,
    /// Those past the first 8 (many `track_extra_parameters` given at once): rare,
    /// so only they take a heap allocation.
    more: Vec<(&'a str, &'a str)>,
}

impl<'a> StartupTracked<'a> {
    /// Notes a tracked parameter's value (`name` in canonical spelling); a repeated
    /// name keeps its place and takes the new value, as in [`ClientParams::set`].
    /// Whether `name` (canonical) was given.
    pub fn has(&self, name: &str) -> bool {
        self.iter().any(|(k, _)| *k == name)
    }

    pub fn set(&mut self, name: &'a str, value: &'a str) {
        let (first, more) = (&mut self.pairs[..self.len], &mut self.more);
        if let Some(p) = first
            .iter_mut()
            .chain(more.iter_mut())
            .find(|(k, _)| *k == name)
        {
            p.1 = value;
        } else if self.len < self.pairs.len() {
            self.pairs[self.len] = (name, value);
            self.len += 1;
        } else {
            self.more.push((name, value));
        }
    }

    /// The pairs, in order.
    fn iter(&self) -> impl Iterator<Item = &(&'a str, &'a str)> {
        self.pairs[..self.len].iter().chain(&self.more)
    }

    fn count(&self) -> usize {
        self.len + self.more.len()
    }
}

/// Whether `server` has every tracked parameter of `set` at its value. A match is
/// remembered on the server, so the next check is a pointer compare.
pub fn matches(set: &Arc<ParamSet>, server: &mut ServerConn) -> bool {
    if server
        .params
        .matched
        .as_ref()
        .is_some_and(|m| Arc::ptr_eq(m, set))
    {
        return true;
    }
    let matches = set
        .values
        .iter()
        .all(|(k, v)| server.param(k) == Some(v.as_str()));
    if matches {
        server.params.matched = Some(set.clone());
    }
    matches
}

/// Tracked parameter values, shared between clients and remembered by servers.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ParamSet {
    values: Vec<(String, String)>,
    /// `track_extra_parameters`, in their configured spelling.
    extra: Vec<String>,
    /// A replication client's `options`, passed to its server as given.
    options: Option<Box<str>>,
}

/// The parameter set a pool's newest client got: the next client with the same
/// values shares it rather than keeping a copy of its own, and gets the welcome's
/// ParameterStatus messages already written.
#[derive(Debug, Default)]
pub struct SharedParams(Mutex<Shared>);

/// The server's welcome parameters, as given to clients.
pub type WelcomeParams = Arc<Vec<(String, String)>>;

#[derive(Debug, Default)]
struct Shared {
    set: Option<Arc<ParamSet>>,
    /// A set as a client gave it (before completion from this welcome) that came out
    /// as `set`: a client giving the same values gets `set` without the comparison.
    pre: Option<(Arc<ParamSet>, WelcomeParams)>,
    /// The ParameterStatus messages of `set` laid over this welcome.
    written: Option<(WelcomeParams, Bytes)>,
}

impl SharedParams {
    /// The last client's set as it gave it, if `tracked` are the same values (with the
    /// same `track_extra_parameters`): no set is built, and [`ClientParams::settle`]
    /// finds it at once. None: build one ([`ClientParams::build`]).
    pub fn reuse(&self, extra: &[String], tracked: &StartupTracked<'_>) -> Option<ClientParams> {
        let last = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let (pre, _) = last.pre.as_ref()?;
        let same = pre.extra == extra
            && pre.values.len() == tracked.count()
            && (pre.values.iter())
                .zip(tracked.iter())
                .all(|((k, v), (pk, pv))| k == pk && v == pv);
        same.then(|| ClientParams { set: pre.clone() })
    }
}

impl ClientParams {
    pub fn new(extra: &[String]) -> ClientParams {
        ClientParams {
            set: Arc::new(ParamSet {
                values: Vec::new(),
                extra: extra.to_vec(),
                options: None,
            }),
        }
    }

    /// The canonical spelling of `name` if it is tracked.
    pub fn tracked(&self, name: &str) -> Option<&str> {
        canonical(&self.set.extra, name)
    }

    /// The client's value for a tracked parameter, if it has one.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.set
            .values
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Records the client's value for a tracked parameter; untracked names are ignored.
    pub fn set(&mut self, name: &str, value: &str) {
        let Some(name) = self.tracked(name) else {
            return;
        };
        match self.set.values.iter().position(|(k, _)| k == name) {
            Some(i) if self.set.values[i].1 == value => {}
            Some(i) => {
                let v = &mut Arc::make_mut(&mut self.set).values[i].1;
                v.clear();
                v.push_str(value);
            }
            None => {
                let entry = (name.to_owned(), value.to_owned());
                Arc::make_mut(&mut self.set).values.push(entry);
            }
        }
    }

    /// The client's values for `tracked`, built now (the rare case: see
    /// [`SharedParams::reuse`]).
    pub fn build(extra: &[String], tracked: &StartupTracked<'_>) -> ClientParams {
        let mut p = ClientParams::new(extra);
        for (k, v) in tracked.iter() {
            p.set(k, v);
        }
        p
    }

    /// Completes the client's set at login ([`ClientParams::fill_unset`]), shares it,
    /// and appends the welcome's ParameterStatus messages ([`ClientParams::overlay`])
    /// to `out`. The pool's shared set is taken as it is when the completed set would
    /// equal it (the common case: nothing is built, and the messages are copied as
    /// written for the last such client), else the completed set becomes the shared
    /// one.
    pub fn settle(&mut self, welcome: &WelcomeParams, shared: &SharedParams, out: &mut BytesMut) {
        let mut guard = shared.0.lock().unwrap_or_else(|p| p.into_inner());
        let last = &mut *guard;
        let as_last = (last.pre.as_ref()).is_some_and(|(pre, w)| {
            Arc::ptr_eq(w, welcome) && (Arc::ptr_eq(pre, &self.set) || **pre == *self.set)
        });
        match &last.set {
            Some(s) if as_last || self.completed_equals(welcome, s) => {
                let own = std::mem::replace(&mut self.set, s.clone());
                if !as_last {
                    last.pre = Some((own, welcome.clone()));
                }
            }
            _ => {
                let own = self.set.clone();
                self.fill_unset(welcome);
                last.set = Some(self.set.clone());
                last.pre = Some((own, welcome.clone()));
                last.written = None;
            }
        }
        if let Some((w, bytes)) = &last.written {
            if Arc::ptr_eq(w, welcome) {
                out.extend_from_slice(bytes);
                return;
            }
        }
        let start = out.len();
        self.overlay(welcome, |k, v| backend::parameter_status(out, k, v));
        last.written = Some((welcome.clone(), Bytes::copy_from_slice(&out[start..])));
    }

    /// Whether [`ClientParams::fill_unset`] would make the set equal to `other`.
    fn completed_equals(&self, welcome: &[(String, String)], other: &ParamSet) -> bool {
        let own = self
            .set
            .values
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()));
        let filled = welcome.iter().filter_map(|(k, v)| {
            let name = self.tracked(k)?;
            let unset = !self.set.values.iter().any(|(n, _)| n == name);
            unset.then_some((name, v.as_str()))
        });
        self.set.extra == other.extra
            && own
                .chain(filled)
                .eq(other.values.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    }

    /// Fills the tracked parameters the client did not set from the server's initial
    /// values, so a server another client changed is set back (PgBouncer does the same).
    pub fn fill_unset(&mut self, welcome: &[(String, String)]) {
        for (k, v) in welcome {
            if let Some(name) = self.tracked(k).map(str::to_owned) {
                if !self.set.values.iter().any(|(n, _)| *n == name) {
                    Arc::make_mut(&mut self.set).values.push((name, v.clone()));
                }
            }
        }
        // Kept for the client's whole life: no spare capacity.
        if self.set.values.capacity() > self.set.values.len() {
            Arc::make_mut(&mut self.set).values.shrink_to_fit();
        }
    }

    /// Whether `server` has some tracked parameter at another value than this client.
    /// A match is remembered on the server, so the next check is a pointer compare.
    pub fn differs(&self, server: &mut ServerConn) -> bool {
        !matches(&self.set, server)
    }

    /// Keeps a replication client's `options` as given: its server is its own, so
    /// every setting can go to it (CREATE SUBSCRIPTION sends extra_float_digits).
    pub fn set_startup_options(&mut self, options: &str) {
        Arc::make_mut(&mut self.set).options = Some(options.into());
    }

    /// What [`ClientParams::set_startup_options`] kept.
    pub fn startup_options(&self) -> Option<&str> {
        self.set.options.as_deref()
    }

    /// The client's tracked values, as (name, value).
    pub fn values(&self) -> &[(String, String)] {
        &self.set.values
    }

    /// The tracked values this client wants, for a request left in a pool's line.
    pub fn wanted(&self) -> &Arc<ParamSet> {
        &self.set
    }

    /// The SET statements that make `server` match this client, or None if it does.
    pub fn sync_sql(&self, server: &mut ServerConn) -> Option<String> {
        if !self.differs(server) {
            return None;
        }
        let mut sql = String::new();
        for (k, v) in &self.set.values {
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

    /// Calls `f` on the server's welcome parameters with this client's own values laid
    /// over them, then on the client's values the welcome lacks (nothing is copied).
    pub fn overlay(&self, welcome: &[(String, String)], mut f: impl FnMut(&str, &str)) {
        let own = |k: &str| {
            self.set
                .values
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(k))
        };
        for (k, v) in welcome {
            f(k, own(k).map_or(v, |(_, v)| v));
        }
        for (k, v) in &self.set.values {
            if !welcome.iter().any(|(n, _)| n.eq_ignore_ascii_case(k)) {
                f(k, v);
            }
        }
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
            p.set.values,
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
        p.set("TimeZone", "UTC");
        let mut o = Vec::new();
        p.overlay(&w, |k, v| o.push(format!("{k}={v}")));
        assert_eq!(
            o,
            ["application_name=app", "server_version=15", "TimeZone=UTC"]
        );
    }

    #[test]
    fn equal_sets_are_shared_and_copied_on_write() {
        let shared = SharedParams::default();
        let mut a = ClientParams::new(&[]);
        a.set("TimeZone", "UTC");
        let mut b = a.clone();
        b.set = Arc::new((*b.set).clone());
        let none = WelcomeParams::default();
        a.settle(&none, &shared, &mut BytesMut::new());
        b.settle(&none, &shared, &mut BytesMut::new());
        assert!(Arc::ptr_eq(&a.set, &b.set));
        b.set("timezone", "Asia/Tokyo");
        assert_eq!(a.get("TimeZone"), Some("UTC"));
        assert_eq!(b.get("TimeZone"), Some("Asia/Tokyo"));
        // Setting the same value again keeps the shared set.
        let before = a.set.clone();
        a.set("TimeZone", "UTC");
        assert!(Arc::ptr_eq(&before, &a.set));
    }

    #[test]
    fn settle_takes_the_shared_set_only_if_the_completed_set_equals_it() {
        let shared = SharedParams::default();
        let welcome = Arc::new(vec![
            ("client_encoding".to_owned(), "UTF8".to_owned()),
            ("server_version".to_owned(), "15".to_owned()),
            ("TimeZone".to_owned(), "UTC".to_owned()),
        ]);
        let login = |app: &str, tz: Option<&str>| {
            let mut p = ClientParams::new(&[]);
            p.set("application_name", app);
            if let Some(tz) = tz {
                p.set("timezone", tz);
            }
            let mut out = BytesMut::from(&b"greeting"[..]);
            p.settle(&welcome, &shared, &mut out);
            // What it was sent: the messages written now or copied from the last
            // client's, the same either way.
            let mut expected = BytesMut::from(&b"greeting"[..]);
            p.overlay(&welcome, |k, v| {
                backend::parameter_status(&mut expected, k, v)
            });
            assert_eq!(out, expected);
            p
        };
        let a = login("x", None);
        assert_eq!(a.get("client_encoding"), Some("UTF8"));
        assert_eq!(a.get("TimeZone"), Some("UTC"));
        assert_eq!(a.get("server_version"), None);
        // Same values (the time zone given or filled in): the same set.
        let b = login("x", None);
        assert!(Arc::ptr_eq(&a.set, &b.set));
        // Given in another order than the fill would put it: equal values, but a
        // set of its own, which becomes the shared one.
        let c = login("x", Some("UTC"));
        assert_eq!(c.get("TimeZone"), Some("UTC"));
        assert!(!Arc::ptr_eq(&c.set, &a.set));
        let d = login("y", None);
        assert!(!Arc::ptr_eq(&d.set, &b.set));
        assert_eq!(d.get("application_name"), Some("y"));
        assert_eq!(d.get("TimeZone"), Some("UTC"));
        let e = login("y", None);
        assert!(Arc::ptr_eq(&d.set, &e.set));
        // Another welcome (the server's values changed): the messages are written anew.
        let welcome = Arc::new(vec![("TimeZone".to_owned(), "Asia/Tokyo".to_owned())]);
        let mut p = ClientParams::new(&[]);
        p.set("application_name", "y");
        p.set("client_encoding", "UTF8");
        let mut out = BytesMut::new();
        p.settle(&welcome, &shared, &mut out);
        assert!(String::from_utf8_lossy(&out).contains("Asia/Tokyo"));
    }

    #[test]
    fn a_login_like_the_last_shares_its_set_without_building_one() {
        let shared = SharedParams::default();
        let welcome = Arc::new(vec![("TimeZone".to_owned(), "UTC".to_owned())]);
        let extra = vec!["IntervalStyle".to_owned()];
        let startup = |pairs: &[(&'static str, &'static str)]| {
            let mut t = StartupTracked::default();
            for (k, v) in pairs {
                t.set(canonical(&extra, k).expect("tracked"), v);
            }
            t
        };
        let first = startup(&[("application_name", "a"), ("intervalstyle", "iso_8601")]);
        // Nobody logged in yet: built.
        assert!(shared.reuse(&extra, &first).is_none());
        let mut a = ClientParams::build(&extra, &first);
        assert_eq!(a.get("IntervalStyle"), Some("iso_8601"));
        a.settle(&welcome, &shared, &mut BytesMut::new());
        // The same values (a repeated name keeps its place, last value wins): reused,
        // and settled into the first client's set.
        let same = startup(&[
            ("application_name", "x"),
            ("IntervalStyle", "iso_8601"),
            ("APPLICATION_NAME", "a"),
        ]);
        let mut b = shared.reuse(&extra, &same).expect("the last client's set");
        b.settle(&welcome, &shared, &mut BytesMut::new());
        assert!(Arc::ptr_eq(&a.set, &b.set));
        assert_eq!(b.get("TimeZone"), Some("UTC"));
        // Another value, another order, other extra parameters: built.
        let other = startup(&[("application_name", "b"), ("intervalstyle", "iso_8601")]);
        assert!(shared.reuse(&extra, &other).is_none());
        let order = startup(&[("intervalstyle", "iso_8601"), ("application_name", "a")]);
        assert!(shared.reuse(&extra, &order).is_none());
        assert!(shared.reuse(&[], &first).is_none());
        let mut many = startup(&[("application_name", "a"), ("intervalstyle", "iso_8601")]);
        for _ in 0..8 {
            many.set("IntervalStyle", "x");
            many.set("DateStyle", "ISO");
            many.set("TimeZone", "UTC");
            many.set("client_encoding", "UTF8");
            many.set("standard_conforming_strings", "on");
        }
        // Repeats take no new place.
        assert_eq!(many.count(), 6);
        // Past the first 8: kept in order and compared like the rest.
        let names: Vec<String> = (0..10).map(|i| format!("p{i}")).collect();
        let mut over = StartupTracked::default();
        for n in &names {
            over.set(n, "v");
        }
        over.set("p9", "w");
        let built = ClientParams::build(&names, &over);
        assert_eq!(built.set.values.len(), 10);
        assert_eq!(built.get("p9"), Some("w"));
        assert!(shared.reuse(&names, &over).is_none());
        let mut c = built;
        c.settle(&welcome, &shared, &mut BytesMut::new());
        assert!(shared.reuse(&names, &over).is_some());
        over.set("p8", "changed");
        assert!(shared.reuse(&names, &over).is_none());
    }
}
