//! What every thread is doing (`myprobe stacks`): threads with their state, syscall, stack, the lock they wait
//! on and who holds it, and the statement they run; merged like pt-pmp (identical stacks, with a count), the
//! wait-for graph's cycles reported as deadlocks.

pub mod core;
pub mod core_file;
pub mod resolve;
pub mod text;

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    fmt::Write as _,
    path::{Path, PathBuf},
    rc::Rc,
};

use serde::Serialize;

use crate::{
    collect::{self, threads::ThreadRecord},
    profile::waits::{self, FutexOp},
    query::{holders::Listed, CauseWait},
    render::terminal_safe,
    server::Cause,
    server::WaitKind,
    symbolize::{data::DataSymbolizer, Symbolizer},
};

/// One thread, named.
#[derive(Clone, Debug, Serialize)]
pub struct ThreadStack {
    pub tid: u32,
    pub name: String,
    /// As `ps` shows it (R, S, D, …); not in a core.
    pub state: Option<char>,
    /// On a CPU when read.
    pub running: bool,
    /// The syscall it is in, with the arguments that mean something: `futex(0x… wait)`, `read(fd 12)`.
    pub syscall: Option<String>,
    /// How long since it last ran, ms (not running threads).
    pub idle_ms: Option<f64>,
    /// The lock it waits on, if in a futex wait.
    pub waits: Option<LockWait>,
    /// The statement its connection runs, from the server's process list (normalized).
    pub statement: Option<String>,
    /// Why it waits, where its stack says (a row lock, a metadata lock, the redo log, …), with what it waits for
    /// and who holds it where the server lists them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<CauseWait>,
    /// Frames, leaf first (user frames, then kernel frames with `--kernel`).
    pub frames: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct LockWait {
    /// Named as `profile locks` names locks.
    pub lock: String,
    /// `mutex`, `rw-lock`, `condition/event`, …
    pub kind: &'static str,
    /// The thread holding it, where the lock word records it (glibc mutexes).
    pub owner: Option<u32>,
    /// The lock word's address.
    pub address: u64,
    /// The function that waits for it (above the lock's own frames).
    pub site: Option<String>,
    /// For a lock that records no owner (InnoDB's latches, rw-locks): the threads in the same function that
    /// do not wait for it, which may be the ones holding it (none listed for a site every connection passes).
    pub inside: Vec<u32>,
}

/// Names every thread of a live process's snapshot: its frames, its syscall, the lock it waits on and who holds
/// it.
/// Where the file a core or a crash report names at `path` is on this machine: under `root` (`--root`, the
/// filesystem a container's server ran in), else at that path.
pub fn file_under(root: Option<&Path>, path: &Path) -> PathBuf {
    match root {
        Some(root) => root.join(path.strip_prefix("/").unwrap_or(path)),
        None => path.to_path_buf(),
    }
}

pub fn name_threads(
    pid: u32,
    records: &[ThreadRecord],
    wait_begins: &waits::WaitBegins,
) -> Vec<ThreadStack> {
    let mut symbolizer = Symbolizer::new(pid).ok();
    let brackets = match symbolizer.as_mut() {
        Some(s) => wait_begins.brackets(pid, s),
        None => waits::Brackets::new(),
    };
    name_threads_with(
        symbolizer.as_mut(),
        DataSymbolizer::new(pid).ok().as_mut(),
        records,
        &brackets,
    )
}

/// Names every thread with these symbolizers (of a live process or of a core file); `brackets`: the functions
/// that announce their waits (`waits::WaitBegins`), by name.
pub fn name_threads_with(
    mut symbolizer: Option<&mut Symbolizer>,
    mut data: Option<&mut DataSymbolizer>,
    records: &[ThreadRecord],
    brackets: &waits::Brackets,
) -> Vec<ThreadStack> {
    let tids: HashSet<u32> = records.iter().map(|r| r.tid).collect();
    let mut threads: Vec<ThreadStack> = records
        .iter()
        .map(|r| {
            let (user, kernel): (Vec<Rc<str>>, Vec<Rc<str>>) = match symbolizer.as_mut() {
                Some(s) => (
                    s.user_stack(r.stack.user()),
                    s.kernel_stack(r.stack.kernel()),
                ),
                None => (
                    r.stack
                        .user()
                        .iter()
                        .map(|ip| format!("{ip:#x}").into())
                        .collect(),
                    Vec::new(),
                ),
            };
            let mut cause = None;
            let waits = r.futex.map(|f| {
                let op = r
                    .syscall
                    .map_or(FutexOp::Unknown, |(_, args)| futex_op(args[1]));
                let kind = waits::kind(&user, op);
                // A snapshot has no type announced: an InnoDB lock wait is taken for a row lock's.
                cause = Some(waits::cause(&user, kind, brackets).given(0));
                let site = waits::site(&user);
                let lock = match data.as_mut() {
                    Some(d) => waits::lock_word_name(d, f.addr, site.as_deref()),
                    None => format!("{:#x}", f.addr),
                };
                LockWait {
                    lock,
                    kind: kind.label(),
                    owner: owner(kind, &user, f.word, f.next_int, &tids).filter(|&t| t != r.tid),
                    address: f.addr,
                    site,
                    inside: Vec::new(),
                }
            });
            ThreadStack {
                tid: r.tid,
                name: r.name.to_string(),
                state: r.state,
                running: r.on_cpu,
                syscall: r.syscall.map(|(nr, args)| describe_syscall(nr, &args)),
                idle_ms: r.idle_ns.map(|ns| ns as f64 / 1e6),
                waits,
                statement: None,
                cause: cause.map(|cause| CauseWait {
                    cause,
                    us: 0,
                    site: None,
                    object: None,
                    holder: None,
                }),
                frames: user.iter().chain(&kernel).map(|f| f.to_string()).collect(),
            }
        })
        .collect();
    mark_possible_holders(&mut threads);
    threads
}

/// What each futex wait of `records` waits for, as `name_threads_with` names it from its stack, and the site it waits
/// from (what names a lock word in no variable, [`waits::lock_word_name`]): nothing else of what a snapshot shows (the
/// history names a few hundred waits a second).
pub fn futex_causes(
    symbolizer: &mut Symbolizer,
    records: &[&ThreadRecord],
    brackets: &waits::Brackets,
) -> Vec<(u32, Cause, Option<String>)> {
    records
        .iter()
        .filter(|r| r.futex.is_some())
        .map(|r| {
            let user = symbolizer.user_stack(r.stack.user());
            let op = r
                .syscall
                .map_or(FutexOp::Unknown, |(_, args)| futex_op(args[1]));
            let cause = waits::cause(&user, waits::kind(&user, op), brackets).given(0);
            (r.tid, cause, waits::site(&user))
        })
        .collect()
}

/// Marks the threads that may hold a lock which records no owner: those whose stacks are in the function that waits
/// for it (its critical section is there or below) without waiting for it themselves.
fn mark_possible_holders(threads: &mut [ThreadStack]) {
    let found: Vec<Vec<u32>> = threads
        .iter()
        .map(|t| {
            let Some(w) = t.waits.as_ref().filter(|w| {
                w.owner.is_none()
                    && [WaitKind::Mutex, WaitKind::RwLock, WaitKind::OtherLock]
                        .iter()
                        .any(|k| k.label() == w.kind)
            }) else {
                return Vec::new();
            };
            // The function's own name: `mariadbd+0x… in f` names a place, not a function.
            let Some(site) = w.site.as_deref().filter(|s| !s.contains(" in ")) else {
                return Vec::new();
            };
            threads
                .iter()
                .filter(|o| o.tid != t.tid)
                .filter(|o| o.waits.as_ref().is_none_or(|ow| ow.address != w.address))
                .filter(|o| o.frames.iter().any(|f| f == site))
                .map(|o| o.tid)
                .collect()
        })
        .collect();
    for (t, inside) in threads.iter_mut().zip(found) {
        if let Some(w) = &mut t.waits {
            w.inside = inside;
        }
    }
}

/// FUTEX_WAIT and friends (the command in the low bits, without the private and clock flags).
fn futex_op(op: u64) -> FutexOp {
    match op & 15 {
        0 => FutexOp::Wait,
        9 => FutexOp::WaitBitset,
        6 | 13 => FutexOp::LockPi,
        _ => FutexOp::Unknown,
    }
}

/// The holder of a lock, where the lock word keeps it: a glibc mutex's `__owner` (the int 8 bytes into it), or a
/// priority-inheritance futex's word (the owner's TID in its low 30 bits). Condition variables and InnoDB's
/// latches keep none.
fn owner(
    kind: WaitKind,
    frames: &[Rc<str>],
    word: u32,
    next: i32,
    tids: &HashSet<u32>,
) -> Option<u32> {
    if kind != WaitKind::Mutex || frames.iter().any(|f| f.starts_with("srw_mutex_impl")) {
        return None;
    }
    let owner = u32::try_from(next).ok().filter(|t| tids.contains(t));
    owner.or_else(|| Some(word & 0x3fff_ffff).filter(|t| tids.contains(t)))
}

fn describe_syscall(nr: i64, args: &[u64; 6]) -> String {
    let name = collect::syscalls::name(nr as u64);
    match name.as_ref() {
        "futex" => {
            let op = match args[1] & 15 {
                0 => "wait",
                1 => "wake",
                6 => "lock_pi",
                9 => "wait_bitset",
                13 => "lock_pi2",
                _ => "op",
            };
            format!("futex({:#x} {op})", args[0])
        }
        "read" | "write" | "pread64" | "pwrite64" | "readv" | "writev" | "recvfrom" | "sendto"
        | "recvmsg" | "sendmsg" | "fsync" | "fdatasync" | "accept" | "accept4"
        | "io_uring_enter" => {
            format!("{name}(fd {})", args[0] as i32)
        }
        "poll" | "ppoll" | "epoll_wait" | "epoll_pwait" => {
            format!("{name}({} fds)", args[1] as i32)
        }
        _ => format!("{name}()"),
    }
}

/// The statements of the server's process list, by the OS thread that runs them; `Err` says why there are
/// none (the server did not answer, no access, or it names no thread for them).
/// What the server says of its threads: the statement each runs and its connection, and the lock waits it lists
/// (`query::holders::listed`).
#[derive(Default)]
pub struct ServerWord {
    pub statements: HashMap<u32, String>,
    pub connections: HashMap<u32, u64>,
    pub waits: Vec<(u64, Listed)>,
}

impl ServerWord {
    /// Gives each waiting thread what it waits for and who holds it, as the server listed.
    pub fn name(&self, threads: &mut [ThreadStack]) {
        for t in threads {
            t.statement = self.statements.get(&t.tid).cloned().or(t.statement.take());
            let (Some(conn), Some(c)) = (self.connections.get(&t.tid), t.cause.as_mut()) else {
                continue;
            };
            let listed = self
                .waits
                .iter()
                .find(|(w, l)| w == conn && l.is_of(c.cause));
            if let Some((_, l)) = listed {
                *c = l.wait();
            }
        }
    }
}

pub fn statements(
    args: &crate::client::ConnectArgs,
    pid: u32,
    binary: &Path,
) -> anyhow::Result<ServerWord> {
    let mut client = crate::client::connect(args, Some(pid))?;
    let list = client.processlist()?;
    // Its own connection is always in it, but where the list is a table performance_schema fills.
    if list.rows.is_empty() {
        anyhow::bail!(
            "its process list has no connection but this one (an idle server, or MySQL with performance_schema off)"
        );
    }
    let mut tids = crate::process::tids::TidMap::new(pid);
    let (mut unmapped, mut threadless) = (0, 0);
    let mut connections = HashMap::new();
    let statements: HashMap<u32, String> = list
        .rows
        .into_iter()
        .filter_map(|r| {
            let text = r.info?;
            let Some(tid) = r.tid else {
                threadless += 1;
                return None;
            };
            let Some(tid) = tids.host(tid) else {
                unmapped += 1;
                return None;
            };
            connections.insert(tid, r.id);
            Some((tid, crate::wire::fingerprint::normalize(&text)))
        })
        .collect();
    if threadless > 0 && statements.is_empty() {
        anyhow::bail!(
            "its process list names no thread for the {threadless} statements it runs (MySQL with \
             performance_schema off)"
        );
    }
    if unmapped > 0 {
        say!(
            "myprobe: {unmapped} statements of the process list left out: the server names their threads by ids \
             that none of its threads has in its PID namespace now (ended since)"
        );
    }
    let memory = crate::query::holders::MemoryLocks::of(pid, binary, client.server());
    let (waits, failed) = crate::query::holders::listed(&mut client, memory.as_ref());
    if let Some(e) = failed {
        say!("myprobe: note: who holds the locks threads wait for is not read: {e:#}");
    }
    Ok(ServerWord {
        statements,
        connections,
        waits,
    })
}

/// The thread serving each connection of `sessions` (by its object's address), among `records`: the one whose
/// thread pointer the connection keeps. Each of `threads` so served gets its connection's statement, as the
/// process list would give it.
pub fn link_sessions(
    sessions: &[crate::sessions::Session],
    records: &[ThreadRecord],
    threads: &mut [ThreadStack],
) -> HashMap<u64, u32> {
    let served: HashMap<u64, u32> = crate::sessions::serving_threads(sessions, records)
        .into_iter()
        .map(|(thd, t)| (thd, t.tid))
        .collect();
    for s in sessions {
        let (Some(tid), Some(query)) = (served.get(&s.thd), &s.query) else {
            continue;
        };
        if let Some(t) = threads.iter_mut().find(|t| t.tid == *tid) {
            t.statement = Some(query_text(query));
        }
    }
    served
}

/// A statement read from memory as the process list's are shown: normalized.
fn query_text(query: &crate::sessions::Query) -> String {
    use crate::sessions::Query;
    match query {
        Query::Text(t) => crate::wire::fingerprint::normalize(t),
        Query::Truncated(t) => format!("{} (truncated)", crate::wire::fingerprint::normalize(t)),
        Query::Changing => "(its statement changed while read)".to_string(),
    }
}

/// The connections read from the server's memory (`sessions`), those running a statement first, by id, then those
/// idle in an open transaction (who may hold the locks others wait for): a line each with its statement
/// (normalized as the process list's are) and, where read, its user and host, database, command and time in it at
/// `now_us` (microseconds since the epoch, where known; an idle one's: since its last command), whether a
/// transaction is open, the thread serving it (`served`, by the object's address) and whether that thread is
/// `crashed`; then the count of the idle.
pub fn render_sessions(
    sessions: &[crate::sessions::Session],
    now_us: Option<u64>,
    served: &HashMap<u64, u32>,
    crashed: Option<u32>,
) -> String {
    let mut running: Vec<&crate::sessions::Session> =
        sessions.iter().filter(|s| s.query.is_some()).collect();
    running.sort_by_key(|s| s.id);
    let mut idle_in_transaction: Vec<&crate::sessions::Session> = sessions
        .iter()
        .filter(|s| s.query.is_none() && s.in_transaction == Some(true))
        .collect();
    idle_in_transaction.sort_by_key(|s| s.id);
    let mut out = format!(
        "connections read from the server's memory: {} running a statement, {} idle ({} in an open transaction)\n",
        running.len(),
        sessions.len() - running.len(),
        idle_in_transaction.len()
    );
    for session in running.into_iter().chain(idle_in_transaction) {
        // What PROCESSLIST would say beside it: its database, command and time, where they were read.
        let time = session
            .started_us
            .zip(now_us)
            .map(|(t, now)| format!("{} s", now.saturating_sub(t) / 1_000_000));
        let transaction = (session.in_transaction == Some(true)).then_some("in a transaction");
        let context: Vec<&str> = [
            session.db.as_deref(),
            session.command,
            time.as_deref(),
            transaction,
        ]
        .into_iter()
        .flatten()
        .collect();
        let mut context = match context.is_empty() {
            true => String::new(),
            false => format!(" ({})", context.join(", ")),
        };
        if let Some(user) = &session.user {
            let host = session.host.as_ref().map(|h| format!("@{h}"));
            context = format!(" {user}{}{context}", host.unwrap_or_default());
        }
        if let Some(&tid) = served.get(&session.thd) {
            context += &format!(", thread {tid}");
            if crashed == Some(tid) {
                context += ", which crashed";
            }
        }
        let text = match &session.query {
            Some(query) => query_text(query),
            None => "idle in its transaction".to_string(),
        };
        let _ = writeln!(
            out,
            "  connection {}{}: {}",
            session.id,
            crate::render::terminal_safe(&context),
            crate::render::terminal_safe(&text)
        );
    }
    out
}

/// Threads with identical frames, merged: most threads first.
pub struct Group<'a> {
    pub frames: &'a [String],
    pub threads: Vec<&'a ThreadStack>,
}

