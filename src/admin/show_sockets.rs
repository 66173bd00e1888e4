//! SHOW CLIENTS, SERVERS, SOCKETS and ACTIVE_SOCKETS: one row per connection with
//! PgBouncer 1.25's columns.
//!
//! `ptr` and `link` are opaque handles in PgBouncer (object addresses); Sluice makes
//! them from the connection ids, with a high bit telling clients from servers, so
//! that a client's `link` equals its server's `ptr` and the reverse. `id` is the
//! number in the `C-<id>`/`S-<id>` log prefixes; KILL_CLIENT takes it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::BytesMut;

use super::rows::{Cell, Table, Ty};
use super::show_pools::{pool_rows, PoolRow};
use crate::app::App;
use crate::clock::Tick;
use crate::net::PeerAddr;
use crate::pool::{ServerAddr, ServerIdent};
use crate::session::cancel::{CancelView, Target};
use crate::stats::conns::{ClientInfo, ClientState, CompactAddr};
use crate::stats::logins::LoginEntry;

const COLUMNS: [(&str, Ty); 21] = [
    ("type", Ty::Text),
    ("user", Ty::Text),
    ("database", Ty::Text),
    ("replication", Ty::Text),
    ("state", Ty::Text),
    ("addr", Ty::Text),
    ("port", Ty::Int4),
    ("local_addr", Ty::Text),
    ("local_port", Ty::Int4),
    ("connect_time", Ty::Text),
    ("request_time", Ty::Text),
    ("wait", Ty::Int4),
    ("wait_us", Ty::Int4),
    ("close_needed", Ty::Int4),
    ("ptr", Ty::Text),
    ("link", Ty::Text),
    ("remote_pid", Ty::Int4),
    ("tls", Ty::Text),
    ("application_name", Ty::Text),
    ("prepared_statements", Ty::Int4),
    ("id", Ty::Int8),
];

/// The extra columns of SOCKETS and ACTIVE_SOCKETS (buffer positions; Sluice's
/// buffers are per session and not exposed, so they read 0).
const DEBUG_COLUMNS: [&str; 7] = [
    "recv_pos",
    "pkt_pos",
    "pkt_remain",
    "send_pos",
    "send_remain",
    "pkt_avail",
    "send_avail",
];

fn header(out: &mut BytesMut, debug: bool) -> Table<'_> {
    let mut cols: Vec<(&str, Ty)> = COLUMNS.to_vec();
    if debug {
        cols.extend(DEBUG_COLUMNS.iter().map(|c| (*c, Ty::Int4)));
    }
    // The buffer positions read 0 (missing trailing cells are sent as the pad).
    Table::new(out, &cols).pad_with(Cell::UInt(0))
}

fn client_ptr(id: u64) -> Cell<'static> {
    Cell::Hex((1u64 << 40) | id)
}

fn server_ptr(id: u64) -> Cell<'static> {
    Cell::Hex((2u64 << 40) | id)
}

/// An empty `link` (PgBouncer prints an unlinked one as an empty string).
const NO_LINK: Cell<'static> = Cell::Str("");

/// Wall-clock time of a moment in the past.
fn wall(at: Tick) -> SystemTime {
    SystemTime::now()
        .checked_sub(at.elapsed())
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

/// `(addr, port)` as PgBouncer prints them; UNIX sockets read `unix`.
fn peer_text(p: &PeerAddr, listen_port: u16) -> (Cell<'static>, u16) {
    match p {
        PeerAddr::Tcp(a) => (Cell::Ip(a.ip()), a.port()),
        PeerAddr::Unix => (Cell::Str("unix"), listen_port),
    }
}

fn local_text(a: Option<CompactAddr>, unix_port: u16) -> (Cell<'static>, u16) {
    match a {
        Some(a) => (Cell::Ip(a.ip), a.port),
        None => (Cell::Str("unix"), unix_port),
    }
}

fn client_row<'a>(c: &'a ClientInfo, state: &'a str, listen_port: u16) -> [Cell<'a>; 21] {
    let (addr, port) = peer_text(&c.meta.peer, listen_port);
    let (laddr, lport) = local_text(c.meta.local_addr, listen_port);
    let waited = c.waited();
    [
        "C".into(),
        (*c.meta.user).into(),
        (*c.meta.database).into(),
        replication_text(c.meta.replication()).into(),
        state.into(),
        addr,
        port.into(),
        laddr,
        lport.into(),
        Cell::Time(c.connect_time()),
        Cell::Time(c.request_time()),
        waited.as_secs().into(),
        u64::from(waited.subsec_micros()).into(),
        0u32.into(),
        client_ptr(c.meta.id),
        c.linked().map_or(NO_LINK, |s| server_ptr(s.id)),
        0u32.into(),
        Cell::Tls(c.meta.tls),
        (*c.meta.application_name).into(),
        c.prepared().into(),
        c.meta.id.into(),
    ]
}

