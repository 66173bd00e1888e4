//! SHOW POOLS, DATABASES and USERS, with PgBouncer 1.25's columns. The row data is
//! also what `/metrics` exports, so both always agree.
//!
//! The console itself appears as PgBouncer shows it: database `pgbouncer` with user
//! `pgbouncer`, pool size 2, statement mode.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use rustc_hash::FxHashMap;

use super::rows::{Table, Ty};
use crate::app::App;
use crate::clock::Tick;
use crate::config::{DatabaseEntry, ADMIN_DB};
use crate::pool::Pool;
use crate::session::cancel::Target;
use crate::stats::conns::ClientState;

/// One SHOW POOLS row.
#[derive(Debug, Clone)]
pub struct PoolRow {
    pub database: String,
    pub user: String,
    pub cl_active: u32,
    pub cl_waiting: u32,
    /// Cancel requests for the pool's clients: sent, each over a connection of its
    /// own (also `sv_active_cancel`), and waiting for that connection.
    pub cl_active_cancel_req: u32,
    pub cl_waiting_cancel_req: u32,
    pub sv_active: u32,
    /// Given back while cancels were on their way to it, held until they are done.
    pub sv_being_canceled: u32,
    pub sv_idle: u32,
    pub sv_used: u32,
    pub sv_tested: u32,
    pub sv_login: u32,
    pub maxwait: Duration,
    pub pool_mode: &'static str,
    pub load_balance_hosts: Option<&'static str>,
    /// None for the console's own pool.
    pub pool: Option<Arc<Pool>>,
}

#[derive(Default, Clone, Copy)]
struct ClientCounts {
    active: u32,
    waiting: u32,
    cancels_waiting: u32,
    cancels_sent: u32,
    maxwait: Duration,
}

impl ClientCounts {
    fn add(&mut self, o: ClientCounts) {
        self.active += o.active;
        self.waiting += o.waiting;
        self.cancels_waiting += o.cancels_waiting;
        self.cancels_sent += o.cancels_sent;
        self.maxwait = self.maxwait.max(o.maxwait);
    }
}

/// A name's allocation, as a key: a client's names are its pool's shared ones
/// (`session::start`), so counting by it hashes a word per name and allocates an
/// entry per pool, not per client. Each key's map entry holds a clone of the `Arc`,
/// so no allocation is freed and its address reused while the pass runs.
fn name_key(name: &Arc<str>) -> usize {
    Arc::as_ptr(name) as *const u8 as usize
}

/// Client counts per (database, pool user): waiting ones, and the others, which
/// PgBouncer counts as `cl_active` whether linked or idle. One pass over the
/// clients, unsorted and uncloned: monitoring polls SHOW POOLS (and `/metrics`) with
/// thousands of clients, on the loop they share.
fn client_counts(app: &App) -> HashMap<(String, String), ClientCounts> {
    type ByName = (Arc<str>, Arc<str>, ClientCounts);
    let mut by_ptr: FxHashMap<(usize, usize), ByName> = FxHashMap::default();
    app.client_reg.for_each(|c| {
        let (db, user) = (&c.meta.database, &c.meta.pool_user);
        let (_, _, e) = by_ptr
            .entry((name_key(db), name_key(user)))
            .or_insert_with(|| (db.clone(), user.clone(), ClientCounts::default()));
        if c.state() == ClientState::Waiting {
            e.waiting += 1;
            e.maxwait = e.maxwait.max(c.waited());
        } else {
            e.active += 1;
        }
    });
    let mut m: HashMap<(String, String), ClientCounts> = HashMap::new();
    for (db, user, n) in by_ptr.into_values() {
        m.entry((db.to_string(), user.to_string()))
            .or_default()
            .add(n);
    }
    for (target, [waiting, sent]) in app.cancels.in_flight() {
        let Target::Pool((db, user)) = target else {
            continue;
        };
        let e = m.entry((db.to_string(), user.to_string())).or_default();
        e.cancels_waiting += waiting;
        e.cancels_sent += sent;
    }
    m
}

