//! `so_reuseport`: two Sluice processes on one TCP port, the kernel spreading the
//! clients over both.

use super::{cfg_at, md5_sluice, select};
use crate::support::{self, wait_until, Sluice};
use std::time::Duration;

/// Logins each instance logged (`log_connections` is on by default).
fn logins(s: &Sluice) -> usize {
    s.log().matches("login attempt:").count()
}

/// Clients of [`two_processes_share_a_port`].
const N: usize = 24;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_share_a_port() {
    // Session pooling keeps a server per client: a pool as large as the clients, so
    // that however the kernel spreads them, none waits (past the default 20, the
    // 21st on one process waited out query_wait_timeout and failed).
    let pool = N.to_string();
    let a = md5_sluice()
        .setting("so_reuseport", "1")
        .setting("default_pool_size", &pool)
        .start();
    let port = a.port().to_string();
    // Its own temp dir, so its own unix socket, pidfile and log.
    let b = md5_sluice()
        .setting("so_reuseport", "1")
        .setting("default_pool_size", &pool)
        .setting("listen_port", &port)
        .start();
    // The port answered already (A): B is listening once its unix socket, bound after
    // its TCP listener, exists.
    let b_socket = b.socket_dir().join(format!(".s.PGSQL.{port}"));
    assert!(
        wait_until(Duration::from_secs(10), || b_socket.exists()),
        "second instance never bound\n{}",
        b.diagnostics()
    );

    // Each connection comes from a new source port, so the kernel's choice is a fresh
    // draw: 24 all landing on one instance has odds of 2 in 16 million.
    let mut clients = Vec::new();
    for i in 0..N {
        let c = support::connect(&cfg_at("127.0.0.1", a.port())).await;
        select(&c, i as i32).await;
        clients.push(c);
    }
    // Log lines may trail the answers a little.
    wait_until(Duration::from_secs(5), || logins(&a) + logins(&b) >= N);
    let (la, lb) = (logins(&a), logins(&b));
    assert_eq!(
        la + lb,
        N,
        "A logged {la}, B {lb}\n{}\n{}",
        a.log(),
        b.log()
    );
    assert!(
        la > 0 && lb > 0,
        "one instance got every client: A {la}, B {lb}"
    );
    // Every client is served by whichever instance took it.
    for (i, c) in clients.iter().enumerate() {
        select(c, 100 + i as i32).await;
    }
}

#[test]
fn without_it_a_second_process_cannot_bind() {
    let a = md5_sluice().setting("so_reuseport", "1").start();
    let port = a.port().to_string();
    // Both must set it: a process without the option is refused the port.
    let (status, out) = md5_sluice()
        .setting("listen_port", &port)
        .start_expect_failure();
    assert!(!status.success());
    assert!(
        out.contains(&format!("bind 127.0.0.1:{port}")),
        "error does not name the address: {out}"
    );
}

/// The restart `so_reuseport` allows: the old process, told to shut down once its
/// clients leave (SIGTERM), stops taking new ones but serves those it has, while the
/// new one on the same port takes every new client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_process_takes_over_while_the_old_one_drains() {
    let mut old = md5_sluice().setting("so_reuseport", "1").start();
    let port = old.port();
    // Alone on the port: this client is the old process's.
    let held = support::connect(&cfg_at("127.0.0.1", port)).await;
    select(&held, 1).await;
    let new = md5_sluice()
        .setting("so_reuseport", "1")
        .setting("listen_port", &port.to_string())
        .start();
    let new_socket = new.socket_dir().join(format!(".s.PGSQL.{port}"));
    assert!(wait_until(Duration::from_secs(10), || new_socket.exists()));

    old.signal(libc::SIGTERM);
    assert!(
        wait_until(Duration::from_secs(5), || old
            .log()
            .contains("waiting for clients")),
        "{}",
        old.diagnostics()
    );
    // The old listener closes as the shutdown begins, just after that line.
    tokio::time::sleep(Duration::from_millis(300)).await;
    const N: usize = 12;
    let mut clients = Vec::new();
    for i in 0..N {
        let c = support::connect(&cfg_at("127.0.0.1", port)).await;
        select(&c, i as i32).await;
        clients.push(c);
    }
    wait_until(Duration::from_secs(5), || logins(&new) >= N);
    assert_eq!(logins(&new), N, "{}", new.log());
    assert_eq!(logins(&old), 1, "{}", old.log());
    // The old process still serves its client, and leaves once it is gone.
    select(&held, 2).await;
    assert!(old.is_running());
    drop(held);
    assert!(
        old.wait_exit(Duration::from_secs(10)).is_some(),
        "old process still running\n{}",
        old.diagnostics()
    );
    select(&clients[0], 3).await;
}
