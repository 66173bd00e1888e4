//! Cancel keys: each client gets its own (pid, key) at login; a CancelRequest carrying
//! it is forwarded to the backend currently serving that client, and ignored otherwise.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustc_hash::FxHashMap;
use tokio::net::{TcpStream, UnixStream};

use crate::net::listener::unix_socket_path;
use crate::net::Stream;
use crate::pool::ServerAddr;
use crate::protocol::startup::cancel_request;
use crate::stats::conns::ClientInfo;

/// All live client cancel keys, each with its client's console entry, which knows the
/// server the client is linked to right now (if any).
#[derive(Debug, Default)]
pub struct CancelRegistry {
    // Fx: the keys are ours (random), a peer only looks them up.
    map: Mutex<FxHashMap<(u32, u32), Arc<ClientInfo>>>,
}

/// A client's cancel key; its owner removes it from the registry when the client
/// goes away ([`CancelRegistry::remove`]).
#[derive(Debug, Clone, Copy)]
pub struct CancelKey {
    pub pid: u32,
    pub key: u32,
}

impl CancelRegistry {
    fn lock(&self) -> std::sync::MutexGuard<'_, FxHashMap<(u32, u32), Arc<ClientInfo>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Forgets a client's key.
    pub fn remove(&self, pid: u32, key: u32) {
        self.lock().remove(&(pid, key));
    }

    /// Issues a fresh random key for a new client.
    pub fn register(&self, client: &Arc<ClientInfo>) -> CancelKey {
        let mut map = self.lock();
        loop {
            let (pid, key) = (rand::random::<u32>() & 0x7fff_ffff, rand::random::<u32>());
            if let std::collections::hash_map::Entry::Vacant(e) = map.entry((pid, key)) {
                e.insert(client.clone());
                return CancelKey { pid, key };
            }
        }
    }

    /// Forwards a cancel for (pid, key) if it names a client that holds a server.
    /// Returns whether a cancel was sent.
    pub async fn cancel(&self, pid: u32, key: u32, connect_timeout: Duration) -> bool {
        let client = self.lock().get(&(pid, key)).cloned();
        let Some(server) = client.and_then(|c| c.linked()) else {
            return false;
        };
        let (addr, spid, skey) = (&server.addr, server.backend_pid, server.backend_key);
        let send = async {
            let stream = match addr {
                ServerAddr::Tcp(h, p) => Stream::Tcp(TcpStream::connect((h.as_str(), *p)).await?),
                ServerAddr::Unix(d, p) => {
                    Stream::Unix(UnixStream::connect(unix_socket_path(d, *p)).await?)
                }
            };
            stream.write_all(&cancel_request(spid, skey)).await?;
            // PostgreSQL closes after reading the request; wait for that so the
            // cancel is delivered before we report success.
            let mut buf = bytes::BytesMut::with_capacity(16);
            let _ = stream.read_buf(&mut buf).await;
            Ok::<_, std::io::Error>(())
        };
        let limit = if connect_timeout.is_zero() {
            Duration::from_secs(15)
        } else {
            connect_timeout
        };
        match tokio::time::timeout(limit, send).await {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                tracing::warn!("cancel request to {addr} failed: {e}");
                false
            }
            Err(_) => {
                tracing::warn!("cancel request to {addr} timed out");
                false
            }
        }
    }
}
