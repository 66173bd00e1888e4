//! SHOW LISTS, STATE, MEM, DNS_HOSTS, DNS_ZONES, PEERS and PEER_POOLS: PgBouncer's
//! object counts, the DNS cache and `[peers]`, and the views of what Sluice does
//! without (slab caches, zone checks, peer pools), answered as a PgBouncer in the same
//! state would.

use bytes::BytesMut;

use super::rows::{Cell, Table, Ty};
use super::show_pools::{database_rows, user_names};
use crate::app::App;
use crate::config::DatabaseEntry;
use crate::pool::Pool;
use crate::session::cancel::Target;

/// SHOW LISTS rows: PgBouncer's object counts. Sluice has no slab caches, so there
/// are no free objects, and no DNS zones (those are c-ares's).
pub fn list_rows(app: &App) -> Vec<(&'static str, u64)> {
    let pools = app.pools.all();
    let used_clients = u64::from(app.clients.load(std::sync::atomic::Ordering::Relaxed));
    let logged_in = app.client_reg.len() as u64;
    // Cancel requests on their way are neither logging in nor logged in; their
    // connections onwards are servers, as PgBouncer counts both.
    let (cancels, cancel_conns) = app
        .cancels
        .in_flight()
        .values()
        .fold((0u64, 0u64), |(n, c), [w, s]| {
            (n + u64::from(w + s), c + u64::from(*s))
        });
    let pool_servers: u64 = pools.iter().map(|p| u64::from(p.counts().total)).sum();
    let used_servers = pool_servers + cancel_conns;
    let (dns_names, dns_queries) = app.config().dns.counts();
    vec![
        ("databases", database_rows(app).len() as u64),
        ("users", user_names(app).len() as u64),
        ("peers", app.config().peers.len() as u64),
        ("pools", pools.len() as u64 + 1),
        ("peer_pools", peer_pool_rows(app).len() as u64),
        ("free_clients", 0),
        ("used_clients", used_clients),
        (
            "login_clients",
            used_clients.saturating_sub(logged_in + cancels),
        ),
        ("free_servers", 0),
        ("used_servers", used_servers),
        ("dns_names", dns_names),
        ("dns_zones", 0),
        ("dns_queries", dns_queries),
        ("dns_pending", 0),
    ]
}

/// SHOW LISTS.
pub fn lists(app: &App, out: &mut BytesMut) {
    let mut t = Table::new(out, &[("list", Ty::Text), ("items", Ty::Int4)]);
    for (k, v) in list_rows(app) {
        t.row(vec![k.into(), v.into()]);
    }
    t.finish();
}

/// SHOW STATE.
pub fn state(app: &App, out: &mut BytesMut) {
    let g = app.gate();
    let yes = |b: bool| Cell::from(if b { "yes" } else { "no" });
    let mut t = Table::new(out, &[("key", Ty::Text), ("value", Ty::Text)]);
    let paused = g.pause_mode();
    t.row(vec!["active".into(), yes(!paused && !g.suspended)]);
    t.row(vec!["paused".into(), yes(paused)]);
    t.row(vec!["suspended".into(), yes(g.suspended)]);
    t.finish();
}

/// SHOW MEM: PgBouncer's slab caches have no counterpart; the rows name the same
/// objects with Sluice's in-memory sizes and live counts (nothing is kept free).
pub fn mem(app: &App, out: &mut BytesMut) {
    let pools = app.pools.all();
    let servers: u64 = pools.iter().map(|p| u64::from(p.counts().total)).sum();
    let clients = u64::from(app.clients.load(std::sync::atomic::Ordering::Relaxed));
    let caches = [
        ("user_cache", 64, user_names(app).len() as u64),
        (
            "db_cache",
            std::mem::size_of::<DatabaseEntry>() as u64,
            database_rows(app).len() as u64,
        ),
        (
            "pool_cache",
            std::mem::size_of::<Pool>() as u64,
            pools.len() as u64 + 1,
        ),
        (
            "server_cache",
            std::mem::size_of::<crate::pool::ServerConn>() as u64,
            servers,
        ),
        (
            "client_cache",
            std::mem::size_of::<crate::stats::conns::ClientInfo>() as u64,
            clients,
        ),
        // Idle clients asleep without a task (session/keeper.rs).
        (
            "asleep_client_cache",
            std::mem::size_of::<crate::session::Session>() as u64,
            app.keeper.asleep() as u64,
        ),
    ];
    let mut t = Table::new(
        out,
        &[
            ("name", Ty::Text),
            ("size", Ty::Int4),
            ("used", Ty::Int4),
            ("free", Ty::Int4),
            ("memtotal", Ty::Int4),
        ],
    );
    for (name, size, used) in caches {
        t.row(vec![
            name.into(),
            size.into(),
            used.into(),
            0u64.into(),
            (size * used).into(),
        ]);
    }
    t.finish();
}

