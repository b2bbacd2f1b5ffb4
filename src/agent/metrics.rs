//! What `/metrics` says, in Prometheus's text format: the statements by fingerprint (counts, errors, time by
//! part, latency histograms), lock waits by lock and site, the DB load of the seconds the session history sampled
//! (`load.rs`), what was lost, the agent's own CPU and memory, and the host's CPUs.
//!
//! Each server traced has series of its own, labelled by its PID, port and version (and container and pod): a
//! restarted server is another, whose series start from zero, and those of one that exited stay at their last
//! values until they age out. A counter never goes down. Cardinality is bounded per server: a fingerprint has
//! series of its own among the `top` with the most time, the rest add to `other`. A fingerprint gets series
//! when there is room, or at a window's end when it took more than twice the time of the least busy one that
//! has series, which then stops being exported (its series end; what it does next adds to `other`). Names follow Prometheus's conventions (base units, `_total` counters), labels
//! OpenTelemetry's database conventions where they map (`db.system` → `db_system`, `db.namespace`,
//! `db.query.summary`, `db.query.text`).

use std::{
    collections::HashMap,
    fmt::Write,
    time::{Duration, Instant},
};

use super::load::{Load, Ranked};
use crate::{
    collect::Lost, history::Second, query::QueryRecord, query::Text, query::TimeParts,
    server::Cause,
};

/// Upper bounds of the latency histogram's buckets, seconds.
pub const LATENCY_BUCKETS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// Fingerprints remembered per window as candidates for series of their own; the rest only add to `other`.
const MAX_CANDIDATES: usize = 10_000;

/// Lock and site pairs with series of their own; the rest add to `other`.
const MAX_LOCK_SERIES: usize = 200;

/// `OTHER`'s labels: the statements of every fingerprint without series of its own.
pub const OTHER: &str = "other";

/// The other side of a deadlock the server no longer kept when it was read.
const UNKNOWN: &str = "unknown";

#[derive(Clone, Debug, Default)]
struct Series {
    count: u64,
    errors: u64,
    parts_us: [u64; crate::query::PARTS],
    /// The time by cause (`QueryRecord::by_cause`), in the order of `Cause::ALL`.
    causes_us: [u64; Cause::ALL.len()],
    total_us: u64,
    /// Statements per bucket of [`LATENCY_BUCKETS`] (not cumulative), and above the last.
    buckets: [u64; LATENCY_BUCKETS.len() + 1],
    /// Time in the window under way, µs: what ranks fingerprints.
    window_us: u64,
}

impl Series {
    /// A statement traced, standing for `scale` statements (one period traced in `scale`).
    fn add(&mut self, r: &QueryRecord, scale: u64) {
        self.count += scale;
        self.errors += r.error.is_some() as u64 * scale;
        for (sum, v) in self.parts_us.iter_mut().zip(r.time.values()) {
            *sum = sum.saturating_add(v.saturating_mul(scale));
        }
        for (cause, us) in r.by_cause() {
            let sum = &mut self.causes_us[cause as usize];
            *sum = sum.saturating_add(us.saturating_mul(scale));
        }
        let us = r.duration_us.saturating_mul(scale);
        self.total_us = self.total_us.saturating_add(us);
        self.window_us = self.window_us.saturating_add(us);
        let secs = r.duration_us as f64 / 1e6;
        let bucket = LATENCY_BUCKETS
            .iter()
            .position(|&le| secs <= le)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.buckets[bucket] += scale;
    }
}

/// A fingerprint in a database (a statement without one: its command, as `(execute)`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Key {
    db: Text,
    fingerprint: Text,
}

/// Lock waits summed per lock and site.
#[derive(Clone, Copy, Debug, Default)]
pub struct LockWaits {
    pub waits: u64,
    pub wait_ns: u64,
}

/// Everything `/metrics` says: each server's series, and the agent's own.
pub struct Metrics {
    top: usize,
    servers: Vec<ServerSeries>,
    pub attaches: u64,
    /// Off-CPU and lock tracing runs one period in this many: what their figures are scaled by.
    pub sample_every: u64,
}

/// One server's series, summed since the agent attached to it, and kept for a while after it exited.
pub struct ServerSeries {
    pid: u32,
    /// Its labels in the text format (`server_pid="…",…,db_system="…"`): on every series of its own.
    labels: String,
    /// When the agent let it go (it exited): its last values stay until [`Metrics::forget`] ages them out.
    gone: Option<Instant>,
    top: usize,
    exposed: HashMap<Key, Series>,
    other: Series,
    candidates: HashMap<Key, u64>,
    locks: HashMap<(String, String), LockWaits>,
    /// Deadlocks by the rolled-back statement's fingerprint and the other side's, lock wait timeouts by the
    /// fingerprint: (cause, statement, other side's fingerprint or `unknown`).
    lock_errors: HashMap<(Cause, Key, Text), u64>,
    /// Events lost per collector.
    lost: HashMap<&'static str, Lost>,
    pub windows: u64,
    /// On-CPU samples of the server's threads.
    pub cpu_samples: u64,
    /// Statements: the cycle of the last one traced (each is scaled by its own, `QueryRecord::stands_for`).
    pub statements_every: u64,
    /// The DB load of the seconds the session history sampled.
    load: Load,
}

