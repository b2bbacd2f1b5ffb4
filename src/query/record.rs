//! The record model of the statements' pipeline: a statement's record ([`QueryRecord`]), its time in parts
//! ([`TimeParts`]), its waits by cause ([`CauseWait`]) and who held them ([`Holder`]), the key of a prepared
//! statement ([`StatementKey`]), and its timestamp as records write it. A leaf: it imports no other file of
//! `query/`, and every other file builds on it.

use serde::Serialize;

use crate::collect::queries::TimePart;
use crate::server::Cause;
use crate::wire::fingerprint;

/// A text records share (a connection's user, a statement's fingerprint): cloned without copying, as a busy
/// server runs the same statements thousands of times a second.
pub type Text = std::sync::Arc<str>;

/// One statement, as `myprobe queries --json` prints it (see ARCHITECTURE.md, "Query records").
/// Times in microseconds.
#[derive(Clone, Debug, Default, Serialize)]
pub struct QueryRecord {
    pub ts: Timestamp,
    pub tid: u32,
    pub conn: Option<u32>,
    pub user: Option<Text>,
    pub db: Option<Text>,
    pub command: &'static str,
    pub query: Option<Text>,
    pub fingerprint: Option<Text>,
    pub duration_us: u64,
    /// `duration_us`, partitioned.
    #[serde(flatten)]
    pub time: TimeParts,
    pub lock_waits: u64,
    pub lock_max_us: u64,
    pub lock_addr: Option<String>,
    pub lock_symbol: Option<String>,
    /// Where the longest lock wait happened: the innermost function above the locking primitives
    /// (`profile::waits::site`).
    pub lock_site: Option<String>,
    /// Why it took its time: what most of the time seen went to ([`QueryRecord::by_cause`]).
    pub cause: Option<Cause>,
    /// Its lock waits and sleeps by cause, longest first: what each waited for, how long, and at which site.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub waits: Vec<CauseWait>,
    /// Its blocked reads, writes and syncs, a part each, by the file of the longest ([`QueryRecord::name_io`]):
    /// a page read of `sbtest.sbtest1`, the redo log, the binlog.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub io: Vec<CauseWait>,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub syncs: u64,
    pub net_bytes: u64,
    pub syscalls: u64,
    /// Its internal temporary tables that went to disk, and its sorts' merge passes (what the server's
    /// `Created_tmp_disk_tables` and `Sort_merge_passes` count, for this statement).
    #[serde(skip_serializing_if = "is_zero")]
    pub tmp_disk_tables: u32,
    #[serde(skip_serializing_if = "is_zero")]
    pub sort_merge_passes: u32,
    pub error: Option<u16>,
    /// The request was longer than what the tracer keeps: `query` is its beginning.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    /// Still running when tracing ended: `duration_us` and the rest are so far.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub in_flight: bool,
    /// Read ahead with the statement before it on its thread, and run within that statement's time (its own
    /// time and counters are unknown: zero).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub pipelined: bool,
    /// It ran when tracing began (read from the server's memory): `duration_us` is from its real start, its parts
    /// from the start of tracing (the time before is `unseen_us`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub before_tracing: bool,
    #[serde(skip)]
    pub lock_addr_raw: u64,
    /// Sampled: the statements this one stands for, its period being one in that many (0 or 1: all traced).
    #[serde(skip)]
    pub stands_for: u32,
    /// The stack id of the longest lock wait (`collect::queries::Event::Stack`), 0 if none.
    #[serde(skip)]
    pub lock_stack: u64,
    /// Its futex waits by stack.
    #[serde(skip)]
    pub wait_slots: Vec<WaitSlot>,
    /// Who woke the longest-waited stack of each cause's waits (`name_waits`): the server's thread and when
    /// (CLOCK_MONOTONIC, ns), for a lock's releaser.
    #[serde(skip)]
    pub wakers: Vec<(Cause, u32, u64)>,
    /// The descriptor of each I/O part's (read, write, sync) longest blocked syscall, -1 for none.
    #[serde(skip)]
    pub io_fds: [i32; 3],
    /// An execution of a prepared statement: its connection's socket and the statement id.
    #[serde(skip)]
    pub prepared: Option<StatementKey>,
    /// Its connection's socket ([`dispatch_fd`] of its thread when seen at dispatch_command).
    #[serde(skip)]
    pub socket: i32,
    /// When it began and ended (CLOCK_MONOTONIC, ns), to join it with what the server says of its threads.
    #[serde(skip)]
    pub start_ns: u64,
    #[serde(skip)]
    pub end_ns: u64,
}