/// Logged-in clients per user name, by the same one pass: every client's name is
/// listed, the console's own clients are not counted.
fn clients_per_user(app: &App) -> HashMap<String, u32> {
    let mut by_ptr: FxHashMap<usize, (Arc<str>, u32)> = FxHashMap::default();
    app.client_reg.for_each(|c| {
        let (_, n) = by_ptr
            .entry(name_key(&c.meta.user))
            .or_insert_with(|| (c.meta.user.clone(), 0));
        if !c.meta.is_admin() {
            *n += 1;
        }
    });
    let mut m: HashMap<String, u32> = HashMap::new();
    for (name, n) in by_ptr.into_values() {
        *m.entry(name.to_string()).or_default() += n;
    }
    m
}

/// Every pool, the console's included, sorted by (database, user).
pub fn pool_rows(app: &App) -> Vec<PoolRow> {
    let counts = client_counts(app);
    let now = Tick::now();
    let mut rows: Vec<PoolRow> = app
        .pools
        .all()
        .into_iter()
        .map(|p| {
            let pc = p.config();
            // Idle past server_check_delay: checked before reuse ("used" in PgBouncer).
            let check = pc
                .server_check_query
                .as_ref()
                .map(|_| pc.server_check_delay);
            let n = p.counts_at(check, now);
            let c = counts
                .get(&(p.key.database.clone(), p.key.user.clone()))
                .copied()
                .unwrap_or_default();
            PoolRow {
                database: p.key.database.clone(),
                user: p.key.user.clone(),
                cl_active: c.active,
                cl_waiting: c.waiting,
                cl_active_cancel_req: c.cancels_sent,
                cl_waiting_cancel_req: c.cancels_waiting,
                sv_active: n.active.saturating_sub(n.being_canceled + n.resetting),
                sv_being_canceled: n.being_canceled,
                sv_idle: n.idle - n.used,
                sv_used: n.used,
                sv_tested: n.resetting,
                sv_login: n.total.saturating_sub(n.idle + n.active),
                maxwait: c.maxwait,
                pool_mode: pc.pool_mode.as_str(),
                load_balance_hosts: Some(pc.load_balance.as_str()),
                pool: Some(p),
            }
        })
        .collect();
    let console = counts
        .get(&(ADMIN_DB.to_owned(), ADMIN_DB.to_owned()))
        .copied()
        .unwrap_or_default();
    rows.push(PoolRow {
        database: ADMIN_DB.to_owned(),
        user: ADMIN_DB.to_owned(),
        cl_active: console.active,
        cl_waiting: 0,
        cl_active_cancel_req: 0,
        cl_waiting_cancel_req: 0,
        sv_active: 0,
        sv_being_canceled: 0,
        sv_idle: 0,
        sv_used: 0,
        sv_tested: 0,
        sv_login: 0,
        maxwait: Duration::ZERO,
        pool_mode: "statement",
        load_balance_hosts: None,
        pool: None,
    });
    rows.sort_by(|a, b| (&a.database, &a.user).cmp(&(&b.database, &b.user)));
    rows
}

/// SHOW POOLS.
pub fn pools(app: &App, out: &mut BytesMut) {
    let mut cols = vec![("database", Ty::Text), ("user", Ty::Text)];
    for c in [
        "cl_active",
        "cl_waiting",
        "cl_active_cancel_req",
        "cl_waiting_cancel_req",
        "sv_active",
        "sv_active_cancel",
        "sv_being_canceled",
        "sv_idle",
        "sv_used",
        "sv_tested",
        "sv_login",
        "maxwait",
        "maxwait_us",
    ] {
        cols.push((c, Ty::Int4));
    }
    cols.push(("pool_mode", Ty::Text));
    cols.push(("load_balance_hosts", Ty::Text));
    let mut t = Table::new(out, &cols);
    for r in pool_rows(app) {
        t.row(vec![
            r.database.into(),
            r.user.into(),
            r.cl_active.into(),
            r.cl_waiting.into(),
            r.cl_active_cancel_req.into(),
            r.cl_waiting_cancel_req.into(),
            r.sv_active.into(),
            r.cl_active_cancel_req.into(),
            r.sv_being_canceled.into(),
            r.sv_idle.into(),
            r.sv_used.into(),
            r.sv_tested.into(),
            r.sv_login.into(),
            r.maxwait.as_secs().into(),
            u64::from(r.maxwait.subsec_micros()).into(),
            r.pool_mode.into(),
            r.load_balance_hosts.into(),
        ]);
    }
    t.finish();
}

