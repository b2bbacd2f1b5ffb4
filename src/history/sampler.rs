//! Each second, what each connection of a server is doing, from what is there without asking the server: its
//! connections read from its memory (`sessions`: who runs a statement, who sits in an open transaction, their text,
//! user, host and database, and the thread serving each), and the state of those threads read by the threads'
//! iterator (on a CPU, waiting for one, or blocked: the futex a stack names as a row lock, a metadata lock, the redo
//! log…, the file or socket a syscall waits on). Only the threads of such connections are read, and one that has not
//! run since the last second keeps what its stack said then. Who holds a lock waited for is asked of the server
//! (or read from its memory, MariaDB's metadata locks) only in a second where some connection waits for one.

use std::{
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result};
// Keyed by addresses and ids, which no client chooses: hashed the fast way.
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use super::{Second, SessionSample, IDLE_IN_TRANSACTION};
use crate::{
    client::{Client, ConnectArgs},
    collect::{
        threads::{self, ThreadRecord},
        CollectOptions, Stop,
    },
    process::{memory::ProcMemory, Target},
    profile::waits::{self, Brackets},
    query::{
        files::{file_cause, Files},
        holders::{self, Listed, MemoryLocks},
        recent::{Recent, SECOND_NS},
    },
    server::Cause,
    sessions::{self, Query, Session},
    stacks,
    symbolize::{data::DataSymbolizer, Symbolizer},
    wire::fingerprint,
};

/// Addresses whose names are kept (code and lock words: a server that runs for days waits on ever more).
const NAMES_KEPT: usize = 100_000;

/// What a thread was doing, as named from its record.
#[derive(Clone, Debug)]
struct Named {
    cause: Cause,
    object: Option<String>,
}

/// One server's sampler.
pub struct Sampler {
    pid: u32,
    server: String,
    mem: ProcMemory,
    layout: sessions::Layout,
    walk: sessions::Walk,
    symbolizer: Symbolizer,
    data: DataSymbolizer,
    brackets: Brackets,
    files: Files,
    connect: Option<ConnectArgs>,
    client: Option<Client>,
    memory_locks: Option<MemoryLocks>,
    /// The serving threads' states named last, by thread pointer, with their switches then.
    last: HashMap<u64, (u64, Named)>,
    /// The serving threads last seen waiting on their connection's socket (a pool's threads wait elsewhere).
    on_socket: HashSet<u64>,
    /// The futex waits named from their stacks, by where they wait from (the iterator unwinds them no more): their
    /// cause and site.
    known_waits: HashMap<threads::WaitPlace, (Cause, Option<String>)>,
    /// The statements (connection, and when its command began) that waited for a lock someone holds at the last
    /// second.
    waiting: HashSet<(u64, Option<u64>)>,
    /// When each connection was first seen in its open transaction.
    in_transaction_since: HashMap<u64, f64>,
    recent: Arc<Recent>,
    /// What was said once (a server that does not answer), not every second.
    said: HashSet<String>,
}

impl Sampler {
    /// The sampler of `target`, named `server` in the store; `connect`: how to ask it who holds a lock (none: only
    /// what its memory says).
    pub fn new(
        target: &Target,
        server: String,
        connect: Option<ConnectArgs>,
        recent: Arc<Recent>,
        brackets: Brackets,
    ) -> Result<Sampler> {
        let pid = target.pid;
        let layout = sessions::Layout::of_process(pid, &target.binary, target.flavor.server())
            .context("finding the server's connections in its memory")?;
        if let Some(missing) = layout.unknown() {
            say!("myprobe: agent: history of {target}: {missing}");
        }
        let mut symbolizer = Symbolizer::new(pid).context("preparing symbolization")?;
        symbolizer.preload(false);
        let memory_locks = MemoryLocks::with_sessions(
            pid,
            &target.binary,
            target.flavor.server(),
            Some(layout.clone()),
        );
        Ok(Sampler {
            pid,
            server,
            mem: ProcMemory::open(pid)?,
            layout,
            walk: sessions::Walk::default(),
            symbolizer,
            data: DataSymbolizer::new(pid).context("reading the process's memory map")?,
            brackets,
            files: Files::new(pid),
            connect,
            client: None,
            memory_locks,
            last: HashMap::default(),
            on_socket: HashSet::default(),
            known_waits: HashMap::default(),
            waiting: HashSet::default(),
            in_transaction_since: HashMap::default(),
            recent,
            said: HashSet::default(),
        })
    }

