//! The agent's HTTP endpoints: its page at `/` (page.rs), `/metrics` (Prometheus), `/healthz`, the session history
//! (`/api/history`, `/api/history/at`) and the windows kept with their times (`/api/windows`), and pprof as Go's `net/http/pprof` serves
//! it: `/debug/pprof/profile?seconds=N` (on-CPU), `/debug/pprof/offcpu` and `/debug/pprof/locks` (also as
//! `block` and `mutex`, Go's names), which wait N seconds and answer the profile of those seconds; and the
//! windows kept, under `/debug/pprof/windows/`.
//!
//! A request is served by a thread of its own, at most [`MAX_REQUESTS`] at once (more get 503): a profile
//! request waits its seconds, and must not hold up a scrape meanwhile.
//!
//! With `--web.config.file`, over TLS (tls.rs) and behind basic auth (access.rs), checked for every request
//! before its path is routed: an endpoint added to `handle` is covered as it is written.

use std::{
    io::Cursor,
    sync::{
        atomic::{AtomicUsize, Ordering},
        mpsc, Arc,
    },
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context, Result};
use tiny_http::{Header, Request, Response, Server};

use super::{
    access::{Access, REALM},
    metrics::Own,
    shared::{ProfileRequest, Shared, Status, WAKE},
    tls,
    web_config::WebConfig,
};
use crate::{collect::Kind, history};

/// Requests served at once.
const MAX_REQUESTS: usize = 8;

/// The longest profile a request may ask for, and what it gets without `seconds` (Go's default).
const MAX_SECONDS: u64 = 300;
const DEFAULT_SECONDS: u64 = 30;

/// Listens on `address` (an error at once if it cannot), over TLS and behind basic auth as `web` says, and serves
/// from a thread of its own until the agent is stopped (`Shared::stop`).
pub fn serve(
    address: &str,
    web: WebConfig,
    shared: Arc<Shared>,
) -> Result<std::thread::JoinHandle<()>> {
    let listening = || format!("listening on {address} (choose another with --listen)");
    let (server, front) = match web.tls {
        None => (
            Server::http(address)
                .map_err(|e| anyhow::anyhow!("{e}"))
                .with_context(listening)?,
            None,
        ),
        Some(config) => {
            let (server, front) =
                tls::serve(address, config, shared.stop.clone()).with_context(listening)?;
            (server, Some(front))
        }
    };
    let access = Arc::new(Access::new(web.users, web.headers));
    let busy = Arc::new(AtomicUsize::new(0));
    Ok(std::thread::spawn(move || {
        // The TLS front's socket lives as long as this thread serves it.
        let _front = front;
        while !shared.stop.is_stopped() {
            // Ctrl-C is seen within a second; a request wakes it at once.
            let request = match server.recv_timeout(WAKE) {
                Ok(Some(r)) => r,
                Ok(None) => continue,
                Err(e) => {
                    say!("myprobe: agent: warning: the HTTP server failed: {e}");
                    std::thread::sleep(Duration::from_millis(200));
                    continue;
                }
            };
            if busy.fetch_add(1, Ordering::SeqCst) >= MAX_REQUESTS {
                busy.fetch_sub(1, Ordering::SeqCst);
                let _ = request.respond(text(503, "too many requests at once; try again\n"));
                continue;
            }
            let (shared, busy, access) =
                (Arc::clone(&shared), Arc::clone(&busy), Arc::clone(&access));
            std::thread::spawn(move || {
                handle(request, &shared, &access);
                busy.fetch_sub(1, Ordering::SeqCst);
            });
        }
    }))
}

type Answer = Response<Cursor<Vec<u8>>>;

