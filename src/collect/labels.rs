//! Each sample's statement (src/bpf/statement.h): the BPF side reads, at the moment of an event, which statement
//! the thread runs from the server's own memory, and labels the event by when that statement began; the first
//! event of a thread's statement sends its text. Here: where each server keeps its statements
//! ([`StatementLabels`], written to the kernel for each process traced; found by a [`StatementSource`] of a layer
//! above, `sessions::statements`), and the labels turned into statements people read ([`Resolver`]: fingerprint,
//! connection, user, database).

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use libbpf_rs::{MapCore, MapFlags};

use crate::wire::fingerprint;

/// statement.h's labels that are no statement's start.
const NOT_READ: u64 = 0;
const IDLE: u64 = 1;
const NO_CONNECTION: u64 = 2;

/// The bytes of `struct statement_text` before its text (checked against the skeletons' type in cpu.rs).
pub const TEXT_HEADER_BYTES: usize = 48;

/// A sample's statement, as people read it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Statement {
    /// A statement: its fingerprint, and whose.
    Running(Running),
    /// A thread with a connection object but no statement: a connection's between its statements (waiting for the
    /// client's next), or one of MySQL's background threads (which have objects of their own).
    Idle,
    /// A thread of the server without a connection: its own (InnoDB's I/O, purge, the page cleaner, …).
    NoConnection,
    /// Not read: the thread's memory was not readable then, or its statement's text was lost on the way.
    Unread,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Running {
    pub fingerprint: Arc<str>,
    pub connection: u64,
    pub user: Option<Arc<str>>,
    pub db: Option<Arc<str>>,
}

/// The longest fingerprint shown as a frame.
const FRAME_MAX: usize = 300;

impl Statement {
    /// As a root frame: the statement's fingerprint, or what the thread did.
    pub fn frame(&self) -> String {
        match self {
            Statement::Running(r) if r.fingerprint.len() > FRAME_MAX => {
                let mut end = FRAME_MAX;
                while !r.fingerprint.is_char_boundary(end) {
                    end -= 1;
                }
                format!("{}…", &r.fingerprint[..end])
            }
            Statement::Running(r) => r.fingerprint.to_string(),
            Statement::Idle => "[no statement running]".into(),
            Statement::NoConnection => "[no connection: the server's own threads]".into(),
            Statement::Unread => "[statement not read]".into(),
        }
    }

    /// Its labels, as profile stores file samples under them (OpenTelemetry's names for the database's).
    pub fn labels(&self) -> Vec<(&'static str, String)> {
        let mut labels = vec![("db_query_summary", self.frame())];
        if let Statement::Running(r) = self {
            labels.push(("connection", r.connection.to_string()));
            labels.extend(r.user.as_ref().map(|u| ("db_user", u.to_string())));
            labels.extend(r.db.as_ref().map(|d| ("db_namespace", d.to_string())));
        }
        labels
    }
}

/// `struct statement_layout` of statement.h: where one server keeps its threads' statements.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BpfLayout {
    /// The thread's connection object at its thread pointer + this.
    pub thd_tpoff: i64,
    pub id_offset: u32,
    pub id_width: u32,
    /// The statement's `{ str, length }`.
    pub query_offset: u32,
    /// Its start's `{ seconds; microseconds }`.
    pub started_offset: u32,
}

impl BpfLayout {
    fn bytes(&self) -> [u8; 24] {
        let mut b = [0u8; 24];
        b[..8].copy_from_slice(&self.thd_tpoff.to_ne_bytes());
        b[8..12].copy_from_slice(&self.id_offset.to_ne_bytes());
        b[12..16].copy_from_slice(&self.id_width.to_ne_bytes());
        b[16..20].copy_from_slice(&self.query_offset.to_ne_bytes());
        b[20..24].copy_from_slice(&self.started_offset.to_ne_bytes());
        b
    }
}

/// Where the servers' statements are, and their connections' names: read from their binaries and memory by a
/// layer above (sessions).
pub trait StatementSource: Send + Sync {
    /// Where process `pid` keeps its threads' statements.
    fn layout(&self, pid: u32) -> Result<BpfLayout>;
    /// The user and database of connection `id` of process `pid`, whose object is at `thd`, where it still holds
    /// that connection.
    fn user_and_db(&self, pid: u32, thd: u64, id: u64) -> Option<(Option<String>, Option<String>)>;
}