pub fn groups(threads: &[ThreadStack]) -> Vec<Group<'_>> {
    let mut by_frames: BTreeMap<&[String], Vec<&ThreadStack>> = BTreeMap::new();
    for t in threads {
        by_frames.entry(&t.frames).or_default().push(t);
    }
    let mut groups: Vec<Group> = by_frames
        .into_iter()
        .map(|(frames, threads)| Group { frames, threads })
        .collect();
    groups.sort_by(|a, b| {
        b.threads
            .len()
            .cmp(&a.threads.len())
            .then(a.frames.cmp(b.frames))
    });
    groups
}

/// Every cycle of the wait-for graph (a thread waits for a lock held by the next): the threads of each, in
/// order, starting from the lowest thread id.
pub fn deadlocks(threads: &[ThreadStack]) -> Vec<Vec<u32>> {
    let next: HashMap<u32, u32> = threads
        .iter()
        .filter_map(|t| Some((t.tid, t.waits.as_ref()?.owner?)))
        .collect();
    let mut seen = HashSet::new();
    let mut cycles = Vec::new();
    let mut starts: Vec<u32> = next.keys().copied().collect();
    starts.sort_unstable();
    for start in starts {
        let mut path = Vec::new();
        let mut at = start;
        while let Some(&n) = next.get(&at) {
            if seen.contains(&at) {
                break;
            }
            seen.insert(at);
            path.push(at);
            if let Some(i) = path.iter().position(|&t| t == n) {
                let mut cycle = path[i..].to_vec();
                let low = (0..cycle.len()).min_by_key(|&j| cycle[j]).unwrap_or(0);
                cycle.rotate_left(low);
                cycles.push(cycle);
                break;
            }
            at = n;
        }
    }
    cycles
}