/// A statement's futex waits at one stack (`query_counters.waits`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WaitSlot {
    /// The stack's id (stack_ids.h).
    pub stack: u64,
    /// The type its thread last announced (`thd_wait_begin`).
    pub hint: u32,
    /// Its time in the lock part, and how many waits.
    pub ns: u64,
    pub waits: u64,
    /// The server's thread that woke its last wait (0: none seen), and when (CLOCK_MONOTONIC, ns).
    pub waker: u32,
    pub woken_ns: u64,
}

/// A statement's time as parts that add up to its duration (the response-time profile of Method R), in
/// microseconds. Each nanosecond the kernel side saw went to one part (`enum time_part` of
/// src/bpf/queries.h); `unseen_us` is what it did not see (a statement read ahead with the one before it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TimeParts {
    /// On CPU: in the server's code (and the page faults and interrupts it takes), and in its syscalls unless
    /// they are split out (`queries --syscall-cpu`).
    pub user_us: u64,
    /// With `--syscall-cpu`: on CPU in syscalls that are none of the parts below (whose own time on a CPU then
    /// goes to them).
    pub sys_us: u64,
    /// Runnable, waiting for a CPU.
    pub runq_us: u64,
    /// In futex waits: mutexes, rw-locks, condition variables, InnoDB's latches and row locks.
    pub lock_us: u64,
    /// In read, write and sync syscalls (disk I/O, or the page cache's).
    pub read_us: u64,
    pub write_us: u64,
    pub sync_us: u64,
    /// In the client's socket: reading the request, sending the reply, polls.
    pub net_us: u64,
    /// Blocked anywhere else: other syscalls, page faults.
    pub other_us: u64,
    /// In `SLEEP()`: asked for by the statement, not a wait on anything (futex waits the kernel side saw as
    /// locks', moved here once their stack says so).
    pub sleep_us: u64,
    pub unseen_us: u64,
}

/// A statement's waits for one cause ([`QueryRecord::waits`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CauseWait {
    pub cause: Cause,
    pub us: u64,
    /// Where its longest stack waits (`profile::waits::site`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub site: Option<String>,
    /// What it waited for (`sbtest.sbtest1 (PRIMARY, X)`) and who held it, where the server said while it waited
    /// (`holders.rs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holder: Option<Holder>,
}

impl CauseWait {
    /// In a DBA's words, what it waited for and who held it, where known: `waits for a row lock on sbtest.sbtest1
    /// (PRIMARY, X) held by connection 42 (app@10.0.0.5), idle in its transaction for 40 s`.
    pub fn phrase(&self) -> String {
        let mut s = self.cause.phrase().to_string();
        match &self.object {
            // A lock's object: `on db.t (PRIMARY, X)`; a file's, or what is read from it: `(ib_logfile0)`.
            Some(o) if self.cause.has_holder() || self.cause.is_lock_error() => {
                s.push_str(" on ");
                s.push_str(o);
            }
            Some(o) => {
                s.push_str(" (");
                s.push_str(o);
                s.push(')');
            }
            None => {}
        }
        if let Some(h) = &self.holder {
            s.push_str(" held by ");
            s.push_str(&h.describe());
        }
        s
    }
}

