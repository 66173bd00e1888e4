//! The state one Sluice instance owns and passes to every task: the current config,
//! the pools, the cancel-key registry and the shutdown signal. Nothing is global, so
//! several instances can run in one process (tests do).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use rustc_hash::FxHashMap;
use tokio::sync::watch;

use crate::admin::AdminState;
use crate::config::Config;
use crate::pool::Pools;
use crate::session::cancel::CancelRegistry;
use crate::stats::conns::{ClientInfo, ClientRegistry};

/// How the process is shutting down, if it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Shutdown {
    /// Running normally.
    No,
    /// SIGTERM / SHUTDOWN WAIT_FOR_CLIENTS: no new clients; exit when the last leaves.
    WaitForClients,
    /// SIGINT / SHUTDOWN WAIT_FOR_SERVERS: no new clients; exit once no server is lent.
    WaitForServers,
    /// SIGQUIT / SHUTDOWN: exit now.
    Immediate,
}

/// Whether clients may get servers right now, and which databases refuse new logins.
/// Sessions check it before every acquire and wait while it blocks them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Gate {
    /// A shutdown that stops lending servers (WAIT_FOR_SERVERS or harder).
    pub stopping: bool,
    /// PAUSE (all databases).
    pub paused: bool,
    /// SUSPEND.
    pub suspended: bool,
    /// PAUSE db (and KILL db, until RESUME db).
    pub paused_dbs: Vec<String>,
    /// DISABLE db.
    pub disabled_dbs: Vec<String>,
}

impl Gate {
    /// Whether a client of `db` must wait before getting a server.
    pub fn blocks(&self, db: &str) -> bool {
        self.stopping || self.paused || self.suspended || self.paused_dbs.iter().any(|d| d == db)
    }

    /// PgBouncer's pause mode: a PAUSE of all databases, or a shutdown that stops
    /// lending servers (SIGINT, WAIT_FOR_SERVERS).
    pub fn pause_mode(&self) -> bool {
        self.paused || self.stopping
    }

    /// Whether new logins to `db` are refused.
    pub fn disabled(&self, db: &str) -> bool {
        self.disabled_dbs.iter().any(|d| d == db)
    }
}

/// Shared state of one running instance.
#[derive(Debug)]
pub struct App {
    config: RwLock<Arc<Config>>,
    pub pools: Pools,
    pub cancels: CancelRegistry,
    /// Prepared statements shared by all clients (transaction pooling).
    pub statements: Arc<crate::prepared::Registry>,
    /// Connected clients (logged in or logging in), for `max_client_conn`.
    pub clients: AtomicU32,
    /// Client ids for logs.
    pub client_ids: AtomicU64,
    shutdown: watch::Sender<Shutdown>,
    /// Bumped at each reload, for what applies settings to things already open (the
    /// listeners' `tcp_defer_accept`).
    reloads: watch::Sender<u64>,
    /// PAUSE, SUSPEND, DISABLE and stopping, for sessions to wait on.
    gate: watch::Sender<Gate>,
    /// Logged-in clients, for the console and metrics.
    pub client_reg: Arc<ClientRegistry>,
    /// Clients whose login waited and is not over yet, for SHOW SOCKETS.
    pub logins: crate::stats::logins::LoginRegistry,
    /// The console's and the statistics' own state.
    pub admin: AdminState,
    /// Logged-in clients per database and per user.
    client_counts: Mutex<ClientCounts>,
    /// Idle clients asleep without a task (session/keeper.rs).
    pub keeper: crate::session::keeper::Keeper,
    /// Whether a client waiting in line leaves its request for the releasing side to
    /// write (`pool::Request`): on a single event loop, where the woken waiter runs
    /// only after every task already queued. With worker threads a woken task runs
    /// next on the waking thread anyway, and the write would be made holding the
    /// pool's lock, which the other threads wait on.
    pub hand_over_requests: bool,
}

/// Logged-in clients per database and per user (max_db_client_connections,
/// max_user_client_connections). Keyed by the pools' shared names: counting a client
/// allocates nothing. Fx hashing: the names are those of logged-in clients (counted
/// after authentication, at most max_client_conn of them), not anything a peer can
/// fill the table with.
#[derive(Debug, Default)]
struct ClientCounts {
    db: FxHashMap<Arc<str>, u32>,
    user: FxHashMap<Arc<str>, u32>,
}