/// Thread ids shown in one line, at most.
const TIDS_SHOWN: usize = 12;

/// What one thread is doing, in one line: `1234 one_connection S 3.2 s in futex(0x… wait)`.
fn one_line(t: &ThreadStack) -> String {
    let mut line = t.tid.to_string();
    if !t.name.is_empty() {
        let _ = write!(line, " {}", terminal_safe(&t.name));
    }
    if let Some(state) = t.state {
        let _ = write!(line, " {state}");
    }
    if t.running {
        line.push_str(" (on a CPU)");
    }
    if let Some(ms) = t.idle_ms.filter(|_| !t.running && t.state != Some('R')) {
        let _ = write!(line, " {}", human_ms(ms));
    }
    if let Some(s) = &t.syscall {
        let _ = write!(line, " in {s}");
    }
    line
}

fn human_ms(ms: f64) -> String {
    if ms >= 1000.0 {
        format!("{:.1} s", ms / 1000.0)
    } else {
        format!("{ms:.0} ms")
    }
}

/// "waits for a row lock on db.t (PRIMARY, X) held by connection 42, idle in its transaction for 40 s" where the
/// stack names the cause; else "waits for mutex LOCK held by thread T", or what is known without an owner.
fn wait_line(t: &ThreadStack) -> Option<String> {
    let w = t.waits.as_ref()?;
    if let Some(c) = t
        .cause
        .as_ref()
        .filter(|c| !matches!(c.cause, Cause::InternalLock | Cause::UnknownWait))
    {
        return Some(terminal_safe(&c.phrase()).into_owned());
    }
    let lock = terminal_safe(&w.lock);
    Some(match w.owner {
        Some(o) => format!("waits for {} {lock} held by thread {o}", w.kind),
        None if [WaitKind::Condition, WaitKind::StatementWait]
            .iter()
            .any(|k| k.label() == w.kind) =>
        {
            format!("waits on {} {lock}", w.kind)
        }
        // InnoDB's latches, rw-locks, metadata locks: the lock word keeps no owner.
        None if w.inside.is_empty() => format!(
            "waits for {} {lock} (this kind of lock records no owner)",
            w.kind
        ),
        None => format!(
            "waits for {} {lock} (this kind of lock records no owner; in {} without waiting for it, maybe \
             holding it: thread{} {})",
            w.kind,
            w.site.as_deref().unwrap_or_default(),
            if w.inside.len() == 1 { "" } else { "s" },
            w.inside
                .iter()
                .take(TIDS_SHOWN)
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(" ")
        ),
    })
}