/// One server as a row, whether idle in its pool or linked to a client.
struct ServerView {
    id: u64,
    user: String,
    database: String,
    state: &'static str,
    addr: ServerAddr,
    local_addr: Option<std::net::SocketAddr>,
    created: Tick,
    request_time: SystemTime,
    close_needed: bool,
    link: Option<u64>,
    backend_pid: u32,
    application_name: String,
    prepared: u32,
    tls: crate::tls::TlsInfo,
    replication: &'static str,
}

/// The `replication` column: none, physical or logical.
fn replication_text(r: Option<crate::protocol::startup::Replication>) -> &'static str {
    r.map_or("none", |r| r.name())
}

fn server_row(s: &ServerView) -> [Cell<'_>; 21] {
    let (addr, port) = match &s.addr {
        ServerAddr::Tcp(h, p) => (Cell::Str(h), *p),
        ServerAddr::Unix(_, p) => (Cell::Str("unix"), *p),
    };
    let (laddr, lport) = match (&s.addr, s.local_addr) {
        // A TCP connection not yet made has no local end.
        (ServerAddr::Tcp(..), None) => (Cell::Str(""), 0),
        (_, local) => local_text(local.map(Into::into), 0),
    };
    [
        "S".into(),
        (&s.user).into(),
        (&s.database).into(),
        s.replication.into(),
        s.state.into(),
        addr,
        port.into(),
        laddr,
        lport.into(),
        Cell::Time(wall(s.created)),
        Cell::Time(s.request_time),
        0u32.into(),
        0u32.into(),
        s.close_needed.into(),
        server_ptr(s.id),
        s.link.map_or(NO_LINK, client_ptr),
        s.backend_pid.into(),
        Cell::Tls(s.tls),
        (&s.application_name).into(),
        s.prepared.into(),
        s.id.into(),
    ]
}

/// Every server: linked ones (from their clients) and idle ones (from their pools).
fn server_views(app: &App) -> Vec<ServerView> {
    let mut views = Vec::new();
    let rows = pool_rows(app);
    let generations: Vec<Option<u64>> = rows
        .iter()
        .map(|r| r.pool.as_ref().map(|p| p.generation()))
        .collect();
    // The linked servers of each pool, found in one pass over the clients (unsorted,
    // uncloned) rather than one per pool: a pooler with hundreds of pools and
    // thousands of clients answers at once. Only a linked client's names are looked
    // up, and at most as many clients are linked as there are servers.
    let index: HashMap<(&str, &str), usize> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| ((r.database.as_str(), r.user.as_str()), i))
        .collect();
    let mut linked: Vec<Vec<ServerView>> = rows.iter().map(|_| Vec::new()).collect();
    app.client_reg.for_each(|c| {
        if c.meta.is_admin() {
            return;
        }
        let Some(s) = c.linked() else {
            return;
        };
        let Some(&i) = index.get(&(&*c.meta.database, &*c.meta.pool_user)) else {
            return;
        };
        let Some(generation) = generations[i] else {
            return;
        };
        linked[i].push(ServerView {
            id: s.id,
            user: rows[i].user.clone(),
            database: rows[i].database.clone(),
            state: "active",
            addr: s.addr.clone(),
            local_addr: s.local_addr,
            created: s.created,
            request_time: c.request_time(),
            close_needed: s.generation != generation,
            link: Some(c.meta.id),
            backend_pid: s.backend_pid,
            application_name: c.meta.application_name.to_string(),
            prepared: s.prepared(),
            tls: s.tls,
            replication: replication_text(c.meta.replication()),
        });
    });
    for ((row, generation), mut active) in rows.iter().zip(generations).zip(linked) {
        let (Some(pool), Some(generation)) = (row.pool.as_ref(), generation) else {
            continue;
        };
        let cfg = pool.config();
        // In their clients' order, as SHOW CLIENTS lists them.
        active.sort_by_key(|v| v.link);
        views.append(&mut active);
        // Given back while cancels were on their way to it: no client, not idle yet.
        for (ident, since) in pool.being_canceled() {
            let prepared = ident.prepared();
            let state = "being_canceled";
            views.push(unlinked_view(
                row, &ident, state, since, prepared, generation,
            ));
        }
        // Its client gone, its reset query running (PgBouncer's `tested`).
        for (ident, since) in pool.resetting_servers() {
            let prepared = ident.prepared();
            views.push(unlinked_view(
                row, &ident, "tested", since, prepared, generation,
            ));
        }
        // Being opened: no backend yet, and no local end known.
        for o in pool.openings() {
            views.push(ServerView {
                id: o.id,
                user: row.user.clone(),
                database: row.database.clone(),
                state: "new",
                addr: o.addr,
                local_addr: None,
                created: o.since,
                request_time: wall(o.since),
                close_needed: false,
                link: None,
                backend_pid: 0,
                application_name: String::new(),
                prepared: 0,
                tls: Default::default(),
                replication: "none",
            });
        }
        let now = Tick::now();
        for s in pool.idle_servers() {
            let used = cfg.server_check_query.is_some()
                && now.reached(s.last_used, cfg.server_check_delay);
            let state = if used { "used" } else { "idle" };
            views.push(unlinked_view(
                row,
                &s.ident,
                state,
                s.last_used,
                s.prepared,
                generation,
            ));
        }
    }
    newest_sightings(views)
}