impl Metrics {
    pub fn new(top: usize) -> Self {
        Metrics {
            top,
            servers: Vec::new(),
            attaches: 0,
            sample_every: 1,
        }
    }

    /// A server attached: its series, from zero, labelled `labels` (the text format's `name="value",…`).
    pub fn attach(&mut self, pid: u32, labels: String) -> &mut ServerSeries {
        self.attaches += 1;
        // The same server attached again (its tracing failed): its series go on from where they were.
        if let Some(i) = self
            .servers
            .iter()
            .position(|s| s.pid == pid && s.labels == labels)
        {
            self.servers[i].gone = None;
            return &mut self.servers[i];
        }
        // A PID reused by another server: the old one's series end now.
        self.servers.retain(|s| s.pid != pid);
        self.servers.push(ServerSeries {
            pid,
            labels,
            gone: None,
            top: self.top,
            exposed: HashMap::new(),
            other: Series::default(),
            candidates: HashMap::new(),
            locks: HashMap::new(),
            lock_errors: HashMap::new(),
            lost: HashMap::new(),
            windows: 0,
            cpu_samples: 0,
            statements_every: 1,
            load: Load::new(self.top),
        });
        self.servers.last_mut().expect("just pushed")
    }

    /// The series of the server with this PID, traced now.
    pub fn server(&mut self, pid: u32) -> Option<&mut ServerSeries> {
        self.servers
            .iter_mut()
            .find(|s| s.pid == pid && s.gone.is_none())
    }

    /// The server with this PID is let go (it exited): its series stay, at their last values, until forgotten.
    pub fn detached(&mut self, pid: u32) {
        if let Some(s) = self.server(pid) {
            s.gone = Some(Instant::now());
        }
    }

    /// Ends the series of the servers gone for longer than `after`.
    pub fn forget(&mut self, after: Duration) {
        self.servers
            .retain(|s| s.gone.is_none_or(|gone| gone.elapsed() < after));
    }

    /// The exposition, in Prometheus's text format 0.0.4: a family's series together, server after server.
    pub fn render(&self, own: &Own) -> String {
        let mut out = String::new();
        let rows: Vec<(String, &Series)> = self
            .servers
            .iter()
            .flat_map(ServerSeries::statement_rows)
            .collect();
        write_statement_counts(&mut out, &rows);
        write_latency_histograms(&mut out, &rows);
        self.write_lock_waits(&mut out);
        self.write_lock_errors(&mut out);
        self.write_load(&mut out);
        self.write_lost(&mut out);
        self.write_agent(&mut out);
        write_process(&mut out, own);
        out
    }