/// The aggregated view, pt-pmp's: each distinct stack once, with its count and threads, most threads first;
/// then the deadlocks.
pub fn render_groups(threads: &[ThreadStack]) -> String {
    let mut out = String::new();
    for g in groups(threads) {
        let tids: Vec<String> = g
            .threads
            .iter()
            .take(TIDS_SHOWN)
            .map(|t| t.tid.to_string())
            .collect();
        let more = g.threads.len().saturating_sub(TIDS_SHOWN);
        let _ = write!(
            out,
            "{} thread{}: {}{}",
            g.threads.len(),
            if g.threads.len() == 1 { "" } else { "s" },
            tids.join(" "),
            if more > 0 {
                format!(" … ({more} more)")
            } else {
                String::new()
            }
        );
        let running = g.threads.iter().filter(|t| t.running).count();
        if running > 0 {
            let _ = write!(out, " ({running} on a CPU)");
        }
        out.push('\n');
        // What tells the threads of the group apart: their contended waits and statements, one line each (idle
        // threads waiting for work are the count alone).
        for t in &g.threads {
            let contended = t
                .waits
                .as_ref()
                .is_some_and(|w| w.kind != WaitKind::Condition.label());
            let wait = wait_line(t).filter(|_| contended);
            if wait.is_some() || t.statement.is_some() {
                let _ = writeln!(out, "  {}", one_line(t));
            }
            if let Some(w) = wait {
                let _ = writeln!(out, "      {w}");
            }
            if let Some(s) = &t.statement {
                let _ = writeln!(out, "      statement: {}", terminal_safe(s));
            }
        }
        if let [t] = g.threads[..] {
            let contended = t
                .waits
                .as_ref()
                .is_some_and(|w| w.kind != WaitKind::Condition.label());
            if !contended && t.statement.is_none() {
                let _ = writeln!(out, "  {}", one_line(t));
            }
        }
        frames_block(&mut out, g.frames);
        out.push('\n');
    }
    deadlock_block(&mut out, threads);
    out
}

