//! Who holds the lock a statement waits for, from the server's own tables (InnoDB's lock waits, performance_schema's
//! data and metadata locks): read only while a statement has waited long for a lock another connection holds
//! (`Event::LongWaits`), paced (`READ_GAP`, `READ_SHARE`), by a thread of its own with its own connection, so that
//! the statements' pipeline never waits for the server.

use std::{
    collections::HashMap,
    path::Path,
    time::{Duration, Instant},
};

use super::{
    reader::{Asked, OwnConnections, Reader},
    record::{realtime_offset_ns, CauseWait, Holder, QueryRecord},
};
use crate::{
    client::{Client, ConnectArgs},
    process::memory::ProcMemory,
    server::{causes::holder_cause, Cause, Server},
    sessions::{
        self,
        mdl::{self, MdlLayout},
        Query, Session,
    },
};

/// A statement whose futex wait for a lock another connection holds lasts this long has its lock's holder looked
/// for: a hot row's waits of 20 to 50 ms too (sysbench's lock waits, under 0.4 ms, never ask).
pub const LONG_WAIT: Duration = Duration::from_millis(20);

/// The least time between the end of one read of the tables and the next: InnoDB refreshes the copy of its locks
/// that `information_schema` shows only when it was last read over 100 ms before (trx0i_s.cc's
/// `CACHE_MIN_IDLE_TIME_US`), and a read sooner would show the last one's again. MySQL's `data_lock_waits` has no
/// such copy: the same pace keeps it as cheap.
const READ_GAP: Duration = Duration::from_millis(110);

/// At most one part in this of the time is spent reading the tables: a read that takes long (a transaction holding
/// millions of row locks, which the server copies under its lock system's latch) spaces the next ones out.
const READ_SHARE: u32 = 50;

/// How long after a connection that failed the next is tried: asked at every look (20 a second), a server that
/// turns myprobe away is not asked again at once.
const CONNECT_RETRY: Duration = Duration::from_secs(1);

/// The holders kept, by waiting connection; past it, the oldest reads are forgotten.
const MAX_WAITING: usize = 10_000;

/// A lock wait the server listed: what is waited for, and who holds it.
#[derive(Clone, Debug)]
pub struct Listed {
    pub cause: Cause,
    /// `sbtest.sbtest1 (PRIMARY, X)`
    pub object: String,
    pub holder: Holder,
    /// When it was read (CLOCK_MONOTONIC, ns).
    pub at_ns: u64,
}

impl Listed {
    /// Whether it is the wait of a statement its stack says waits for `cause`: the same cause, or a metadata lock
    /// the server lists as the table lock or user lock it is.
    pub fn is_of(&self, cause: Cause) -> bool {
        cause == self.cause || (cause == Cause::MetadataLock && self.cause.has_holder())
    }

    /// The wait in a DBA's words (`CauseWait::phrase`).
    pub fn wait(&self) -> CauseWait {
        CauseWait {
            cause: self.cause,
            us: 0,
            site: None,
            object: Some(self.object.clone()),
            holder: Some(self.holder.clone()),
        }
    }
}

