//! What the agent's threads share: its options, the state the HTTP threads, the main thread and the servers'
//! threads read and write (`Shared`: metrics, status, profile requests waiting, the unwind tables and the program
//! sets of each store), and the sums of a window or a request (`Sums`).

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{mpsc, Arc, Mutex, MutexGuard},
    time::{Duration, Instant, SystemTime},
};

use anyhow::Result;

use super::{metrics::Metrics, retain::Retention};
use crate::{
    collect::{
        self,
        labels::Statement,
        periods::{BudgetShares, Duty},
        targets::Targets,
        unwind_store::{Stores, UnwindStore},
        Collected, Kind, Lost, RawStack, Row, Stop,
    },
    query::follow::FollowOptions,
    runner,
};

/// How often the stack collectors' sums are moved out of the kernel: what a profile request's time is
/// rounded to.
pub(super) const SLICE: Duration = Duration::from_secs(1);

/// How long the agent's threads sleep at most: every wakeup of a thread of its own takes a busy server's CPU
/// for a moment, so they wake for what is due (slices, periods, requests) and otherwise this seldom.
pub(super) const WAKE: Duration = Duration::from_secs(1);

/// Addresses whose names are kept from one window to the next: past these, they are symbolized again.
pub(super) const MAX_NAMES_CACHED: usize = 100_000;

pub struct Options {
    pub pid: Option<u32>,
    pub window: Duration,
    /// On-CPU sampling frequency, Hz.
    pub frequency: u64,
    pub min_block_us: u64,
    /// Where the HTTP server listens: `127.0.0.1:9369`.
    pub listen: String,
    /// TLS and basic auth for it: exporter-toolkit's web configuration file (`--web.config.file`).
    pub web_config: Option<PathBuf>,
    /// Where the windows are kept, for how long, and within how many bytes.
    pub dir: PathBuf,
    pub retain: Duration,
    pub retain_bytes: u64,
    /// Fingerprints with series of their own, per server.
    pub top: usize,
    /// How long the series of a server that exited stay, at their last values.
    pub forget_after: Duration,
    /// Off-CPU and lock tracing attached one second in N (`None`: all the time).
    pub duty: Option<Duty>,
    /// A process that is not mariadbd/mysqld may be traced.
    pub any_process: bool,
    /// Each server's off-CPU programs its own (`--programs-per-server`), not one set for the servers of a store.
    pub programs_per_server: bool,
    /// The session history: where it is kept and for how long (none: `--no-history`).
    pub history: Option<(PathBuf, crate::history::store::Retention)>,
    /// The statements' tracing: one second in N or more (`sampling`), its connection to the server (none:
    /// `--no-sql`), `--raw-sql`, `--btf`, memory.
    pub queries: FollowOptions,
    /// The profiles' samples labelled by the statement their thread ran (none: `--no-statement-labels`).
    pub statement_labels: bool,
}

/// Rows of one kind summed over a time (a window, or a request's seconds), by lock word, statement and stack:
/// bounded by the stacks and statements seen, not by the time.
#[derive(Default)]
pub struct Sums {
    columns: Vec<String>,
    pub(super) rows: HashMap<SumKey, Box<[u64]>>,
    events: u64,
    traced: Duration,
    lost: Lost,
}

impl Sums {
    /// Adds `c`'s rows, each value multiplied by `scale` (traced one period in `scale`).
    pub(super) fn add(&mut self, c: &Collected, scale: u64) {
        if self.columns.is_empty() {
            self.columns = c.columns.clone();
        }
        for row in &c.rows {
            let sum = self
                .rows
                .entry((row.key, row.statement.clone(), Arc::clone(&row.stack)))
                .or_insert_with(|| vec![0; row.values.len()].into());
            for (s, v) in sum.iter_mut().zip(&row.values) {
                *s = s.saturating_add(v.saturating_mul(scale));
            }
        }
        self.events = self.events.saturating_add(c.events);
        self.traced += c.traced;
        self.lost = c.lost;
    }