/// The views were read from live state, one client and one list after another, not
/// from a snapshot: a server handed on meanwhile is met twice (linked to the client
/// that gave it back, then to the next one or idle). The later sighting is the newer.
fn newest_sightings(mut views: Vec<ServerView>) -> Vec<ServerView> {
    let last: HashMap<u64, usize> = views.iter().enumerate().map(|(i, v)| (v.id, i)).collect();
    let mut i = 0;
    views.retain(|v| {
        let keep = last.get(&v.id) == Some(&i);
        i += 1;
        keep
    });
    views
}

/// A server no client holds (idle, or held for cancels), in `row`'s pool.
fn unlinked_view(
    row: &PoolRow,
    ident: &ServerIdent,
    state: &'static str,
    since: Tick,
    prepared: u32,
    generation: u64,
) -> ServerView {
    ServerView {
        id: ident.id,
        user: row.user.clone(),
        database: row.database.clone(),
        state,
        addr: ident.addr.clone(),
        local_addr: ident.local_addr,
        created: ident.created,
        request_time: wall(since),
        close_needed: ident.generation != generation,
        link: None,
        backend_pid: ident.backend_pid,
        application_name: String::new(),
        prepared,
        tls: ident.tls,
        replication: "none",
    }
}

/// A cancel request's database and user as PgBouncer shows them: its client's, or
/// none for one passed on to a peer.
fn cancel_names(r: &CancelView) -> (String, String) {
    match (&r.target, &r.user) {
        (Target::Pool((db, _)), Some(user)) => (db.to_string(), user.to_string()),
        (Target::Pool((db, _)), None) => (db.to_string(), "(nouser)".to_owned()),
        (Target::Peer(_), _) => ("(nodb)".to_owned(), "(nouser)".to_owned()),
    }
}

/// A cancel request as a client row: waiting for its connection onwards, or sent
/// on it (and linked to it).
fn cancel_client_row(r: &CancelView, listen_port: u16) -> [Cell<'static>; 21] {
    let (database, user) = cancel_names(r);
    let (addr, port) = peer_text(&r.peer, listen_port);
    let (laddr, lport) = local_text(r.local.map(Into::into), listen_port);
    let state = match r.sent {
        Some(_) => "active_cancel_req",
        None => "waiting_cancel_req",
    };
    let link = r.sent.map_or(NO_LINK, |_| server_ptr(r.server_id));
    let arrived = wall(r.arrived);
    [
        "C".into(),
        user.into(),
        database.into(),
        "none".into(),
        state.into(),
        addr,
        port.into(),
        laddr,
        lport.into(),
        Cell::Time(arrived),
        Cell::Time(arrived),
        0u32.into(),
        0u32.into(),
        0u32.into(),
        client_ptr(r.client_id),
        link,
        0u32.into(),
        Cell::Tls(r.tls),
        "".into(),
        0u32.into(),
        r.client_id.into(),
    ]
}

/// The connection a cancel request goes on, as a server: `new` while it is made,
/// then `active_cancel`, linked to the request, until the other end closes it; none
/// while the request waits for its turn.
fn cancel_server_view(r: &CancelView) -> Option<ServerView> {
    let (database, user) = cancel_names(r);
    let (state, since, local, link) = match r.sent {
        Some((at, local)) => ("active_cancel", at, local, Some(r.client_id)),
        None if r.connecting => ("new", r.arrived, None, None),
        None => return None,
    };
    Some(ServerView {
        id: r.server_id,
        user,
        database,
        state,
        addr: r.to.clone(),
        local_addr: local,
        created: since,
        request_time: wall(since),
        close_needed: false,
        link,
        backend_pid: r.backend_pid,
        application_name: String::new(),
        prepared: 0,
        tls: r.server_tls,
        replication: "none",
    })
}

