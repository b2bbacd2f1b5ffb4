//! `myprobe agent`: an always-on daemon for one server. It keeps on-CPU (19 Hz), off-CPU, lock-wait and
//! statement collectors attached, and serves what they find over HTTP (`http.rs`): Prometheus metrics
//! (`metrics.rs`), pprof profiles of the next N seconds, and the windows it keeps as pprof files
//! (`retain.rs`).
//!
//! Each collector runs in a thread of its own, as in `myprobe report`, but never ends by itself: the stack
//! collectors move their sums out of the kernel every second (`CollectOptions::slices`) and the main thread
//! adds each slice to the window under way and to the profile requests waiting. The statements go to the
//! metrics as they end. When the server exits, the collectors end, and the agent waits for a server to attach
//! to again (the same executable, when it was given a PID).

pub mod http;
pub mod metrics;
pub mod retain;

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{mpsc, Arc, Mutex, MutexGuard},
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context, Result};

use crate::{
    collect::{
        self, periods::Duty, ring::RingOptions, Collected, Kind, Lost, RawStack, Row, Slice,
        Slices, Stop,
    },
    process::{self, Target},
    profile::{
        self,
        stacks::{self, StackNamer, StackOptions},
        waits, Profile,
    },
    query::follow::FollowOptions,
    render::{pprof, RenderOptions},
    runner::{self, Plan},
    symbolize::{data::DataSymbolizer, Symbolizer},
};

use metrics::{LockWaits, Metrics};
use retain::Retention;

/// How often the stack collectors' sums are moved out of the kernel: what a profile request's time is
/// rounded to.
const SLICE: Duration = Duration::from_secs(1);

/// How long the agent's threads sleep at most: every wakeup of a thread of its own takes a busy server's CPU
/// for a moment, so they wake for what is due (slices, periods, requests) and otherwise this seldom.
const WAKE: Duration = Duration::from_secs(1);

/// Addresses whose names are kept from one window to the next: past these, they are symbolized again.
const MAX_NAMES_CACHED: usize = 100_000;

pub struct Options {
    pub pid: Option<u32>,
    pub window: Duration,
    /// On-CPU sampling frequency, Hz.
    pub frequency: u64,
    pub min_block_us: u64,
    /// Where the HTTP server listens: `127.0.0.1:9369`.
    pub listen: String,
    /// Where the windows are kept, for how long, and within how many bytes.
    pub dir: PathBuf,
    pub retain: Duration,
    pub retain_bytes: u64,
    /// Fingerprints with series of their own.
    pub top: usize,
    /// Off-CPU and lock tracing attached one second in N (`None`: all the time).
    pub duty: Option<Duty>,
    /// A process that is not mariadbd/mysqld may be traced.
    pub any_process: bool,
    /// The statements' tracing: one second in N or more (`sampling`), its connection to the server (none:
    /// `--no-sql`), `--raw-sql`, `--btf`, memory.
    pub queries: FollowOptions,
}

/// Rows of one kind summed over a time (a window, or a request's seconds), by lock word and stack: bounded by
/// the stacks seen, not by the time.
#[derive(Default)]
pub struct Sums {
    columns: Vec<String>,
    rows: HashMap<(u64, Arc<RawStack>), Box<[u64]>>,
    events: u64,
    traced: Duration,
    lost: Lost,
}

impl Sums {
    /// Adds `c`'s rows, each value multiplied by `scale` (traced one period in `scale`).
    fn add(&mut self, c: &Collected, scale: u64) {
        if self.columns.is_empty() {
            self.columns = c.columns.clone();
        }
        for row in &c.rows {
            let sum = self
                .rows
                .entry((row.key, Arc::clone(&row.stack)))
                .or_insert_with(|| vec![0; row.values.len()].into());
            for (s, v) in sum.iter_mut().zip(&row.values) {
                *s = s.saturating_add(v.saturating_mul(scale));
            }
        }
        self.events = self.events.saturating_add(c.events);
        self.traced += c.traced;
        self.lost = c.lost;
    }