impl QueryRecord {
    /// Names its blocked I/O, a part at a time: the cause and object `named` gives the file of its longest syscall
    /// (given the part, 0 for reads, 1 writes, 2 syncs, and the descriptor), else a file read, write or sync.
    pub fn name_io(
        &mut self,
        mut named: impl FnMut(usize, i32) -> Option<(Cause, Option<String>)>,
    ) {
        let t = &self.time;
        let parts = [
            (Cause::FileRead, t.read_us),
            (Cause::FileWrite, t.write_us),
            (Cause::FileSync, t.sync_us),
        ];
        let mut io: Vec<CauseWait> = Vec::new();
        for (i, (plain, us)) in parts.into_iter().enumerate().filter(|(_, (_, us))| *us > 0) {
            let fd = self.io_fds[i];
            let (cause, object) = (fd >= 0)
                .then(|| named(i, fd))
                .flatten()
                .unwrap_or((plain, None));
            // One cause, one entry (the redo log written, then synced), named by its longer part's file.
            match io.iter_mut().find(|w| w.cause == cause) {
                Some(w) => {
                    if us > w.us || w.object.is_none() {
                        w.object = object.or(w.object.take());
                    }
                    w.us = w.us.saturating_add(us);
                }
                None => io.push(CauseWait {
                    cause,
                    us,
                    site: None,
                    object,
                    holder: None,
                }),
            }
        }
        io.sort_by(|a, b| b.us.cmp(&a.us).then(a.cause.cmp(&b.cause)));
        self.io = io;
    }

    /// Names its waits: each stack's cause and site from `named` (given the stack id and the type its thread
    /// announced), the time in `SLEEP()` moved out of the lock waits, and the record's cause set.
    pub fn name_waits(&mut self, named: impl Fn(u64, u32) -> Option<(Cause, Option<String>)>) {
        let mut waits: Vec<(CauseWait, u64)> = Vec::new();
        let mut sleeps = 0u64;
        // Each cause's waker: its longest-waited stack's, (cause, ns, waker, woken).
        let mut wakers: Vec<(Cause, u64, u32, u64)> = Vec::new();
        for slot in &self.wait_slots {
            let (stack, ns, count) = (slot.stack, slot.ns, slot.waits);
            let (cause, site) = named(stack, slot.hint).unwrap_or((Cause::UnknownWait, None));
            if slot.waker != 0 {
                let woke = (cause, ns, slot.waker, slot.woken_ns);
                match wakers.iter_mut().find(|w| w.0 == cause) {
                    Some(w) if w.1 < ns => *w = woke,
                    Some(_) => {}
                    None => wakers.push(woke),
                }
            }
            if cause == Cause::Sleep {
                // Not a lock wait: neither counted as one nor its longest.
                sleeps += count;
                if stack == self.lock_stack {
                    (self.lock_max_us, self.lock_addr_raw, self.lock_addr) = (0, 0, None);
                    self.lock_site = None;
                }
            }
            match waits.iter_mut().find(|(w, _)| w.cause == cause) {
                Some((w, longest)) => {
                    w.us = w.us.saturating_add(ns);
                    if ns > *longest {
                        (w.site, *longest) = (site, ns);
                    }
                }
                None => waits.push((
                    CauseWait {
                        cause,
                        us: ns,
                        site,
                        object: None,
                        holder: None,
                    },
                    ns,
                )),
            }
        }
        let mut waits: Vec<CauseWait> = waits
            .into_iter()
            .map(|(mut w, _)| {
                w.us = w.us.saturating_add(500) / 1000;
                w
            })
            .filter(|w| w.us > 0)
            .collect();
        self.lock_waits = self.lock_waits.saturating_sub(sleeps);
        // Each wait rounded on its own, the part as a whole: what a few µs of rounding leave is the longest's.
        let slots = waits.iter().fold(0u64, |a, w| a.saturating_add(w.us));
        let rounding = self.time.lock_us.saturating_sub(slots);
        if rounding > 0 && rounding <= self.wait_slots.len() as u64 {
            if let Some(w) = waits.iter_mut().max_by_key(|w| w.us) {
                w.us += rounding;
            }
        }
        let slept = waits
            .iter()
            .filter(|w| w.cause == Cause::Sleep)
            .fold(0u64, |a, w| a.saturating_add(w.us));
        self.time.lock_to_sleep(slept);
        // What the stacks do not tell (a statement's fifth stack, a wait without one) stays unknown.
        let named = waits
            .iter()
            .filter(|w| w.cause != Cause::Sleep)
            .fold(0u64, |a, w| a.saturating_add(w.us));
        if self.time.lock_us > named {
            waits.push(CauseWait {
                cause: Cause::UnknownWait,
                us: self.time.lock_us - named,
                site: self.lock_site.clone().filter(|_| waits.is_empty()),
                object: None,
                holder: None,
            });
        }
        waits.sort_by(|a, b| b.us.cmp(&a.us).then(a.cause.cmp(&b.cause)));
        self.waits = waits;
        self.wakers = wakers.into_iter().map(|(c, _, t, at)| (c, t, at)).collect();
        // The time not seen is no cause: a statement that began before tracing is known by what it was seen doing.
        let causes = self.by_cause();
        let seen = causes.iter().filter(|(c, _)| *c != Cause::Unseen);
        self.cause = seen
            .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
            .or(causes.first())
            .map(|(c, _)| *c);
    }