/// The statement labels of a run: each server's layout, found once and shared by the run's collectors.
pub struct StatementLabels {
    source: Box<dyn StatementSource>,
    layouts: Mutex<HashMap<u32, Option<BpfLayout>>>,
}

impl StatementLabels {
    pub fn new(source: Box<dyn StatementSource>) -> Arc<StatementLabels> {
        Arc::new(StatementLabels {
            source,
            layouts: Mutex::default(),
        })
    }

    /// The layout of process `pid`, found the first time; `None`, said once on stderr, where it cannot be.
    fn layout(&self, pid: u32) -> Option<BpfLayout> {
        let mut layouts = self.layouts.lock().unwrap_or_else(|e| e.into_inner());
        *layouts
            .entry(pid)
            .or_insert_with(|| match self.source.layout(pid) {
                Ok(l) => Some(l),
                Err(e) => {
                    say!("myprobe: warning: samples of PID {pid} are not labelled by statement: {e:#}");
                    None
                }
            })
    }

    /// Writes the layouts of `pids` to the object's `statement_layouts` (those not in `written` yet), and takes back
    /// those of the processes in `written` no longer among them.
    pub(crate) fn publish(
        &self,
        object: &libbpf_rs::Object,
        pids: &[u32],
        written: &mut HashSet<u32>,
    ) -> Result<()> {
        let Some(map) = object.maps().find(|m| m.name() == "statement_layouts") else {
            return Ok(());
        };
        for &pid in pids {
            if !written.insert(pid) {
                continue;
            }
            if let Some(l) = self.layout(pid) {
                map.update(&pid.to_ne_bytes(), &l.bytes(), MapFlags::ANY)
                    .context("writing where a server keeps its statements")?;
            }
        }
        let gone: Vec<u32> = written
            .iter()
            .filter(|p| !pids.contains(p))
            .copied()
            .collect();
        for pid in gone {
            written.remove(&pid);
            // None there (no layout was found) is what was wanted.
            let _ = map.delete(&pid.to_ne_bytes());
        }
        Ok(())
    }
}

/// A connection's user and database, where read.
type UserAndDb = (Option<Arc<str>>, Option<Arc<str>>);

/// Texts fingerprinted, kept at most: past it they are forgotten (and fingerprinted again when seen).
const FINGERPRINTS_KEPT: usize = 20_000;

/// A thread's statements are kept this long after their text came, so that sums drained later still find them;
/// a thread's latest statement is kept while it lasts (a wait of minutes is summed when it ends).
const STATEMENTS_KEPT: Duration = Duration::from_secs(10);

/// Labels turned into statements: a collector run's, given each text as it comes and each label as its sums do.
/// A label's statement is a number (`u32`) among those of the run: 0 for none (labels off).
#[derive(Default)]
pub struct Resolver {
    labels: Option<Arc<StatementLabels>>,
    /// The process of the sums that do not say theirs (a run of one target).
    pid: u32,
    interned: Vec<Arc<Statement>>,
    ids: HashMap<Arc<Statement>, u32>,
    /// Each statement whose text came, by (process, thread, start): its number, and when it came.
    statements: HashMap<(u32, u32, u64), (u32, Instant)>,
    /// Each thread's latest start.
    latest: HashMap<(u32, u32), u64>,
    fingerprints: HashMap<Box<[u8]>, Arc<str>>,
    /// Each connection's user and database, by (process, object, id).
    connections: HashMap<(u32, u64, u64), UserAndDb>,
    pruned: Option<Instant>,
    /// Texts that were not records of statement.h (never trusted).
    pub malformed: u64,
}

impl Resolver {
    /// Resolves the labels of `pid`'s samples (and of those that say their process) where `labels` is given;
    /// otherwise every sample is labelled 0.
    pub fn new(labels: Option<Arc<StatementLabels>>, pid: u32) -> Resolver {
        Resolver {
            labels,
            pid,
            // 0: no statement.
            interned: vec![Arc::new(Statement::Unread)],
            ..Resolver::default()
        }
    }

