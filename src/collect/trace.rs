//! Any function or static probe (src/bpf/trace.bpf.c): calls, errors and time per function and what the
//! user aggregates by, summed in the kernel; with `inside`, the syscalls, off-CPU time and futex waits of the
//! threads while they are in a traced function. The call rate is measured first, with counting probes only,
//! and a rate above the budget is refused before anything is timed.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use libbpf_rs::{Link, MapCore, UprobeMultiOpts, UprobeOpts, UsdtOpts};

use super::{
    maps::{for_each_typed, Plain},
    skeleton::stack_skeleton,
    stack_collector::{self, Collector, Loaded, Open, Stacks, Sum},
    CollectOptions, Collected, Features,
};
use crate::process::probes::EntryProbe;

mod skel {
    include!(concat!(env!("OUT_DIR"), "/trace.skel.rs"));
}
stack_skeleton!(Skeleton, TraceSkelBuilder, OpenTraceSkel, TraceSkel);
// SAFETY: generated from BTF structs of integers and integer arrays.
unsafe impl Plain for skel::types::trace_key {}
// SAFETY: as above.
unsafe impl Plain for skel::types::trace_stats {}
// SAFETY: as above.
unsafe impl Plain for skel::types::inside_key {}
// SAFETY: as above.
unsafe impl Plain for skel::types::inside_stats {}

pub use skel::types::{trace_arg_kind as ArgKind, trace_errval as ErrVal};

/// Where a probe goes.
#[derive(Clone, Debug)]
pub enum Place {
    /// A function's entry (its return is probed by the same uprobe session).
    Function(EntryProbe),
    /// A static probe, by provider and name (libbpf places it on every site).
    Usdt { provider: String, name: String },
}

/// One probe: what people call it, the file it is in, where.
#[derive(Clone, Debug)]
pub struct ProbePoint {
    pub label: String,
    /// The file, as the uprobe attach opens it.
    pub open_path: PathBuf,
    pub place: Place,
}

pub struct TraceOptions {
    pub probes: Vec<ProbePoint>,
    /// The argument kept (from 0) and how it is read.
    pub arg: Option<(u32, ArgKind)>,
    pub errval: ErrVal,
    pub by_thread: bool,
    pub by_stack: bool,
    pub inside: bool,
    /// Calls per second, over all probes, above which tracing is refused; 0: no check.
    pub max_rate: u64,
}

impl TraceOptions {
    /// Whether calls are timed: a function is, a static probe is only counted.
    pub fn timed(&self) -> bool {
        self.probes
            .iter()
            .any(|p| matches!(p.place, Place::Function(_)))
    }
}

/// Calls summed for one key.
#[derive(Clone, Debug, Default)]
pub struct KeyedStats {
    /// Index into [`TraceOptions::probes`].
    pub probe: usize,
    pub tid: u32,
    pub stack_id: u64,
    pub arg: i64,
    /// A string argument, when one was read.
    pub text: Option<String>,
    pub calls: u64,
    pub errors: u64,
    pub total_ns: u64,
    pub max_ns: u64,
    /// hist[i]: calls of [2^i, 2^(i+1)) ns.
    pub hist: Vec<u64>,
}

/// What a thread did while inside a traced function.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Inside {
    Syscall(u32),
    /// A futex wait on this lock word.
    LockWait(u64),
    OffCpu,
}

#[derive(Clone, Debug)]
pub struct InsideStats {
    /// The outermost traced function the thread was in.
    pub probe: usize,
    pub what: Inside,
    pub count: u64,
    pub total_ns: u64,
    pub max_ns: u64,
}

/// The rate measured before tracing.
#[derive(Clone, Debug)]
pub struct Rate {
    pub calls_per_s: Vec<f64>,
    pub measured: Duration,
}

impl Rate {
    pub fn total(&self) -> f64 {
        self.calls_per_s.iter().sum()
    }
}

pub struct Traced {
    /// With `by_stack`: rows of (probe index as key, stack) with `calls` and `total_ns`.
    pub collected: Collected,
    pub stats: Vec<KeyedStats>,
    pub inside: Vec<InsideStats>,
    pub rate: Option<Rate>,
    /// Calls nested deeper than the kernel keeps: counted, not timed.
    pub too_deep: u64,
}