    fn collected(&self) -> Collected {
        Collected {
            columns: self.columns.clone(),
            rows: self
                .rows
                .iter()
                .map(|((key, stack), values)| Row {
                    tid: 0,
                    key: *key,
                    stack: Arc::clone(stack),
                    values: values.clone(),
                })
                .collect(),
            events: self.events,
            lost: self.lost,
            traced: self.traced,
            estimate: None,
        }
    }
}

/// A `/debug/pprof/...?seconds=N` waiting for its seconds to pass.
pub struct ProfileRequest {
    pub kind: Kind,
    pub until: Instant,
    pub started: SystemTime,
    pub sums: Sums,
    /// Until when the slices added cover.
    pub covered: Option<Instant>,
    /// The gzip-compressed pprof, or why there is none.
    pub reply: mpsc::Sender<Result<Vec<u8>, String>>,
}

/// What the agent is doing, for `/healthz` and `/metrics`.
#[derive(Clone, Default)]
pub struct Status {
    /// The server traced: its PID and version.
    pub attached: Option<(u32, String)>,
    /// Since when (RFC 3339).
    pub since: String,
    /// Why no server is traced.
    pub waiting: String,
}

/// What the HTTP threads and the main thread share.
pub struct Shared {
    metrics: Mutex<Metrics>,
    status: Mutex<Status>,
    requests: Mutex<Vec<ProfileRequest>>,
    pub retention: Retention,
    pub host: String,
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    pub fn metrics(&self) -> MutexGuard<'_, Metrics> {
        locked(&self.metrics)
    }
    pub fn status(&self) -> Status {
        locked(&self.status).clone()
    }
    pub fn requests(&self) -> MutexGuard<'_, Vec<ProfileRequest>> {
        locked(&self.requests)
    }
    fn set_waiting(&self, why: String) {
        let mut s = locked(&self.status);
        if s.waiting != why || s.attached.is_some() {
            say!("myprobe: agent: waiting for a server: {why}");
        }
        *s = Status {
            waiting: why,
            ..Status::default()
        };
    }
}

