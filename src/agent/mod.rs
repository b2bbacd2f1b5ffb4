//! `myprobe agent`: an always-on daemon for every MySQL and MariaDB server of a host, in any PID namespace or
//! root (or the one `-p` names, across its restarts). It keeps on-CPU (19 Hz), off-CPU, lock-wait and statement
//! collectors attached to each, and serves what they find over HTTP (`http.rs`): Prometheus metrics
//! (`metrics.rs`), each server's series labelled by it, pprof profiles of the next N seconds of a server, and the
//! windows it keeps as pprof files (`retain.rs`).
//!
//! The main thread looks for servers once a second: a new one, once it listens, is traced by a thread of its own
//! (`server.rs`), whose collectors each run in a thread of their own, as in `myprobe report`, but never end by
//! themselves: the stack collectors move their sums out of the kernel every second (`CollectOptions::slices`) and
//! the server's thread adds each slice to its window under way and to the profile requests waiting. The
//! statements go to the metrics as they end. When a server exits its collectors end, and its series stay at their
//! last values until `--forget-after` ages them out.

mod access;
pub mod history;
pub mod http;
pub mod load;
pub mod metrics;
mod page;
pub mod retain;
pub mod server;
mod shared;
mod tls;
pub mod web_config;

use shared::{release_free_memory, SLICE, WAKE};
pub use shared::{Attached, Options, ProfileRequest, Shared, Status, Sums};

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use crate::{
    collect,
    process::{self, Target},
};

use retain::Retention;

/// A server traced by a thread of its own.
struct Session {
    target: Target,
    thread: std::thread::JoinHandle<Result<()>>,
}

/// A server whose tracing failed: tried again from `at`, later each time.
struct Failed {
    at: Instant,
    failures: u32,
}

/// How long a server found as it starts is waited for to listen before it is traced anyway: until then it takes
/// no connection, which the statements' tracing makes at once.
const LISTEN_WAIT: Duration = Duration::from_secs(30);

/// Runs until SIGINT or SIGTERM.
pub fn run(o: Options) -> Result<()> {
    // First: a file to fix is said before anything else is looked at.
    let web = match &o.web_config {
        Some(path) => web_config::WebConfig::load(path)?,
        None => web_config::WebConfig::default(),
    };
    let scheme = if web.tls.is_some() { "https" } else { "http" };
    crate::collect::features::check_environment(o.queries.btf.as_deref())?;
    // Before any thread is made: they inherit it.
    yield_to_the_server();
    few_arenas();
    collect::install_stop_handler();
    let retention = Retention::new(&o.dir, o.retain, o.retain_bytes)?;
    let history =
        (o.history.as_ref()).map(|(path, r)| crate::history::writer::Writer::open(path, r.clone()));
    let shared = Arc::new(Shared::new(
        o.top,
        retention,
        crate::report::hostname(),
        history,
    ));
    let server = http::serve(&o.listen, web, Arc::clone(&shared))?;
    say!(
        "myprobe: agent: serving {scheme}://{}/ (its page), /metrics and /debug/pprof/; windows of {} s kept in {}",
        o.listen,
        o.window.as_secs(),
        o.dir.display()
    );
    let o = Arc::new(o);
    let mut wanted = Wanted::new(o.pid);
    let mut sessions: Vec<Session> = Vec::new();
    let mut failed: HashMap<u32, Failed> = HashMap::new();
    while !shared.stop.is_stopped() {
        // Servers whose tracing ended: they exited, or it failed (tried again later).
        for s in sessions.extract_if(.., |s| s.thread.is_finished()) {
            let pid = s.target.pid;
            let result = s
                .thread
                .join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("its thread panicked")));
            match result {
                Ok(()) if process::exited(pid) => {
                    say!("myprobe: agent: {} exited", s.target);
                    failed.remove(&pid);
                }
                Ok(()) => {}
                Err(e) => {
                    let failures = failed.get(&pid).map_or(0, |f| f.failures) + 1;
                    say!("myprobe: agent: tracing {} failed: {e:#}", s.target);
                    // Not again at once: the same failure would repeat every second.
                    let at = Instant::now() + Duration::from_secs(5 * u64::from(failures.min(60)));
                    failed.insert(pid, Failed { at, failures });
                }
            }
            // What the tracing of that server took: its unwind tables, symbols and collectors.
            release_free_memory();
        }
        shared.end_finished_sets();
        match wanted.servers(&sessions) {
            Ok(pids) => {
                let (found, share) = (pids.len(), pids.len().max(1) as u32);
                // The statements' CPU budget, split between the servers found now at each of their periods.
                shared.budget_shares.set(share);
                for pid in pids {
                    let traced = sessions.iter().any(|s| s.target.pid == pid);
                    let later = failed.get(&pid).is_some_and(|f| Instant::now() < f.at);
                    // A server found as it starts is traced once it listens; the one -p gave, at once. Asked
                    // last: it reads the server's descriptors.
                    if traced || later || (!wanted.given_and_never_traced() && !ready(pid)) {
                        continue;
                    }
                    let target = match process::resolve(Some(pid), o.any_process) {
                        Ok(t) => t,
                        // The PID given is not a server: said at once, not waited for.
                        Err(e) if wanted.given_and_never_traced() => return Err(e),
                        Err(_) => continue,
                    };
                    wanted.tracing(&target);
                    let (o, shared) = (Arc::clone(&o), Arc::clone(&shared));
                    let traced = target.clone();
                    let thread = std::thread::Builder::new()
                        .name(format!("server-{pid}"))
                        .spawn(move || server::trace(&traced, &o, &shared, share))
                        .context("starting a thread")?;
                    sessions.push(Session { target, thread });
                }
                if sessions.is_empty() {
                    shared.set_waiting(format!(
                        "{found} server(s) found, none traced yet: waiting for them to listen, or to try again \
                         after a failure (said above)"
                    ));
                }
            }
            Err(why) => {
                if sessions.is_empty() {
                    shared.set_waiting(why);
                }
            }
        }
        shared.metrics().forget(o.forget_after);
        answer_untraced(&shared, &sessions);
        // Ctrl-C and SIGTERM are seen within this.
        std::thread::sleep(WAKE);
    }
    say!("myprobe: agent: stopping");
    for s in sessions {
        let _ = s.thread.join();
    }
    shared.end_every_set();
    let _ = server.join();
    Ok(())
}

