//! The one life cycle of every collector that traces (the stack collectors and the statements), owned here
//! ([`run`]): open the BPF object, set its target and unwind maps, let the collector configure it, fit its maps
//! to the kernel memory budget, load it ([`open_and_load`], which `threads` shares); publish the unwind tables,
//! attach, read the ring buffer until the duration ends or the run stops, ticking after every read (the tables
//! of code mapped meanwhile published again, a sampled run's periods, the collector's own work), slicing where
//! asked; detach, read what the probes sent until then, and let the collector say what it found.
//!
//! A collector supplies only its hooks ([`Lifecycle`]): `configure`, `attach`, `record`, `tick`, `slice`,
//! `stop` and `finish`.

use std::{
    cell::RefCell,
    mem::MaybeUninit,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use libbpf_rs::{
    skel::{OpenSkel, SkelBuilder},
    Link, OpenObject,
};

use super::{
    periods::SamplePeriods,
    ring,
    skeleton::{install_unwind, refresh_unwind, StackSkeleton, UnwindMaps},
    targets::{self, Published},
    unwind_store::Installed,
    CollectOptions, Features, Kind,
};

pub type Open<'o, L> = <<L as Lifecycle>::Skel as StackSkeleton>::Open<'o>;
pub type Loaded<'o, L> = <<L as Lifecycle>::Skel as StackSkeleton>::Loaded<'o>;

/// What a collector does at each step of [`run`].
pub trait Lifecycle {
    /// Its skeleton: every collector that traces includes src/bpf/stack_ids.h (the target, the unwinder, the
    /// ring buffer `events`).
    type Skel: StackSkeleton;
    /// What a run of it returns.
    type Output;
    /// How progress lines, load errors and the verifier's messages name it: "profile cpu".
    const NAME: &'static str;
    /// Which it is, for a command that runs several.
    const KIND: Kind;

    /// Its own settings (`.rodata`) and the programs to load, before loading.
    fn configure(&mut self, open: &mut Open<'_, Self>, opts: &CollectOptions) -> Result<()>;

    /// Attaches its programs. The links returned are the run's: dropped once tracing ends, after
    /// [`Lifecycle::stop`], and replaced at a sampled run's period edges ([`Step::links`]).
    fn attach(&mut self, skel: &mut Loaded<'_, Self>, opts: &CollectOptions) -> Result<Vec<Link>>;

    /// One record of the ring buffer.
    fn record(&mut self, data: &[u8]);

    /// After every read of the ring buffer while tracing: its progress line, and when it wants the next tick at
    /// the latest.
    fn tick(&mut self, step: &mut Step<'_, '_, Self::Skel>) -> Result<ring::Tick>;

    /// What it found since the slice before, sent where `CollectOptions::slices` asks while the probes go on;
    /// false if nobody took it (whoever wanted the slices has stopped).
    fn slice(&mut self, _step: &mut Step<'_, '_, Self::Skel>, _slice: Slicing<'_>) -> Result<bool> {
        anyhow::bail!("{} cannot be read while it traces", Self::NAME)
    }

    /// Tracing ended: detach what it holds itself, before the run's links are dropped.
    fn stop(&mut self) {}

    /// What it found, once everything is detached and the ring buffer read to its end.
    fn finish(&mut self, skel: &mut Loaded<'_, Self>, end: End<'_>) -> Result<Self::Output>;

    /// What a run that only loads returns (`CollectOptions::verify_only`).
    fn unloaded(&mut self) -> Self::Output;
}

/// What a tick or a slice may act on besides the collector: the loaded object, the run's links, its periods
/// and the unwind tables published.
pub struct Step<'a, 'o, S: StackSkeleton> {
    pub skel: &'a mut S::Loaded<'o>,
    /// The run's links (what [`Lifecycle::attach`] returned): a sampled run empties them between periods.
    pub links: &'a mut Vec<Link>,
    /// A sampled run's periods (`CollectOptions::duty`).
    pub periods: Option<&'a mut SamplePeriods>,
    pub publishing: &'a mut Publishing,
    pub opts: &'a CollectOptions,
    /// The time since tracing began.
    pub elapsed: Duration,
}

impl<S: StackSkeleton> Step<'_, '_, S> {
    /// Publishes the tables of code mapped since; false once a set of targets has none left.
    pub fn refresh_unwind(&mut self) -> Result<bool> {
        self.publishing
            .update::<S>(self.opts, S::unwind(self.skel), false)
    }
}

/// A slice due: the time it covers, which ends `at`, and where it goes.
pub struct Slicing<'a> {
    pub traced: Duration,
    pub at: Instant,
    pub to: &'a super::Slices,
}

/// How a run ended, for [`Lifecycle::finish`].
pub struct End<'a> {
    /// The time traced.
    pub traced: Duration,
    /// A sampled run's periods, ended.
    pub periods: Option<&'a SamplePeriods>,
}

/// Opens a collector's object (`--btf`), sets its target and unwind maps, lets `configure` set the rest, fits its
/// maps to `--max-kernel-mem` and loads it (`name` says it in errors). From here on Ctrl-C ends tracing with
/// results: the handler is installed before anything is attached, so that a Ctrl-C right after attaching still
/// detaches cleanly.
pub fn open_and_load<'obj, S: StackSkeleton>(
    object: &'obj mut MaybeUninit<OpenObject>,
    opts: &CollectOptions,
    name: &str,
    configure: impl FnOnce(&mut S::Open<'obj>) -> Result<()>,
) -> Result<S::Loaded<'obj>> {
    super::install_stop_handler();
    super::load::install_print();
    let mut builder = S::Builder::default();
    if let Some(btf) = &opts.btf {
        builder
            .object_builder_mut()
            .btf_custom_path(btf)
            .context("setting the BTF path")?;
    }
    let mut open = builder.open(object).context("opening the BPF object")?;
    let object_name = open.open_object().name().unwrap_or_default();
    let collector = object_name
        .to_str()
        .unwrap_or_default()
        .trim_end_matches("_bpf");
    Features::of_kernel(opts.btf.as_deref()).require_build_for(collector)?;
    super::skeleton::set_common::<S>(&mut open, opts)?;
    configure(&mut open)?;
    super::budget::fit(
        open.open_object_mut(),
        opts.max_kernel_mem,
        opts.shared_maps(),
    )?;
    super::load::load(open, name, opts.verify_only.as_ref())
}

