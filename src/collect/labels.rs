//! Each sample's statement (src/bpf/statement.h): the BPF side reads, at the moment of an event, which statement
//! the thread runs from the server's own memory, and labels the event by the statement's text, hashed without its
//! literals (or, where it could not be read, by when it began) and its connection; each text and each thread's
//! connection go to user space once. Here: where each server keeps its statements
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

/// statement.h's labels that are no statement.
const NOT_READ: u64 = 0;
const IDLE: u64 = 1;
const NO_CONNECTION: u64 = 2;
/// Set in a label of a statement's text hashed (the same for every run of it); clear in one by its start.
const HASHED: u64 = 1 << 63;

/// statement.h's records (`enum statement_record_kind`).
const TEXT: u32 = 0;
const CONNECTION: u32 = 1;

/// The bytes of `struct statement_text` before its text (checked against the skeletons' type in cpu.rs), and of
/// `struct statement_connection` (a type of no map, which the skeletons leave out).
pub const TEXT_HEADER_BYTES: usize = 40;
pub const CONNECTION_BYTES: usize = 32;

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

/// A label's fingerprint, and when its text came for one by start (which is forgotten).
type Text = (Arc<str>, Option<Instant>);

/// Texts fingerprinted, kept at most: past it they are forgotten (and fingerprinted again when seen).
const FINGERPRINTS_KEPT: usize = 20_000;

/// The text of a statement labelled by its start is kept this long after it came, so that sums drained later still
/// find it; a thread's latest is kept while it lasts (a wait of minutes is summed when it ends).
const STATEMENTS_KEPT: Duration = Duration::from_secs(10);

/// With `forget_unused`, a thread's latest statement labelled by its start is forgotten past this (a wait summed
/// later than this loses its statement).
const LATEST_KEPT: Duration = Duration::from_secs(600);

/// Connections kept at most: past it they are forgotten (their samples then without user and database).
const CONNECTIONS_KEPT: usize = 20_000;

/// The statements' texts the kernel sent (one per label: a text without its literals, or a run where its text
/// could not be read), and the fingerprints they made: the two match where literals made no label of their own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatementTexts {
    pub labels: u64,
    pub fingerprints: u64,
}

/// Labels turned into statements: a collector run's, given each text and connection as they come and each label as
/// its sums do. A label's statement is a number (`u32`) among those of the run: 0 for none (labels off).
#[derive(Default)]
pub struct Resolver {
    labels: Option<Arc<StatementLabels>>,
    /// The process of the sums that do not say theirs (a run of one target).
    pid: u32,
    interned: HashMap<u32, Arc<Statement>>,
    ids: HashMap<Arc<Statement>, u32>,
    next: u32,
    /// The numbers of `Unread`, `Idle` and `NoConnection`, never forgotten.
    fixed: [u32; 3],
    /// Each label's fingerprint by (process, thread, label), the thread 0 for a hashed label; and, for one by start,
    /// when its text came.
    texts: HashMap<(u32, u32, u64), Text>,
    /// Each thread's latest label by start.
    latest: HashMap<(u32, u32), u64>,
    fingerprints: HashMap<Box<[u8]>, Arc<str>>,
    /// Each connection's user and database, by (process, id).
    connections: HashMap<(u32, u64), UserAndDb>,
    /// The statement of each (process, thread or 0, label, connection) resolved: the sums' path.
    resolved: HashMap<(u32, u32, u64, u64), u32>,
    pruned: Option<Instant>,
    /// Where sums are sliced (the agent): the numbers resolved since the last pruning and the one before, and
    /// the others forgotten then (no sum holds them past a slice), so that connections that come and go do not
    /// grow what is kept.
    forget_unused: bool,
    used: HashSet<u32>,
    used_before: HashSet<u32>,
    /// Records that were not statement.h's (never trusted).
    pub malformed: u64,
    /// The labels whose text came, by fingerprint (forgotten with the fingerprints).
    labels_by_fingerprint: HashMap<Arc<str>, u64>,
    labels_forgotten: u64,
    fingerprints_forgotten: u64,
}

impl Resolver {
    /// Resolves the labels of `pid`'s samples (and of those that say their process) where `labels` is given;
    /// otherwise every sample is labelled 0. `sliced`: the sums are moved out each slice, and what no sum holds
    /// any more is forgotten.
    pub fn new(labels: Option<Arc<StatementLabels>>, pid: u32, sliced: bool) -> Resolver {
        let mut r = Resolver {
            labels,
            pid,
            next: 1,
            forget_unused: sliced,
            ..Resolver::default()
        };
        r.fixed =
            [Statement::Unread, Statement::Idle, Statement::NoConnection].map(|s| r.intern(s));
        r
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
        self.interned.get(&id).cloned()
    }