    pub(super) fn collected(&self) -> Collected {
        Collected {
            columns: self.columns.clone(),
            rows: self
                .rows
                .iter()
                .map(|((key, statement, stack), values)| Row {
                    tid: 0,
                    key: *key,
                    stack: Arc::clone(stack),
                    values: values.clone(),
                    statement: statement.clone(),
                })
                .collect(),
            events: self.events,
            lost: self.lost,
            traced: self.traced,
            estimate: None,
            statement_texts: None,
        }
    }
}

/// What a row is summed by: its lock word, its statement, its stack.
pub(super) type SumKey = (u64, Option<Arc<Statement>>, Arc<RawStack>);

/// A `/debug/pprof/...?seconds=N` waiting for its seconds to pass.
pub struct ProfileRequest {
    /// The server profiled.
    pub pid: u32,
    pub kind: Kind,
    pub until: Instant,
    pub started: SystemTime,
    pub sums: Sums,
    /// Until when the slices added cover.
    pub covered: Option<Instant>,
    /// The gzip-compressed pprof, or why there is none.
    pub reply: mpsc::Sender<Result<Vec<u8>, String>>,
}

/// What the agent is doing, for `/healthz` and `/debug/pprof/`.
#[derive(Clone, Default)]
pub struct Status {
    /// The servers traced now.
    pub attached: Vec<Attached>,
    /// Why no server is traced, where none is.
    pub waiting: String,
}

/// A server traced now.
#[derive(Clone)]
pub struct Attached {
    pub pid: u32,
    /// `mariadbd (PID 123, MariaDB 10.11.19-…)`.
    pub server: String,
    /// Since when (RFC 3339).
    pub since: String,
}

/// What the HTTP threads, the main thread and the servers' threads share.
pub struct Shared {
    pub(super) metrics: Mutex<Metrics>,
    pub(super) status: Mutex<Status>,
    pub(super) requests: Mutex<Vec<ProfileRequest>>,
    /// The servers' unwind tables in the kernel, one copy for servers of the same code.
    pub(super) unwind: Stores,
    /// The off-CPU and lock programs of the servers of each store: one set of each for them all.
    sets: Mutex<Vec<ProgramSet>>,
    pub retention: Retention,
    pub host: String,
    /// The agent's run: Ctrl-C and SIGTERM end it, and with it every loop of the agent.
    pub(super) stop: Stop,
    /// Between how many servers the statements' CPU budget is split: those found now.
    pub(super) budget_shares: BudgetShares,
    /// The session history's store (none: `--no-history`).
    pub(super) history: Option<Mutex<crate::history::writer::Writer>>,
}