/// How long the call rate is measured before anything is timed.
pub const RATE_WINDOW: Duration = Duration::from_millis(200);

/// What one traced call costs the server, entry and return probes, when the kernel emulates the probed
/// instruction and when it single-steps it (measured on this machine: a loop of calls, traced and not).
pub const COST_PER_CALL_NS: f64 = 1500.0;
pub const COST_PER_STEPPED_CALL_NS: f64 = 11600.0;

impl ProbePoint {
    /// The server's cost of one traced call of this probe, in ns.
    pub fn cost_ns(&self) -> f64 {
        match &self.place {
            Place::Function(e) if !e.emulated => COST_PER_STEPPED_CALL_NS,
            _ => COST_PER_CALL_NS,
        }
    }
}

/// Traces the probes for the duration (or until Ctrl-C). An error when the rate is above the budget.
pub fn collect(opts: &CollectOptions, trace: &TraceOptions) -> Result<Traced> {
    let mut c = Trace {
        trace,
        pid: opts.pid as i32,
        stop: opts.stop.clone(),
        links: Vec::new(),
        sessions: true,
        rate: None,
        stats: Vec::new(),
        inside: Vec::new(),
        too_deep: 0,
    };
    let collected = stack_collector::run(&mut c, opts)?;
    Ok(Traced {
        collected,
        stats: c.stats,
        inside: c.inside,
        rate: c.rate,
        too_deep: c.too_deep,
    })
}

struct Trace<'a> {
    trace: &'a TraceOptions,
    pid: i32,
    stop: super::Stop,
    /// The timing probes, dropped first when tracing ends (return probes before entry probes).
    links: Vec<Link>,
    /// Functions timed by uprobe sessions in uprobe_multi links (6.13); else by an entry and a return probe each.
    sessions: bool,
    rate: Option<Rate>,
    stats: Vec<KeyedStats>,
    inside: Vec<InsideStats>,
    too_deep: u64,
}

impl Trace<'_> {
    /// Attaches `prog` to every probe of `trace`: functions grouped per file in one uprobe_multi link each
    /// (uprobe sessions are such links), static probes one link each. The cookie is the probe's index. Without
    /// sessions, `function` and `ret` (its return probe, attached first so that it is detached first) are attached
    /// to each function on its own.
    fn attach_all(
        &self,
        pid: i32,
        function: &libbpf_rs::ProgramMut,
        ret: Option<&libbpf_rs::ProgramMut>,
        usdt: &libbpf_rs::ProgramMut,
        session: bool,
    ) -> Result<Vec<Link>> {
        let mut links = Vec::new();
        if !self.sessions {
            let functions =
                self.trace
                    .probes
                    .iter()
                    .enumerate()
                    .filter_map(|(i, p)| match &p.place {
                        Place::Function(e) => Some((i, p, e.offset())),
                        Place::Usdt { .. } => None,
                    });
            for (retprobe, prog) in [(true, ret), (false, Some(function))] {
                let Some(prog) = prog else { continue };
                for (i, p, offset) in functions.clone() {
                    let opts = UprobeOpts {
                        cookie: i as u64,
                        retprobe,
                        ..Default::default()
                    };
                    let link = prog
                        .attach_uprobe_with_opts(pid, &p.open_path, offset, opts)
                        .with_context(|| format!("attaching to {}", p.label))?;
                    links.push(link);
                }
            }
        }
        let mut files: Vec<&PathBuf> = Vec::new();
        for p in self.trace.probes.iter().filter(|_| self.sessions) {
            if matches!(p.place, Place::Function(_)) && !files.contains(&&p.open_path) {
                files.push(&p.open_path);
            }
        }
        for file in files {
            let (offsets, cookies): (Vec<usize>, Vec<u64>) = self
                .trace
                .probes
                .iter()
                .enumerate()
                .filter(|(_, p)| &p.open_path == file)
                .filter_map(|(i, p)| match &p.place {
                    Place::Function(e) => Some((e.offset(), i as u64)),
                    Place::Usdt { .. } => None,
                })
                .unzip();
            let opts = UprobeMultiOpts {
                offsets,
                cookies,
                session,
                ..Default::default()
            };
            let link = function
                .attach_uprobe_multi_with_opts(pid, file, "", opts)
                .with_context(|| format!("attaching to the functions of {}", file.display()))?;
            links.push(link);
        }
        for (i, p) in self.trace.probes.iter().enumerate() {
            if let Place::Usdt { provider, name } = &p.place {
                let opts = UsdtOpts {
                    cookie: i as u64,
                    ..Default::default()
                };
                let link = usdt
                    .attach_usdt_with_opts(pid, &p.open_path, provider, name, opts)
                    .with_context(|| {
                        format!(
                            "attaching to usdt:{provider}:{name} in {}",
                            p.open_path.display()
                        )
                    })?;
                links.push(link);
            }
        }
        Ok(links)
    }

    /// Counts calls for [`RATE_WINDOW`] with counting probes only.
    fn measure_rate(&self, skel: &Loaded<'_, Self>, pid: i32) -> Result<Rate> {
        let links = self.attach_all(
            pid,
            match self.sessions {
                true => &skel.progs.on_call_count,
                false => &skel.progs.on_call_count_one,
            },
            None,
            &skel.progs.on_usdt_count,
            false,
        )?;
        let started = Instant::now();
        while started.elapsed() < RATE_WINDOW && !self.stop.is_stopped() {
            std::thread::sleep(Duration::from_millis(10));
        }
        drop(links);
        let measured = started.elapsed();
        let map = &skel.maps.rate_calls;
        let calls_per_s = (0..self.trace.probes.len() as u32)
            .map(|i| {
                let n = map
                    .lookup(&i.to_ne_bytes(), libbpf_rs::MapFlags::ANY)
                    .ok()
                    .flatten()
                    .and_then(|v| {
                        v.get(..8)
                            .map(|b| u64::from_ne_bytes(b.try_into().unwrap()))
                    })
                    .unwrap_or(0);
                n as f64 / measured.as_secs_f64()
            })
            .collect();
        Ok(Rate {
            calls_per_s,
            measured,
        })
    }
}