    fn intern(&mut self, s: Statement) -> u32 {
        if let Some(&id) = self.ids.get(&s) {
            return id;
        }
        let s = Arc::new(s);
        let id = self.next;
        self.next = self.next.wrapping_add(1).max(1);
        self.interned.insert(id, Arc::clone(&s));
        self.ids.insert(s, id);
        id
    }

    /// The number of the statement labelled `label` on thread `tid` of process `pid` (0: the run's one), run by
    /// connection `connection`.
    pub fn resolve(&mut self, pid: u32, tid: u32, label: u64, connection: u64) -> u32 {
        if self.labels.is_none() {
            return 0;
        }
        let pid = if pid == 0 { self.pid } else { pid };
        let [unread, idle, no_connection] = self.fixed;
        let id = match label {
            NOT_READ => unread,
            IDLE => idle,
            NO_CONNECTION => no_connection,
            label => {
                let tid = if label & HASHED != 0 { 0 } else { tid };
                let key = (pid, tid, label, connection);
                match self.resolved.get(&key) {
                    Some(&id) => id,
                    None => self.statement_of(key).unwrap_or(unread),
                }
            }
        };
        if self.forget_unused {
            self.used.insert(id);
        }
        id
    }

    /// The statement of (process, thread or 0, label, connection), where its text came.
    fn statement_of(&mut self, key: (u32, u32, u64, u64)) -> Option<u32> {
        let (pid, tid, label, connection) = key;
        let fingerprint = Arc::clone(&self.texts.get(&(pid, tid, label))?.0);
        let (user, db) = self
            .connections
            .get(&(pid, connection))
            .cloned()
            .unwrap_or_default();
        let id = self.intern(Statement::Running(Running {
            fingerprint,
            connection,
            user,
            db,
        }));
        self.resolved.insert(key, id);
        Some(id)
    }

    /// The labels whose text came and the fingerprints they made; `None` where labels are off.
    pub fn texts(&self) -> Option<StatementTexts> {
        self.labels.as_ref()?;
        Some(StatementTexts {
            labels: self.labels_forgotten + self.labels_by_fingerprint.values().sum::<u64>(),
            fingerprints: self.fingerprints_forgotten + self.labels_by_fingerprint.len() as u64,
        })
    }

