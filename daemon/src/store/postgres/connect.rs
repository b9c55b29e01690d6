//! Opening a connection to the cluster's database, for the pool and for dedicated
//! connections (migrations, `LISTEN`), with the guards a long-running node needs:
//!
//! - **No connection to itself.** While the database is down, a TCP connect to a port in
//!   the kernel's ephemeral range can be handed that same port as its local one: the
//!   socket "connects" to itself, the startup handshake then waits forever for an answer
//!   that is its own message, and the port stays taken so the database cannot bind it
//!   when it comes back. Every TCP socket is checked (local address = peer address) and
//!   dropped at once when it is one.
//! - **Bounded.** The TCP connect and the startup handshake together finish within
//!   [`HANDSHAKE_TIMEOUT`], so a database that answers nothing (or nonsense that never
//!   completes a message) is an `Unavailable` error, not a hung task.
//! - **A silent peer is noticed.** Keepalives and `TCP_USER_TIMEOUT` end a connection
//!   whose peer stopped acknowledging, so a query on it fails instead of hanging.
//!
//! Hosts and ports are taken from the URL as libpq reads them (several hosts tried in
//! order or shuffled with `load_balance_hosts=random`, `hostaddr` for the address and
//! `host` for the TLS name, `target_session_attrs` checked); a Unix-socket host is opened
//! by `tokio-postgres` itself (it cannot connect to itself).

use std::net::SocketAddr;
use std::time::Duration;

use deadpool_postgres::Connect;
use futures_util::future::BoxFuture;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::mpsc::UnboundedSender;
use tokio::task::JoinHandle;
use tokio_postgres::config::{Host, LoadBalanceHosts, TargetSessionAttrs};
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{AsyncMessage, Client, Connection, Notification};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::store::StoreError;

/// The TCP connect and the startup handshake (TLS and authentication included) must
/// finish within this.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long unacknowledged data may sit on a connection before the kernel ends it.
const USER_TIMEOUT: Duration = Duration::from_secs(20);

/// An open connection: the client, the task that drives the connection, and the
/// notifications it receives (`LISTEN`), which the pool's connections ignore.
pub(crate) struct Opened {
    pub client: Client,
    pub driver: JoinHandle<()>,
    pub notifications: tokio::sync::mpsc::UnboundedReceiver<Notification>,
}

/// Whether a connected TCP socket is connected to itself.
pub(crate) fn is_self_connected(stream: &TcpStream) -> bool {
    matches!((stream.local_addr(), stream.peer_addr()), (Ok(l), Ok(p)) if l == p)
}

fn unavailable(what: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(what.to_string())
}

/// Opens a connection as [`Opened`], bounded by [`HANDSHAKE_TIMEOUT`].
pub(crate) async fn open(
    config: &tokio_postgres::Config,
    tls: &MakeRustlsConnect,
) -> Result<Opened, StoreError> {
    open_within(config, tls, HANDSHAKE_TIMEOUT).await
}

/// [`open`] with the handshake bounded by `limit`.
async fn open_within(
    config: &tokio_postgres::Config,
    tls: &MakeRustlsConnect,
    limit: Duration,
) -> Result<Opened, StoreError> {
    let mut targets = tcp_targets(config);
    if targets.is_empty() {
        // Unix-socket hosts (or none): tokio-postgres connects by itself.
        let attempt = config.connect(tls.clone());
        let (client, connection) = tokio::time::timeout(limit, attempt)
            .await
            .map_err(|_| unavailable(no_answer(limit)))?
            .map_err(super::pg_err)?;
        return Ok(drive(client, connection));
    }
    if config.get_load_balance_hosts() == LoadBalanceHosts::Random {
        use rand::seq::SliceRandom;
        targets.shuffle(&mut rand::rng());
    }
    let mut last = None;
    for (host, tls_name, port) in targets {
        match tokio::time::timeout(limit, open_tcp(config, tls, &host, &tls_name, port)).await {
            Ok(Ok(opened)) => return Ok(opened),
            Ok(Err(e)) => last = Some(e),
            Err(_) => last = Some(unavailable(format!("{host}:{port}: {}", no_answer(limit)))),
        }
    }
    Err(last.unwrap_or_else(|| unavailable("no database host to connect to")))
}

fn no_answer(limit: Duration) -> String {
    format!(
        "the database did not complete the connection within {:.1} s",
        limit.as_secs_f64()
    )
}