    /// The sessions of second `ts` (seconds since the epoch), `now` in seconds with their fraction.
    pub fn sample(
        &mut self,
        reader: &mut threads::Reader<'_>,
        ts: i64,
        now: f64,
    ) -> Result<Second> {
        let second = self.read_second(reader, ts, now);
        if second.is_err() {
            // The iterator read threads whose states were then not kept: every thread is read at the next second.
            self.last.clear();
        }
        second
    }

    fn read_second(
        &mut self,
        reader: &mut threads::Reader<'_>,
        ts: i64,
        now: f64,
    ) -> Result<Second> {
        let own = self.client.as_ref().map(Client::connection_id);
        // The threads of every connection known, those that ran since the last second alone: a connection whose
        // thread waits on its socket and has not run since is as it was, and not read again.
        let mut wanted: HashMap<u64, u64> =
            HashMap::with_capacity_and_hasher(self.last.len() + 64, Default::default());
        wanted.extend(
            self.walk
                .serving()
                .chain(self.last.keys().copied())
                .map(|t| {
                    (
                        t,
                        self.last
                            .get(&t)
                            .map_or(u64::MAX, |(switches, _)| *switches),
                    )
                }),
        );
        let snapshot = reader.read(Some(&wanted))?;
        let mut ran = snapshot.threads;
        let ran_now: HashSet<u64> = ran.iter().map(|t| t.tls_base).collect();
        // A thread that ended may have served a connection that ended, whose object now holds another: every
        // connection is read.
        let none = HashSet::default();
        let on_socket = if snapshot.ended == 0 {
            &self.on_socket
        } else {
            &none
        };
        // Only the connections that run a statement or hold a transaction open are read whole.
        let listed = sessions::read_wanted(
            &self.mem,
            &self.layout,
            &mut self.walk,
            |t| wanted.contains_key(&t) && !ran_now.contains(&t) && on_socket.contains(&t),
            |b| b.in_transaction == Some(true) || runs(b.command, b.has_query),
        )
        .context("reading the server's connections from its memory")?;
        let sampled: Vec<&Session> = listed.iter().filter(|s| Some(s.id) != own).collect();
        self.follow_transactions(&listed, now);
        // A connection new since the last second: its thread is read now.
        let new: HashSet<u64> = sampled
            .iter()
            .filter_map(|s| s.thread)
            .filter(|t| !wanted.contains_key(t))
            .collect();
        if !new.is_empty() {
            wanted.extend(new.iter().map(|&t| (t, u64::MAX)));
            // With those that ran again since: the iterator keeps the switches it read last.
            let more = reader.read(Some(&wanted))?.threads;
            let again: HashSet<u64> = more.iter().map(|t| t.tls_base).collect();
            ran.retain(|t| !again.contains(&t.tls_base));
            ran.extend(more);
        }
        let live: HashSet<u64> = self.walk.serving().collect();
        let named = self.name_threads(&ran, &live);
        if reader.know_waits(&named)? {
            let named: HashSet<_> = named.into_iter().collect();
            self.known_waits.retain(|place, _| named.contains(place));
        }
        let started: Vec<Option<u64>> = sampled.iter().map(|s| s.started_us).collect();
        drop(sampled);
        // Each connection's names moved into its sample, not copied.
        let mut out: Vec<SessionSample> = listed
            .into_iter()
            .filter(|s| Some(s.id) != own)
            .map(|s| {
                let state = s.thread.and_then(|t| self.last.get(&t)).map(|(_, n)| n);
                self.session_sample(s, state, now)
            })
            .collect();
        // What a transaction runs, as sampled: a holder's own statements where tracing saw none of them (statements
        // traced one second in several).
        for s in out.iter().filter(|s| s.transaction_s.is_some()) {
            if let Some(statement) = &s.statement {
                self.recent
                    .add_normalized(s.conn, statement.as_str().into(), ts * SECOND_NS);
            }
        }
        // Who holds a lock is asked only for a statement that waited a second ago too: the short waits of a busy
        // server (most row locks under load, another statement's each second) ask the server nothing.
        let waiting: HashSet<(u64, Option<u64>)> = out
            .iter()
            .zip(started)
            .filter(|(o, _)| holds(&o.state))
            .map(|(o, started)| (o.conn, started))
            .collect();
        if waiting.iter().any(|w| self.waiting.contains(w)) {
            let metadata = out
                .iter()
                .any(|s| holds(&s.state) && s.state != Cause::RowLock.label());
            self.name_holders(&mut out, metadata);
        }
        self.waiting = waiting;
        let blockers: HashSet<u64> = out
            .iter()
            .flat_map(|s| s.blocker.into_iter().chain(s.root_blocker))
            .collect();
        for s in out.iter_mut().filter(|s| blockers.contains(&s.conn)) {
            let since = s
                .transaction_s
                .map(|t| ((now - t).floor() as i64 - 1) * SECOND_NS);
            s.holder_statements = self.recent.texts_of(s.conn, since);
        }
        Ok(Second {
            ts,
            server: self.server.clone(),
            sessions: out,
        })
    }