    /// When it ended, in ns since the epoch.
    pub fn ended_ns(&self) -> i64 {
        (self.ts.0 + i128::from(self.duration_us) * 1000) as i64
    }

    /// Hides the literals of the statements its waits' holders ran, which the server gave as they were.
    pub fn hide_holders_literals(&mut self) {
        for h in self.waits.iter_mut().filter_map(|w| w.holder.as_mut()) {
            h.statement = h.statement.take().map(|s| shown_text(&s, false));
        }
    }

    /// What it spilled to disk, where it did: an internal temporary table (the time on a CPU of a statement that
    /// works on one is that table's), else a sort.
    pub fn spill(&self) -> Option<Cause> {
        if self.tmp_disk_tables > 0 {
            Some(Cause::TempTableOnDisk)
        } else if self.sort_merge_passes > 0 {
            Some(Cause::SortOnDisk)
        } else {
            None
        }
    }

    /// What it spilled, counted: `1 temporary table on disk, 3 sort merge passes`.
    pub fn spilled(&self) -> Option<String> {
        spill_counts(
            u64::from(self.tmp_disk_tables),
            u64::from(self.sort_merge_passes),
        )
    }

    /// Its time by cause, adding up to its duration: on a CPU (a statement's that spilled to disk, the spill's),
    /// its waits by what they waited for (the lock waits as [`QueryRecord::waits`] names them), its I/O (its
    /// temporary files', the spill's), the client, and the time not seen.
    pub fn by_cause(&self) -> Vec<(Cause, u64)> {
        let t = &self.time;
        let spill = self.spill();
        // Called twice a statement: one allocation, of room for every cause pushed below.
        let mut out = Vec::with_capacity(10 + self.waits.len() + self.io.len());
        out.extend([
            (
                spill.unwrap_or(Cause::Cpu),
                t.user_us.saturating_add(t.sys_us),
            ),
            (Cause::RunQueue, t.runq_us),
        ]);
        let mut waited = 0u64;
        for w in self.waits.iter().filter(|w| w.cause != Cause::Sleep) {
            let us = w.us.min(t.lock_us - waited);
            waited += us;
            out.push((w.cause, us));
        }
        out.push((Cause::UnknownWait, t.lock_us - waited));
        if self.io.is_empty() {
            out.extend([
                (Cause::FileRead, t.read_us),
                (Cause::FileWrite, t.write_us),
                (Cause::FileSync, t.sync_us),
            ]);
        }
        // The same cause in a lock wait and in I/O (the redo log: a follower's wait, a leader's sync) is one.
        for w in &self.io {
            let cause = match spill {
                Some(spill) if w.cause == Cause::TempFile => spill,
                _ => w.cause,
            };
            match out.iter_mut().find(|(c, _)| *c == cause) {
                Some((_, us)) => *us = us.saturating_add(w.us),
                None => out.push((cause, w.us)),
            }
        }
        out.extend([
            (Cause::Client, t.net_us),
            (Cause::Other, t.other_us),
            (Cause::Sleep, t.sleep_us),
            (Cause::Unseen, t.unseen_us),
        ]);
        out.retain(|(_, us)| *us > 0);
        out
    }
}

/// The parts of a statement's time ([`TimeParts`]).
pub const PARTS: usize = 11;