/// The TCP hosts to try, in order: (address to connect to, name for TLS, port).
fn tcp_targets(config: &tokio_postgres::Config) -> Vec<(String, String, u16)> {
    let hosts = config.get_hosts();
    let addrs = config.get_hostaddrs();
    let ports = config.get_ports();
    let n = hosts.len().max(addrs.len());
    let mut out = Vec::new();
    for i in 0..n {
        let port = ports
            .get(i)
            .or_else(|| ports.first())
            .copied()
            .unwrap_or(5432);
        let name = match hosts.get(i) {
            Some(Host::Tcp(h)) => Some(h.clone()),
            Some(Host::Unix(_)) => {
                if addrs.get(i).is_none() {
                    // A Unix socket: leave the whole URL to tokio-postgres.
                    return Vec::new();
                }
                None
            }
            None => None,
        };
        let connect_to = match addrs.get(i) {
            Some(a) => a.to_string(),
            None => name.clone().unwrap_or_default(),
        };
        out.push((connect_to.clone(), name.unwrap_or(connect_to), port));
    }
    out
}

async fn open_tcp(
    config: &tokio_postgres::Config,
    tls: &MakeRustlsConnect,
    host: &str,
    tls_name: &str,
    port: u16,
) -> Result<Opened, StoreError> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| unavailable(format!("cannot resolve {host}: {e}")))?
        .collect();
    let mut last = None;
    for addr in addrs {
        let stream = match TcpStream::connect(addr).await {
            Ok(s) => s,
            Err(e) => {
                last = Some(unavailable(format!("{addr}: {e}")));
                continue;
            }
        };
        if is_self_connected(&stream) {
            // Dropped here, which frees the port for the database.
            tracing::warn!(%addr, "a connection to the database connected to itself (the database is down and its port is in the ephemeral range); dropped");
            last = Some(unavailable(format!(
                "{addr}: the connection connected to itself (nothing listens there)"
            )));
            continue;
        }
        let _ = stream.set_nodelay(true);
        let sock = socket2::SockRef::from(&stream);
        let _ = sock.set_tcp_keepalive(
            &socket2::TcpKeepalive::new()
                .with_time(Duration::from_secs(10))
                .with_interval(Duration::from_secs(5)),
        );
        let _ = sock.set_tcp_user_timeout(Some(USER_TIMEOUT));
        let mut make = tls.clone();
        let connector =
            <MakeRustlsConnect as MakeTlsConnect<TcpStream>>::make_tls_connect(&mut make, tls_name)
                .map_err(|e| unavailable(format!("TLS for {tls_name}: {e}")))?;
        let opened = match config.connect_raw(stream, connector).await {
            Ok((client, connection)) => drive(client, connection),
            Err(e) => {
                last = Some(super::pg_err(e));
                continue;
            }
        };
        match session_fits(config, &opened.client).await {
            Ok(()) => return Ok(opened),
            Err(e) => last = Some(unavailable(format!("{addr}: {e}"))),
        }
    }
    Err(last.unwrap_or_else(|| unavailable(format!("{host}: no address"))))
}

/// `target_session_attrs` of the URL, as libpq checks it: with several hosts (a primary
/// and its standbys), `read-write` skips a server that allows no writes.
async fn session_fits(config: &tokio_postgres::Config, client: &Client) -> Result<(), String> {
    let wanted = config.get_target_session_attrs();
    if wanted == TargetSessionAttrs::Any {
        return Ok(());
    }
    let rows = client
        .simple_query("SHOW transaction_read_only")
        .await
        .map_err(|e| format!("cannot ask whether the server allows writes: {e}"))?;
    let read_only = rows.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(|v| v == "on"),
        _ => None,
    });
    match (wanted, read_only) {
        (TargetSessionAttrs::ReadWrite, Some(true)) => {
            Err("the server allows no writes (target_session_attrs=read-write)".into())
        }
        (TargetSessionAttrs::ReadOnly, Some(false)) => {
            Err("the server allows writes (target_session_attrs=read-only)".into())
        }
        _ => Ok(()),
    }
}

/// Spawns the task that drives `connection`, forwarding its notifications.
fn drive<S, T>(client: Client, mut connection: Connection<S, T>) -> Opened
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (tx, notifications) = tokio::sync::mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        use futures_util::StreamExt;
        while let Some(m) = messages.next().await {
            match m {
                Ok(AsyncMessage::Notification(n)) => forward(&tx, n),
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "a database connection ended");
                    break;
                }
            }
        }
    });
    Opened {
        client,
        driver,
        notifications,
    }
}

/// A notification nobody listens for (a pool connection) is dropped; the connection
/// goes on.
fn forward(tx: &UnboundedSender<Notification>, n: Notification) {
    let _ = tx.send(n);
}

/// The pool's way of opening connections: [`open`].
pub(crate) struct Guarded {
    pub tls: MakeRustlsConnect,
}