fn handle(request: Request, shared: &Shared, access: &Access) {
    // Before any path is routed: every endpoint, those added later too, is behind it.
    if !access.allows(authorization(&request).as_deref()) {
        let _ = request.respond(with_headers(unauthorized(), access));
        return;
    }
    let url = request.url().to_string();
    let (path, query) = url.split_once('?').unwrap_or((&url, ""));
    let answer = match path {
        "/metrics" => metrics(shared),
        "/healthz" => health(shared),
        "/" => with_type(
            200,
            super::page::html(&shared.host, cpus()).into_bytes(),
            "text/html; charset=utf-8",
        ),
        "/debug/pprof" | "/debug/pprof/" => index(shared),
        "/debug/pprof/profile" => profile(shared, Kind::Cpu, query),
        "/debug/pprof/offcpu" | "/debug/pprof/block" => profile(shared, Kind::Offcpu, query),
        "/debug/pprof/locks" | "/debug/pprof/mutex" => profile(shared, Kind::Locks, query),
        "/debug/pprof/windows" | "/debug/pprof/windows/" => windows(shared),
        "/api/history" => history_range(shared, query),
        "/api/history/at" => history_at(shared, query),
        "/api/windows" => windows_json(shared, query),
        p => match p.strip_prefix("/debug/pprof/windows/") {
            Some(name) => window(shared, name),
            None => text(404, &format!("no such page: {p}; see /debug/pprof/\n")),
        },
    };
    let _ = request.respond(with_headers(answer, access));
}

fn authorization(request: &Request) -> Option<String> {
    request
        .headers()
        .iter()
        .find(|h| h.field.equiv("Authorization"))
        .map(|h| h.value.as_str().to_string())
}

fn unauthorized() -> Answer {
    let challenge = format!("Basic realm=\"{REALM}\"");
    text(401, "401 Unauthorized: a user and password are needed\n")
        .with_header(Header::from_bytes("WWW-Authenticate", challenge).expect("a valid header"))
}

/// `http_server_config.headers`, on every response.
fn with_headers(mut answer: Answer, access: &Access) -> Answer {
    for (name, value) in access.headers() {
        if let Ok(header) = Header::from_bytes(name.as_bytes(), value.as_bytes()) {
            answer.add_header(header);
        }
    }
    answer
}

/// `/api/history?from=S&to=S&points=N` (seconds since the epoch; the last hour by default): the load over the range.
fn history_range(shared: &Shared, query: &str) -> Answer {
    let now = now_s();
    let from = param(query, "from").unwrap_or(now - 3600);
    let to = param(query, "to").unwrap_or(now);
    let points = param(query, "points").unwrap_or(60).clamp(1, 2000);
    history_json(shared, |db| {
        Ok(serde_json::to_vec(&history::read::range(
            db, from, to, points,
        )?)?)
    })
}

/// `/api/history/at?t=S`: the sessions at that second, and who blocked whom.
fn history_at(shared: &Shared, query: &str) -> Answer {
    let Some(t) = param(query, "t") else {
        return text(400, "give the second as t=SECONDS_SINCE_THE_EPOCH\n");
    };
    history_json(shared, |db| {
        Ok(serde_json::to_vec(&history::read::moment(db, t)?)?)
    })
}

fn history_json(
    shared: &Shared,
    read: impl FnOnce(&rusqlite::Connection) -> anyhow::Result<Vec<u8>>,
) -> Answer {
    let Some(path) = shared.history_path() else {
        return text(404, "this agent keeps no session history (--no-history)\n");
    };
    match history::store::Store::open_read(&path).and_then(|db| read(&db)) {
        Ok(body) => with_type(200, body, "application/json"),
        Err(e) => text(500, &format!("the history could not be read: {e:#}\n")),
    }
}