    /// A record of statement.h (one whose first word is 0): a label's text, or a thread's connection.
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
        let (Some(kind), Some(pid)) = (word(8, 4), word(12, 4)) else {
            self.malformed += 1;
            return;
        };
        let pid = pid as u32;
        if kind == u64::from(CONNECTION) {
            let (Some(connection), Some(thd)) = (word(16, 8), word(24, 8)) else {
                self.malformed += 1;
                return;
            };
            if self.connections.len() >= CONNECTIONS_KEPT {
                self.connections.clear();
            }
            let names = labels
                .source
                .user_and_db(pid, thd, connection)
                .map_or((None, None), |(u, d)| (u.map(Arc::from), d.map(Arc::from)));
            self.connections.insert((pid, connection), names);
            return;
        }
        let (Some(tid), Some(label), Some(kept)) = (word(16, 4), word(24, 8), word(32, 4)) else {
            self.malformed += 1;
            return;
        };
        let text = bytes.get(TEXT_HEADER_BYTES..TEXT_HEADER_BYTES + kept as usize);
        let (Some(text), true) = (text, kind == u64::from(TEXT) && label > NO_CONNECTION) else {
            self.malformed += 1;
            return;
        };
        let fingerprint = match self.fingerprints.get(text) {
            Some(f) => Arc::clone(f),
            None => {
                if self.fingerprints.len() >= FINGERPRINTS_KEPT {
                    self.fingerprints.clear();
                    self.labels_forgotten += self.labels_by_fingerprint.values().sum::<u64>();
                    self.fingerprints_forgotten += self.labels_by_fingerprint.len() as u64;
                    self.labels_by_fingerprint.clear();
                }
                let f: Arc<str> = fingerprint::fingerprint_bytes(text).into();
                self.fingerprints.insert(text.into(), Arc::clone(&f));
                f
            }
        };
        let now = Instant::now();
        // A hashed label names its statement on any thread.
        let tid = if label & HASHED != 0 { 0 } else { tid as u32 };
        if !self.texts.contains_key(&(pid, tid, label)) {
            *self
                .labels_by_fingerprint
                .entry(Arc::clone(&fingerprint))
                .or_default() += 1;
        }
        let by_start = label & HASHED == 0;
        self.texts
            .insert((pid, tid, label), (fingerprint, by_start.then_some(now)));
        if by_start {
            self.latest.insert((pid, tid), label);
        }
        self.prune(now);
    }

    /// Forgets the texts by start whose sums have all come (see [`STATEMENTS_KEPT`]), and in a sliced run the
    /// statements no sum holds.
    fn prune(&mut self, now: Instant) {
        if self.pruned.is_some_and(|t| now - t < STATEMENTS_KEPT) {
            return;
        }
        self.pruned = Some(now);
        let forget = self.forget_unused;
        let latest = &mut self.latest;
        self.texts.retain(|&(pid, tid, label), (_, came)| {
            let Some(came) = came else {
                return true;
            };
            let age = now - *came;
            let is_latest = latest.get(&(pid, tid)) == Some(&label);
            if is_latest && forget && age >= LATEST_KEPT {
                latest.remove(&(pid, tid));
                return false;
            }
            age < STATEMENTS_KEPT || is_latest
        });
        let texts = &self.texts;
        self.resolved
            .retain(|&(pid, tid, label, _), _| texts.contains_key(&(pid, tid, label)));
        if forget {
            let used = std::mem::take(&mut self.used);
            let kept: HashSet<u32> = (used.iter().chain(&self.used_before).copied())
                .chain(self.fixed)
                .collect();
            self.interned.retain(|id, _| kept.contains(id));
            self.ids.retain(|_, id| kept.contains(id));
            self.resolved.retain(|_, id| kept.contains(id));
            self.used_before = used;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where every server keeps its statements, for these tests: a user and a database for every connection.
    struct Fixed;

    impl StatementSource for Fixed {
        fn layout(&self, _: u32) -> Result<BpfLayout> {
            Ok(BpfLayout::default())
        }
        fn user_and_db(&self, _: u32, _: u64, id: u64) -> Option<(Option<String>, Option<String>)> {
            Some((Some(format!("user{id}")), Some("shop".into())))
        }
    }

    /// A `struct statement_text` as statement.h sends it.
    fn text(pid: u32, tid: u32, label: u64, sql: &str) -> Vec<u8> {
        let mut r = vec![0u8; 8];
        r.extend(TEXT.to_ne_bytes());
        r.extend(pid.to_ne_bytes());
        r.extend(tid.to_ne_bytes());
        r.extend((sql.len() as u32).to_ne_bytes());
        r.extend(label.to_ne_bytes());
        r.extend((sql.len() as u32).to_ne_bytes());
        r.extend([0; 4]);
        assert_eq!(r.len(), TEXT_HEADER_BYTES);
        r.extend(sql.as_bytes());
        r
    }

    /// A `struct statement_connection`.
    fn connection(pid: u32, id: u64) -> Vec<u8> {
        let mut r = vec![0u8; 8];
        r.extend(CONNECTION.to_ne_bytes());
        r.extend(pid.to_ne_bytes());
        r.extend(id.to_ne_bytes());
        r.extend(0x1000u64.to_ne_bytes());
        assert_eq!(r.len(), CONNECTION_BYTES);
        r
    }

    const HASH: u64 = HASHED | 0x1234;
    const STARTED: u64 = 1_700_000_000_000_000;

    fn resolver(sliced: bool) -> Resolver {
        Resolver::new(Some(StatementLabels::new(Box::new(Fixed))), 7, sliced)
    }

    fn named(r: &mut Resolver, tid: u32, label: u64, conn: u64) -> Arc<Statement> {
        let id = r.resolve(7, tid, label, conn);
        r.statement(id).unwrap()
    }

    #[test]
    fn texts_name_their_statements_and_the_other_labels_say_what_the_thread_was() {
        let mut r = resolver(false);
        r.add_text(&connection(7, 42));
        r.add_text(&text(7, 8, HASH, "SELECT c FROM t WHERE id=5"));
        let id = r.resolve(7, 8, HASH, 42);
        assert_eq!(
            r.resolve(0, 9, HASH, 42),
            id,
            "the run's own process, any thread"
        );
        let Statement::Running(s) = &*r.statement(id).unwrap() else {
            panic!("{:?}", r.statement(id));
        };
        assert_eq!(&*s.fingerprint, "select c from t where id = ?");
        assert_eq!(s.connection, 42);
        assert_eq!(
            (s.user.as_deref(), s.db.as_deref()),
            (Some("user42"), Some("shop"))
        );
        // Another connection's run of it: another statement, of the same fingerprint, without names not read.
        let Statement::Running(other) = &*named(&mut r, 9, HASH, 43) else {
            panic!("another connection's");
        };
        assert_eq!(
            (&other.fingerprint, other.connection, &other.user),
            (&s.fingerprint, 43, &None)
        );
        // A label by start names a statement with its thread.
        r.add_text(&text(7, 8, STARTED, "SELECT 2"));
        assert!(matches!(
            &*named(&mut r, 8, STARTED, 42),
            Statement::Running(_)
        ));
        assert_eq!(
            *named(&mut r, 9, STARTED, 42),
            Statement::Unread,
            "another thread's"
        );
        assert_eq!(
            *named(&mut r, 8, HASHED | 1, 42),
            Statement::Unread,
            "a text never sent"
        );
        assert_eq!(*named(&mut r, 8, IDLE, 42), Statement::Idle);
        assert_eq!(*named(&mut r, 8, NO_CONNECTION, 0), Statement::NoConnection);
        assert_eq!(*named(&mut r, 8, NOT_READ, 0), Statement::Unread);
        let mut off = Resolver::new(None, 7, false);
        off.add_text(&text(7, 8, HASH, "SELECT 1"));
        assert_eq!(off.resolve(7, 8, HASH, 42), 0);
        assert_eq!(off.statement(0), None);
        assert_eq!(off.texts(), None);
    }

    #[test]
    fn the_texts_read_are_counted_by_label_against_their_fingerprints() {
        let mut r = resolver(false);
        r.add_text(&text(7, 8, HASH, "SELECT c FROM t WHERE id=5"));
        // The same label sent twice (two CPUs at once): one text.
        r.add_text(&text(7, 9, HASH, "SELECT c FROM t WHERE id=6"));
        assert_eq!(
            r.texts(),
            Some(StatementTexts {
                labels: 1,
                fingerprints: 1
            })
        );
        // A label of another text of that fingerprint, and a run's: literals that made labels of their own.
        r.add_text(&text(7, 8, HASHED | 0x99, "select c from t where id = 7"));
        r.add_text(&text(7, 8, STARTED, "SELECT c FROM t WHERE id=8"));
        r.add_text(&text(7, 8, HASHED | 0x98, "SELECT 1"));
        assert_eq!(
            r.texts(),
            Some(StatementTexts {
                labels: 4,
                fingerprints: 2
            })
        );
    }

    #[test]
    fn a_malformed_record_is_counted_never_trusted() {
        let mut r = resolver(false);
        let mut cut = text(7, 8, HASH, "SELECT 1");
        cut.truncate(TEXT_HEADER_BYTES + 3);
        r.add_text(&cut);
        r.add_text(&[0; 10]);
        r.add_text(&text(7, 8, IDLE, "SELECT 1"));
        assert_eq!(r.malformed, 3);
        assert_eq!(*named(&mut r, 8, HASH, 1), Statement::Unread);
    }

    #[test]
    fn sliced_runs_forget_the_statements_no_sum_holds() {
        let mut r = resolver(true);
        r.add_text(&text(7, 8, STARTED, "SELECT a FROM t"));
        let first = r.resolve(7, 8, STARTED, 1);
        r.add_text(&text(7, 8, STARTED + 10, "SELECT b FROM t"));
        let latest = r.resolve(7, 8, STARTED + 10, 1);
        let now = Instant::now();
        r.prune(now + Duration::from_secs(11));
        assert_eq!(
            r.resolve(7, 8, STARTED + 10, 1),
            latest,
            "the thread's latest"
        );
        for later in [22, 33] {
            r.prune(now + Duration::from_secs(later));
        }
        assert_eq!(r.statement(first), None, "unused for two prunings");
        assert!(r.statement(latest).is_some(), "used");
        assert_eq!(*named(&mut r, 8, IDLE, 1), Statement::Idle);
        // Past LATEST_KEPT, the latest too.
        r.prune(now + LATEST_KEPT + Duration::from_secs(60));
        assert_eq!(r.resolve(7, 8, STARTED + 10, 1), r.fixed[0]);
    }
}