    /// The DB load of the seconds the session history sampled: active session-seconds by state, statement, user
    /// and client host; and, while it samples, the sessions by state now and how long a blocker has held others
    /// up.
    fn write_load(&self, out: &mut String) {
        family(
            out,
            "myprobe_db_load_seconds_total",
            "counter",
            "Active sessions (each running a statement) summed over the seconds the session history sampled, by \
             state (CPU, run queue, row lock, metadata lock, client, ...): its rate is the average active sessions, \
             the DB load. A state is written once it has load.",
        );
        for s in &self.servers {
            for st in s.load.states().into_iter().filter(|st| st.seconds > 0) {
                let _ = writeln!(
                    out,
                    "myprobe_db_load_seconds_total{{{},state=\"{}\"}} {}",
                    s.labels,
                    escape(&st.state),
                    st.seconds
                );
            }
        }
        // Each family's name, help, ranking, labels, and the names `other` is written with.
        type ByName = (
            &'static str,
            &'static str,
            fn(&Load) -> &Ranked,
            fn(&[String]) -> String,
            &'static [&'static str],
        );
        let by_name: [ByName; 3] = [
            (
                "myprobe_db_load_by_statement_seconds_total",
                "The same by statement: the --top fingerprints with the most load, the rest as `other`.",
                |l| &l.statements,
                |n| statement_labels(&n[0], &n[1]),
                &["", OTHER],
            ),
            (
                "myprobe_db_load_by_user_seconds_total",
                "The same by user: the 20 with the most load (fewer with a smaller --top), the rest as `other`.",
                |l| &l.users,
                |n| format!("user_name=\"{}\"", escape(&n[0])),
                &[OTHER],
            ),
            (
                "myprobe_db_load_by_host_seconds_total",
                "The same by the client's host: the 20 with the most load (fewer with a smaller --top), the rest as \
                 `other`.",
                |l| &l.hosts,
                |n| format!("client_address=\"{}\"", escape(&n[0])),
                &[OTHER],
            ),
        ];
        for (name, help, ranked, labels, other_names) in by_name {
            family(out, name, "counter", help);
            let other_names: Vec<String> = other_names.iter().map(|n| n.to_string()).collect();
            for s in &self.servers {
                let (rows, other) = ranked(&s.load).rows();
                for (names, seconds) in rows {
                    let _ = writeln!(out, "{name}{{{},{}}} {seconds}", s.labels, labels(names));
                }
                if other > 0 {
                    let _ = writeln!(
                        out,
                        "{name}{{{},{}}} {other}",
                        s.labels,
                        labels(&other_names)
                    );
                }
            }
        }
        self.write_sessions_now(out);
    }

    /// What the last second sampled showed, for the servers traced and sampled now.
    fn write_sessions_now(&self, out: &mut String) {
        let sampled = || {
            self.servers
                .iter()
                .filter(|s| s.gone.is_none() && s.load.fresh())
        };
        family(
            out,
            "myprobe_sessions",
            "gauge",
            "Connections at the last second sampled, by state: the active ones by what they do or wait for, and \
             those idle in an open transaction (not load). Written while the session history samples.",
        );
        for s in sampled() {
            for st in s.load.states() {
                let _ = writeln!(
                    out,
                    "myprobe_sessions{{{},state=\"{}\"}} {}",
                    s.labels,
                    escape(&st.state),
                    st.now
                );
            }
        }
        family(
            out,
            "myprobe_blocker_held_seconds",
            "gauge",
            "The longest a connection has been holding others up, at the last second sampled: since the longest \
             waiter behind it began its statement, and for as long as someone waits behind it (a waiter that timed \
             out and tried again included); 0 when nobody waits behind another. Written while the session history \
             samples.",
        );
        for s in sampled() {
            let _ = writeln!(
                out,
                "myprobe_blocker_held_seconds{{{}}} {}",
                s.labels,
                s.load.held_s()
            );
        }
    }

    /// The lock waits summed by lock and wait site, sorted by lock, then site.
    fn write_lock_waits(&self, out: &mut String) {
        type Value = (&'static str, &'static str, fn(&LockWaits) -> f64);
        let values: [Value; 2] = [
            (
                "myprobe_lock_wait_seconds_total",
                "Time the server's threads waited in futex waits, by lock and wait site.",
                |w| w.wait_ns as f64 / 1e9,
            ),
            (
                "myprobe_lock_waits_total",
                "Futex waits of the server's threads, by lock and wait site.",
                |w| w.waits as f64,
            ),
        ];
        for (name, help, value) in values {
            family(out, name, "counter", help);
            for s in &self.servers {
                let mut locks: Vec<(&(String, String), &LockWaits)> = s.locks.iter().collect();
                locks.sort_by(|a, b| a.0.cmp(b.0));
                for ((lock, site), w) in &locks {
                    let _ = writeln!(
                        out,
                        "{name}{{{},lock=\"{}\",site=\"{}\"}} {}",
                        s.labels,
                        escape(lock),
                        escape(site),
                        value(w)
                    );
                }
            }
        }
    }

    /// Deadlocks by pair of statements, and lock wait timeouts by statement.
    fn write_lock_errors(&self, out: &mut String) {
        let families = [
            (
                Cause::Deadlock,
                "myprobe_deadlocks_total",
                "Statements rolled back in deadlocks, by their fingerprint and the other side's (other_query_text, \
                 `unknown` where the server kept a later deadlock when it was read).",
            ),
            (
                Cause::LockWaitTimeout,
                "myprobe_lock_wait_timeouts_total",
                "Statements that timed out waiting for a lock (error 1205), by fingerprint.",
            ),
        ];
        for (cause, name, help) in families {
            family(out, name, "counter", help);
            for s in &self.servers {
                let mut errors: Vec<_> =
                    s.lock_errors.iter().filter(|(k, _)| k.0 == cause).collect();
                errors.sort_by(|a, b| a.0.cmp(b.0));
                for ((_, statement, other), n) in errors {
                    let other = match cause {
                        Cause::Deadlock => format!(
                            ",other_query_text=\"{}\"",
                            escape(&crate::render::queries::clip(other, 1000))
                        ),
                        _ => String::new(),
                    };
                    let _ = writeln!(
                        out,
                        "{name}{{{},{}{other}}} {n}",
                        s.labels,
                        statement_labels(&statement.db, &statement.fingerprint),
                    );
                }
            }
        }
    }

    /// What each server's collectors lost.
    fn write_lost(&self, out: &mut String) {
        family(
            out,
            "myprobe_lost_events_total",
            "counter",
            "Events the collectors could not count, by collector and cause.",
        );
        for s in &self.servers {
            let mut lost: Vec<((&str, &str), u64)> = s
                .lost
                .iter()
                .flat_map(|(collector, l)| causes(l).map(|(cause, n)| ((*collector, cause), n)))
                .collect();
            lost.sort();
            for ((collector, cause), n) in lost {
                let _ = writeln!(
                    out,
                    "myprobe_lost_events_total{{{},collector=\"{collector}\",cause=\"{cause}\"}} {n}",
                    s.labels
                );
            }
        }
    }

    /// The agent's own counts and settings, each server's, and the servers it traces now.
    fn write_agent(&self, out: &mut String) {
        type PerServer = (
            &'static str,
            &'static str,
            &'static str,
            fn(&ServerSeries) -> u64,
        );
        let per_server: [PerServer; 3] = [
            (
                "myprobe_windows_total",
                "counter",
                "Windows ended (each kept as pprof files).",
                |s| s.windows,
            ),
            (
                "myprobe_cpu_samples_total",
                "counter",
                "On-CPU samples of the server's threads (divided by the frequency: CPU seconds).",
                |s| s.cpu_samples,
            ),
            (
                "myprobe_statement_sample_every",
                "gauge",
                "Statements are traced one second in this many now (myprobe_sample_every or more, as their rate \
                 asks); each counts for the cycle it was traced in. A statement that ran only between the seconds \
                 traced has no series: missing, not absent (--sample-every 1 traces every one).",
                |s| s.statements_every,
            ),
        ];
        for (name, kind, help, value) in per_server {
            family(out, name, kind, help);
            for s in &self.servers {
                let _ = writeln!(out, "{name}{{{}}} {}", s.labels, value(s));
            }
        }
        family(
            out,
            "myprobe_attaches_total",
            "counter",
            "Times the agent attached to a server (a restarted server is attached again).",
        );
        let _ = writeln!(out, "myprobe_attaches_total {}", self.attaches);
        family(
            out,
            "myprobe_sample_every",
            "gauge",
            "Off-CPU and lock-wait tracing runs one second in this many (the on-CPU profile always); their series \
             are scaled up by it.",
        );
        let _ = writeln!(out, "myprobe_sample_every {}", self.sample_every);
        family(
            out,
            "myprobe_target_info",
            "gauge",
            "Each server traced now: 1 while attached (a server that exited keeps its other series a while).",
        );
        for s in self.servers.iter().filter(|s| s.gone.is_none()) {
            let _ = writeln!(out, "myprobe_target_info{{{}}} 1", s.labels);
        }
    }
}