/// `/api/windows?from=S&to=S` (the last hour by default): the windows kept that overlap the range, oldest first,
/// each with its start and end (seconds since the epoch), for the page's links to a moment's flame graphs.
fn windows_json(shared: &Shared, query: &str) -> Answer {
    let now = now_s();
    let from = param(query, "from").unwrap_or(now - 3600);
    let to = param(query, "to").unwrap_or(now);
    let listed: Vec<serde_json::Value> = shared
        .retention
        .overlapping(from, to)
        .iter()
        .filter_map(|k| {
            let (kind, pid, _) = k.parts()?;
            let (start, end) = k.span()?;
            Some(serde_json::json!({
                "name": k.name, "kind": kind, "pid": pid, "from": start, "to": end, "bytes": k.bytes,
            }))
        })
        .collect();
    match serde_json::to_vec(&listed) {
        Ok(body) => with_type(200, body, "application/json"),
        Err(e) => text(500, &format!("the windows could not be listed: {e}\n")),
    }
}

/// The CPUs the agent's host gives it: the line the page's chart draws, where the load exceeds what can run.
fn cpus() -> usize {
    std::thread::available_parallelism().map_or(0, usize::from)
}

fn param(query: &str, name: &str) -> Option<i64> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == name)
        .and_then(|(_, v)| v.parse().ok())
}