/// The limit of `max_db_client_connections` / `max_user_client_connections` that the
/// counts in `m` leave no room under, if any (0 means unlimited).
fn full(
    m: &ClientCounts,
    db: &str,
    user: &str,
    (db_max, user_max): (u32, u32),
) -> Result<(), &'static str> {
    if db_max != 0 && m.db.get(db).copied().unwrap_or(0) >= db_max {
        return Err("max_db_client_connections");
    }
    if user_max != 0 && m.user.get(user).copied().unwrap_or(0) >= user_max {
        return Err("max_user_client_connections");
    }
    Ok(())
}

impl ClientCounts {
    fn add(map: &mut FxHashMap<Arc<str>, u32>, key: &Arc<str>) {
        match map.get_mut(&**key) {
            Some(c) => *c += 1,
            None => {
                map.insert(key.clone(), 1);
            }
        }
    }

    fn sub(map: &mut FxHashMap<Arc<str>, u32>, key: &str) {
        if let Some(c) = map.get_mut(key) {
            *c = c.saturating_sub(1);
            if *c == 0 {
                map.remove(key);
            }
        }
    }
}

impl App {
    pub fn new(config: Config) -> Arc<App> {
        let (shutdown, _) = watch::channel(Shutdown::No);
        let (gate, _) = watch::channel(Gate::default());
        let (reloads, _) = watch::channel(0);
        Arc::new(App {
            // peer_id only changes with a restart, so it is fixed here.
            cancels: CancelRegistry::new(config.settings.peer_id),
            config: RwLock::new(Arc::new(config)),
            pools: Pools::new(),
            statements: Arc::default(),
            clients: AtomicU32::new(0),
            client_ids: AtomicU64::new(1),
            shutdown,
            reloads,
            gate,
            client_reg: Arc::default(),
            logins: Default::default(),
            admin: AdminState::default(),
            client_counts: Mutex::default(),
            keeper: Default::default(),
            hand_over_requests: tokio::runtime::Handle::try_current()
                .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread),
        })
    }

    /// The current config snapshot; cheap (one read lock and an `Arc` clone).
    pub fn config(&self) -> Arc<Config> {
        match self.config.read() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Swaps in a reloaded config and lets the pools adapt.
    pub fn set_config(&self, config: Config) {
        let config = Arc::new(config);
        let old = match self.config.write() {
            Ok(mut g) => std::mem::replace(&mut *g, config.clone()),
            Err(p) => std::mem::replace(&mut *p.into_inner(), config.clone()),
        };
        self.pools.reconfigure(&config);
        self.drop_removed_databases(&old, &config);
        self.close_retired_sessions();
        self.reloads.send_modify(|n| *n += 1);
    }

    /// Disconnects the clients of the databases a reloaded config no longer serves
    /// (not named, and no `*` entry), as PgBouncer drops such a database at a
    /// reload: each client is told `database removed`, as its pool's waiters are.
    fn drop_removed_databases(&self, old: &Config, new: &Config) {
        if new.fallback_database.is_some() {
            return;
        }
        let gone = |db: &str| !new.databases.contains_key(db);
        let mut removed: std::collections::BTreeSet<&str> = old
            .databases
            .keys()
            .map(String::as_str)
            .filter(|d| gone(d))
            .collect();
        let clients: Vec<_> = self
            .client_reg
            .all()
            .into_iter()
            .filter(|c| !c.meta.is_admin() && gone(&c.meta.database))
            .collect();
        removed.extend(clients.iter().map(|c| &*c.meta.database));
        for d in removed {
            tracing::warn!(
                "dropping database '{d}' as it does not exist anymore or inactive auto-database"
            );
        }
        if clients.is_empty() {
            return;
        }
        for c in clients {
            c.kill(crate::stats::conns::KillReason::DatabaseRemoved);
        }
        self.keeper.kick();
    }

    /// Disconnects the clients whose server was just retired (RECONNECT, a reload
    /// that changed its database entry) and should not be kept to the end of their
    /// session, as PgBouncer's janitor does: with `server_fast_close`, session-mode
    /// clients between transactions (one in a transaction is ended at its end, by
    /// its session: run.rs); and replication clients, whose sessions may never end.
    /// Each is told `database configuration changed`.
    pub fn close_retired_sessions(&self) {
        let fast = self.config().settings.server_fast_close;
        for c in self.client_reg.all() {
            let replication = c.meta.replication().is_some();
            if c.meta.is_admin() || !(replication || (fast && c.is_ready())) {
                continue;
            }
            let Some(server) = c.linked() else { continue };
            let Some(pool) = self.pools.get(&c.meta.database, &c.meta.pool_user) else {
                continue;
            };
            if server.generation != pool.generation() {
                c.kill(crate::stats::conns::KillReason::ConfigChanged);
            }
        }
    }

    /// Changes at each reload ([`App::set_config`]).
    pub fn reload_watch(&self) -> watch::Receiver<u64> {
        self.reloads.subscribe()
    }

    /// Starts (or escalates) a shutdown; a milder mode never replaces a stricter one.
    pub fn begin_shutdown(&self, mode: Shutdown) {
        self.shutdown.send_if_modified(|cur| {
            if mode > *cur {
                *cur = mode;
                true
            } else {
                false
            }
        });
        if mode >= Shutdown::WaitForServers {
            self.update_gate(|g| g.stopping = true);
            // Those waiting in line are told now (as PgBouncer's janitor tells them);
            // those waiting on the gate, by their sessions (session/run.rs).
            for p in self.pools.all() {
                p.stop_lending();
            }
        }
    }

    /// A receiver to wait for gate changes (PAUSE, RESUME, ...).
    pub fn gate_watch(&self) -> watch::Receiver<Gate> {
        self.gate.subscribe()
    }

    /// Whether the gate holds back requests for `db` now (read on every checkout).
    pub fn gate_blocks(&self, db: &str) -> bool {
        self.gate.borrow().blocks(db)
    }

    /// Whether DISABLE holds `db` now (read at every login, so no copy of the gate).
    pub fn gate_disables(&self, db: &str) -> bool {
        self.gate.borrow().disabled(db)
    }

    /// A copy of the gate now.
    pub fn gate(&self) -> Gate {
        self.gate.borrow().clone()
    }

    /// Changes the gate and wakes waiting sessions if it changed.
    pub fn update_gate(&self, f: impl FnOnce(&mut Gate)) {
        self.gate.send_if_modified(|g| {
            let before = g.clone();
            f(g);
            *g != before
        });
    }

    /// The current shutdown mode.
    pub fn shutdown_mode(&self) -> Shutdown {
        *self.shutdown.borrow()
    }

    /// A receiver to wait for shutdown changes.
    pub fn shutdown_watch(&self) -> watch::Receiver<Shutdown> {
        self.shutdown.subscribe()
    }

    /// Counts a client in, from its accept (PgBouncer's count of client sockets).
    pub fn add_client(&self) {
        self.clients.fetch_add(1, Ordering::AcqRel);
    }

    /// Clients connected now (logged in or logging in), this one included, as
    /// `max_client_conn` counts them.
    pub fn client_count(&self) -> u32 {
        self.clients.load(Ordering::Acquire)
    }

    /// Counts a logged-in client against the limits of its database and user (0 means
    /// unlimited). Returns the name of the setting that refuses it, if one does.
    /// Undo it with [`App::uncount_client`].
    pub fn count_client(&self, who: &ClientInfo, limits: (u32, u32)) -> Result<(), &'static str> {
        let (db, user) = (&who.meta.database, &who.meta.user);
        let mut m = self.client_counts.lock().unwrap_or_else(|p| p.into_inner());
        full(&m, db, user, limits)?;
        ClientCounts::add(&mut m.db, db);
        ClientCounts::add(&mut m.user, user);
        Ok(())
    }

    /// Whether a client of `db` and `user` would be refused by their limits now: the
    /// check PgBouncer makes before it asks for a password (the count is made, and
    /// checked again, once the client has logged in).
    pub fn check_client_limits(
        &self,
        db: &str,
        user: &str,
        limits: (u32, u32),
    ) -> Result<(), &'static str> {
        if limits == (0, 0) {
            return Ok(());
        }
        let m = self.client_counts.lock().unwrap_or_else(|p| p.into_inner());
        full(&m, db, user, limits)
    }

    /// A client counted by [`App::count_client`] has left.
    pub fn uncount_client(&self, who: &ClientInfo) {
        let mut m = self.client_counts.lock().unwrap_or_else(|p| p.into_inner());
        ClientCounts::sub(&mut m.db, &who.meta.database);
        ClientCounts::sub(&mut m.user, &who.meta.user);
    }

    /// Logged-in clients of a database.
    pub fn db_clients(&self, db: &str) -> u32 {
        let m = self.client_counts.lock().unwrap_or_else(|p| p.into_inner());
        m.db.get(db).copied().unwrap_or(0)
    }

    pub fn remove_client(&self) {
        self.clients.fetch_sub(1, Ordering::AcqRel);
    }
}