/// Runs until SIGINT or SIGTERM.
pub fn run(o: Options) -> Result<()> {
    crate::collect::features::check_environment(o.queries.btf.as_deref())?;
    // Before any thread is made: they inherit it.
    yield_to_the_server();
    few_arenas();
    collect::install_stop_handler();
    let retention = Retention::new(&o.dir, o.retain, o.retain_bytes)?;
    let shared = Arc::new(Shared {
        metrics: Mutex::new(Metrics::new(o.top)),
        status: Mutex::new(Status::default()),
        requests: Mutex::new(Vec::new()),
        retention,
        host: crate::report::hostname(),
    });
    let server = http::serve(&o.listen, Arc::clone(&shared))?;
    say!(
        "myprobe: agent: serving http://{}/metrics and /debug/pprof/; windows of {} s kept in {}",
        o.listen,
        o.window.as_secs(),
        o.dir.display()
    );
    // Given a PID, after a restart the agent looks for a server started the same way.
    let mut pid = o.pid;
    let mut same: Option<(PathBuf, Vec<u8>)> = None;
    let mut failures = 0u32;
    while !collect::interrupted() {
        if let Some((exe, cmdline)) = &same {
            let alike: Vec<u32> = process::find_servers()
                .into_iter()
                .filter(|&p| {
                    process::exe_of(p).is_ok_and(|e| e == *exe) && command_line(p) == *cmdline
                })
                .collect();
            pid = match alike.as_slice() {
                [one] => Some(*one),
                found => {
                    shared.set_waiting(format!(
                        "{} servers run {} with the data directory (or command line) of the one traced before",
                        found.len(),
                        exe.display()
                    ));
                    pause(&shared, Duration::from_secs(1));
                    continue;
                }
            };
        }
        let target = match process::resolve(pid, o.any_process) {
            Ok(t) => t,
            Err(e) => {
                if o.pid.is_some() && same.is_none() && failures == 0 {
                    // The PID given is not a server: said at once, not waited for.
                    return Err(e);
                }
                shared.set_waiting(format!("{e:#}"));
                pause(&shared, Duration::from_secs(1));
                continue;
            }
        };
        if o.pid.is_some() {
            same = Some((target.exe.clone(), command_line(target.pid)));
        }
        let attached = attach(&target, &o, &shared);
        // What the tracing of that server took: its unwind tables, symbols and collectors.
        release_free_memory();
        match attached {
            Ok(()) => failures = 0,
            Err(e) => {
                failures += 1;
                shared.set_waiting(format!("tracing {target} failed: {e:#}"));
                // Not again at once: the same failure would repeat every second.
                pause(&shared, Duration::from_secs(5.min(u64::from(failures) * 2)));
            }
        }
    }
    say!("myprobe: agent: stopping");
    let _ = server.join();
    Ok(())
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

/// Hands the pages that the allocator holds free back to the system: after a window's profiles and after a server's
/// tracing, which free more than the agent goes on using.
fn release_free_memory() {
    // SAFETY: malloc_trim only returns free memory of the allocator's own to the system.
    unsafe { libc::malloc_trim(0) };
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

/// Waits, answering the profile requests due meanwhile (there is nothing to profile).
fn pause(shared: &Shared, time: Duration) {
    let started = Instant::now();
    while started.elapsed() < time && !collect::interrupted() {
        let why = shared.status().waiting;
        shared.requests().retain(|r| {
            let due = Instant::now() >= r.until;
            if due {
                let _ = r.reply.send(Err(format!("no server traced: {why}")));
            }
            !due
        });
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Traces `target` until it exits or the agent stops.
fn attach(target: &Target, o: &Options, shared: &Shared) -> Result<()> {
    let mut symbolizer = Symbolizer::new(target.pid).context("preparing symbolization")?;
    symbolizer.preload(false);
    let mut lock_names =
        DataSymbolizer::new(target.pid).context("reading the process's memory map")?;
    let (slices, sliced) = mpsc::channel();
    let plan = Plan {
        target,
        frequency: o.frequency,
        min_block_us: o.min_block_us,
        // Always on: a preempted thread is not unwound at every switch (bench/README.md).
        preempted_leaf_only: true,
        duty: o.duty,
        statements: FollowOptions {
            // Its readers wake once a second (a slice, a period's edge, or a batch of records), not ten times.
            ring: RingOptions::quiet(WAKE),
            stop: Stop::new(),
            ..o.queries.clone()
        },
        slices: Some(Slices {
            every: SLICE,
            send: slices,
        }),
        attached: None,
    };
    let prepared = runner::prepare(&plan)?;
    start_metrics(target, o, shared);
    say!(
        "myprobe: agent: tracing {target}: on-CPU at {} Hz, off-CPU, lock waits, statements",
        o.frequency
    );
    let mut names = Naming {
        target,
        symbolizer: &mut symbolizer,
        lock_names: &mut lock_names,
        host: &shared.host,
    };
    let failed = std::thread::scope(|s| {
        let running = runner::start(
            s,
            &plan,
            prepared.tables.as_ref(),
            prepared.functions,
            |r| shared.metrics().add_statement(r),
            |lost| shared.metrics().set_lost(Kind::Statements.name(), lost),
        );
        read_slices(running, &sliced, o, shared, &mut names)
    });
    let exited = process::target_exited();
    if exited.is_none() && !collect::interrupted() {
        anyhow::bail!("every collector ended: {}", failed.join("; "));
    }
    if let Some(pid) = exited {
        shared.set_waiting(format!("the server (PID {pid}) exited"));
    }
    Ok(())
}

/// The metrics and status of a server being attached to.
fn start_metrics(target: &Target, o: &Options, shared: &Shared) {
    {
        let mut m = shared.metrics();
        m.attaches += 1;
        m.sample_every = o.duty.map_or(1, |d| d.every).into();
        m.statements_every = o
            .queries
            .sampling
            .duty(o.queries.max_cpu_pct)
            .map_or(1, |d| d.every.into());
        // Every collector's losses are exported from the start, at zero.
        for kind in Kind::PROFILES {
            m.set_lost(kind.name(), Lost::default());
        }
        m.set_lost(Kind::Statements.name(), Lost::default());
        m.set_db_system(target.flavor.db_system());
    }
    *locked(&shared.status) = Status {
        attached: Some((target.pid, target.version.clone())),
        since: crate::report::rfc3339(SystemTime::now()),
        waiting: String::new(),
    };
}

/// Adds the collectors' slices to the window under way and to the requests waiting, ends windows, and answers
/// requests, until every collector has ended (the server exited, or the agent stops). Returns why collectors
/// ended early.
fn read_slices(
    mut running: runner::Running<'_>,
    sliced: &mpsc::Receiver<Slice>,
    o: &Options,
    shared: &Shared,
    names: &mut Naming<'_>,
) -> Vec<String> {
    let mut window = Window::new();
    let mut failed = Vec::new();
    // Until every collector has ended (the server exited, or the agent stops), and those that ended early have
    // been joined and said. The plan holds a sender of the slices: the channel stays open, a wait is a timeout.
    while !(running.profiles.is_empty() && running.statements.is_finished()) {
        if let Ok(slice) = sliced.recv_timeout(WAKE) {
            add_slice(shared, &mut window, &slice);
        }
        // Slices wait here while a window is written: every one in before a request is answered.
        while let Ok(slice) = sliced.try_recv() {
            add_slice(shared, &mut window, &slice);
        }
        answer_due(shared, names);
        if window.started.elapsed() >= o.window {
            let ended = std::mem::replace(&mut window, Window::new());
            end_window(ended, shared, names);
        }
        // A collector that ended early (it could not load here) is said once; the others go on.
        for (kind, h) in running.profiles.extract_if(.., |(_, h)| h.is_finished()) {
            if let Err(e) = runner::joined(h, kind) {
                let failure = format!("{}: {e:#}", kind.label());
                say!("myprobe: agent: warning: not traced: {failure}");
                failed.push(failure);
            }
        }
    }
    while let Ok(slice) = sliced.try_recv() {
        add_slice(shared, &mut window, &slice);
    }
    end_window(window, shared, names);
    let followed = runner::joined(running.statements, Kind::Statements);
    let mut m = shared.metrics();
    match followed {
        Ok(f) => m.set_lost(Kind::Statements.name(), f.lost),
        Err(e) => failed.push(format!("statements: {e:#}")),
    }
    m.detached();
    failed
}

/// What names stacks and locks, and labels profiles, for one server.
struct Naming<'a> {
    target: &'a Target,
    symbolizer: &'a mut Symbolizer,
    lock_names: &'a mut DataSymbolizer,
    host: &'a str,
}

impl Naming<'_> {
    /// The gzip-compressed pprof of `sums`, labelled with the host, the server's version and the time it
    /// covers; for locks, also the waits by lock and site.
    fn pprof(
        &mut self,
        kind: Kind,
        sums: &Sums,
        started: SystemTime,
    ) -> Result<(Vec<u8>, ByLockAndSite)> {
        let c = sums.collected();
        let mut namer = StackNamer::new(
            self.symbolizer,
            StackOptions {
                pid: self.target.pid,
                per_thread: false,
                addresses: false,
            },
        );
        let mut lock_waits = HashMap::new();
        let profile = match kind {
            Kind::Cpu => stacks::on_cpu(&c, &mut namer),
            Kind::Offcpu => stacks::off_cpu(&c, &mut namer),
            _ => {
                lock_waits = by_lock_and_site(&c, &mut namer, self.lock_names);
                profile::locks::summarize(&c, &mut namer, self.lock_names).0
            }
        };
        Ok((self.encode(&profile, kind, started)?, lock_waits))
    }

    fn encode(&self, profile: &Profile, kind: Kind, started: SystemTime) -> Result<Vec<u8>> {
        let mut opts = RenderOptions::default();
        opts.meta.insert("pid".into(), self.target.pid.into());
        opts.meta
            .insert("comm".into(), self.target.comm.clone().into());
        let mut message = pprof::build(profile, &opts);
        let covered = started.elapsed().unwrap_or_default();
        let start_ns = started
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as i64;
        let window = format!(
            "{}/{}",
            crate::report::rfc3339(started),
            crate::report::rfc3339(started + covered)
        );
        pprof::label(
            &mut message,
            &[
                ("host", self.host),
                ("server_version", &self.target.version),
                ("window", &window),
                ("profile", kind.name()),
            ],
            start_ns,
            covered.as_nanos() as i64,
        );
        let mut bytes = Vec::new();
        pprof::write_message(&message, &mut bytes)?;
        Ok(bytes)
    }
}

type ByLockAndSite = HashMap<(String, String), LockWaits>;

/// The waits of a window by lock and site, for `myprobe_lock_wait_seconds_total`: a lock word in no variable
/// goes by its mapping (`[heap]`), its site telling it apart, so that heap addresses make no series.
fn by_lock_and_site(
    c: &Collected,
    namer: &mut StackNamer,
    lock_names: &mut DataSymbolizer,
) -> ByLockAndSite {
    let mut by = HashMap::new();
    for row in &c.rows {
        let waits = c.value(row, "waits");
        if waits == 0 {
            continue;
        }
        let name = lock_names.name(row.key);
        let lock = if lock_names.names_no_variable(&name) {
            name.split(['+', ' ']).next().unwrap_or(&name).to_string()
        } else {
            name
        };
        let site =
            waits::site(&namer.user_frames(&row.stack)).unwrap_or_else(|| "[unknown]".into());
        let w: &mut LockWaits = by.entry((lock, site)).or_default();
        w.waits = w.waits.saturating_add(waits);
        w.wait_ns = w.wait_ns.saturating_add(c.value(row, "wait_ns"));
    }
    by
}

fn add_slice(shared: &Shared, window: &mut Window, slice: &Slice) {
    let kind = slice.collector;
    let c = &slice.collected;
    let scale = {
        let mut m = shared.metrics();
        m.set_lost(kind.name(), c.lost);
        if kind == Kind::Cpu {
            m.cpu_samples = m.cpu_samples.saturating_add(c.events);
            1
        } else {
            m.sample_every
        }
    };
    for r in shared.requests().iter_mut().filter(|r| r.kind == kind) {
        r.sums.add(c, scale);
        r.covered = r.covered.max(Some(slice.at));
    }
    window.sums.entry(kind).or_default().add(c, scale);
}

/// The window under way.
struct Window {
    started: Instant,
    started_at: SystemTime,
    sums: HashMap<Kind, Sums>,
}

impl Window {
    fn new() -> Self {
        Window {
            started: Instant::now(),
            started_at: SystemTime::now(),
            sums: HashMap::new(),
        }
    }
}

/// Keeps a window's profiles as files, and its lock waits in the metrics.
fn end_window(window: Window, shared: &Shared, names: &mut Naming) {
    for kind in Kind::PROFILES {
        let Some(sums) = window.sums.get(&kind).filter(|s| !s.rows.is_empty()) else {
            continue;
        };
        match names.pprof(kind, sums, window.started_at) {
            Ok((bytes, lock_waits)) => {
                shared.metrics().add_lock_waits(lock_waits);
                if let Err(e) = shared
                    .retention
                    .keep(kind.name(), window.started_at, &bytes)
                {
                    say!(
                        "myprobe: agent: warning: the {} window is not kept: {e:#}",
                        kind.name()
                    );
                }
            }
            Err(e) => say!("myprobe: agent: warning: the {} window: {e:#}", kind.name()),
        }
    }
    shared.metrics().end_window();
    names.symbolizer.bound_caches(MAX_NAMES_CACHED);
    names.lock_names.bound_cache(MAX_NAMES_CACHED);
    release_free_memory();
}

/// Answers the profile requests whose time has passed and whose collector's slices cover it (or stopped
/// coming: a collector that ended).
fn answer_due(shared: &Shared, names: &mut Naming) {
    let now = Instant::now();
    let due: Vec<ProfileRequest> = shared
        .requests()
        .extract_if(.., |r| {
            now >= r.until && (r.covered >= Some(r.until) || now >= r.until + 3 * SLICE)
        })
        .collect();
    for r in due {
        let answer = names
            .pprof(r.kind, &r.sums, r.started)
            .map(|(bytes, _)| bytes)
            .map_err(|e| format!("{e:#}"));
        let _ = r.reply.send(answer);
    }
}