pub(super) fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    /// Nothing traced yet: metrics of the `top` fingerprints per server, windows kept by `retention`.
    pub(super) fn new(
        top: usize,
        retention: Retention,
        host: String,
        history: Option<crate::history::writer::Writer>,
    ) -> Shared {
        Shared {
            metrics: Mutex::new(Metrics::new(top)),
            status: Mutex::new(Status::default()),
            requests: Mutex::new(Vec::new()),
            unwind: Stores::default(),
            sets: Mutex::new(Vec::new()),
            retention,
            host,
            stop: Stop::new(),
            budget_shares: BudgetShares::default(),
            history: history.map(Mutex::new),
        }
    }

    /// Where the session history is kept, if it is.
    pub fn history_path(&self) -> Option<PathBuf> {
        self.history
            .as_ref()
            .map(|w| locked(w).path().to_path_buf())
    }

    pub fn metrics(&self) -> MutexGuard<'_, Metrics> {
        locked(&self.metrics)
    }
    pub fn status(&self) -> Status {
        locked(&self.status).clone()
    }
    pub(super) fn status_mut(&self) -> MutexGuard<'_, Status> {
        locked(&self.status)
    }
    pub fn requests(&self) -> MutexGuard<'_, Vec<ProfileRequest>> {
        locked(&self.requests)
    }
    /// Adds the server of `plan` to the `kind` programs of the servers of its `store`, starting them where none
    /// run; its slices go to `send`. The set's members are returned, for the server to leave it.
    pub(crate) fn join_set(
        &self,
        kind: Kind,
        store: &Arc<UnwindStore>,
        plan: &runner::Plan<'_>,
        send: mpsc::Sender<collect::Slice>,
    ) -> Arc<Targets> {
        let pid = plan.target.pid;
        let mut sets = locked(&self.sets);
        end_finished(&mut sets);
        let mine = |s: &&ProgramSet| s.kind == kind && Arc::ptr_eq(&s.store, store);
        if let Some(set) = sets
            .iter()
            .filter(mine)
            .find(|s| s.targets.join(pid, send.clone()))
        {
            return Arc::clone(&set.targets);
        }
        let targets = Arc::new(Targets::of(pid, send));
        let opts = plan.shared_options(store, Arc::clone(&targets));
        let offcpu = plan.offcpu_settings();
        let thread = std::thread::Builder::new()
            .name(kind.name().into())
            .spawn(move || {
                let traced = match kind {
                    Kind::Offcpu => collect::offcpu::collect(&opts, offcpu).map(|_| ()),
                    _ => collect::locks::collect(&opts).map(|_| ()),
                };
                // What its objects took, handed back once they are closed.
                drop(opts);
                release_free_memory();
                traced
            });
        match thread {
            Ok(thread) => sets.push(ProgramSet {
                kind,
                store: Arc::clone(store),
                targets: Arc::clone(&targets),
                thread,
            }),
            Err(e) => say!(
                "myprobe: agent: warning: {} not traced: starting a thread: {e}",
                kind.label()
            ),
        }
        targets
    }

    /// Says and forgets the program sets that ended (no member left, or they failed).
    pub(super) fn end_finished_sets(&self) {
        end_finished(&mut locked(&self.sets));
    }

    /// Waits for every program set to end (the agent's run stopped), saying why one failed.
    pub(super) fn end_every_set(&self) {
        for set in locked(&self.sets).drain(..) {
            set.join();
        }
    }

    /// Why no server is traced; said when it changes.
    pub(super) fn set_waiting(&self, why: String) {
        let mut s = locked(&self.status);
        if s.waiting != why {
            say!("myprobe: agent: waiting for a server: {why}");
            s.waiting = why;
        }
    }
}

/// The collectors whose programs the servers of a store share: they run at events of the whole host (each
/// switch, each futex call), where a set per server would run once per server for each.
pub(super) const SHARED_KINDS: [Kind; 2] = [Kind::Offcpu, Kind::Locks];

/// One set of programs of a collector for the servers of a store (collect::targets), traced by a thread of its
/// own until none of them is left.
struct ProgramSet {
    kind: Kind,
    store: Arc<UnwindStore>,
    targets: Arc<Targets>,
    thread: std::thread::JoinHandle<Result<()>>,
}

/// Says and forgets the sets that ended (no member left, or they failed): their stores go with them.
fn end_finished(sets: &mut Vec<ProgramSet>) {
    for set in sets.extract_if(.., |s| s.thread.is_finished()) {
        set.join();
    }
}

impl ProgramSet {
    /// Waits for its thread to end, and says why it did if it failed.
    fn join(self) {
        let result = self
            .thread
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("its thread panicked")));
        if let Err(e) = result {
            say!(
                "myprobe: agent: warning: {} not traced: {e:#}",
                self.kind.label()
            );
        }
    }
}

/// Hands the pages that the allocator holds free back to the system: after a window's profiles and after a server's
/// tracing, which free more than the agent goes on using.
pub(super) fn release_free_memory() {
    // SAFETY: malloc_trim only returns free memory of the allocator's own to the system.
    unsafe { libc::malloc_trim(0) };
}