impl ServerSeries {
    /// A statement traced: it stands for `r.stands_for` of them.
    pub fn add_statement(&mut self, mut r: QueryRecord) {
        // The record's own strings become the key: nothing is copied for a statement.
        let key = Key {
            db: r.db.take().unwrap_or_default(),
            fingerprint: r
                .fingerprint
                .take()
                .unwrap_or_else(|| format!("({})", r.command.to_lowercase()).into()),
        };
        let scale = u64::from(r.stands_for.max(1));
        self.statements_every = scale;
        let r = &r;
        if let Some(w) = r.waits.iter().find(|w| w.cause.is_lock_error()) {
            let other: Text = match (
                w.cause,
                w.holder.as_ref().and_then(|h| h.statement.as_deref()),
            ) {
                (Cause::Deadlock, Some(s)) => crate::wire::fingerprint::fingerprint(s).into(),
                (Cause::Deadlock, None) => UNKNOWN.into(),
                _ => "".into(),
            };
            let mut errors = (w.cause, key.clone(), other);
            if self.lock_errors.len() >= MAX_LOCK_SERIES && !self.lock_errors.contains_key(&errors)
            {
                let other = Key {
                    db: "".into(),
                    fingerprint: OTHER.into(),
                };
                errors = (w.cause, other, OTHER.into());
            }
            *self.lock_errors.entry(errors).or_default() += scale;
        }
        if let Some(s) = self.exposed.get_mut(&key) {
            s.add(r, scale);
        } else if self.exposed.len() < self.top {
            self.exposed.entry(key).or_default().add(r, scale);
        } else {
            self.other.add(r, scale);
            if self.candidates.len() < MAX_CANDIDATES || self.candidates.contains_key(&key) {
                let time = self.candidates.entry(key).or_default();
                *time = time.saturating_add(r.duration_us);
            }
        }
    }

    /// A window ended: the fingerprints that took the most time in it get series, in place of those that
    /// took less than half as much.
    pub fn end_window(&mut self) {
        self.windows += 1;
        let mut candidates: Vec<(Key, u64)> = self.candidates.drain().collect();
        candidates.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut least: Vec<(Key, u64)> = self
            .exposed
            .iter()
            .map(|(k, s)| (k.clone(), s.window_us))
            .collect();
        least.sort_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0)));
        for ((candidate, time), (evicted, its_time)) in candidates.into_iter().zip(least) {
            if time <= its_time.saturating_mul(2) {
                break;
            }
            self.exposed.remove(&evicted);
            self.exposed.insert(candidate, Series::default());
        }
        for s in self.exposed.values_mut() {
            s.window_us = 0;
        }
        self.other.window_us = 0;
        self.load.end_window();
    }

    /// A second of the session history: its active sessions add to the DB load.
    pub fn add_second(&mut self, second: &Second) {
        self.load.add_second(second);
    }

    /// Adds a window's lock waits, by (lock name, wait site).
    pub fn add_lock_waits(&mut self, waits: HashMap<(String, String), LockWaits>) {
        for (key, w) in waits {
            let key = if self.locks.len() < MAX_LOCK_SERIES || self.locks.contains_key(&key) {
                key
            } else {
                (OTHER.to_string(), OTHER.to_string())
            };
            let sum = self.locks.entry(key).or_default();
            sum.waits = sum.waits.saturating_add(w.waits);
            sum.wait_ns = sum.wait_ns.saturating_add(w.wait_ns);
        }
    }

    /// What a collector lost since it attached to the server.
    pub fn set_lost(&mut self, collector: &'static str, lost: Lost) {
        self.lost.insert(collector, lost);
    }

    /// Each fingerprint with series of its own, by key, then `other` if it has counted any: its labels and its
    /// series.
    fn statement_rows(&self) -> Vec<(String, &Series)> {
        let mut rows: Vec<(&Key, &Series)> = self.exposed.iter().collect();
        rows.sort_by(|a, b| a.0.cmp(b.0));
        let other = Key {
            db: "".into(),
            fingerprint: OTHER.into(),
        };
        if self.other.count > 0 {
            rows.push((&other, &self.other));
        }
        rows.into_iter()
            .map(|(k, s)| (self.statement_labels(k), s))
            .collect()
    }

    fn statement_labels(&self, k: &Key) -> String {
        format!(
            "{},{}",
            self.labels,
            statement_labels(&k.db, &k.fingerprint)
        )
    }
}