/// Traces with `collector` for the duration (or until the run stops) and returns what it found.
pub fn run<L: Lifecycle>(collector: &mut L, opts: &CollectOptions) -> Result<L::Output> {
    // bpf_loop, which every object calls, was checked before anything started (features::check_environment).
    let mut object = MaybeUninit::uninit();
    let mut skel = open_and_load::<L::Skel>(&mut object, opts, L::NAME, |open| {
        collector.configure(open, opts)
    })?;
    if opts.verify_only.is_some() {
        return Ok(collector.unloaded());
    }
    let mut publishing = Publishing::default();
    publishing.update::<L::Skel>(opts, L::Skel::unwind(&mut skel), true)?;
    let mut links = collector.attach(&mut skel, opts)?;
    if !opts.announce.is_empty() {
        say!("{}", opts.announce);
    }
    if let Some(attached) = &opts.attached {
        let _ = attached.send(L::KIND);
    }

    // The reader hands records to the collector between the ticks, never during one.
    let collector = RefCell::new(collector);
    let reader = ring::reader(L::Skel::events(&skel), |data| {
        collector.borrow_mut().record(data);
    })?;
    let mut periods = opts.duty.clone().map(SamplePeriods::of);
    let mut last_slice = Instant::now();
    let traced = ring::poll(&reader, opts, |elapsed| {
        let collector = &mut *collector.borrow_mut();
        let mut step = Step {
            skel: &mut skel,
            links: &mut links,
            periods: periods.as_mut(),
            publishing: &mut publishing,
            opts,
            elapsed,
        };
        let tick = collector.tick(&mut step)?;
        if let Some(to) = opts
            .slices
            .as_ref()
            .filter(|s| last_slice.elapsed() >= s.every)
        {
            let traced = last_slice.elapsed();
            last_slice = Instant::now();
            let slice = Slicing {
                traced,
                at: last_slice,
                to,
            };
            if !collector.slice(&mut step, slice)? {
                opts.stop.stop();
            }
        }
        // Woken for a period's edge and a slice on time, whatever the poll interval.
        let due = [
            tick.due,
            periods.as_ref().and_then(SamplePeriods::next_change),
            opts.slices.as_ref().map(|s| last_slice + s.every),
        ]
        .into_iter()
        .flatten()
        .min();
        Ok(ring::Tick {
            status: tick.status,
            due,
        })
    });
    if let Some(p) = periods.as_mut() {
        p.end();
    }
    collector.borrow_mut().stop();
    drop(links);
    let traced = traced?;
    // What the probes sent between the last read and their detaching (a server shutting down while tracing ends
    // makes hundreds of stacks first seen then).
    reader.consume().context("reading the ring buffer")?;
    drop(reader);
    let collector = collector.into_inner();
    let end = End {
        traced,
        periods: periods.as_ref(),
    };
    collector.finish(&mut skel, end)
}

/// What a run has published of the unwind tables: its process's, or each of its targets'.
#[derive(Default)]
pub struct Publishing {
    installed: Installed,
    pub(crate) published: Published,
}

impl Publishing {
    /// Publishes the tables, `first` or again where they changed; false once a set of targets has none left.
    pub fn update<S: StackSkeleton>(
        &mut self,
        opts: &CollectOptions,
        maps: UnwindMaps<'_, S::UnwindMapping>,
        first: bool,
    ) -> Result<bool> {
        match &opts.targets {
            Some(targets) => {
                let kernel = targets::Kernel {
                    target_bits: maps.target_bits,
                    processes: maps.processes,
                };
                self.published
                    .sync(targets, opts.unwind.as_deref(), &kernel)
            }
            None if first => install_unwind::<S>(opts, &mut self.installed, maps).map(|()| true),
            None => refresh_unwind::<S>(opts, &mut self.installed, maps).map(|()| true),
        }
    }
}