/// Each thread on its own, in thread id order.
pub fn render_threads(threads: &[ThreadStack]) -> String {
    let mut out = String::new();
    let mut sorted: Vec<&ThreadStack> = threads.iter().collect();
    sorted.sort_by_key(|t| t.tid);
    for t in sorted {
        let _ = writeln!(out, "{}", one_line(t));
        if let Some(w) = wait_line(t) {
            let _ = writeln!(out, "    {w}");
        }
        if let Some(s) = &t.statement {
            let _ = writeln!(out, "    statement: {}", terminal_safe(s));
        }
        frames_block(&mut out, &t.frames);
        out.push('\n');
    }
    deadlock_block(&mut out, threads);
    out
}

fn frames_block(out: &mut String, frames: &[String]) {
    if frames.is_empty() {
        out.push_str("    (no user stack)\n");
    }
    for f in frames {
        let _ = writeln!(out, "    {}", terminal_safe(f));
    }
}

fn deadlock_block(out: &mut String, threads: &[ThreadStack]) {
    let by_tid: HashMap<u32, &ThreadStack> = threads.iter().map(|t| (t.tid, t)).collect();
    for cycle in deadlocks(threads) {
        let _ = writeln!(
            out,
            "DEADLOCK: {} threads wait for each other:",
            cycle.len()
        );
        for tid in &cycle {
            let Some(t) = by_tid.get(tid) else { continue };
            let _ = writeln!(out, "  thread {}", one_line(t));
            if let Some(w) = wait_line(t) {
                let _ = writeln!(out, "      {w}");
            }
            frames_block(out, &t.frames);
        }
        out.push('\n');
    }
}