impl Connect for Guarded {
    fn connect(
        &self,
        pg_config: &tokio_postgres::Config,
    ) -> BoxFuture<'_, Result<(Client, JoinHandle<()>), tokio_postgres::Error>> {
        let config = pg_config.clone();
        Box::pin(async move {
            match open(&config, &self.tls).await {
                Ok(o) => Ok((o.client, o.driver)),
                // deadpool wants a tokio-postgres error: the guarded failures become a
                // connection error that says why (pg_err reads it back as Unavailable).
                Err(e) => Err(connect_error(&config, e).await),
            }
        })
    }
}

/// A `tokio_postgres::Error` for a failure of [`open`], which the pool's interface
/// needs. tokio-postgres builds its errors itself, so the error comes from a handshake
/// with an in-memory peer that answers at once with a `FATAL` connection failure
/// (SQLSTATE 08006) carrying the reason: [`super::pg_err`] reads it back as
/// `Unavailable`, with the reason in its message.
async fn connect_error(config: &tokio_postgres::Config, e: StoreError) -> tokio_postgres::Error {
    use tokio::io::AsyncWriteExt;
    let reason = e.to_string().replace('\0', " ");
    let mut body = Vec::new();
    for (field, value) in [
        (b'S', "FATAL"),
        (b'V', "FATAL"),
        (b'C', "08006"),
        (b'M', reason.as_str()),
    ] {
        body.push(field);
        body.extend_from_slice(value.as_bytes());
        body.push(0);
    }
    body.push(0);
    let mut message = vec![b'E'];
    let len = u32::try_from(body.len() + 4).unwrap_or(u32::MAX);
    message.extend_from_slice(&len.to_be_bytes());
    message.extend_from_slice(&body);
    let mut c = config.clone();
    c.ssl_mode(tokio_postgres::config::SslMode::Disable);
    // The handshake ends at the peer's first message, an error: the loop never repeats.
    loop {
        let (ours, mut peer) = tokio::io::duplex(64 * 1024);
        let _ = peer.write_all(&message).await;
        if let Err(err) = c.connect_raw(ours, tokio_postgres::NoTls).await {
            return err;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tls() -> MakeRustlsConnect {
        super::super::tls_connector("").expect("tls")
    }

    #[tokio::test]
    async fn a_socket_connected_to_itself_is_recognised() {
        // Bound to a port and connected to that same port: Linux completes the
        // "simultaneous open" with itself, as it does when the kernel picks a closed
        // server's port as a client's local port.
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind("127.0.0.1:0".parse().expect("addr"))
            .expect("bind");
        let me = socket.local_addr().expect("local");
        let stream = socket.connect(me).await.expect("self-connect");
        assert!(is_self_connected(&stream));

        let server = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("listen");
        let addr = server.local_addr().expect("addr");
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), server.accept());
        let (client, (accepted, _)) = (client.expect("connect"), accepted.expect("accept"));
        assert!(!is_self_connected(&client));
        assert!(!is_self_connected(&accepted));
    }

    /// A server that accepts and then says `reply` (nothing when empty) and keeps the
    /// connection open.
    async fn server_saying(reply: &'static [u8]) -> u16 {
        use tokio::io::AsyncWriteExt;
        let server = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("listen");
        let port = server.local_addr().expect("addr").port();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((mut s, _)) = server.accept().await {
                if !reply.is_empty() {
                    let _ = s.write_all(reply).await;
                }
                held.push(s);
            }
        });
        port
    }

    fn config(port: u16) -> tokio_postgres::Config {
        format!("postgres://kiln@127.0.0.1:{port}/kiln?sslmode=disable")
            .parse()
            .expect("url")
    }

    #[tokio::test]
    async fn a_database_that_answers_nothing_is_unavailable_not_a_hang() {
        let port = server_saying(b"").await;
        let err = open_within(&config(port), &tls(), Duration::from_millis(500))
            .await
            .err()
            .expect("no connection");
        assert!(
            matches!(&err, StoreError::Unavailable(m) if m.contains("did not complete")),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_database_that_answers_nonsense_is_unavailable() {
        // Read as a message of a huge length (never completed) or refused outright.
        let port = server_saying(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
        let err = open_within(&config(port), &tls(), Duration::from_millis(500))
            .await
            .err()
            .expect("no connection");
        assert!(matches!(err, StoreError::Unavailable(_)), "{err}");
    }

    #[tokio::test]
    async fn nothing_listening_is_unavailable_at_once() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        };
        let err = open(&config(port), &tls())
            .await
            .err()
            .expect("no connection");
        assert!(matches!(err, StoreError::Unavailable(_)), "{err}");
    }

    #[tokio::test]
    async fn the_pools_error_carries_the_reason_and_reads_as_unavailable() {
        let reason = StoreError::Unavailable("the connection connected to itself".into());
        let e = connect_error(&config(1), reason).await;
        let mapped = super::super::pg_err(e);
        assert!(
            matches!(&mapped, StoreError::Unavailable(m) if m.contains("connected to itself")),
            "{mapped}"
        );
    }
}