    /// Notes when each connection's transaction was first seen open, and forgets those that ended.
    fn follow_transactions(&mut self, listed: &[Session], now: f64) {
        let open: HashSet<u64> = listed
            .iter()
            .filter(|s| s.in_transaction == Some(true))
            .map(|s| s.id)
            .collect();
        let ended: Vec<u64> = self
            .in_transaction_since
            .keys()
            .filter(|c| !open.contains(c))
            .copied()
            .collect();
        for c in &ended {
            self.in_transaction_since.remove(c);
        }
        self.recent.forget(ended.into_iter());
        for c in open {
            self.in_transaction_since.entry(c).or_insert(now);
        }
    }

    /// Names the state of each thread of `ran` (those that ran since the last second) into `last`, a futex wait
    /// from where it waited before as then, and forgets the threads no longer `live`. Gives the places of the
    /// waits named from their stacks this time.
    fn name_threads(
        &mut self,
        ran: &[ThreadRecord],
        live: &HashSet<u64>,
    ) -> Vec<threads::WaitPlace> {
        let in_futex: Vec<&ThreadRecord> = ran
            .iter()
            .filter(|t| t.futex.is_some() && t.state != Some('R') && !t.known_wait)
            .collect();
        let futex_waits: HashMap<u32, (Cause, Option<String>)> =
            stacks::futex_causes(&mut self.symbolizer, &in_futex, &self.brackets)
                .into_iter()
                .map(|(tid, cause, site)| (tid, (cause, site)))
                .collect();
        // The places of the waits their stacks named, which are not unwound again; an `unknown wait` is (its stack
        // may have been cut short).
        let mut places = Vec::new();
        for t in &in_futex {
            let (Some(place), Some(wait)) = (t.wait_place(), futex_waits.get(&t.tid)) else {
                continue;
            };
            if wait.0 != Cause::UnknownWait {
                self.known_waits.insert(place, wait.clone());
                places.push(place);
            }
        }
        for t in ran {
            let known = t.known_wait.then(|| t.wait_place()).flatten();
            let n = match (
                futex_waits.get(&t.tid),
                known.and_then(|p| self.known_waits.get(&p)),
            ) {
                (Some((cause, site)), _) | (None, Some((cause, site))) => {
                    // A lock of the server's own is named by its word; the others by what the server lists.
                    let lock = t
                        .futex
                        .filter(|_| matches!(cause, Cause::InternalLock | Cause::UnknownWait));
                    Named {
                        cause: *cause,
                        object: lock.map(|f| {
                            waits::lock_word_name(&mut self.data, f.addr, site.as_deref())
                        }),
                    }
                }
                (None, None) => self.name_state(t),
            };
            self.last.insert(t.tls_base, (t.switches, n));
            if waits_on_socket(t) {
                self.on_socket.insert(t.tls_base);
            } else {
                self.on_socket.remove(&t.tls_base);
            }
        }
        self.last.retain(|t, _| live.contains(t));
        self.on_socket.retain(|t| live.contains(t));
        self.symbolizer.bound_caches(NAMES_KEPT);
        self.data.bound_cache(NAMES_KEPT);
        places
    }

