//! Host name lookups for server connections, cached as PgBouncer caches them:
//! `dns_max_ttl` for an answer, `dns_nxdomain_ttl` for a failure, whatever TTL the
//! DNS records carry. The lookup itself is the system resolver's (`getaddrinfo`, on
//! a blocking thread), so `/etc/hosts` and `nsswitch.conf` apply as for libpq.
//!
//! Connections that need a name while it is being looked up share that lookup.
//!
//! The cache belongs to one loaded configuration (a reload starts an empty one), and
//! holds only the names in `[databases]` host entries: the operator's, never a
//! client's.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustc_hash::FxHashMap;

use crate::clock::Tick;

/// One name's last lookup.
#[derive(Debug, Clone)]
struct Entry {
    /// The addresses, or why the lookup failed.
    found: Result<Vec<IpAddr>, String>,
    until: Tick,
}

impl Entry {
    /// Whether it may still be used at `now`.
    fn live(&self, now: Tick) -> bool {
        self.until.nanos_since(now) > 0
    }
}

/// Lookups of the configuration's host names, with how long each may be kept.
#[derive(Debug)]
pub struct DnsCache {
    max_ttl: Duration,
    nxdomain_ttl: Duration,
    entries: Mutex<FxHashMap<String, Entry>>,
    /// The lookup under way for a name, which every connection that needs the name
    /// meanwhile waits for (as PgBouncer's lookups gather their waiters).
    pending: Mutex<FxHashMap<String, Arc<Lookup>>>,
    /// Lookups under way (SHOW LISTS `dns_queries`).
    in_flight: AtomicU32,
    /// Lookups made (for tests).
    made: AtomicU32,
}

/// A lookup's outcome, once there is one.
type Lookup = tokio::sync::OnceCell<Found>;
type Found = Result<Vec<IpAddr>, String>;

/// A name, its addresses (empty after a failure) and the seconds left, for SHOW
/// DNS_HOSTS.
pub type HostRow = (String, Vec<IpAddr>, u64);

impl DnsCache {
    pub fn new(max_ttl: Duration, nxdomain_ttl: Duration) -> DnsCache {
        DnsCache {
            max_ttl,
            nxdomain_ttl,
            entries: Mutex::default(),
            pending: Mutex::default(),
            in_flight: AtomicU32::new(0),
            made: AtomicU32::new(0),
        }
    }