/// SHOW DNS_HOSTS: the server host names looked up and still kept (`dns_max_ttl`,
/// `dns_nxdomain_ttl`): seconds left, and the addresses (none after a failure).
pub fn dns_hosts(app: &App, out: &mut BytesMut) {
    let mut t = Table::new(
        out,
        &[
            ("hostname", Ty::Text),
            ("ttl", Ty::Int8),
            ("addrs", Ty::Text),
        ],
    );
    for (name, ips, left) in app.config().dns.rows() {
        let addrs: Vec<String> = ips.iter().map(ToString::to_string).collect();
        t.row(vec![name.into(), left.into(), addrs.join(",").into()]);
    }
    t.finish();
}

/// SHOW DNS_ZONES: empty: zones are checked only by PgBouncer's c-ares build
/// (`dns_zone_check_period`).
pub fn dns_zones(out: &mut BytesMut) {
    Table::new(
        out,
        &[
            ("zonename", Ty::Text),
            ("serial", Ty::Int8),
            ("count", Ty::Int4),
        ],
    )
    .finish();
}

/// SHOW PEERS: the `[peers]` entries, `pool_size` defaulting as PgBouncer's does.
pub fn peers(app: &App, out: &mut BytesMut) {
    let cfg = app.config();
    let mut t = Table::new(
        out,
        &[
            ("peer_id", Ty::Int4),
            ("host", Ty::Text),
            ("port", Ty::Int4),
            ("pool_size", Ty::Int4),
        ],
    );
    for p in cfg.peers.values() {
        t.row(vec![
            p.id.into(),
            p.host.as_str().into(),
            p.port.into(),
            p.pool_size.unwrap_or(cfg.settings.default_pool_size).into(),
        ]);
    }
    t.finish();
}

/// The peers cancel requests have been passed on to, by id, with those on their way:
/// waiting for their connection, and sent.
fn peer_pool_rows(app: &App) -> Vec<(u16, [u32; 2])> {
    let mut rows: Vec<(u16, [u32; 2])> = app
        .cancels
        .in_flight()
        .into_iter()
        .filter_map(|(t, n)| match t {
            Target::Peer(id) => Some((id, n)),
            Target::Pool(_) => None,
        })
        .collect();
    rows.sort_unstable();
    rows
}

/// SHOW PEER_POOLS: a row per peer a cancel request has been passed on to (as
/// PgBouncer makes a peer pool at first use). Each request uses a connection of its
/// own: `sv_active_cancel` is the requests sent, `sv_login` 0.
pub fn peer_pools(app: &App, out: &mut BytesMut) {
    let mut t = Table::new(
        out,
        &[
            ("peer_id", Ty::Int4),
            ("cl_active_cancel_req", Ty::Int4),
            ("cl_waiting_cancel_req", Ty::Int4),
            ("sv_active_cancel", Ty::Int4),
            ("sv_login", Ty::Int4),
        ],
    );
    for (id, [waiting, sent]) in peer_pool_rows(app) {
        t.row(vec![
            u32::from(id).into(),
            sent.into(),
            waiting.into(),
            sent.into(),
            0u32.into(),
        ]);
    }
    t.finish();
}