/// The servers to trace: every one of the host, or the one `-p` gave and, once it exited, the one started as it
/// was (the same executable and data directory).
enum Wanted {
    Every,
    Given {
        pid: u32,
        /// The executable and `--datadir` of the server traced, once it was.
        traced: Option<(PathBuf, Vec<u8>)>,
    },
}

impl Wanted {
    fn new(pid: Option<u32>) -> Wanted {
        pid.map_or(Wanted::Every, |pid| Wanted::Given { pid, traced: None })
    }

    fn given_and_never_traced(&self) -> bool {
        matches!(self, Wanted::Given { traced: None, .. })
    }

    fn tracing(&mut self, target: &Target) {
        if let Wanted::Given { pid, traced } = self {
            *pid = target.pid;
            *traced = Some((target.exe.clone(), command_line(target.pid)));
        }
    }

    /// Their PIDs, or why there are none.
    fn servers(&self, sessions: &[Session]) -> Result<Vec<u32>, String> {
        let (pid, exe, cmdline) = match self {
            Wanted::Every => {
                let found = process::find_servers();
                if found.is_empty() {
                    return Err("no MySQL or MariaDB server (mariadbd/mysqld) is running".into());
                }
                return Ok(found);
            }
            Wanted::Given { pid, traced: None } => return Ok(vec![*pid]),
            Wanted::Given {
                pid,
                traced: Some((exe, cmdline)),
            } => (pid, exe, cmdline),
        };
        if sessions.iter().any(|s| s.target.pid == *pid) {
            return Ok(vec![*pid]);
        }
        let alike: Vec<u32> = process::find_servers()
            .into_iter()
            .filter(|&p| process::exe_of(p).is_ok_and(|e| e == *exe) && command_line(p) == *cmdline)
            .collect();
        match alike.as_slice() {
            [one] => Ok(vec![*one]),
            found => Err(format!(
                "{} servers run {} with the data directory (or command line) of the one traced before",
                found.len(),
                exe.display()
            )),
        }
    }
}

/// Whether a server takes connections (it listens), or started long enough ago that it will not.
fn ready(pid: u32) -> bool {
    crate::client::socket::listens(pid)
        || process::running_for(pid).is_some_and(|t| t >= LISTEN_WAIT)
}

/// Answers the profile requests for a server not traced (any more), once due.
fn answer_untraced(shared: &Shared, sessions: &[Session]) {
    let why = shared.status().waiting;
    let now = Instant::now();
    shared.requests().retain(|r| {
        let orphan = now >= r.until + 3 * SLICE && !sessions.iter().any(|s| s.target.pid == r.pid);
        if orphan {
            let _ = r
                .reply
                .send(Err(format!("server {} is not traced: {why}", r.pid)));
        }
        !orphan
    });
}

/// Puts the calling thread, and the threads it makes from now on, in SCHED_BATCH: the same share of the CPUs, but
/// a thread of the agent that wakes never preempts the one running (sched(7)). On a server whose threads keep the
/// CPUs busy, a wakeup that preempts a thread holding an InnoDB latch leaves the others spinning on it; the agent's
/// work waits the few milliseconds for that thread's turn to end instead.
fn yield_to_the_server() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: a plain system call on the calling thread, with a parameter that lives across it.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) } != 0 {
        say!(
            "myprobe: agent: warning: the agent's threads keep their scheduling policy (SCHED_BATCH refused: {})",
            std::io::Error::last_os_error()
        );
    }
}

/// Two malloc arenas for all the agent's threads, not glibc's eight per CPU. The memory a thread frees stays in its
/// arena, where only the threads given that arena reuse it: a server's collectors come and go with its restarts,
/// each window's profiles are written on another thread than the one that read them, and with many arenas the
/// agent's RSS climbed by tens of MiB at each restart while what it held stayed the same (46 MiB).
fn few_arenas() {
    // SAFETY: mallopt only sets the allocator's own parameter; before any other thread exists.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, 2) };
}

/// What tells a server apart from others of the same executable: its `--datadir` (the port and socket may
/// change from one start to the next), else its whole command line.
fn command_line(pid: u32) -> Vec<u8> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    cmdline
        .split(|&b| b == 0)
        .find(|a| a.starts_with(b"--datadir="))
        .map_or_else(|| cmdline.clone(), <[u8]>::to_vec)
}