    /// The socket addresses of `host` at `port`: an address as it is, a name from
    /// the cache while its entry lasts, else looked up (and kept).
    pub async fn resolve(&self, host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(vec![SocketAddr::new(ip, port)]);
        }
        let now = Tick::now();
        let cached = self.lock().get(host).filter(|e| e.live(now)).cloned();
        let found = match cached {
            Some(e) => e.found,
            None => {
                let shared = Arc::clone(self.lock_pending().entry(host.to_owned()).or_default());
                // One connection looks up; the others wait for its answer. Should it
                // give up (a connect timeout drops it), the next waiter looks up.
                let found = shared
                    .get_or_init(|| async {
                        self.in_flight.fetch_add(1, Ordering::Relaxed);
                        self.made.fetch_add(1, Ordering::Relaxed);
                        let _done = InFlight(&self.in_flight);
                        lookup(host).await
                    })
                    .await
                    .clone();
                let mut pending = self.lock_pending();
                // The first to come back keeps the answer and retires the lookup.
                if pending.get(host).is_some_and(|p| Arc::ptr_eq(p, &shared)) {
                    pending.remove(host);
                    drop(pending);
                    self.keep(host, &found);
                }
                found
            }
        };
        match found {
            Ok(ips) => Ok(ips
                .into_iter()
                .map(|ip| SocketAddr::new(ip, port))
                .collect()),
            Err(e) => Err(io::Error::other(e)),
        }
    }

    /// Keeps a lookup's outcome for as long as its kind may be kept (not at all for 0).
    fn keep(&self, host: &str, found: &Found) {
        let ttl = match found {
            Ok(_) => self.max_ttl,
            Err(_) => self.nxdomain_ttl,
        };
        if !ttl.is_zero() {
            let entry = Entry {
                found: found.clone(),
                until: Tick::now() + ttl,
            };
            self.lock().insert(host.to_owned(), entry);
        }
    }

    /// The entries still valid, by name.
    pub fn rows(&self) -> Vec<HostRow> {
        let now = Tick::now();
        let mut rows: Vec<HostRow> = self
            .lock()
            .iter()
            .filter(|(_, e)| e.live(now))
            .map(|(name, e)| {
                let left = e.until.micros_since(now).div_ceil(1_000_000);
                let ips = e.found.clone().unwrap_or_default();
                (name.clone(), ips, left)
            })
            .collect();
        rows.sort();
        rows
    }

    /// How many names are kept, and how many lookups are under way (SHOW LISTS).
    pub fn counts(&self) -> (u64, u64) {
        let now = Tick::now();
        let names = self.lock().values().filter(|e| e.live(now)).count();
        (
            names as u64,
            u64::from(self.in_flight.load(Ordering::Relaxed)),
        )
    }

    fn lock_pending(&self) -> std::sync::MutexGuard<'_, FxHashMap<String, Arc<Lookup>>> {
        // Entries are inserted and removed whole: a poisoned map is still sound.
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FxHashMap<String, Entry>> {
        // Entries are inserted whole: a poisoned map is still sound.
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Counts a lookup down when dropped.
struct InFlight<'a>(&'a AtomicU32);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The system resolver's addresses for `host`, each once, in its order.
async fn lookup(host: &str) -> Result<Vec<IpAddr>, String> {
    let addrs = tokio::net::lookup_host((host, 0))
        .await
        .map_err(|e| format!("{host}: {e}"))?;
    let mut ips: Vec<IpAddr> = Vec::new();
    for a in addrs {
        if !ips.contains(&a.ip()) {
            ips.push(a.ip());
        }
    }
    if ips.is_empty() {
        return Err(format!("{host}: no address"));
    }
    Ok(ips)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn connections_needing_a_name_at_once_share_one_lookup() {
        // Nothing kept: only the sharing saves lookups here.
        let cache = Arc::new(DnsCache::new(Duration::ZERO, Duration::ZERO));
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let cache = cache.clone();
            tasks.push(tokio::spawn(
                async move { cache.resolve("localhost", 1).await },
            ));
        }
        for t in tasks {
            assert!(t.await.expect("task").is_ok());
        }
        // All 8 start before the first lookup (on a blocking thread) can end.
        let made = cache.made.load(Ordering::Relaxed);
        assert_eq!(made, 1, "{made} lookups for 8 connections");
        assert!(cache.lock_pending().is_empty());
        // Later, one more.
        cache.resolve("localhost", 1).await.expect("localhost");
        assert_eq!(cache.made.load(Ordering::Relaxed), made + 1);
    }

    #[tokio::test]
    async fn names_are_kept_for_their_ttl_and_addresses_never() {
        let cache = DnsCache::new(Duration::from_secs(15), Duration::from_secs(15));
        let addrs = cache.resolve("127.0.0.1", 5432).await.expect("an address");
        assert_eq!(addrs, vec!["127.0.0.1:5432".parse().expect("addr")]);
        assert!(cache.rows().is_empty());
        let addrs = cache.resolve("localhost", 6432).await.expect("localhost");
        assert!(
            addrs
                .iter()
                .all(|a| a.port() == 6432 && a.ip().is_loopback()),
            "{addrs:?}"
        );
        let rows = cache.rows();
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(rows[0].0, "localhost");
        assert!((1..=15).contains(&rows[0].2), "{rows:?}");
        // A failure is kept too, for its own ttl, and answered from the cache (no
        // lookup: a test cannot count on a resolver that fails fast offline).
        cache.keep(
            "nowhere.example",
            &Err("nowhere.example: no address".into()),
        );
        let e = cache
            .resolve("nowhere.example", 1)
            .await
            .expect_err("kept failure");
        assert_eq!(e.to_string(), "nowhere.example: no address");
        assert_eq!(cache.rows().len(), 2);
        assert_eq!(cache.counts(), (2, 0), "names kept, no lookup under way");
        // Zero: nothing is kept.
        let uncached = DnsCache::new(Duration::ZERO, Duration::ZERO);
        uncached.resolve("localhost", 1).await.expect("localhost");
        uncached.keep("nowhere.example", &Err("no".into()));
        assert!(uncached.rows().is_empty());
    }
}