/// The lock waits the server lists now (and, from its `memory`, its metadata locks where it lists none), by waiting
/// connection, each held by the root of its chain; what could not be read is the first error, the rest kept.
pub fn listed(
    c: &mut Client,
    memory: Option<&MemoryLocks>,
) -> (Vec<(u64, Listed)>, Option<anyhow::Error>) {
    let at_ns = crate::collect::monotonic_ns();
    let server = c.server();
    let mut listed = Vec::new();
    let mut failed = None;
    for sql in server.lock_holders_sql() {
        match c.query(sql) {
            Ok(rows) => listed.extend(rows.into_iter().filter_map(|r| parse(r, at_ns))),
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
    }
    match memory.map(MemoryLocks::listed) {
        Some(Ok(more)) => listed.extend(more),
        Some(Err(e)) => {
            failed.get_or_insert(e.context("reading the metadata locks from the server's memory"));
        }
        None => {}
    }
    (to_roots(listed), failed)
}

/// The metadata locks the server's `memory` holds, without asking the server (one that does not answer), each
/// held by the root of its chain.
pub fn from_memory(memory: Option<&MemoryLocks>) -> anyhow::Result<Vec<(u64, Listed)>> {
    let listed = memory.map(MemoryLocks::listed).transpose()?;
    Ok(to_roots(listed.unwrap_or_default()))
}

/// The reader of the server's lock tables, and what it found.
pub struct Holders {
    /// Asked at every look that found a long wait, it reads at its own pace and sends the waits it listed, by
    /// waiting connection.
    reader: Option<Reader<(), Vec<(u64, Listed)>>>,
    found: HashMap<u64, Vec<Listed>>,
}

impl Holders {
    /// Starts the reader of the server `pid`'s lock tables (and of its memory, which runs `binary`, where its
    /// metadata locks are), connecting as `args` when first asked (the connection one of the run's `own`).
    pub fn start(args: &ConnectArgs, pid: u32, binary: &Path, own: &OwnConnections) -> Holders {
        let (args, own) = (args.clone(), own.clone());
        let binary = binary.to_path_buf();
        let reader = Reader::spawn("myprobe-holders", move |asked| {
            read_when_asked(&args, pid, &binary, &own, &asked)
        });
        let reader = reader
            .map_err(|e| {
                say!("myprobe: warning: who holds the locks statements wait for is not read: {e}")
            })
            .ok();
        Holders {
            reader,
            found: HashMap::new(),
        }
    }

    /// A statement waits long for a lock another connection holds: the tables are read, as soon as their pace
    /// allows (`read_when_asked`).
    pub fn ask(&mut self) {
        // What it listed before is taken in as the waits go on, not only at the next record: a pile-up that ends
        // no statement for long leaves no list in the channel.
        self.take_found();
        if let Some(reader) = &self.reader {
            reader.ask(());
        }
    }

    /// Takes in what the reader listed since.
    fn take_found(&mut self) {
        let Some(reader) = &self.reader else { return };
        for listed in reader.found() {
            if self.found.len() > MAX_WAITING {
                self.found.clear();
            }
            for (waiting, l) in listed {
                let of = self.found.entry(waiting).or_default();
                if of.len() >= 64 {
                    of.remove(0);
                }
                of.push(l);
            }
        }
    }

    /// Gives the record's waits the holder and object the server listed for its connection while it ran.
    pub fn name(&mut self, record: &mut QueryRecord) {
        let Some(conn) = record.conn else { return };
        self.take_found();
        let Some(listed) = self.found.get(&u64::from(conn)) else {
            return;
        };
        let during =
            |l: &&Listed| (record.start_ns..=record.end_ns.max(record.start_ns)).contains(&l.at_ns);
        for l in listed.iter().rev().filter(during) {
            if let Some(w) = record
                .waits
                .iter_mut()
                .find(|w| w.holder.is_none() && l.is_of(w.cause))
            {
                w.cause = l.cause;
                w.object = Some(l.object.clone());
                w.holder = Some(Holder {
                    seen_at_ns: (i128::from(l.at_ns) + realtime_offset_ns()) as i64,
                    ..l.holder.clone()
                });
                if record.cause == Some(Cause::MetadataLock) {
                    record.cause = Some(l.cause);
                }
            }
        }
    }
}

/// Reads the lock tables each time asked (once for the asks that came during a read or its pause), until the
/// pipeline ends: each read `READ_GAP` after the last, or longer where reads take long (`READ_SHARE`).
fn read_when_asked(
    args: &ConnectArgs,
    pid: u32,
    binary: &Path,
    own: &OwnConnections,
    asked: &Asked<(), Vec<(u64, Listed)>>,
) {
    let mut client = None;
    let mut said = false;
    let mut in_memory: Option<Option<MemoryLocks>> = None;
    let mut next_read = Instant::now();
    while asked.next().is_ok() {
        let pause = next_read.saturating_duration_since(Instant::now());
        if asked.wait(pause, |()| false).is_err() || asked.take(|()| false).is_err() {
            return;
        }
        if client.is_none() {
            match own.connect(args, pid) {
                Ok(c) => client = Some(c),
                Err(e) => {
                    next_read = Instant::now() + CONNECT_RETRY;
                    if !std::mem::replace(&mut said, true) {
                        say!("myprobe: note: who holds the locks statements wait for is not read: {e:#}");
                    }
                    continue;
                }
            }
        }
        let Some(c) = client.as_mut() else { continue };
        let memory = in_memory.get_or_insert_with(|| MemoryLocks::of(pid, binary, c.server()));
        let started = Instant::now();
        let (listed, failed) = listed(c, memory.as_ref());
        next_read = Instant::now() + READ_GAP.max(started.elapsed() * READ_SHARE);
        if let Some(e) = failed.filter(|_| !std::mem::replace(&mut said, true)) {
            say!("myprobe: note: who holds the locks statements wait for is not read: {e:#}");
        }
        if !asked.send(listed) {
            return;
        }
    }
}

/// A MariaDB server's metadata-lock waits, read from its memory (`sessions::mdl`): it lists them in no table.
pub struct MemoryLocks {
    mem: ProcMemory,
    sessions: sessions::Layout,
    locks: MdlLayout,
}

impl MemoryLocks {
    /// The reader of the process `pid`'s (running `binary`) metadata locks, where `server` lists them in no table;
    /// one that cannot be read is said.
    pub fn of(pid: u32, binary: &Path, server: &dyn Server) -> Option<MemoryLocks> {
        MemoryLocks::with_sessions(pid, binary, server, None)
    }

    /// The same, with where its connections are (`sessions`) when the caller has found it already.
    pub fn with_sessions(
        pid: u32,
        binary: &Path,
        server: &dyn Server,
        sessions: Option<sessions::Layout>,
    ) -> Option<MemoryLocks> {
        if !server.metadata_locks_in_memory() {
            return None;
        }
        MemoryLocks::open(pid, binary, server, sessions)
            .map_err(|e| say!("myprobe: note: who holds the metadata locks is not read: {e:#}"))
            .ok()
    }

    fn open(
        pid: u32,
        binary: &Path,
        server: &dyn Server,
        sessions: Option<sessions::Layout>,
    ) -> anyhow::Result<MemoryLocks> {
        let sessions = match sessions {
            Some(s) => s,
            None => sessions::Layout::of_process(pid, binary, server)?,
        };
        Ok(MemoryLocks {
            mem: ProcMemory::open(pid)?,
            sessions,
            locks: MdlLayout::of_process(pid, binary)?,
        })
    }

    /// Each connection's metadata-lock wait, by each connection holding the lock (or queued before it).
    fn listed(&self) -> anyhow::Result<Vec<(u64, Listed)>> {
        let at_ns = crate::collect::monotonic_ns();
        let now_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        let connections = sessions::read(&self.mem, &self.sessions)?;
        let by_thd: HashMap<u64, &Session> = connections.iter().map(|s| (s.thd, s)).collect();
        let mut listed = Vec::new();
        for s in &connections {
            // A connection that ended or was granted its lock meanwhile waits for nothing now.
            let Ok(Some(w)) = mdl::waiting_for(&self.mem, &self.locks, s.thd) else {
                continue;
            };
            let lock_type = match w.namespace {
                "USER_LOCK" => "USER LEVEL LOCK",
                n => n,
            };
            let holders = w.holders.iter().map(|h| (h, false));
            let queued = w.queued_behind.iter().map(|h| (h, true));
            for ((thd, mode), queued) in holders.chain(queued) {
                let Some(h) = by_thd.get(thd) else { continue };
                let object = match w.namespace {
                    "USER_LOCK" => format!("'{}' ({mode})", w.name),
                    "BACKUP" => format!("the backup lock ({mode})"),
                    "SCHEMA" => format!("{} ({mode})", w.db),
                    _ => format!("{}.{} ({mode})", w.db, w.name),
                };
                // A pending request is not what the lock is held in (`to_roots` gives the root's): the wait's
                // cause is by what it asked for.
                let mode = if queued { w.wanted } else { mode };
                listed.push((
                    s.id,
                    Listed {
                        cause: holder_cause("metadata", lock_type, mode),
                        object,
                        holder: holder_of(h, now_us),
                        at_ns,
                    },
                ));
            }
        }
        Ok(listed)
    }
}

/// A connection read from memory as the holder of a lock.
fn holder_of(s: &Session, now_us: u64) -> Holder {
    Holder {
        conn: s.id,
        user: s.user.as_deref().map(str::to_owned),
        host: s.host.as_deref().map(str::to_owned),
        command: s.command.map(str::to_string),
        command_s: s.started_us.map(|t| now_us.saturating_sub(t) / 1_000_000),
        statement: match &s.query {
            Some(Query::Text(t) | Query::Truncated(t)) => Some(t.clone()),
            _ => None,
        },
        ..Holder::default()
    }
}

/// Each wait as held by the root of its chain: a waiter the servers list as blocked by another waiter (whose
/// request for the same row or object came first) is given the connection that one waits for in turn, down to one
/// that waits for nothing, and which holds the lock. A chain that loops (a deadlock not yet broken) stays as listed.
fn to_roots(listed: Vec<(u64, Listed)>) -> Vec<(u64, Listed)> {
    let waiting: std::collections::HashSet<u64> = listed.iter().map(|(w, _)| *w).collect();
    let root_of = |first: u64| {
        let mut at = first;
        for _ in 0..32 {
            let holders = || listed.iter().filter(move |(w, _)| *w == at);
            match holders().find(|(_, l)| !waiting.contains(&l.holder.conn)) {
                Some((_, l)) => return Some(l),
                None => at = holders().next()?.1.holder.conn,
            }
        }
        None
    };
    let mut out: Vec<(u64, Listed)> = Vec::new();
    // The locks held by connections that wait for nothing first: a waiter's own holder before one reached through
    // a chain.
    let (held, queued): (Vec<_>, Vec<_>) = listed
        .iter()
        .partition(|(_, l)| !waiting.contains(&l.holder.conn));
    for (w, l) in held.into_iter().chain(queued) {
        let mut l = l.clone();
        if waiting.contains(&l.holder.conn) {
            // What the root holds, and how (the lock it was granted, not the request queued before this one).
            if let Some(root) = root_of(l.holder.conn).filter(|r| r.holder.conn != *w) {
                l.holder = Holder {
                    queued_behind: Some(l.holder.conn),
                    ..root.holder.clone()
                };
                l.object = root.object.clone();
            }
        }
        // One entry per waiter, cause and holder.
        if !out
            .iter()
            .any(|(o, x)| *o == *w && x.cause == l.cause && x.holder.conn == l.holder.conn)
        {
            out.push((*w, l));
        }
    }
    out
}

/// One row of `Server::lock_holders_sql`: the waiting connection and what it waits for.
fn parse(row: Vec<Option<String>>, at_ns: u64) -> Option<(u64, Listed)> {
    let [waiting, holder, kind, lock_type, object, index, mode, _duration, trx_s, command, time, user, host, info] =
        <[Option<String>; 14]>::try_from(row).ok()?;
    let num = |v: &Option<String>| v.as_deref().and_then(|s| s.parse::<u64>().ok());
    let (kind, lock_type, mode) = (
        kind?,
        lock_type.unwrap_or_default(),
        mode.unwrap_or_default(),
    );
    let cause = holder_cause(&kind, &lock_type, &mode);
    let object = object.unwrap_or_default().replace('`', "");
    let object = match index {
        Some(index) => format!("{object} ({index}, {mode})"),
        None => format!("{object} ({mode})"),
    };
    Some((
        num(&waiting)?,
        Listed {
            cause,
            object,
            holder: Holder {
                conn: num(&holder)?,
                user,
                host,
                command,
                command_s: num(&time),
                transaction_s: num(&trx_s),
                statement: info,
                ..Holder::default()
            },
            at_ns,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(values: &[Option<&str>]) -> Vec<Option<String>> {
        values.iter().map(|v| v.map(str::to_string)).collect()
    }

    #[test]
    fn a_listed_wait_names_its_cause_object_and_holder() {
        let (waiting, l) = parse(
            row(&[
                Some("340"),
                Some("339"),
                Some("row"),
                Some("RECORD"),
                Some("`sbtest`.`sbtest1`"),
                Some("PRIMARY"),
                Some("X"),
                None,
                Some("40"),
                Some("Sleep"),
                Some("38"),
                Some("root"),
                Some("localhost"),
                None,
            ]),
            7,
        )
        .unwrap();
        assert_eq!((waiting, l.cause), (340, Cause::RowLock));
        assert_eq!(l.object, "sbtest.sbtest1 (PRIMARY, X)");
        assert_eq!(
            l.holder.describe(),
            "connection 339 (root@localhost), idle in its transaction for 40 s"
        );
        let (_, l) = parse(
            row(&[
                Some("85"),
                Some("83"),
                Some("metadata"),
                Some("TABLE"),
                Some("sbtest.sbtest2"),
                None,
                Some("SHARED_NO_READ_WRITE"),
                Some("TRANSACTION"),
                None,
                Some("Query"),
                Some("1"),
                Some("root"),
                None,
                Some("DO SLEEP(3)"),
            ]),
            7,
        )
        .unwrap();
        assert_eq!(l.cause, Cause::TableLock);
        assert_eq!(
            l.holder.describe(),
            "connection 83 (root), running for 1 s: DO SLEEP(?)"
        );
        assert!(parse(row(&[Some("1")]), 7).is_none());
    }

    #[test]
    fn a_wait_queued_behind_another_is_held_by_the_root_of_the_chain() {
        let listed = |waiting: u64, holder: u64, command: &str| {
            let mut values = vec![
                Some(waiting.to_string()),
                Some(holder.to_string()),
                Some("row".into()),
                Some("RECORD".into()),
                Some("db.t".into()),
                Some("PRIMARY".into()),
                Some("X".into()),
            ];
            values.extend([
                None,
                None,
                Some(command.into()),
                Some("5".into()),
                None,
                None,
                None,
            ]);
            parse(values, 1).unwrap()
        };
        // 30 waits for 27 (idle, holding the row) and for 29 (queued before it); 31 only for 30; 40 and 41 for
        // each other.
        let roots = to_roots(vec![
            listed(29, 27, "Sleep"),
            listed(30, 29, "Query"),
            listed(30, 27, "Sleep"),
            listed(31, 30, "Query"),
            listed(40, 41, "Query"),
            listed(41, 40, "Query"),
        ]);
        let of = |w: u64| -> Vec<(u64, Option<u64>)> {
            roots
                .iter()
                .filter(|(x, _)| *x == w)
                .map(|(_, l)| (l.holder.conn, l.holder.queued_behind))
                .collect()
        };
        assert_eq!(of(29), [(27, None)]);
        assert_eq!(of(30), [(27, None)]);
        assert_eq!(of(31), [(27, Some(30))]);
        assert_eq!(of(40), [(41, None)]);
        let l = &roots.iter().find(|(w, _)| *w == 31).unwrap().1;
        assert_eq!(
            l.holder.describe(),
            "connection 27, idle in its transaction for 5 s (queued behind connection 30)"
        );
    }
}