/// A statement's labels: its database, its operation and first table, its fingerprint.
fn statement_labels(db: &str, fingerprint: &str) -> String {
    let summary = if fingerprint == OTHER {
        OTHER.to_string()
    } else {
        summary(fingerprint)
    };
    format!(
        "db_namespace=\"{}\",db_query_summary=\"{}\",db_query_text=\"{}\"",
        escape(db),
        escape(&summary),
        escape(&crate::render::queries::clip(fingerprint, 1000))
    )
}

/// The agent itself, read from /proc when scraped, and its host's CPUs.
#[derive(Default)]
pub struct Own {
    pub cpu_seconds: f64,
    pub rss_bytes: u64,
    pub start_time: f64,
    /// The host's CPUs online: what a server's DB load is compared with.
    pub host_cpus: u64,
}

impl Own {
    /// This process's CPU time and resident memory.
    pub fn read() -> Own {
        let stat = crate::process::Stat::of("self").unwrap_or_default();
        // SAFETY: sysconf has no preconditions.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        // SAFETY: as above.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
        let cpu = stat.utime.saturating_add(stat.stime);
        let boot = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<u64>().ok())
            })
            .unwrap_or(0);
        // SAFETY: as above.
        let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as u64;
        Own {
            cpu_seconds: cpu as f64 / ticks,
            rss_bytes: stat.rss_pages.saturating_mul(page),
            start_time: boot as f64 + stat.start_time as f64 / ticks,
            host_cpus: cpus,
        }
    }
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Each row's count, errors and time by part.
fn write_statement_counts(out: &mut String, rows: &[(String, &Series)]) {
    type Count = (&'static str, &'static str, fn(&Series) -> u64);
    let counts: [Count; 2] = [
        (
            "myprobe_statements_total",
            "Statements the server ran, by fingerprint.",
            |s| s.count,
        ),
        (
            "myprobe_statement_errors_total",
            "Statements that ended with an error, by fingerprint.",
            |s| s.errors,
        ),
    ];
    for (name, help, value) in counts {
        family(out, name, "counter", help);
        for (l, s) in rows {
            let _ = writeln!(out, "{name}{{{l}}} {}", value(s));
        }
    }
    family(
        out,
        "myprobe_statement_time_seconds_total",
        "counter",
        "Statements' time by where it went (part); the parts of a fingerprint add up to its \
         myprobe_statement_duration_seconds_sum.",
    );
    for (l, s) in rows {
        for (part, us) in TimeParts::NAMES.iter().zip(s.parts_us) {
            let _ = writeln!(
                out,
                "myprobe_statement_time_seconds_total{{{l},part=\"{part}\"}} {}",
                seconds(us)
            );
        }
    }
    family(
        out,
        "myprobe_statement_cause_seconds_total",
        "counter",
        "Statements' time by why it went there (cause: CPU, row lock, metadata lock, redo log, sleep, ...); the \
         causes of a fingerprint add up to its myprobe_statement_duration_seconds_sum. A cause is written once it \
         has time.",
    );
    for (l, s) in rows {
        for (cause, us) in Cause::ALL.iter().zip(s.causes_us).filter(|(_, us)| *us > 0) {
            let _ = writeln!(
                out,
                "myprobe_statement_cause_seconds_total{{{l},cause=\"{}\"}} {}",
                cause.label(),
                seconds(us)
            );
        }
    }
}

/// Each row's latency histogram, its buckets cumulative as Prometheus wants them.
fn write_latency_histograms(out: &mut String, rows: &[(String, &Series)]) {
    family(
        out,
        "myprobe_statement_duration_seconds",
        "histogram",
        "Statements' latency, from the request read to the reply sent, by fingerprint.",
    );
    for (l, s) in rows {
        let mut cumulative = 0;
        for (le, n) in LATENCY_BUCKETS.iter().zip(s.buckets) {
            cumulative += n;
            let _ = writeln!(
                out,
                "myprobe_statement_duration_seconds_bucket{{{l},le=\"{le}\"}} {cumulative}"
            );
        }
        let _ = writeln!(
            out,
            "myprobe_statement_duration_seconds_bucket{{{l},le=\"+Inf\"}} {}",
            s.count
        );
        let _ = writeln!(
            out,
            "myprobe_statement_duration_seconds_sum{{{l}}} {}",
            seconds(s.total_us)
        );
        let _ = writeln!(
            out,
            "myprobe_statement_duration_seconds_count{{{l}}} {}",
            s.count
        );
    }
}

/// The agent's own CPU time, memory and start, under the names every Prometheus client uses; the host's CPUs.
fn write_process(out: &mut String, own: &Own) {
    family(
        out,
        "process_cpu_seconds_total",
        "counter",
        "The agent's own CPU time, user and system.",
    );
    let _ = writeln!(out, "process_cpu_seconds_total {}", own.cpu_seconds);
    family(
        out,
        "process_resident_memory_bytes",
        "gauge",
        "The agent's own resident memory.",
    );
    let _ = writeln!(out, "process_resident_memory_bytes {}", own.rss_bytes);
    family(
        out,
        "process_start_time_seconds",
        "gauge",
        "When the agent started, seconds since the epoch.",
    );
    let _ = writeln!(out, "process_start_time_seconds {}", own.start_time);
    family(
        out,
        "myprobe_host_cpus",
        "gauge",
        "The host's CPUs online: a server's DB load above it waits for CPUs (dist/myprobe-rules.yml).",
    );
    let _ = writeln!(out, "myprobe_host_cpus {}", own.host_cpus);
}