/// A client whose login waits, as PgBouncer lists its login clients: named once
/// its startup packet was read, `(nouser)`/`(nodb)` before.
fn login_row(e: &LoginEntry, listen_port: u16) -> [Cell<'_>; 21] {
    let (addr, port) = peer_text(&e.peer, listen_port);
    let (laddr, lport) = local_text(e.local, listen_port);
    let (user, database, tls) = match &e.names {
        Some(n) => (&*n.user, &*n.database, n.tls),
        None => ("(nouser)", "(nodb)", Default::default()),
    };
    let since = wall(e.since);
    [
        "C".into(),
        user.into(),
        database.into(),
        "none".into(),
        "cl_login".into(),
        addr,
        port.into(),
        laddr,
        lport.into(),
        Cell::Time(since),
        Cell::Time(since),
        0u32.into(),
        0u32.into(),
        0u32.into(),
        client_ptr(e.id),
        NO_LINK,
        0u32.into(),
        Cell::Tls(tls),
        "".into(),
        0u32.into(),
        e.id.into(),
    ]
}

/// SHOW CLIENTS: logged-in clients, then cancel requests on their way.
pub fn clients(app: &App, out: &mut BytesMut) {
    let port = app.config().settings.listen_port;
    let mut t = header(out, false);
    for c in app.client_reg.all() {
        t.row(client_row(&c, c.state().as_str(), port));
    }
    for r in app.cancels.on_way() {
        t.row(cancel_client_row(&r, port));
    }
    t.finish();
}

/// SHOW SERVERS: pool servers, then the connections cancel requests went on.
pub fn servers(app: &App, out: &mut BytesMut) {
    let mut t = header(out, false);
    for s in server_views(app) {
        t.row(server_row(&s));
    }
    for v in app.cancels.on_way().iter().filter_map(cancel_server_view) {
        t.row(server_row(&v));
    }
    t.finish();
}

/// SHOW SOCKETS (every connection) or ACTIVE_SOCKETS (those busy with a request),
/// with PgBouncer's list names as the state.
pub fn sockets(app: &App, out: &mut BytesMut, only_active: bool) {
    let port = app.config().settings.listen_port;
    let clients: Vec<Arc<ClientInfo>> = app.client_reg.all();
    let mut t = header(out, true);
    for c in &clients {
        let state = match c.state() {
            ClientState::Waiting => "cl_waiting",
            ClientState::Active | ClientState::Idle => "cl_active",
        };
        if only_active && c.state() != ClientState::Active {
            continue;
        }
        t.row(client_row(c, state, port));
    }
    for mut s in server_views(app) {
        if only_active && s.state != "active" {
            continue;
        }
        s.state = match s.state {
            "active" => "sv_active",
            "used" => "sv_used",
            "new" => "sv_login",
            _ => "sv_idle",
        };
        t.row(server_row(&s));
    }
    // Last, as PgBouncer's list of login clients. Never in ACTIVE_SOCKETS: a login
    // waits on its client or on a lookup, with nothing of its own to send.
    if !only_active {
        for e in app.logins.all() {
            t.row(login_row(&e, port));
        }
    }
    t.finish();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::Tick;

    #[test]
    fn a_cancel_connection_is_new_until_the_request_is_sent_on_it() {
        let mut r = CancelView {
            target: Target::Pool(("db".into(), "pool_user".into())),
            user: Some("alice".into()),
            client_id: 5,
            peer: PeerAddr::Unix,
            local: None,
            tls: Default::default(),
            arrived: Tick::now(),
            server_id: 9,
            to: ServerAddr::for_host("127.0.0.1", 5432),
            backend_pid: 4242,
            server_tls: Default::default(),
            connecting: false,
            sent: None,
        };
        assert!(cancel_server_view(&r).is_none(), "waiting for its turn");
        r.connecting = true;
        let v = cancel_server_view(&r).expect("a connection");
        assert_eq!((v.state, v.link, v.id), ("new", None, 9));
        assert_eq!((v.database.as_str(), v.user.as_str()), ("db", "alice"));
        let local = "127.0.0.1:40000".parse().ok();
        r.sent = Some((Tick::now(), local));
        let v = cancel_server_view(&r).expect("a connection");
        assert_eq!(
            (v.state, v.link, v.local_addr),
            ("active_cancel", Some(5), local)
        );
        assert_eq!(v.backend_pid, 4242);
        // One passed on to a peer has no pool's names.
        r.target = Target::Peer(3);
        let v = cancel_server_view(&r).expect("a connection");
        assert_eq!(
            (v.database.as_str(), v.user.as_str()),
            ("(nodb)", "(nouser)")
        );
    }
}