impl TimeParts {
    /// The parts' names, in the order of [`TimeParts::values`].
    pub const NAMES: [&'static str; PARTS] = [
        "user", "sys", "runq", "lock", "read", "write", "sync", "net", "other", "sleep", "unseen",
    ];

    pub fn values(&self) -> [u64; PARTS] {
        [
            self.user_us,
            self.sys_us,
            self.runq_us,
            self.lock_us,
            self.read_us,
            self.write_us,
            self.sync_us,
            self.net_us,
            self.other_us,
            self.sleep_us,
            self.unseen_us,
        ]
    }

    pub(super) fn from_values(v: [u64; PARTS]) -> Self {
        let [user_us, sys_us, runq_us, lock_us, read_us, write_us, sync_us, net_us, other_us, sleep_us, unseen_us] =
            v;
        TimeParts {
            user_us,
            sys_us,
            runq_us,
            lock_us,
            read_us,
            write_us,
            sync_us,
            net_us,
            other_us,
            sleep_us,
            unseen_us,
        }
    }

    /// Moves up to `us` of the lock waits' time to the sleep's (a wait in `SLEEP()`).
    pub fn lock_to_sleep(&mut self, us: u64) {
        let moved = us.min(self.lock_us);
        self.lock_us -= moved;
        self.sleep_us += moved;
    }

    /// The parts of a statement of `duration_ns` whose seen parts are `part_ns` (in the order of the kernel's
    /// `enum time_part`), and its duration in µs: rounded so that the parts add up to it exactly.
    pub fn of(duration_ns: u64, part_ns: &[u64]) -> (Self, u64) {
        let mut ns = [0u64; PARTS];
        for (slot, part) in [
            TimePart::PART_USER,
            TimePart::PART_SYS,
            TimePart::PART_RUNQ,
            TimePart::PART_LOCK,
            TimePart::PART_READ,
            TimePart::PART_WRITE,
            TimePart::PART_SYNC,
            TimePart::PART_NET,
            TimePart::PART_OTHER,
        ]
        .into_iter()
        .enumerate()
        {
            ns[slot] = part_ns.get(part.0 as usize).copied().unwrap_or(0);
        }
        let seen = ns.iter().fold(0u64, |a, &v| a.saturating_add(v));
        ns[PARTS - 1] = duration_ns.saturating_sub(seen);
        let total = duration_ns.max(seen);
        let us = largest_remainder(&ns, total.saturating_add(500) / 1000, 1000);
        (Self::from_values(us), total.saturating_add(500) / 1000)
    }
}

/// `values` divided by `unit` and rounded so that they add up to `target` (which is their sum divided by
/// `unit`, rounded): the largest remainders are rounded up (Hamilton's method), so parts add up exactly.
#[inline] // with its unit known where it is called, no division is made
pub fn largest_remainder<const N: usize>(values: &[u64; N], target: u64, unit: u64) -> [u64; N] {
    let mut out = values.map(|v| v / unit);
    let floor = out.iter().fold(0u64, |a, &v| a.saturating_add(v));
    // Called for every statement: the few parts to round up are picked in place, largest remainder first
    // (the first of equal ones), with no sort and no allocation.
    let mut remainder: [Option<u64>; N] = std::array::from_fn(|i| Some(values[i] % unit));
    for _ in 0..target.saturating_sub(floor).min(N as u64) {
        let Some(i) = (0..N).max_by_key(|&i| (remainder[i], std::cmp::Reverse(i))) else {
            break;
        };
        remainder[i] = None;
        out[i] += 1;
    }
    out
}

/// A prepared statement: the socket of its connection (how the tracker knows connections) and its id.
pub type StatementKey = (i32, u32);

