//! The Prometheus endpoint (`metrics_listen = HOST:PORT`, off by default): a minimal
//! HTTP/1.1 responder for `GET /metrics`, so that no exporter process is needed.
//!
//! Each connection gets one response and is closed. Requests are bounded in size
//! (8 KiB of headers) and time (5 s to send them), and the number of connections
//! served at once is capped, so a misbehaving scraper cannot hold resources.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::app::App;

const MAX_REQUEST: usize = 8 * 1024;
const READ_TIMEOUT: Duration = Duration::from_secs(5);
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_CONNECTIONS: usize = 16;

/// Binds the endpoint's listener if `metrics_listen` is set.
pub async fn bind_setting(s: &crate::config::Settings) -> Result<Option<TcpListener>, String> {
    let Some(addr) = &s.metrics_listen else {
        return Ok(None);
    };
    let l = TcpListener::bind(addr.as_str())
        .await
        .map_err(|e| format!("cannot listen on metrics_listen {addr}: {e}"))?;
    tracing::info!("metrics listening on http://{addr}/metrics");
    Ok(Some(l))
}

/// Serves scrapes until the task is aborted.
pub async fn serve(app: Arc<App>, listener: TcpListener) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut failures = crate::lifecycle::AcceptFailures::new("metrics ");
    loop {
        let (sock, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                failures.met(&e).await;
                continue;
            }
        };
        // Over the cap, the connection is closed at once rather than queued.
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            continue;
        };
        let app = app.clone();
        tokio::spawn(async move {
            respond(&app, sock).await;
            drop(permit);
        });
    }
}

/// Reads the request head; None if it is too big, too slow or the peer went away.
async fn read_head(sock: &mut TcpStream) -> Option<String> {
    let mut buf = Vec::with_capacity(512);
    let read = async {
        let mut chunk = [0u8; 1024];
        loop {
            if buf.windows(4).any(|w| w == b"\r\n\r\n") || buf.windows(2).any(|w| w == b"\n\n") {
                return true;
            }
            if buf.len() > MAX_REQUEST {
                return false;
            }
            match sock.read(&mut chunk).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    };
    match crate::timer::timeout(READ_TIMEOUT, read).await {
        Ok(true) => Some(String::from_utf8_lossy(&buf).into_owned()),
        _ => None,
    }
}

/// What to send for a request line: status, content type, body.
fn route(app: &App, request_line: &str) -> (&'static str, &'static str, String) {
    let mut parts = request_line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics") => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            super::metrics_text::render(app),
        ),
        ("GET", _) => ("404 Not Found", "text/plain", "not found\n".into()),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "only GET is served\n".into(),
        ),
    }
}

async fn respond(app: &App, mut sock: TcpStream) {
    let Some(head) = read_head(&mut sock).await else {
        return;
    };
    let line = head.lines().next().unwrap_or("");
    let (status, ctype, body) = route(app, line);
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let write = async {
        sock.write_all(response.as_bytes()).await?;
        sock.shutdown().await
    };
    let _ = crate::timer::timeout(WRITE_TIMEOUT, write).await;
}
