//! One server traced by the agent: its four collectors (runner), their slices added to the window under way and
//! to the profile requests for it, its windows kept, its statements and lock waits in its own series, everything
//! labelled by the server (`ServerLabels`: its PID, port, version, container and pod).

use std::{
    collections::HashMap,
    sync::{mpsc, Arc},
    time::{Instant, SystemTime},
};

use anyhow::{Context, Result};

use super::{
    metrics::{escape, LockWaits},
    shared::{
        release_free_memory, Attached, Options, ProfileRequest, Shared, Sums, MAX_NAMES_CACHED,
        SHARED_KINDS, SLICE, WAKE,
    },
};
use crate::{
    client::socket::listening_port,
    collect::{
        targets::Targets, CollectOptions, Collected, Kind, Lost, RingOptions, Slice, Slices, Stop,
    },
    process::{self, container::Container, Target},
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

/// What tells a server apart on each of its series and profiles: its host PID, TCP port and version, the
/// container it runs in and that container's pod, and what it is (`db_system`).
#[derive(Clone, Debug)]
pub struct ServerLabels(Vec<(&'static str, String)>);

impl ServerLabels {
    pub fn of(target: &Target) -> ServerLabels {
        let mut labels = vec![("server_pid", target.pid.to_string())];
        if let Some(port) = listening_port(target.pid) {
            labels.push(("server_port", port.to_string()));
        }
        labels.push(("server_version", target.version.clone()));
        if let Some(c) = Container::of(target.pid) {
            labels.push(("container_id", c.id));
            if let Some((namespace, pod)) = c.pod {
                labels.push(("k8s_namespace_name", namespace));
                labels.push(("k8s_pod_name", pod));
            }
        }
        labels.push(("db_system", target.flavor.db_system().to_string()));
        ServerLabels(labels)
    }

    /// In Prometheus's text format: `server_pid="…",…`.
    pub fn prometheus(&self) -> String {
        let labels: Vec<String> = self
            .0
            .iter()
            .map(|(name, value)| format!("{name}=\"{}\"", escape(value)))
            .collect();
        labels.join(",")
    }
}

/// Traces `target` until it exits or the agent stops, its maps within `share` of the agent's kernel memory
/// budget (the servers found as it attaches: maps are sized once, when loaded); the statements' CPU budget is
/// split between the servers found at each of its periods (`Shared::budget_shares`).
pub fn trace(target: &Target, o: &Options, shared: &Shared, share: u32) -> Result<()> {
    let mut symbolizer = Symbolizer::new(target.pid).context("preparing symbolization")?;
    symbolizer.preload(false);
    let mut lock_names =
        DataSymbolizer::new(target.pid).context("reading the process's memory map")?;
    let (slices, sliced) = mpsc::channel();
    let slices_to = slices.clone();
    let mut plan = Plan {
        target,
        frequency: o.frequency,
        min_block_us: o.min_block_us,
        // Always on: a preempted thread is not unwound at every switch (bench/README.md).
        preempted_leaf_only: true,
        duty: o.duty.clone(),
        statements: FollowOptions {
            // Its readers wake once a second (a slice, a period's edge, or a batch of records), not ten times.
            ring: RingOptions::quiet(WAKE),
            stop: Stop::new(),
            budget_shares: shared.budget_shares.clone(),
            max_kernel_mem_mib: (o.queries.max_kernel_mem_mib / u64::from(share.max(1))).max(1),
            // Each server's own: connection ids are per server.
            recent: Arc::default(),
            ..o.queries.clone()
        },
        slices: Some(Slices {
            every: SLICE,
            send: slices,
        }),
        attached: None,
        stores: Some(&shared.unwind),
        shared: Vec::new(),
        labels: o.statement_labels.then(|| {
            crate::collect::labels::StatementLabels::new(
                crate::sessions::statements::StatementsInMemory::boxed(),
            )
        }),
    };
    let prepared = runner::prepare(&plan)?;
    // Off-CPU and lock waits by the programs of the servers of the same store, where they can be shared.
    let compat = plan.statements.collect_options(0).features().compat();
    let sets: Vec<(Kind, Arc<Targets>)> = match &prepared.tables {
        Some(store) if !o.programs_per_server && !compat => SHARED_KINDS
            .into_iter()
            .map(|kind| (kind, shared.join_set(kind, store, &plan, slices_to.clone())))
            .collect(),
        _ => Vec::new(),
    };
    plan.shared = sets.iter().map(|(kind, _)| *kind).collect();
    let labels = ServerLabels::of(target);
    start_metrics(target, &labels, &plan, shared);
    say!(
        "myprobe: agent: tracing {target}: on-CPU at {} Hz, off-CPU, lock waits{}, statements",
        o.frequency,
        if plan.shared.is_empty() {
            ""
        } else {
            " (by programs shared with the servers of the same code)"
        }
    );
    let pid = target.pid;
    // Fed by the statements' pipeline: what a holder ran, for its records and the session history.
    let recent = Arc::clone(&plan.statements.recent);
    let history_opts = CollectOptions {
        unwind: prepared.tables.clone(),
        ..plan.statements.collect_options(pid)
    };
    let mut names = Naming {
        target,
        labels: &labels,
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
            |r| {
                if let Some(s) = shared.metrics().server(pid) {
                    s.add_statement(r);
                }
            },
            |lost| {
                if let Some(s) = shared.metrics().server(pid) {
                    s.set_lost(Kind::Statements.name(), lost);
                }
            },
        );
        let sampling =
            super::history::start(s, target, &history_opts, &plan.statements, shared, &recent);
        let failed = read_slices(running, &sliced, o, shared, &mut names);
        sampling.end();
        failed
    });
    for (_, set) in &sets {
        set.leave(pid);
    }
    if let Some(tables) = &prepared.tables {
        tables.leave(pid);
    }
    shared.metrics().detached(pid);
    shared.status_mut().attached.retain(|a| a.pid != pid);
    if !process::exited(pid) && !shared.stop.is_stopped() {
        anyhow::bail!("every collector ended: {}", failed.join("; "));
    }
    Ok(())
}

/// The series and status of a server being attached to.
fn start_metrics(target: &Target, labels: &ServerLabels, plan: &Plan, shared: &Shared) {
    {
        let mut m = shared.metrics();
        m.sample_every = plan.duty.as_ref().map_or(1, |d| d.every).into();
        let s = m.attach(target.pid, labels.prometheus());
        s.statements_every = plan
            .statements
            .sampling
            .duty(plan.statements.max_cpu_pct, &plan.statements.budget_shares)
            .map_or(1, |d| d.every.into());
        // Every collector's losses are exported from the start, at zero.
        for kind in Kind::PROFILES {
            s.set_lost(kind.name(), Lost::default());
        }
        s.set_lost(Kind::Statements.name(), Lost::default());
    }
    let mut status = shared.status_mut();
    status.attached.retain(|a| a.pid != target.pid);
    status.attached.push(Attached {
        pid: target.pid,
        server: target.to_string(),
        since: crate::report::rfc3339(SystemTime::now()),
    });
}

/// Adds the collectors' slices to the window under way and to the requests waiting, ends windows, and answers
/// requests, until every collector has ended (the server exited, or the agent stops). Returns why collectors
/// ended early.
fn read_slices(
    running: runner::Running<'_>,
    sliced: &mpsc::Receiver<Slice>,
    o: &Options,
    shared: &Shared,
    names: &mut Naming<'_>,
) -> Vec<String> {
    let runner::Running {
        mut profiles,
        statements,
    } = running;
    let mut statements = Some(statements);
    let mut window = Window::new();
    let mut failed = Vec::new();
    // Until every collector has ended (the server exited, or the agent stops), and those that ended early have
    // been joined and said. The plan holds a sender of the slices: the channel stays open, a wait is a timeout.
    while !(profiles.is_empty() && statements.is_none()) {
        if let Ok(slice) = sliced.recv_timeout(WAKE) {
            add_slice(shared, names.target.pid, &mut window, &slice);
        }
        // Slices wait here while a window is written: every one in before a request is answered.
        while let Ok(slice) = sliced.try_recv() {
            add_slice(shared, names.target.pid, &mut window, &slice);
        }
        answer_due(shared, names);
        if window.started.elapsed() >= o.window {
            let ended = std::mem::replace(&mut window, Window::new());
            end_window(ended, shared, names);
        }
        // A collector that ended early (it could not load here) is said once; the others go on.
        let mut ended_early = |kind: Kind, e: anyhow::Error| {
            let failure = format!("{}: {e:#}", kind.label());
            say!("myprobe: agent: warning: not traced: {failure}");
            failed.push(failure);
        };
        for (kind, h) in profiles.extract_if(.., |(_, h)| h.is_finished()) {
            if let Err(e) = runner::joined(h, kind) {
                ended_early(kind, e);
            }
        }
        if let Some(h) = statements.take_if(|h| h.is_finished()) {
            match runner::joined(h, Kind::Statements) {
                Ok(f) => {
                    if let Some(s) = shared.metrics().server(names.target.pid) {
                        s.set_lost(Kind::Statements.name(), f.lost);
                    }
                }
                Err(e) => ended_early(Kind::Statements, e),
            }
        }
    }
    while let Ok(slice) = sliced.try_recv() {
        add_slice(shared, names.target.pid, &mut window, &slice);
    }
    end_window(window, shared, names);
    failed
}

/// What names stacks and locks, and labels profiles, for one server.
struct Naming<'a> {
    target: &'a Target,
    labels: &'a ServerLabels,
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
                by_statement: false,
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
        let mut labels: Vec<(&str, &str)> = vec![("host", self.host)];
        labels.extend(self.labels.0.iter().map(|(l, v)| (*l, v.as_str())));
        labels.extend([("window", window.as_str()), ("profile", kind.name())]);
        pprof::label(&mut message, &labels, start_ns, covered.as_nanos() as i64);
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

fn add_slice(shared: &Shared, pid: u32, window: &mut Window, slice: &Slice) {
    let kind = slice.collector;
    let c = &slice.collected;
    let scale = {
        let mut m = shared.metrics();
        let sample_every = m.sample_every;
        let Some(s) = m.server(pid) else { return };
        s.set_lost(kind.name(), c.lost);
        if kind == Kind::Cpu {
            s.cpu_samples = s.cpu_samples.saturating_add(c.events);
            1
        } else {
            sample_every
        }
    };
    let mine = |r: &&mut ProfileRequest| r.kind == kind && r.pid == pid;
    for r in shared.requests().iter_mut().filter(mine) {
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
                if let Some(s) = shared.metrics().server(names.target.pid) {
                    s.add_lock_waits(lock_waits);
                }
                if let Err(e) =
                    shared
                        .retention
                        .keep(kind.name(), names.target.pid, window.started_at, &bytes)
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
    if let Some(s) = shared.metrics().server(names.target.pid) {
        s.end_window();
    }
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
            r.pid == names.target.pid
                && now >= r.until
                && (r.covered >= Some(r.until) || now >= r.until + 3 * SLICE)
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