/// Temporary tables on disk and sort merge passes, counted in words: `1 temporary table on disk, 3 sort merge
/// passes`; none when both are 0.
pub fn spill_counts(tmp_disk_tables: u64, sort_merge_passes: u64) -> Option<String> {
    let counted = |n: u64, one: &str, many: &str| {
        (n > 0).then(|| format!("{n} {}", if n == 1 { one } else { many }))
    };
    let parts: Vec<String> = [
        counted(
            tmp_disk_tables,
            "temporary table on disk",
            "temporary tables on disk",
        ),
        counted(sort_merge_passes, "sort merge pass", "sort merge passes"),
    ]
    .into_iter()
    .flatten()
    .collect();
    (!parts.is_empty()).then(|| parts.join(", "))
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// What stands for the socket of a statement seen at dispatch_command (TLS), for its prepared statements' keys:
/// its thread, below every socket and the -1 of no socket.
pub fn dispatch_fd(tid: u32) -> i32 {
    -1 - (tid & 0x3fff_ffff) as i32
}

/// What a later stage learned that the tracker did not see, handed to it by the pipeline (`Tracker::learn`):
/// the later records carry it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Learned {
    /// The text of a statement prepared before tracing (or whose prepare went by unseen).
    Prepared { key: StatementKey, text: String },
    /// What the server says of the connection on `socket` (its process list, or its memory), where its
    /// handshake went by unseen.
    Connection {
        socket: i32,
        id: u32,
        user: Option<String>,
        db: Option<String>,
    },
}

impl QueryRecord {
    /// Gives this record, an execution of a statement whose text went by unseen, the text learned for it.
    pub fn name_statement(&mut self, text: &str, raw_sql: bool) {
        let (fingerprint, query) = fingerprint_and_shown(text, raw_sql);
        (self.fingerprint, self.query) = (Some(fingerprint), Some(query));
    }
}

/// A statement's text as records show it: literals hidden unless raw SQL is asked for.
pub fn shown_text(text: &str, raw_sql: bool) -> String {
    if raw_sql {
        text.to_string()
    } else {
        fingerprint::normalize(text)
    }
}

/// A statement's fingerprint, and its text as records show it.
pub fn fingerprint_and_shown(text: &str, raw_sql: bool) -> (Text, Text) {
    (
        fingerprint::fingerprint(text).into(),
        shown_text(text, raw_sql).into(),
    )
}

/// The connection that holds what a statement waits for, as the server said while it waited.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Holder {
    /// The connection's id, user and host.
    pub conn: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Its command (`Sleep`: idle) and how long it had been in it, in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command_s: Option<u64>,
    /// How long its transaction had been open, in seconds, where the server says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transaction_s: Option<u64>,
    /// The statement it ran, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub statement: Option<String>,
    /// The waiting connection the wait queued behind, where that one's request came first (InnoDB's queue of a
    /// row's locks, a pending exclusive metadata lock): this one is the root of the chain, which holds the lock.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queued_behind: Option<u64>,
    /// What its transaction ran, newest first, as far as the statements followed saw it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ran: Vec<Ran>,
    /// Idle in its transaction, none of whose statements were followed (it began before tracing, or they were
    /// not sampled).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub ran_not_seen: bool,
    /// Known by having let the wait go (its thread woke the waiter: `query::released`), not from the server's
    /// tables: the statement it ran then (its COMMIT, most often) is not known.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub released: bool,
    /// When it was seen holding the lock (ns since the epoch; 0: unknown): what it ran after (its COMMIT, which
    /// let the waiter go) is not what the waiter waited behind.
    #[serde(skip)]
    pub seen_at_ns: i64,
}

/// What is said of a holder idle in its transaction none of whose statements were followed.
pub const RAN_NOT_SEEN: &str =
    "; what its transaction ran was not seen (it began before its statements were followed, or they were not sampled)";

/// A statement a holder's transaction ran, and when it ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Ran {
    /// RFC 3339, to the second, UTC.
    pub ended: String,
    pub statement: String,
}

impl Ran {
    /// `statement`, which ended at `at_ns` (ns since the epoch).
    pub fn new(at_ns: i64, statement: &str) -> Ran {
        Ran {
            ended: format_ts(i128::from(at_ns))
                .get(..19)
                .map_or_else(String::new, |t| format!("{t}Z")),
            statement: statement.to_string(),
        }
    }
}

