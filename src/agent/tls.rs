//! The agent's HTTP server over TLS (`--web.config.file`'s `tls_server_config`).
//!
//! tiny_http speaks plain HTTP: its own TLS would bring rustls 0.20 and ring 0.16 beside the rustls 0.23 that ureq
//! already brings, and it takes connections only from a TCP or unix listener. So the agent accepts TLS itself,
//! with rustls, and relays each connection's plaintext to tiny_http listening on a unix socket in a directory of
//! its own (0700, root's; removed when the server ends): what reaches tiny_http came through TLS, or from root on
//! this host. A connection is a thread, as a request is, at most [`MAX_CONNECTIONS`] at once.

use std::{
    io::{self, Read, Write},
    net::{TcpListener, TcpStream},
    os::{
        fd::{AsRawFd, RawFd},
        unix::{fs::PermissionsExt, net::UnixListener, net::UnixStream},
    },
    path::Path,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{anyhow, Context, Result};
use rustls::{ServerConfig, ServerConnection};

use super::shared::WAKE;
use crate::collect::Stop;

/// Connections relayed at once; more are closed as they come.
const MAX_CONNECTIONS: usize = 64;

/// How long a client has for its handshake, and a write to it or to tiny_http for its bytes to go.
const HANDSHAKE: Duration = Duration::from_secs(10);
const WRITE: Duration = Duration::from_secs(30);

/// A connection silent for this long is closed: longer than the longest profile request waits (300 s and 30).
const IDLE: Duration = Duration::from_secs(360);

/// What a client that speaks plain HTTP to the TLS port is told (as Go's servers tell it).
const PLAIN_HTTP_ANSWER: &[u8] =
    b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n\
Connection: close\r\n\r\nClient sent an HTTP request to an HTTPS server.\n";

/// The directory of tiny_http's unix socket, removed when dropped: kept by the HTTP server's thread.
pub struct Front {
    _dir: tempfile::TempDir,
}

/// Listens on `address` for TLS connections and relays them, until `stop`, to the tiny_http server returned.
pub fn serve(
    address: &str,
    config: Arc<ServerConfig>,
    stop: Stop,
) -> Result<(tiny_http::Server, Front)> {
    let listener = TcpListener::bind(address)?;
    listener.set_nonblocking(true)?;
    let dir = tempfile::Builder::new()
        .prefix("myprobe-agent-")
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir()
        .context("making a private directory for the HTTP server's socket")?;
    let socket = dir.path().join("http.sock");
    let server = tiny_http::Server::from_listener(UnixListener::bind(&socket)?, None)
        .map_err(|e| anyhow!("{e}"))?;
    std::thread::Builder::new()
        .name("https".into())
        .spawn(move || accept(&listener, &config, &socket, &stop))?;
    Ok((server, Front { _dir: dir }))
}

fn accept(listener: &TcpListener, config: &Arc<ServerConfig>, socket: &Path, stop: &Stop) {
    let open = Arc::new(AtomicUsize::new(0));
    while !stop.is_stopped() {
        match readable([listener.as_raw_fd()], WAKE) {
            Ok([true]) => {}
            Ok(_) => continue,
            Err(e) => {
                say!("myprobe: agent: warning: the HTTPS listener failed: {e}");
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
        }
        let tcp = match listener.accept() {
            Ok((tcp, _)) => tcp,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => {
                say!("myprobe: agent: warning: the HTTPS listener failed: {e}");
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
        };
        if open.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            open.fetch_sub(1, Ordering::SeqCst);
            continue;
        }
        let (config, socket, stop, open) = (
            Arc::clone(config),
            socket.to_path_buf(),
            stop.clone(),
            Arc::clone(&open),
        );
        // A client's failure (a handshake refused, a connection reset) is the client's: not said.
        let _ = std::thread::Builder::new()
            .name("https-conn".into())
            .spawn(move || {
                let _ = relay(tcp, config, &socket, &stop);
                open.fetch_sub(1, Ordering::SeqCst);
            });
    }
}

/// Which of `fds` has something to read (or was closed) within `timeout`.
fn readable<const N: usize>(fds: [RawFd; N], timeout: Duration) -> io::Result<[bool; N]> {
    let mut polled = fds.map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    });
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: `polled` is an array of N pollfd, which poll(2) reads and writes within.
    let n = unsafe { libc::poll(polled.as_mut_ptr(), N as libc::nfds_t, ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::Interrupted => Ok([false; N]),
            _ => Err(e),
        };
    }
    Ok(polled.map(|p| p.revents != 0))
}