fn causes(l: &Lost) -> [(&'static str, u64); 5] {
    [
        ("ringbuf_full", l.ringbuf),
        ("user_stack", l.user_stack),
        ("kernel_stack", l.kernel_stack),
        ("map_full", l.state),
        ("undefined_stack", l.undefined_stacks),
    ]
}

fn seconds(us: u64) -> f64 {
    us as f64 / 1e6
}

/// A label value as the text format wants it: backslash, double quote and line feed escaped.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// OpenTelemetry's `db.query.summary` of a fingerprint: its operation and first table (`SELECT sbtest1`).
pub fn summary(fingerprint: &str) -> String {
    let words: Vec<&str> = fingerprint
        .split(|c: char| c.is_whitespace() || c == '(' || c == ',')
        .filter(|w| !w.is_empty())
        .collect();
    let Some(first) = words.first() else {
        return String::new();
    };
    let operation = first.to_uppercase();
    let after = |keyword: &str| {
        words
            .iter()
            .position(|w| w.eq_ignore_ascii_case(keyword))
            .and_then(|i| words.get(i + 1))
    };
    let target = match operation.as_str() {
        "SELECT" | "DELETE" => after("from"),
        "INSERT" | "REPLACE" => after("into"),
        "UPDATE" => words.get(1),
        _ => None,
    };
    match target {
        Some(t) if !t.starts_with('?') => {
            format!("{operation} {}", t.trim_matches(|c| c == '`' || c == ';'))
        }
        _ => operation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(db: &str, fingerprint: &str, user_us: u64, lock_us: u64) -> QueryRecord {
        QueryRecord {
            db: Some(db.into()),
            command: "Query",
            fingerprint: Some(fingerprint.into()),
            duration_us: user_us + lock_us,
            time: TimeParts {
                user_us,
                lock_us,
                ..TimeParts::default()
            },
            ..QueryRecord::default()
        }
    }

    /// A server's labels in these tests: those the statements' series were written with before servers had any.
    const LABELS: &str = "db_system=\"mariadb\"";

    fn server(m: &mut Metrics) -> &mut ServerSeries {
        m.server(1).expect("attached")
    }

    /// The value of the one line starting with `prefix`.
    fn value(text: &str, prefix: &str) -> f64 {
        let lines: Vec<&str> = text.lines().filter(|l| l.starts_with(prefix)).collect();
        assert_eq!(lines.len(), 1, "{prefix} in\n{text}");
        lines[0].rsplit(' ').next().unwrap().parse().unwrap()
    }

    #[test]
    fn a_statement_counts_for_its_cycle() {
        let mut m = Metrics::new(10);
        m.attach(1, LABELS.into());
        server(&mut m).add_statement(QueryRecord {
            stands_for: 7,
            ..record("d", "SELECT ? FROM a", 10, 0)
        });
        server(&mut m).add_statement(record("d", "SELECT ? FROM a", 10, 0));
        let text = m.render(&Own::default());
        let count = "myprobe_statements_total{db_system=\"mariadb\",db_namespace=\"d\"";
        assert_eq!(value(&text, count), 8.0, "{text}");
        assert_eq!(
            value(
                &text,
                "myprobe_statement_sample_every{db_system=\"mariadb\"} "
            ),
            1.0
        );
    }

    #[test]
    fn deadlocks_are_counted_by_pair_of_statements_and_timeouts_by_statement() {
        use crate::query::{CauseWait, Holder};
        let mut m = Metrics::new(10);
        m.attach(1, LABELS.into());
        let failed = |cause, other: Option<&str>| {
            let mut r = record("d", "UPDATE t SET v = ? WHERE id = ?", 10, 0);
            r.error = Some(1213);
            r.waits = vec![CauseWait {
                cause,
                us: 0,
                site: None,
                object: None,
                holder: other.map(|s| Holder {
                    conn: 6,
                    command: Some("Query".into()),
                    statement: Some(s.into()),
                    ..Holder::default()
                }),
            }];
            r
        };
        for _ in 0..3 {
            server(&mut m)
                .add_statement(failed(Cause::Deadlock, Some("DELETE FROM t WHERE id = 5")));
        }
        server(&mut m).add_statement(failed(Cause::Deadlock, None));
        server(&mut m).add_statement(failed(Cause::LockWaitTimeout, Some("SELECT 1")));
        let text = m.render(&Own::default());
        let pair = "myprobe_deadlocks_total{db_system=\"mariadb\",db_namespace=\"d\",db_query_summary=\"UPDATE t\",\
                    db_query_text=\"UPDATE t SET v = ? WHERE id = ?\",other_query_text=";
        assert_eq!(
            value(&text, &format!("{pair}\"delete from t where id = ?\"}}")),
            3.0,
            "{text}"
        );
        assert_eq!(value(&text, &format!("{pair}\"unknown\"}}")), 1.0, "{text}");
        assert_eq!(
            value(&text, "myprobe_lock_wait_timeouts_total{"),
            1.0,
            "{text}"
        );
    }

    #[test]
    fn parts_add_up_to_the_histogram_sum() {
        let mut m = Metrics::new(10);
        m.attach(1, LABELS.into());
        server(&mut m).add_statement(record(
            "sbtest",
            "SELECT c FROM sbtest1 WHERE id = ?",
            300,
            0,
        ));
        server(&mut m).add_statement(record(
            "sbtest",
            "SELECT c FROM sbtest1 WHERE id = ?",
            200,
            2_000_000,
        ));
        let text = m.render(&Own::default());
        let l =
            "db_system=\"mariadb\",db_namespace=\"sbtest\",db_query_summary=\"SELECT sbtest1\",\
                 db_query_text=\"SELECT c FROM sbtest1 WHERE id = ?\"";
        assert_eq!(
            value(&text, &format!("myprobe_statements_total{{{l}}}")),
            2.0
        );
        let user = value(
            &text,
            &format!("myprobe_statement_time_seconds_total{{{l},part=\"user\"}}"),
        );
        let lock = value(
            &text,
            &format!("myprobe_statement_time_seconds_total{{{l},part=\"lock\"}}"),
        );
        let sum = value(
            &text,
            &format!("myprobe_statement_duration_seconds_sum{{{l}}}"),
        );
        assert_eq!((user, lock), (0.0005, 2.0));
        assert!((user + lock - sum).abs() < 1e-12);
        // 300 µs and 2.0002 s: the first bucket of 0.0005, then +Inf only.
        assert_eq!(
            value(
                &text,
                &format!("myprobe_statement_duration_seconds_bucket{{{l},le=\"0.0005\"}}")
            ),
            1.0
        );
        assert_eq!(
            value(
                &text,
                &format!("myprobe_statement_duration_seconds_bucket{{{l},le=\"2.5\"}}")
            ),
            2.0
        );
        assert_eq!(
            value(
                &text,
                &format!("myprobe_statement_duration_seconds_bucket{{{l},le=\"+Inf\"}}")
            ),
            2.0
        );
    }

    #[test]
    fn past_the_top_statements_add_to_other_until_they_take_more_time() {
        let mut m = Metrics::new(1);
        m.attach(1, LABELS.into());
        server(&mut m).add_statement(record("d", "SELECT ? FROM a", 10, 0));
        server(&mut m).add_statement(record("d", "SELECT ? FROM b", 100, 0));
        let text = m.render(&Own::default());
        assert!(text.contains("db_query_summary=\"SELECT a\""));
        assert!(!text.contains("db_query_summary=\"SELECT b\""));
        assert_eq!(
            value(&text, "myprobe_statements_total{db_system=\"mariadb\",db_namespace=\"\",db_query_summary=\"other\""),
            1.0
        );
        // b took 10 times a's time in the window: it takes a's place, from zero; other keeps what it had.
        server(&mut m).end_window();
        server(&mut m).add_statement(record("d", "SELECT ? FROM b", 100, 0));
        let text = m.render(&Own::default());
        assert!(!text.contains("db_query_summary=\"SELECT a\""));
        assert!(text.contains("myprobe_statements_total{db_system=\"mariadb\",db_namespace=\"d\",db_query_summary=\"SELECT b\",db_query_text=\"SELECT ? FROM b\"} 1"));
        // Less than twice as much: no change.
        server(&mut m).end_window();
        server(&mut m).add_statement(record("d", "SELECT ? FROM b", 100, 0));
        server(&mut m).add_statement(record("d", "SELECT ? FROM c", 150, 0));
        server(&mut m).end_window();
        let text = m.render(&Own::default());
        assert!(text.contains("db_query_summary=\"SELECT b\""));
        assert!(!text.contains("db_query_summary=\"SELECT c\""));
    }

    #[test]
    fn each_server_has_its_series_and_one_gone_keeps_them_until_forgotten() {
        let mut m = Metrics::new(10);
        m.attach(1, "server_pid=\"1\"".into()).set_lost(
            "cpu",
            Lost {
                ringbuf: 3,
                ..Lost::default()
            },
        );
        m.attach(2, "server_pid=\"2\"".into())
            .add_statement(record("d", "SELECT ? FROM a", 10, 0));
        m.server(1)
            .unwrap()
            .add_statement(record("d", "SELECT ? FROM a", 10, 0));
        let text = m.render(&Own::default());
        for pid in [1, 2] {
            let labels = format!("server_pid=\"{pid}\"");
            assert_eq!(
                value(&text, &format!("myprobe_statements_total{{{labels},")),
                1.0
            );
            assert_eq!(
                value(&text, &format!("myprobe_target_info{{{labels}}}")),
                1.0
            );
        }
        assert_eq!(
            value(
                &text,
                "myprobe_lost_events_total{server_pid=\"1\",collector=\"cpu\",cause=\"ringbuf_full\"}"
            ),
            3.0
        );
        // Server 1 exits: its series stay at their last values, without target_info, until forgotten.
        m.detached(1);
        assert!(m.server(1).is_none());
        m.forget(Duration::from_secs(60));
        let text = m.render(&Own::default());
        assert_eq!(
            value(&text, "myprobe_statements_total{server_pid=\"1\","),
            1.0
        );
        assert!(!text.contains("myprobe_target_info{server_pid=\"1\"}"));
        m.forget(Duration::ZERO);
        let text = m.render(&Own::default());
        assert!(!text.contains("server_pid=\"1\""), "{text}");
        assert!(text.contains("myprobe_target_info{server_pid=\"2\"} 1"));
        assert!(text.contains("myprobe_attaches_total 2"));
    }

    #[test]
    fn the_db_load_is_exported_by_state_statement_user_and_host() {
        use crate::history::{SessionSample, IDLE_IN_TRANSACTION};
        let mut m = Metrics::new(1);
        m.attach(1, LABELS.into());
        let session = |conn, state: &str, fingerprint: &str, user: &str| SessionSample {
            conn,
            user: Some(user.into()),
            host: Some("app\"1".into()),
            db: Some("d".into()),
            statement: None,
            fingerprint: Some(fingerprint.into()),
            statement_s: Some(20.0),
            transaction_s: None,
            state: state.to_string().into(),
            object: None,
            blocker: Some(9),
            root_blocker: Some(9),
            holder_statements: Vec::new(),
        };
        for ts in 0..4 {
            server(&mut m).add_second(&Second {
                ts,
                server: "s".into(),
                sessions: vec![
                    session(1, "row lock", "UPDATE t SET k = ?", "app"),
                    session(2, "row lock", "UPDATE t SET k = ?", "app"),
                    session(3, "CPU", "SELECT ? FROM t", "batch"),
                    SessionSample {
                        root_blocker: None,
                        ..session(9, IDLE_IN_TRANSACTION, "", "app")
                    },
                ],
            });
        }
        let text = m.render(&Own::read());
        let load = |labels: &str| {
            value(
                &text,
                &format!("myprobe_db_load_seconds_total{{{LABELS},{labels}}}"),
            )
        };
        assert_eq!(
            (load("state=\"row lock\""), load("state=\"CPU\"")),
            (8.0, 4.0)
        );
        assert!(!text.contains("myprobe_db_load_seconds_total{db_system=\"mariadb\",state=\"idle"));
        // One statement and one user with series of their own (--top 1), the rest as other.
        assert_eq!(
            value(&text, "myprobe_db_load_by_statement_seconds_total{db_system=\"mariadb\",db_namespace=\"d\",db_query_summary=\"UPDATE t\""),
            8.0
        );
        assert_eq!(
            value(&text, "myprobe_db_load_by_statement_seconds_total{db_system=\"mariadb\",db_namespace=\"\",db_query_summary=\"other\""),
            4.0
        );
        assert_eq!(
            value(
                &text,
                "myprobe_db_load_by_user_seconds_total{db_system=\"mariadb\",user_name=\"app\"}"
            ),
            8.0
        );
        assert_eq!(
            value(
                &text,
                "myprobe_db_load_by_user_seconds_total{db_system=\"mariadb\",user_name=\"other\"}"
            ),
            4.0
        );
        assert_eq!(value(&text, "myprobe_db_load_by_host_seconds_total{db_system=\"mariadb\",client_address=\"app\\\"1\"}"), 12.0);
        assert_eq!(
            value(
                &text,
                "myprobe_sessions{db_system=\"mariadb\",state=\"idle in transaction\"}"
            ),
            1.0
        );
        assert_eq!(
            value(
                &text,
                "myprobe_sessions{db_system=\"mariadb\",state=\"row lock\"}"
            ),
            2.0
        );
        // The waiters began their statements 20 s before the first second.
        assert_eq!(
            value(&text, "myprobe_blocker_held_seconds{db_system=\"mariadb\"}"),
            23.0
        );
        assert!(value(&text, "myprobe_host_cpus ") >= 1.0);
        // Every family is typed once, before its series.
        for name in [
            "myprobe_db_load_seconds_total",
            "myprobe_sessions",
            "myprobe_blocker_held_seconds",
        ] {
            assert_eq!(
                text.matches(&format!("# TYPE {name} ")).count(),
                1,
                "{name}"
            );
        }
        // A server gone keeps its load, not what it showed last.
        m.detached(1);
        let text = m.render(&Own::default());
        assert_eq!(
            value(
                &text,
                "myprobe_db_load_seconds_total{db_system=\"mariadb\",state=\"CPU\"}"
            ),
            4.0
        );
        assert!(!text.contains("myprobe_blocker_held_seconds{"), "{text}");
        assert!(!text.contains("myprobe_sessions{"), "{text}");
    }

    #[test]
    fn summaries_and_escapes() {
        assert_eq!(
            summary("SELECT c FROM sbtest1 WHERE id = ?"),
            "SELECT sbtest1"
        );
        assert_eq!(summary("INSERT INTO `t` (a, b) VALUES (?+)"), "INSERT t");
        assert_eq!(
            summary("UPDATE sbtest3 SET k = k + ? WHERE id = ?"),
            "UPDATE sbtest3"
        );
        assert_eq!(summary("commit"), "COMMIT");
        assert_eq!(summary(""), "");
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn own_figures_are_read() {
        let own = Own::read();
        assert!(own.rss_bytes > 0);
        assert!(own.start_time > 1e9);
    }
}