/// One SHOW DATABASES row.
#[derive(Debug, Clone)]
pub struct DbRow {
    pub name: String,
    pub host: Option<String>,
    pub port: u16,
    pub database: String,
    pub force_user: Option<String>,
    pub pool_size: u32,
    pub min_pool_size: u32,
    pub reserve_pool_size: u32,
    pub server_lifetime: u64,
    pub pool_mode: Option<&'static str>,
    pub load_balance_hosts: Option<&'static str>,
    pub max_connections: u32,
    pub current_connections: u32,
    pub max_client_connections: u32,
    pub current_client_connections: u32,
    pub paused: bool,
    pub disabled: bool,
}

/// Configured databases, databases made from the `*` entry that have a pool, and the
/// console, sorted by name.
pub fn database_rows(app: &App) -> Vec<DbRow> {
    let cfg = app.config();
    let s = &cfg.settings;
    let gate = app.gate();
    let mut entries: BTreeMap<String, DatabaseEntry> = cfg
        .databases
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if let Some(fb) = &cfg.fallback_database {
        for p in app.pools.all() {
            let name = p.key.database.clone();
            if !entries.contains_key(&name) && name != ADMIN_DB {
                let e = DatabaseEntry {
                    name: name.clone(),
                    ..fb.clone()
                };
                entries.insert(name, e);
            }
        }
    }
    let mut rows: Vec<DbRow> = entries
        .into_iter()
        .map(|(name, d)| DbRow {
            host: d.host.clone(),
            port: d.port,
            database: d.dbname.clone().unwrap_or_else(|| name.clone()),
            force_user: d.user.clone(),
            pool_size: d.pool_size.unwrap_or(s.default_pool_size),
            min_pool_size: d.min_pool_size.unwrap_or(s.min_pool_size),
            reserve_pool_size: d.reserve_pool_size.unwrap_or(s.reserve_pool_size),
            server_lifetime: d.server_lifetime.unwrap_or(s.server_lifetime).as_secs(),
            pool_mode: d.pool_mode.map(|m| m.as_str()),
            load_balance_hosts: Some(d.load_balance_hosts.as_str()),
            max_connections: d.max_db_connections.unwrap_or(s.max_db_connections),
            current_connections: app.pools.db_connections(&name),
            max_client_connections: d
                .max_db_client_connections
                .unwrap_or(s.max_db_client_connections),
            current_client_connections: app.db_clients(&name),
            paused: gate.paused_dbs.contains(&name),
            disabled: gate.disabled(&name),
            name,
        })
        .collect();
    let mut console_clients = 0u32;
    app.client_reg
        .for_each(|c| console_clients += u32::from(c.meta.is_admin()));
    rows.push(DbRow {
        name: ADMIN_DB.to_owned(),
        host: None,
        port: s.listen_port,
        database: ADMIN_DB.to_owned(),
        force_user: Some(ADMIN_DB.to_owned()),
        pool_size: 2,
        min_pool_size: 0,
        reserve_pool_size: 0,
        server_lifetime: s.server_lifetime.as_secs(),
        pool_mode: Some("statement"),
        load_balance_hosts: None,
        max_connections: 0,
        current_connections: 0,
        max_client_connections: 0,
        current_client_connections: console_clients,
        paused: false,
        disabled: false,
    });
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    rows
}