    pub fn enabled(&self) -> bool {
        self.labels.is_some()
    }

    /// Stops labelling (the collector cannot).
    pub fn disable(&mut self) {
        self.labels = None;
    }

    /// The statement numbered `id`; `None` for 0.
    pub fn statement(&self, id: u32) -> Option<Arc<Statement>> {
        (id != 0).then(|| self.interned.get(id as usize).cloned())?
    }

    fn intern(&mut self, s: Statement) -> u32 {
        if let Some(&id) = self.ids.get(&s) {
            return id;
        }
        let s = Arc::new(s);
        let id = self.interned.len() as u32;
        self.interned.push(Arc::clone(&s));
        self.ids.insert(s, id);
        id
    }

    /// The number of the statement labelled `label` on thread `tid` of process `pid` (0: the run's one).
    pub fn resolve(&mut self, pid: u32, tid: u32, label: u64) -> u32 {
        if self.labels.is_none() {
            return 0;
        }
        let pid = if pid == 0 { self.pid } else { pid };
        match label {
            NOT_READ => self.intern(Statement::Unread),
            IDLE => self.intern(Statement::Idle),
            NO_CONNECTION => self.intern(Statement::NoConnection),
            started => match self.statements.get(&(pid, tid, started)) {
                Some(&(id, _)) => id,
                None => self.intern(Statement::Unread),
            },
        }
    }

    /// A `struct statement_text` record (a record whose first word is 0).
    pub fn add_text(&mut self, bytes: &[u8]) {
        let Some(labels) = self.labels.clone() else {
            return;
        };
        let word = |at: usize, width: usize| -> Option<u64> {
            let b = bytes.get(at..at + width)?;
            let mut w = [0u8; 8];
            w[..width].copy_from_slice(b);
            Some(u64::from_ne_bytes(w))
        };
        let (Some(pid), Some(tid), Some(started), Some(connection), Some(thd), Some(kept)) = (
            word(8, 4),
            word(12, 4),
            word(16, 8),
            word(24, 8),
            word(32, 8),
            word(44, 4),
        ) else {
            self.malformed += 1;
            return;
        };
        let Some(text) = bytes.get(TEXT_HEADER_BYTES..TEXT_HEADER_BYTES + kept as usize) else {
            self.malformed += 1;
            return;
        };
        let (pid, tid) = (pid as u32, tid as u32);
        let fingerprint = match self.fingerprints.get(text) {
            Some(f) => Arc::clone(f),
            None => {
                if self.fingerprints.len() >= FINGERPRINTS_KEPT {
                    self.fingerprints.clear();
                }
                let f: Arc<str> = fingerprint::fingerprint_bytes(text).into();
                self.fingerprints.insert(text.into(), Arc::clone(&f));
                f
            }
        };
        let (user, db) = self
            .connections
            .entry((pid, thd, connection))
            .or_insert_with(|| {
                labels
                    .source
                    .user_and_db(pid, thd, connection)
                    .map_or((None, None), |(u, d)| (u.map(Arc::from), d.map(Arc::from)))
            })
            .clone();
        let id = self.intern(Statement::Running(Running {
            fingerprint,
            connection,
            user,
            db,
        }));
        let now = Instant::now();
        self.statements.insert((pid, tid, started), (id, now));
        self.latest.insert((pid, tid), started);
        self.prune(now);
    }

    /// Forgets the statements whose sums have all come (see [`STATEMENTS_KEPT`]), and the connections of the
    /// threads that have none left.
    fn prune(&mut self, now: Instant) {
        if self.pruned.is_some_and(|t| now - t < STATEMENTS_KEPT) {
            return;
        }
        self.pruned = Some(now);
        let latest = &self.latest;
        self.statements.retain(|&(pid, tid, started), (_, came)| {
            now - *came < STATEMENTS_KEPT || latest.get(&(pid, tid)) == Some(&started)
        });
        if self.connections.len() > 10_000 {
            self.connections.clear();
        }
    }
}