impl Collector for Trace<'_> {
    type Skel = Skeleton;
    const NAME: &'static str = "trace";
    const KIND: super::Kind = super::Kind::Trace;

    fn columns(&self) -> Vec<String> {
        vec!["calls".into(), "total_ns".into()]
    }

    fn configure(&mut self, open: &mut Open<'_, Self>, features: &Features) -> Result<()> {
        let functions = self
            .trace
            .probes
            .iter()
            .any(|p| matches!(p.place, Place::Function(_)));
        self.sessions = features.uprobe_multi && features.uprobe_session;
        if functions && !self.sessions {
            say!(
                "myprobe: note: this kernel has no uprobe sessions (Linux 6.13 and later have them): each function \
                 is timed by an entry and a return probe, the return probe running at every call"
            );
        }
        let sessions = self.sessions;
        let progs = &mut open.progs;
        progs.on_call.set_autoload(sessions);
        progs.on_call_count.set_autoload(sessions);
        for prog in [
            &mut progs.on_call_entry,
            &mut progs.on_call_return,
            &mut progs.on_call_count_one,
        ] {
            prog.set_autoload(!sessions);
        }
        let t = self.trace;
        let rodata = super::rodata(open.maps.rodata_data.as_deref_mut())?;
        if let Some((index, kind)) = t.arg {
            rodata.arg_index = index;
            rodata.arg_kind = kind;
        }
        rodata.errval = t.errval;
        rodata.by_thread = t.by_thread;
        rodata.by_stack = t.by_stack;
        rodata.inside = t.inside;
        rodata.futex_nr = libc::SYS_futex;
        let nr = |name: &str| {
            name.parse::<syscalls::Sysno>()
                .map_or(-1, |s| s.id() as i64)
        };
        rodata.uretprobe_nr = nr("uretprobe");
        rodata.uprobe_nr = nr("uprobe");
        for prog in [
            &mut open.progs.on_sys_enter,
            &mut open.progs.on_sys_exit,
            &mut open.progs.on_switch,
        ] {
            prog.set_autoload(t.inside);
        }
        Ok(())
    }

    fn attach(&mut self, skel: &mut Loaded<'_, Self>) -> Result<Vec<Link>> {
        let pid = self.pid;
        if self.trace.max_rate > 0 {
            let rate = self.measure_rate(skel, pid)?;
            let total = rate.total();
            if total > self.trace.max_rate as f64 {
                let cost_ns: f64 = (rate.calls_per_s.iter())
                    .zip(&self.trace.probes)
                    .map(|(r, p)| r * p.cost_ns())
                    .sum();
                let cpu = cost_ns / 1e9 * 100.0;
                let mut busiest: Vec<(usize, f64)> =
                    rate.calls_per_s.iter().copied().enumerate().collect();
                busiest.sort_by(|a, b| b.1.total_cmp(&a.1));
                let names: Vec<String> = busiest
                    .iter()
                    .take(3)
                    .filter(|(_, r)| *r > 0.0)
                    .map(|(i, r)| format!("{} {:.0}/s", self.trace.probes[*i].label, r))
                    .collect();
                bail!(
                    "not tracing: {:.0} calls a second ({}), above the budget of {} (--max-rate); timing every \
                     call would cost the server about {cpu:.0}% of one CPU (~{:.1} µs a call). Trace a function \
                     called less often, or raise --max-rate to accept the cost",
                    total,
                    names.join(", "),
                    self.trace.max_rate,
                    cost_ns / total / 1000.0
                );
            }
            self.rate = Some(rate);
        }
        let p = &skel.progs;
        self.links = match self.sessions {
            true => self.attach_all(pid, &p.on_call, None, &p.on_usdt, true)?,
            false => self.attach_all(
                pid,
                &p.on_call_entry,
                Some(&p.on_call_return),
                &p.on_usdt,
                false,
            )?,
        };
        if !self.trace.inside {
            return Ok(Vec::new());
        }
        let p = &skel.progs;
        [&p.on_sys_enter, &p.on_sys_exit, &p.on_switch]
            .into_iter()
            .map(|prog| {
                prog.attach()
                    .context("attaching the syscall and scheduler tracepoints")
            })
            .collect()
    }

    fn stop(&mut self) {
        self.links.clear();
    }

    fn read(&mut self, skel: &mut Loaded<'_, Self>, _: &mut Stacks) -> Result<Vec<Sum>> {
        let mut sums = Vec::new();
        let by_stack = self.trace.by_stack;
        let string_arg = matches!(self.trace.arg, Some((_, ArgKind::ARG_STR_KIND)));
        for_each_typed(
            &skel.maps.stats,
            |k: skel::types::trace_key, s: skel::types::trace_stats| {
                let text = string_arg.then(|| {
                    let bytes: Vec<u8> = k.str.iter().map(|&c| c as u8).collect();
                    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
                    String::from_utf8_lossy(&bytes[..end]).into_owned()
                });
                if by_stack {
                    sums.push(Sum {
                        pid: 0,
                        tid: k.tid,
                        key: u64::from(k.func),
                        stack_id: k.stack_id,
                        values: Box::new([s.calls, s.total_ns]),
                        statement: 0,
                    });
                }
                self.stats.push(KeyedStats {
                    probe: k.func as usize,
                    tid: k.tid,
                    stack_id: k.stack_id,
                    arg: k.arg,
                    text,
                    calls: s.calls,
                    errors: s.errors,
                    total_ns: s.total_ns,
                    max_ns: s.max_ns,
                    hist: s.hist.to_vec(),
                });
            },
        );
        let futex = libc::SYS_futex as u32;
        for_each_typed(
            &skel.maps.inside_stats,
            |k: skel::types::inside_key, s: skel::types::inside_stats| {
                let what = match (k.what, k.addr) {
                    (u32::MAX, _) => Inside::OffCpu,
                    (nr, addr) if nr == futex && addr != 0 => Inside::LockWait(addr),
                    (nr, _) => Inside::Syscall(nr),
                };
                self.inside.push(InsideStats {
                    probe: k.func as usize,
                    what,
                    count: s.count,
                    total_ns: s.total_ns,
                    max_ns: s.max_ns,
                });
            },
        );
        self.too_deep = skel.maps.bss_data.as_deref().map_or(0, |b| b.too_deep);
        Ok(sums)
    }
}