impl Holder {
    /// In a DBA's words: `connection 42 (root@localhost), idle in its transaction for 40 s`.
    pub fn describe(&self) -> String {
        let who = match (&self.user, &self.host) {
            (Some(u), Some(h)) => format!("connection {} ({u}@{h})", self.conn),
            (Some(u), None) => format!("connection {} ({u})", self.conn),
            _ => format!("connection {}", self.conn),
        };
        let held = match (self.command.as_deref(), &self.statement) {
            (Some("Sleep"), _) => match self.transaction_s.or(self.command_s) {
                Some(s) => format!("{who}, idle in its transaction for {s} s"),
                None => format!("{who}, idle in its transaction"),
            },
            (_, Some(statement)) => {
                let running = self
                    .command_s
                    .map(|s| format!(" for {s} s"))
                    .unwrap_or_default();
                format!("{who}, running{running}: {}", shown_text(statement, false))
            }
            _ if self.released => format!("{who}, which let it go"),
            _ => who,
        };
        let held = match self.queued_behind {
            Some(c) => format!("{held} (queued behind connection {c})"),
            None => held,
        };
        if self.ran_not_seen {
            return format!("{held}{RAN_NOT_SEEN}");
        }
        if self.ran.is_empty() {
            return held;
        }
        let ran: Vec<String> = self
            .ran
            .iter()
            .map(|r| {
                let at = r.ended.get(11..19).unwrap_or(&r.ended);
                format!("{} (ended {at})", shown_text(&r.statement, false))
            })
            .collect();
        format!(
            "{held}; its transaction ran, newest first: {}",
            ran.join(", ")
        )
    }
}

pub(crate) fn realtime_offset_ns() -> i128 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    now.as_nanos() as i128 - crate::collect::monotonic_ns() as i128
}

/// When a statement began, in ns since the epoch: written as [`format_ts`] only where a record is shown (most
/// are only summed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Timestamp(pub i128);

impl std::fmt::Display for Timestamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&format_ts(self.0))
    }
}

impl Serialize for Timestamp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_ts(self.0))
    }
}

/// `2026-11-22T10:30:01.123456Z` (UTC, microseconds) from nanoseconds since the epoch. Called for every
/// statement: the date and time of the second are formatted once a second.
pub fn format_ts(epoch_ns: i128) -> String {
    thread_local! {
        static SECOND: std::cell::Cell<(i64, [u8; 19])> = const { std::cell::Cell::new((i64::MIN, [0; 19])) };
    }
    let us = epoch_ns.max(0) / 1000;
    let (secs, micros) = ((us / 1_000_000) as i64, (us % 1_000_000) as u32);
    let prefix = SECOND.with(|c| {
        let (cached, prefix) = c.get();
        if cached == secs {
            return prefix;
        }
        let mut prefix = [0u8; 19];
        prefix.copy_from_slice(format_second(secs).as_bytes());
        c.set((secs, prefix));
        prefix
    });
    let mut ts = String::with_capacity(27);
    ts.push_str(std::str::from_utf8(&prefix).unwrap_or_default());
    ts.push('.');
    let mut digits = [b'0'; 6];
    let mut m = micros;
    for d in digits.iter_mut().rev() {
        *d = b'0' + (m % 10) as u8;
        m /= 10;
    }
    ts.push_str(std::str::from_utf8(&digits).unwrap_or_default());
    ts.push('Z');
    ts
}

/// The last second [`format_ts`] writes in its 19 bytes (four-digit years): 9999-12-31T23:59:59.
const LAST_SECOND: i64 = 253_402_300_799;