/// SHOW DATABASES.
pub fn databases(app: &App, out: &mut BytesMut) {
    let mut t = Table::new(
        out,
        &[
            ("name", Ty::Text),
            ("host", Ty::Text),
            ("port", Ty::Int4),
            ("database", Ty::Text),
            ("force_user", Ty::Text),
            ("pool_size", Ty::Int4),
            ("min_pool_size", Ty::Int4),
            ("reserve_pool_size", Ty::Int4),
            ("server_lifetime", Ty::Int4),
            ("pool_mode", Ty::Text),
            ("load_balance_hosts", Ty::Text),
            ("max_connections", Ty::Int4),
            ("current_connections", Ty::Int4),
            ("max_client_connections", Ty::Int4),
            ("current_client_connections", Ty::Int4),
            ("paused", Ty::Int4),
            ("disabled", Ty::Int4),
        ],
    );
    for r in database_rows(app) {
        t.row(vec![
            r.name.into(),
            r.host.into(),
            r.port.into(),
            r.database.into(),
            r.force_user.into(),
            r.pool_size.into(),
            r.min_pool_size.into(),
            r.reserve_pool_size.into(),
            r.server_lifetime.into(),
            r.pool_mode.into(),
            r.load_balance_hosts.into(),
            r.max_connections.into(),
            r.current_connections.into(),
            r.max_client_connections.into(),
            r.current_client_connections.into(),
            r.paused.into(),
            r.disabled.into(),
        ]);
    }
    t.finish();
}

/// Every user known: the auth file, `[users]`, pool owners, logged-in clients, and
/// the console's `pgbouncer`.
pub(super) fn user_names(app: &App) -> BTreeSet<String> {
    names_of_users(app, clients_per_user(app).into_keys())
}

fn names_of_users(app: &App, of_clients: impl Iterator<Item = String>) -> BTreeSet<String> {
    let cfg = app.config();
    let mut names: BTreeSet<String> = cfg.userlist.keys().cloned().collect();
    names.extend(cfg.users.keys().cloned());
    names.extend(app.pools.all().iter().map(|p| p.key.user.clone()));
    names.extend(of_clients);
    names.insert(ADMIN_DB.to_owned());
    names
}

/// SHOW USERS.
pub fn users(app: &App, out: &mut BytesMut) {
    let cfg = app.config();
    let s = &cfg.settings;
    let pools = app.pools.all();
    let mut t = Table::new(
        out,
        &[
            ("name", Ty::Text),
            ("pool_size", Ty::Int4),
            ("reserve_pool_size", Ty::Int4),
            ("pool_mode", Ty::Text),
            ("max_user_connections", Ty::Int4),
            ("current_connections", Ty::Int4),
            ("max_user_client_connections", Ty::Int4),
            ("current_client_connections", Ty::Int4),
        ],
    );
    // One pass over the pools and one over the clients, not one per user.
    let mut pool_of: HashMap<&str, &Arc<Pool>> = HashMap::new();
    for p in &pools {
        pool_of.entry(p.key.user.as_str()).or_insert(p);
    }
    let clients_of = clients_per_user(app);
    for name in names_of_users(app, clients_of.keys().cloned()) {
        let u = cfg.users.get(&name);
        // All pools of a user share one counter; any of them reads it.
        let current = pool_of
            .get(name.as_str())
            .map_or(0, |p| p.limits().user.count());
        let clients_now = clients_of.get(name.as_str()).copied().unwrap_or(0);
        t.row(vec![
            name.clone().into(),
            u.and_then(|u| u.pool_size).into(),
            u.and_then(|u| u.reserve_pool_size).into(),
            u.and_then(|u| u.pool_mode).map(|m| m.as_str()).into(),
            u.and_then(|u| u.max_user_connections)
                .unwrap_or(s.max_user_connections)
                .into(),
            current.into(),
            u.and_then(|u| u.max_user_client_connections)
                .unwrap_or(s.max_user_client_connections)
                .into(),
            clients_now.into(),
        ]);
    }
    t.finish();
}