/// Folded stacks (root first), one line per distinct stack with its thread count, for flame graphs.
pub fn folded(threads: &[ThreadStack]) -> String {
    let mut out = String::new();
    for g in groups(threads) {
        let frames: Vec<&str> = g.frames.iter().rev().map(String::as_str).collect();
        let stack = if frames.is_empty() {
            "[no user stack]".to_string()
        } else {
            frames.join(";")
        };
        let _ = writeln!(out, "{} {}", stack, g.threads.len());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thread(tid: u32, owner: Option<u32>) -> ThreadStack {
        ThreadStack {
            tid,
            name: "t".into(),
            state: Some('S'),
            running: false,
            syscall: None,
            idle_ms: None,
            waits: owner.map(|o| LockWait {
                lock: "m".into(),
                kind: "mutex",
                owner: Some(o),
                address: 0x1000,
                site: None,
                inside: Vec::new(),
            }),
            statement: None,
            cause: None,
            frames: vec!["f".into()],
        }
    }

    #[test]
    fn cycles_of_the_wait_for_graph_are_deadlocks() {
        // 1 → 2 → 1 is a deadlock; 3 → 1 waits behind it; 5 → 6 → 7 → 5 is another; 8 waits for no one.
        let threads = [
            thread(2, Some(1)),
            thread(1, Some(2)),
            thread(3, Some(1)),
            thread(7, Some(5)),
            thread(6, Some(7)),
            thread(5, Some(6)),
            thread(8, None),
        ];
        assert_eq!(deadlocks(&threads), vec![vec![1, 2], vec![5, 6, 7]]);
        assert!(deadlocks(&threads[2..3]).is_empty());
    }

    #[test]
    fn threads_inside_a_latch_s_site_are_its_possible_holders() {
        let latch = |tid: u32, address: u64| {
            let mut t = thread(tid, None);
            t.waits = Some(LockWait {
                lock: "buf_pool".into(),
                kind: WaitKind::RwLock.label(),
                owner: None,
                address,
                site: Some("buf_page_get_gen".into()),
                inside: Vec::new(),
            });
            t.frames = vec![
                "ssux_lock_impl<true>::rd_wait".into(),
                "buf_page_get_gen".into(),
            ];
            t
        };
        // 1 and 2 wait for the latch; 3 is in the function past it (it may hold it); 4 waits for another
        // latch in the same function (it may hold this one too); 5 is elsewhere.
        let mut threads = vec![
            latch(1, 0xa),
            latch(2, 0xa),
            thread(3, None),
            latch(4, 0xb),
            thread(5, None),
        ];
        threads[2].frames = vec![
            "btr_cur_search_to_nth_level".into(),
            "buf_page_get_gen".into(),
        ];
        mark_possible_holders(&mut threads);
        let inside = |i: usize| threads[i].waits.as_ref().unwrap().inside.clone();
        assert_eq!(inside(0), vec![3, 4]);
        assert_eq!(inside(1), vec![3, 4]);
        assert_eq!(inside(3), vec![1, 2, 3]);
        let line = wait_line(&threads[0]).unwrap();
        assert!(
            line.ends_with(
                "in buf_page_get_gen without waiting for it, maybe holding it: threads 3 4)"
            ),
            "{line}"
        );
    }

    #[test]
    fn identical_stacks_merge_most_first() {
        let mut threads = vec![thread(1, None), thread(2, None), thread(3, None)];
        threads[2].frames = vec!["g".into()];
        let g = groups(&threads);
        assert_eq!(g.len(), 2);
        assert_eq!(g[0].threads.len(), 2);
        assert_eq!(folded(&threads), "f 2\ng 1\n");
    }
}