    /// A thread not in a futex wait: on a CPU, waiting for one, or in a syscall on a file or a socket.
    fn name_state(&mut self, t: &ThreadRecord) -> Named {
        let plain = |cause| Named {
            cause,
            object: None,
        };
        if t.state == Some('R') {
            return plain(if t.on_cpu {
                Cause::Cpu
            } else {
                Cause::RunQueue
            });
        }
        let Some((nr, args)) = t.syscall else {
            return plain(Cause::Other);
        };
        let part = match syscall_part(nr) {
            Some(Part::Io(part)) => part,
            Some(Part::Net) => return plain(Cause::Client),
            Some(Part::Sleep) => return plain(Cause::Sleep),
            None => return plain(Cause::Other),
        };
        match self.files.path(args[0] as i32) {
            Some(path) if path.starts_with("socket:") => plain(Cause::Client),
            Some(path) => {
                let (cause, object) = file_cause(&path, part);
                Named { cause, object }
            }
            None => plain([Cause::FileRead, Cause::FileWrite, Cause::FileSync][part]),
        }
    }

    fn session_sample(&self, s: Session, state: Option<&Named>, now: f64) -> SessionSample {
        let running = runs_statement(&s);
        let text = s.query.as_ref().and_then(|q| match q {
            Query::Text(t) | Query::Truncated(t) => Some(t.as_str()),
            Query::Changing => None,
        });
        let (statement, fp) = match text.filter(|_| running) {
            Some(t) => (
                Some(fingerprint::normalize(t)),
                Some(fingerprint::fingerprint(t)),
            ),
            None => (None, None),
        };
        let (state, object) = match (running, state) {
            (false, _) => (IDLE_IN_TRANSACTION.into(), None),
            (true, Some(n)) => (n.cause.label().into(), n.object.clone()),
            // Its thread was not read (it ended its statement meanwhile, or no thread is known to serve it).
            (true, None) => (Cause::Other.label().into(), None),
        };
        SessionSample {
            conn: s.id,
            user: s.user,
            host: s.host,
            db: s.db,
            statement,
            fingerprint: fp,
            statement_s: s
                .started_us
                .map(|us| (now - us as f64 / 1e6).max(0.0))
                .map(|v| (v * 1000.0).round() / 1000.0),
            transaction_s: self
                .in_transaction_since
                .get(&s.id)
                .map(|since| ((now - since) * 1000.0).round() / 1000.0),
            state,
            object,
            blocker: None,
            root_blocker: None,
            holder_statements: Vec::new(),
        }
    }

    /// Names who each lock wait is behind, as the server lists them (or its memory, for MariaDB's metadata locks:
    /// read, with every connection, only where one waits for a lock of that kind).
    fn name_holders(&mut self, out: &mut [SessionSample], metadata: bool) {
        let listed = match self.listed(metadata) {
            Ok(l) => l,
            Err(e) => {
                self.say_once(format!(
                    "who holds the locks waited for is not read: {e:#} (tried again each second)"
                ));
                return;
            }
        };
        for s in out.iter_mut() {
            let Some(cause) = Cause::ALL.into_iter().find(|c| c.label() == s.state) else {
                continue;
            };
            if let Some((_, l)) = listed.iter().find(|(w, l)| *w == s.conn && l.is_of(cause)) {
                s.state = l.cause.label().into();
                s.object = Some(l.object.clone());
                s.root_blocker = Some(l.holder.conn);
                s.blocker = Some(l.holder.queued_behind.unwrap_or(l.holder.conn));
            }
        }
    }

    fn listed(&mut self, metadata: bool) -> Result<Vec<(u64, Listed)>> {
        if self.client.is_none() {
            if let Some(args) = &self.connect {
                match crate::client::connect(args, Some(self.pid)) {
                    Ok(c) => self.client = Some(c),
                    // Without SQL, MariaDB's metadata locks are still read from its memory.
                    Err(e) if self.memory_locks.is_some() => self.say_once(format!(
                        "the server does not answer ({e:#}): only its metadata locks are read, from its memory"
                    )),
                    Err(e) => return Err(e),
                }
            }
        }
        let Some(client) = self.client.as_mut() else {
            return holders::from_memory(self.memory_locks.as_ref().filter(|_| metadata));
        };
        let (listed, failed) =
            holders::listed(client, self.memory_locks.as_ref().filter(|_| metadata));
        if let Some(e) = failed {
            // The next second connects again.
            self.client = None;
            if listed.is_empty() {
                return Err(e);
            }
        }
        Ok(listed)
    }

    fn say_once(&mut self, line: String) {
        if self.said.insert(line.clone()) {
            say!("myprobe: agent: history of {}: {line}", self.server);
        }
    }
}

/// Whether the connection runs a statement now (not idle, not a daemon's own).
fn runs_statement(s: &Session) -> bool {
    runs(s.command, s.query.is_some())
}