/// `2026-11-22T10:30:01` (UTC) from seconds since the epoch: the C library's civil date (`gmtime_r`).
fn format_second(secs: i64) -> String {
    let time = secs.clamp(0, LAST_SECOND) as libc::time_t;
    // SAFETY: all zeroes is a valid `tm` (integers, and a null pointer for the zone's name, which gmtime_r sets).
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: gmtime_r reads `time` and writes `tm` only, both alive across the call (it is reentrant: no static).
    if unsafe { libc::gmtime_r(&time, &mut tm) }.is_null() {
        return "1970-01-01T00:00:00".to_string();
    }
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
        i64::from(tm.tm_year) + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn largest_remainders_are_rounded_up_first_and_equal_ones_in_order() {
        assert_eq!(largest_remainder(&[1500, 1500, 1500], 5, 1000), [2, 2, 1]);
        assert_eq!(largest_remainder(&[1100, 1900, 1500], 5, 1000), [1, 2, 2]);
        assert_eq!(largest_remainder(&[999, 1, 0], 1, 1000), [1, 0, 0]);
        assert_eq!(largest_remainder(&[2000, 3000], 5, 1000), [2, 3]);
    }

    #[test]
    fn parts_rounded_to_microseconds_add_up_to_the_duration() {
        // 1.6 + 1.6 + 1.6 + 0.2 µs of 5 µs: rounded alone they would add up to 6.
        let mut part_ns = [0u64; 9];
        part_ns[TimePart::PART_USER.0 as usize] = 1600;
        part_ns[TimePart::PART_LOCK.0 as usize] = 1600;
        part_ns[TimePart::PART_NET.0 as usize] = 1600;
        let (parts, us) = TimeParts::of(5000, &part_ns);
        assert_eq!(us, 5);
        assert_eq!(parts.values().iter().sum::<u64>(), 5);
        assert_eq!((parts.user_us, parts.lock_us, parts.net_us), (2, 2, 1));
        // What was not seen is a part of its own.
        let (parts, us) = TimeParts::of(10_000, &part_ns);
        assert_eq!((us, parts.unseen_us), (10, 5));
        // Parts beyond the duration (never from the kernel side): the duration is their sum.
        let (parts, us) = TimeParts::of(1000, &[2000; 9]);
        assert_eq!((parts.values().iter().sum::<u64>(), us), (18, 18));
    }

    #[test]
    fn a_spilling_statement_s_cpu_and_temporary_files_are_its_spill_s() {
        let mut r = QueryRecord {
            time: TimeParts {
                user_us: 700,
                sys_us: 100,
                runq_us: 50,
                write_us: 150,
                ..TimeParts::default()
            },
            io: vec![CauseWait {
                cause: Cause::TempFile,
                us: 150,
                site: None,
                object: Some("#sql-1_2.MAD".into()),
                holder: None,
            }],
            ..QueryRecord::default()
        };
        assert_eq!(
            r.by_cause(),
            [
                (Cause::Cpu, 800),
                (Cause::RunQueue, 50),
                (Cause::TempFile, 150)
            ]
        );
        assert_eq!(r.spilled(), None);
        (r.tmp_disk_tables, r.sort_merge_passes) = (1, 3);
        assert_eq!(
            r.by_cause(),
            [(Cause::TempTableOnDisk, 950), (Cause::RunQueue, 50)]
        );
        assert_eq!(
            r.spilled().as_deref(),
            Some("1 temporary table on disk, 3 sort merge passes")
        );
        r.tmp_disk_tables = 0;
        assert_eq!(r.by_cause()[0], (Cause::SortOnDisk, 950));
        assert_eq!(r.spilled().as_deref(), Some("3 sort merge passes"));
    }

    #[test]
    fn timestamps() {
        assert_eq!(format_ts(0), "1970-01-01T00:00:00.000000Z");
        // The second's prefix is reused within the second, never across.
        assert_eq!(format_ts(999_999_000), "1970-01-01T00:00:00.999999Z");
        assert_eq!(format_ts(1_000_001_000), "1970-01-01T00:00:01.000001Z");
        // date -u -d @1795343203.498260 → 2026-11-22 10:26:43
        assert_eq!(
            format_ts(1_795_343_203_498_260_000),
            "2026-11-22T10:26:43.498260Z"
        );
        assert_eq!(
            format_ts(951_782_400_000_001_000),
            "2000-02-29T00:00:00.000001Z"
        );
        // Before the epoch is the epoch; past year 9999, its last second (the prefix has four-digit years).
        assert_eq!(format_ts(-5), "1970-01-01T00:00:00.000000Z");
        assert_eq!(
            format_ts(i128::from(LAST_SECOND + 86_400) * 1_000_000_000),
            "9999-12-31T23:59:59.000000Z"
        );
    }
}