fn now_s() -> i64 {
    SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn text(status: u16, body: &str) -> Answer {
    with_type(
        status,
        body.as_bytes().to_vec(),
        "text/plain; charset=utf-8",
    )
}

fn with_type(status: u16, body: Vec<u8>, content_type: &str) -> Answer {
    let header = Header::from_bytes("Content-Type", content_type).expect("a valid header");
    Response::from_data(body)
        .with_status_code(status)
        .with_header(header)
}

fn metrics(shared: &Shared) -> Answer {
    let own = Own::read();
    let body = shared.metrics().render(&own);
    with_type(
        200,
        body.into_bytes(),
        "text/plain; version=0.0.4; charset=utf-8",
    )
}

fn health(shared: &Shared) -> Answer {
    let status = shared.status();
    if status.attached.is_empty() {
        return text(503, &format!("waiting: {}\n", status.waiting));
    }
    let mut body = String::new();
    for a in &status.attached {
        body += &format!(
            "ok: tracing PID {}: {} since {}\n",
            a.pid, a.server, a.since
        );
    }
    text(200, &body)
}

fn index(shared: &Shared) -> Answer {
    let body = format!(
        "<html><head><title>myprobe agent</title></head><body><h1>myprobe agent on {}</h1>\
         <p><a href=\"/\">The page</a>: DB load over time, the sessions at a moment and who blocked whom.</p><ul>\
         <li><a href=\"/metrics\">/metrics</a>: Prometheus</li>\
         <li><a href=\"/healthz\">/healthz</a></li>\
         <li><a href=\"/debug/pprof/profile?seconds=10\">/debug/pprof/profile?seconds=N</a>: on-CPU samples</li>\
         <li><a href=\"/debug/pprof/offcpu?seconds=10\">/debug/pprof/offcpu?seconds=N</a> (or block): off-CPU µs</li>\
         <li><a href=\"/debug/pprof/locks?seconds=10\">/debug/pprof/locks?seconds=N</a> (or mutex): lock waits µs</li>\
         <li><a href=\"/debug/pprof/windows/\">/debug/pprof/windows/</a>: the windows kept</li>\
         </ul><p>Servers traced (a profile is of one: <code>&amp;pid=PID</code> where there are several):</p><ul>{}</ul>\
         </body></html>\n",
        crate::render::svg::xml_escape(&shared.host),
        shared
            .status()
            .attached
            .iter()
            .map(|a| format!("<li>{}</li>", crate::render::svg::xml_escape(&a.server)))
            .collect::<String>()
    );
    with_type(200, body.into_bytes(), "text/html; charset=utf-8")
}

/// The profile of the next `seconds` (Go's contract for `/debug/pprof/profile`).
fn profile(shared: &Shared, kind: Kind, query: &str) -> Answer {
    let seconds = match seconds_of(query) {
        Ok(s) => s,
        Err(e) => return text(400, &format!("{e}\n")),
    };
    let pid = match server_of(query, &shared.status()) {
        Ok(pid) => pid,
        Err((status, e)) => return text(status, &format!("{e}\n")),
    };
    let (reply, answer) = mpsc::channel();
    let duration = Duration::from_secs(seconds);
    shared.requests().push(ProfileRequest {
        pid,
        kind,
        until: Instant::now() + duration,
        started: SystemTime::now(),
        sums: Default::default(),
        covered: None,
        reply,
    });
    // The main thread answers once the time has passed and the collectors' slices of it are in.
    match answer.recv_timeout(duration + Duration::from_secs(30)) {
        Ok(Ok(bytes)) => {
            let mut r = with_type(200, bytes, "application/octet-stream");
            let disposition = format!("attachment; filename=\"{}.pb.gz\"", kind.name());
            r.add_header(
                Header::from_bytes("Content-Disposition", disposition).expect("a valid header"),
            );
            r
        }
        Ok(Err(e)) => text(503, &format!("{e}\n")),
        Err(_) => text(503, "the profile was not ready in time; try again\n"),
    }
}

/// The server a profile is asked of: `pid=N`, or the one traced; an HTTP status and why where there is none.
fn server_of(query: &str, status: &Status) -> Result<u32, (u16, String)> {
    let traced: Vec<String> = status.attached.iter().map(|a| a.server.clone()).collect();
    match query.split('&').find_map(|kv| kv.strip_prefix("pid=")) {
        Some(pid) => match pid.parse::<u32>() {
            Ok(pid) if status.attached.iter().any(|a| a.pid == pid) => Ok(pid),
            _ => Err((
                404,
                format!(
                    "no server with PID {pid:?} is traced; traced: {}",
                    traced.join("; ")
                ),
            )),
        },
        None => match status.attached.as_slice() {
            [one] => Ok(one.pid),
            [] => Err((503, format!("no server traced now: {}", status.waiting))),
            _ => Err((
                400,
                format!(
                    "{} servers are traced: add &pid=PID for one of them: {}",
                    traced.len(),
                    traced.join("; ")
                ),
            )),
        },
    }
}

fn seconds_of(query: &str) -> Result<u64, String> {
    let Some(value) = query.split('&').find_map(|kv| kv.strip_prefix("seconds=")) else {
        return Ok(DEFAULT_SECONDS);
    };
    match value.parse::<u64>() {
        Ok(s) if (1..=MAX_SECONDS).contains(&s) => Ok(s),
        _ => Err(format!(
            "seconds must be a whole number from 1 to {MAX_SECONDS} (got {value:?})"
        )),
    }
}

fn windows(shared: &Shared) -> Answer {
    let mut body = String::from(
        "<html><head><title>myprobe agent: windows</title></head><body><h1>Windows kept</h1><ul>\n",
    );
    for k in shared.retention.list().iter().rev() {
        body += &format!(
            "<li><a href=\"/debug/pprof/windows/{0}\">{0}</a> ({1} bytes)</li>\n",
            k.name, k.bytes
        );
    }
    body += "</ul></body></html>\n";
    with_type(200, body.into_bytes(), "text/html; charset=utf-8")
}

fn window(shared: &Shared, name: &str) -> Answer {
    match shared
        .retention
        .path_of(name)
        .and_then(|p| std::fs::read(p).ok())
    {
        Some(bytes) => with_type(200, bytes, "application/octet-stream"),
        None => text(404, &format!("no window {name:?} is kept\n")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_as_go_takes_them() {
        assert_eq!(seconds_of(""), Ok(30));
        assert_eq!(seconds_of("seconds=5"), Ok(5));
        assert_eq!(seconds_of("debug=0&seconds=7"), Ok(7));
        assert!(seconds_of("seconds=0").is_err());
        assert!(seconds_of("seconds=301").is_err());
        assert!(seconds_of("seconds=-1").is_err());
        assert!(seconds_of("seconds=x").is_err());
    }
}