/// One client's connection: its handshake, then its plaintext to and from tiny_http until either side closes.
fn relay(
    mut tcp: TcpStream,
    config: Arc<ServerConfig>,
    socket: &Path,
    stop: &Stop,
) -> io::Result<()> {
    tcp.set_nonblocking(false)?;
    // tiny_http writes a response in pieces, each a record: Nagle's algorithm would hold the second until the
    // client's delayed ACK of the first (40 ms).
    tcp.set_nodelay(true)?;
    tcp.set_read_timeout(Some(HANDSHAKE))?;
    tcp.set_write_timeout(Some(WRITE))?;
    if speaks_plain_http(&tcp)? {
        let _ = tcp.read(&mut [0; 4096]);
        tcp.write_all(PLAIN_HTTP_ANSWER)?;
        return tcp.shutdown(std::net::Shutdown::Both);
    }
    let mut tls = ServerConnection::new(config).map_err(io::Error::other)?;
    let started = Instant::now();
    while tls.is_handshaking() {
        // Nothing moved for HANDSHAKE, or a client that trickles its bytes took longer in all.
        if tls.complete_io(&mut tcp)? == (0, 0) || started.elapsed() > HANDSHAKE {
            return Ok(());
        }
    }
    tcp.set_read_timeout(None)?;
    let mut backend = UnixStream::connect(socket)?;
    backend.set_write_timeout(Some(WRITE))?;
    let mut buf = vec![0; 16 * 1024];
    let mut idle = Duration::ZERO;
    loop {
        // What came with the handshake, or with the last record read, is already decrypted.
        if !to_backend(&mut tls, &mut backend, &mut buf)? {
            return Ok(());
        }
        send(&mut tls, &mut tcp)?;
        let [from_client, from_backend] = readable([tcp.as_raw_fd(), backend.as_raw_fd()], WAKE)?;
        if !from_client && !from_backend {
            idle += WAKE;
            if idle >= IDLE || stop.is_stopped() {
                return Ok(());
            }
            continue;
        }
        idle = Duration::ZERO;
        if from_client && !read_client(&mut tls, &mut tcp)? {
            return Ok(());
        }
        if from_backend && !to_client(&mut tls, &mut tcp, &mut backend, &mut buf)? {
            tls.send_close_notify();
            return send(&mut tls, &mut tcp);
        }
    }
}

/// A client that starts with a letter sends a request line (a handshake starts with 22, its record's type).
fn speaks_plain_http(tcp: &TcpStream) -> io::Result<bool> {
    let mut first = [0u8; 1];
    Ok(tcp.peek(&mut first)? == 1 && first[0].is_ascii_alphabetic())
}

/// Reads the client's records; false once it closed.
fn read_client(tls: &mut ServerConnection, tcp: &mut TcpStream) -> io::Result<bool> {
    if tls.read_tls(tcp)? == 0 {
        return Ok(false);
    }
    match tls.process_new_packets() {
        Ok(state) => Ok(!state.peer_has_closed() || state.plaintext_bytes_to_read() > 0),
        Err(e) => {
            // The alert that says why, if it can go.
            let _ = send(tls, tcp);
            Err(io::Error::new(io::ErrorKind::InvalidData, e))
        }
    }
}

/// The plaintext decrypted so far, to tiny_http; false once the client said it is done (close_notify).
fn to_backend(
    tls: &mut ServerConnection,
    backend: &mut UnixStream,
    buf: &mut [u8],
) -> io::Result<bool> {
    loop {
        match tls.reader().read(buf) {
            Ok(0) => return Ok(false),
            Ok(n) => backend.write_all(&buf[..n])?,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(true),
            Err(e) => return Err(e),
        }
    }
}

/// What tiny_http wrote, encrypted to the client; false once tiny_http closed the connection.
fn to_client(
    tls: &mut ServerConnection,
    tcp: &mut TcpStream,
    backend: &mut UnixStream,
    buf: &mut [u8],
) -> io::Result<bool> {
    let n = backend.read(buf)?;
    if n == 0 {
        return Ok(false);
    }
    let mut written = 0;
    while written < n {
        written += tls.writer().write(&buf[written..n])?;
        send(tls, tcp)?;
    }
    Ok(true)
}

/// Every record rustls has for the client, written.
fn send(tls: &mut ServerConnection, tcp: &mut TcpStream) -> io::Result<()> {
    while tls.wants_write() {
        tls.write_tls(tcp)?;
    }
    Ok(())
}