fn runs(command: Option<&str>, has_query: bool) -> bool {
    has_query
        && !matches!(
            command,
            Some("Sleep" | "Daemon" | "Binlog Dump" | "Connect")
        )
}

/// Whether a thread waits to read its connection's next request: blocked in a read or a poll (a pool's threads
/// wait in `epoll_wait` or on a futex, for any connection).
fn waits_on_socket(t: &ThreadRecord) -> bool {
    use syscalls::Sysno;
    let Some((nr, _)) = t.syscall.filter(|_| t.state != Some('R')) else {
        return false;
    };
    usize::try_from(nr)
        .ok()
        .and_then(Sysno::new)
        .is_some_and(|s| {
            matches!(
                s,
                Sysno::read | Sysno::recvfrom | Sysno::recvmsg | Sysno::poll | Sysno::ppoll
            )
        })
}

/// Whether a state is a wait that someone holds up (a lock the server lists with its holder).
fn holds(state: &str) -> bool {
    Cause::ALL
        .into_iter()
        .any(|c| c.label() == state && (c.has_holder() || c == Cause::MetadataLock))
}

enum Part {
    /// A file's read, write or sync (0, 1, 2), or a socket's.
    Io(usize),
    /// Waiting on sockets (poll and its kind): the client.
    Net,
    Sleep,
}

/// What a blocked syscall waits for, by its number (the machine's own numbering).
fn syscall_part(nr: i64) -> Option<Part> {
    use syscalls::Sysno;
    let sysno = Sysno::new(usize::try_from(nr).ok()?)?;
    Some(match sysno {
        Sysno::read | Sysno::pread64 | Sysno::readv | Sysno::preadv | Sysno::preadv2 => Part::Io(0),
        Sysno::recvfrom | Sysno::recvmsg | Sysno::sendto | Sysno::sendmsg => Part::Io(0),
        Sysno::write | Sysno::pwrite64 | Sysno::writev | Sysno::pwritev | Sysno::pwritev2 => {
            Part::Io(1)
        }
        Sysno::fsync | Sysno::fdatasync | Sysno::sync_file_range => Part::Io(2),
        Sysno::poll | Sysno::ppoll | Sysno::select | Sysno::pselect6 => Part::Net,
        Sysno::epoll_wait | Sysno::epoll_pwait => Part::Net,
        Sysno::nanosleep | Sysno::clock_nanosleep => Part::Sleep,
        _ => return None,
    })
}

/// Samples `target` once a second until `stop`, giving each second to `sink`; `opts`: the threads' iterator's
/// (its unwind tables: the agent's shared store). Returns when stopped, or when its server cannot be read.
pub fn run(
    opts: &CollectOptions,
    mut sampler: Sampler,
    stop: &Stop,
    mut sink: impl FnMut(Second),
) -> Result<()> {
    threads::with_reader(opts, |reader| -> Result<()> {
        let (mut failures, mut first) = (0u32, true);
        while !stop.is_stopped() {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            // At the start of each second of the clock.
            let wait = Duration::from_secs(1) - Duration::from_nanos(u64::from(now.subsec_nanos()));
            if sleep_unless_stopped(stop, wait) {
                break;
            }
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            match sampler.sample(reader, now.as_secs() as i64, now.as_secs_f64()) {
                Ok(second) => {
                    if first {
                        say!(
                            "myprobe: agent: sampling the sessions of {} each second",
                            sampler.server
                        );
                        first = false;
                    }
                    failures = 0;
                    sink(second);
                }
                Err(e) if crate::process::exited(sampler.pid) => {
                    return Err(e.context("the server exited"));
                }
                Err(e) => {
                    failures += 1;
                    if failures == 3 {
                        say!(
                            "myprobe: agent: history of {}: a second not sampled: {e:#} (tried again each second)",
                            sampler.server
                        );
                    }
                }
            }
        }
        Ok(())
    })?
}

/// Sleeps `d` (at most a second) unless `stop` came first, and says whether it came meanwhile: a stop is seen within
/// a second, as the agent's other threads see it, without waking ten times a second to look.
fn sleep_unless_stopped(stop: &Stop, d: Duration) -> bool {
    if stop.is_stopped() {
        return true;
    }
    std::thread::sleep(d.min(Duration::from_secs(1)));
    stop.is_stopped()
}
