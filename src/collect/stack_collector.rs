//! What every stack-capturing collector shares: the stacks received ([`Stacks`]), and its hooks in the one life
//! cycle of `lifecycle::run` ([`run`]): the ring buffer's records are stacks' definitions, a sampled run is detached
//! between periods, the sums are read once detached (or moved out in slices while tracing) and joined to their
//! stacks, with what was lost.
//!
//! A collector supplies only what differs: its own settings and programs, and its map of sums ([`Collector`]).

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Result;
use libbpf_rs::{skel::Skel, Link, MapCore};

use super::{
    labels::Resolver,
    lifecycle::{self, End, Lifecycle, Slicing, Step},
    periods::SamplePeriods,
    ring,
    skeleton::{attach_by_section, decode_stack, StackSkeleton},
    CollectOptions, Collected, Features, RawStack, Row,
};

pub type Open<'o, C> = <<C as Collector>::Skel as StackSkeleton>::Open<'o>;
pub type Loaded<'o, C> = <<C as Collector>::Skel as StackSkeleton>::Loaded<'o>;

/// Amounts summed in the kernel for one stack id: a row before its stack is joined.
#[derive(Clone, Debug)]
pub struct Sum {
    /// The process, where one set of programs traces several (`CollectOptions::targets`); else 0.
    pub pid: u32,
    pub tid: u32,
    pub key: u64,
    pub stack_id: u64,
    pub values: Box<[u64]>,
    /// Its statement's number among the run's (`Stacks::labels`); 0 where not labelled.
    pub statement: u32,
}

/// What a collector supplies to [`run`].
pub trait Collector {
    type Skel: StackSkeleton;
    /// How progress lines and errors name it: "profile cpu".
    const NAME: &'static str;
    /// Which it is, for a command that runs several.
    const KIND: super::Kind;

    /// The names of the values of its rows.
    fn columns(&self) -> Vec<String>;

    /// The column that counts what was traced (samples, waits, calls).
    fn events_column(&self) -> usize {
        0
    }

    /// Its own settings (.rodata) and the programs to load, before loading.
    fn configure(&mut self, _open: &mut Open<'_, Self>, _features: &Features) -> Result<()> {
        Ok(())
    }

    /// Attaches its programs; the links are dropped in order when tracing ends, before the sums are read.
    /// By default every program loaded that attaches by its section name (tracepoints).
    fn attach(&mut self, skel: &mut Loaded<'_, Self>) -> Result<Vec<Link>> {
        attach_by_section(skel.object())
    }

    /// Labels its sums by statement (src/bpf/statement.h) where it can, before loading: whether it does.
    fn label_statements(&mut self, _open: &mut Open<'_, Self>) -> Result<bool> {
        Ok(false)
    }

    /// Called after every read of the ring buffer (at least every poll interval, see `ring::poll`) while tracing.
    fn tick(&mut self, _skel: &mut Loaded<'_, Self>, _stacks: &mut Stacks) -> Result<()> {
        Ok(())
    }

    /// When the next tick is due at the latest, if the collector keeps a time of its own (memleak's periods).
    fn next_tick(&self) -> Option<Instant> {
        None
    }

    /// Tracing ended: drop the links the collector holds itself, before those [`Collector::attach`] gave.
    fn stop(&mut self) {}

    /// The sums, read once the probes are detached. Stacks not sent through the ring buffer (e.g. from a task
    /// iterator) are added to `stacks`.
    fn read(&mut self, skel: &mut Loaded<'_, Self>, stacks: &mut Stacks) -> Result<Vec<Sum>>;

    /// The sums since the slice before, moved out while the probes go on (`CollectOptions::slices`): what the
    /// next slice or [`Collector::read`] returns starts from here.
    fn slice(&mut self, _skel: &mut Loaded<'_, Self>, _stacks: &mut Stacks) -> Result<Vec<Sum>> {
        anyhow::bail!("{} cannot be read while it traces", Self::NAME)
    }
}

/// The stacks defined so far, by id.
#[derive(Default)]
pub struct Stacks {
    by_id: HashMap<u64, Arc<RawStack>>,
    /// Records received per (thread, statement, stack id): one per stack for collectors that send a stack once, one
    /// per sample for those that send every sample (cpu).
    records: HashMap<(u32, u32, u64), u64>,
    /// The statements the samples were labelled by, and their texts as they came.
    pub labels: Resolver,
    /// Records that were not stacks (never the case for a record of the same skeleton).
    malformed: u64,
    /// Sums of slices sent whose stacks were never defined.
    undefined: u64,
}

impl Stacks {
    /// Adds a `struct stack_event` record and returns its thread, stack id and statement (its number, see
    /// [`Resolver`]), or a statement's text (src/bpf/statement.h: its first word is 0); a malformed one is counted,
    /// never trusted.
    pub fn add_record<S: StackSkeleton>(&mut self, bytes: &[u8]) -> Option<(u32, u64, u32)> {
        if bytes.get(..8).is_some_and(|w| w == [0; 8]) {
            self.labels.add_text(bytes);
            return None;
        }
        let Some(decoded) = decode_stack::<S>(bytes) else {
            self.malformed += 1;
            return None;
        };
        let (tid, stack_id, (label, connection)) =
            (decoded.tid, decoded.stack_id, decoded.statement);
        self.by_id
            .entry(stack_id)
            .or_insert_with(|| Arc::new(decoded.stack));
        let statement = self.labels.resolve(0, tid, label, connection);
        *self.records.entry((tid, statement, stack_id)).or_default() += 1;
        Some((tid, stack_id, statement))
    }

    /// Records received per thread and stack id, as sums of one value.
    pub fn records(&self) -> Vec<Sum> {
        self.records
            .iter()
            .map(|(&(tid, statement, stack_id), &n)| record_sum(tid, statement, stack_id, n))
            .collect()
    }

    /// [`Stacks::records`], counted from zero again.
    pub fn take_records(&mut self) -> Vec<Sum> {
        self.records
            .drain()
            .map(|((tid, statement, stack_id), n)| record_sum(tid, statement, stack_id, n))
            .collect()
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Rows of the sums whose stacks are known, and how many sums had none.
    pub fn join(&self, sums: Vec<Sum>) -> (Vec<Row>, u64) {
        let mut undefined = 0;
        let mut rows = Vec::with_capacity(sums.len());
        for s in sums {
            match self.by_id.get(&s.stack_id) {
                Some(stack) => rows.push(Row {
                    tid: s.tid,
                    key: s.key,
                    stack: Arc::clone(stack),
                    values: s.values,
                    statement: self.labels.statement(s.statement),
                }),
                None => undefined += 1,
            }
        }
        (rows, undefined)
    }
}

fn record_sum(tid: u32, statement: u32, stack_id: u64, n: u64) -> Sum {
    Sum {
        pid: 0,
        tid,
        key: 0,
        stack_id,
        values: Box::new([n]),
        statement,
    }
}

/// How often a collector's sums are moved from the kernel's map while tracing, where they would fill it otherwise:
/// offcpu's per thread (a server under connection churn starts threads all the time: left in the kernel, their
/// entries filled the map within minutes, and a fifth of the waits of an hour went uncounted), and every collector's
/// per statement and connection (`Stacks::labels`).
const DRAIN_INTERVAL: Duration = Duration::from_secs(1);

/// When a collector's sums are next due to be moved from the kernel: once a [`DRAIN_INTERVAL`].
#[derive(Default)]
pub struct DrainPacing(Option<Instant>);

impl DrainPacing {
    /// Counts from now.
    pub fn restart(&mut self) {
        self.0 = Some(Instant::now());
    }

    /// Whether the sums are due now (then the next are due a [`DRAIN_INTERVAL`] later).
    pub fn due(&mut self) -> bool {
        let due = self.0.is_none_or(|t| t.elapsed() >= DRAIN_INTERVAL);
        if due {
            self.restart();
        }
        due
    }
}

/// Stacks user space keeps while slices are read: past this many, they are forgotten on both sides, so that
/// an agent's memory does not grow with every stack it ever saw.
const MAX_STACKS_KEPT: usize = 50_000;

/// Traces with `collector` for the duration (or until Ctrl-C) and returns what it found.
pub fn run<C: Collector>(collector: &mut C, opts: &CollectOptions) -> Result<Collected> {
    let mut run = StackRun {
        collector,
        stacks: Stacks {
            labels: Resolver::new(opts.statements.clone(), opts.pid, opts.slices.is_some()),
            ..Stacks::default()
        },
        layouts_written: HashSet::new(),
    };
    lifecycle::run(&mut run, opts)
}

/// A stack collector's hooks in the one life cycle: the collector, the stacks its run has received, and the
/// processes whose statements' layouts it gave the kernel.
struct StackRun<'c, C> {
    collector: &'c mut C,
    stacks: Stacks,
    layouts_written: HashSet<u32>,
}

impl<C: Collector> StackRun<'_, C> {
    /// Gives the kernel where the statements of the processes traced are, for those not given yet.
    fn publish_layouts(
        &mut self,
        skel: &Loaded<'_, C>,
        opts: &CollectOptions,
        pids: &[u32],
    ) -> Result<()> {
        match opts
            .statements
            .as_ref()
            .filter(|_| self.stacks.labels.enabled())
        {
            Some(labels) => labels.publish(skel.object(), pids, &mut self.layouts_written),
            None => Ok(()),
        }
    }
}

impl<C: Collector> Lifecycle for StackRun<'_, C> {
    type Skel = C::Skel;
    type Output = Collected;
    const NAME: &'static str = C::NAME;
    const KIND: super::Kind = C::KIND;

    fn configure(&mut self, open: &mut Open<'_, C>, opts: &CollectOptions) -> Result<()> {
        if self.stacks.labels.enabled() && !self.collector.label_statements(open)? {
            self.stacks.labels.disable();
        }
        self.collector.configure(open, &opts.features())
    }

    fn attach(&mut self, skel: &mut Loaded<'_, C>, opts: &CollectOptions) -> Result<Vec<Link>> {
        if opts.targets.is_none() {
            self.publish_layouts(skel, opts, &[opts.pid])?;
        }
        self.collector.attach(skel)
    }

    fn record(&mut self, data: &[u8]) {
        self.stacks.add_record::<C::Skel>(data);
    }

    fn tick(&mut self, step: &mut Step<'_, '_, C::Skel>) -> Result<ring::Tick> {
        // Sampled: detached between periods, attached again by section (what offcpu and locks attach), their
        // threads' state from before left stale.
        if let Some(p) = step.periods.as_deref_mut() {
            if let Some(open) = p.due() {
                if open {
                    let period = C::Skel::attach_period(step.skel);
                    *period = period.wrapping_add(1);
                    *step.links = attach_by_section(step.skel.object())?;
                } else {
                    step.links.clear();
                }
                p.set(open);
            }
        }
        // A set of targets follows its members whether attached or not.
        let attached = step.periods.as_deref().is_none_or(SamplePeriods::open);
        if (step.opts.targets.is_some() || attached) && !step.refresh_unwind()? {
            step.opts.stop.stop();
        }
        if step.opts.targets.is_some() {
            let members: Vec<u32> = step
                .publishing
                .published
                .members()
                .keys()
                .copied()
                .collect();
            self.publish_layouts(step.skel, step.opts, &members)?;
        }
        self.collector.tick(step.skel, &mut self.stacks)?;
        let lost = C::Skel::lost(step.skel).total();
        Ok(ring::Tick {
            status: format!(
                "{}: {:>4}/{} s, {} stacks, {lost} lost",
                C::NAME,
                step.elapsed.as_secs(),
                step.opts.duration.as_secs(),
                self.stacks.len()
            ),
            due: self.collector.next_tick(),
        })
    }

    fn slice(&mut self, step: &mut Step<'_, '_, C::Skel>, slice: Slicing<'_>) -> Result<bool> {
        let sums = self.collector.slice(step.skel, &mut self.stacks)?;
        let delivered = deliver(self.collector, step, &mut self.stacks, sums, slice);
        if forget_past_limit::<C>(step.skel, &mut self.stacks) {
            step.publishing.published.forget_stacks();
        }
        Ok(delivered)
    }

    fn stop(&mut self) {
        self.collector.stop();
    }

    fn finish(&mut self, skel: &mut Loaded<'_, C>, end: End<'_>) -> Result<Collected> {
        let sums = self.collector.read(skel, &mut self.stacks)?;
        Ok(collected(
            self.collector,
            skel,
            &mut self.stacks,
            sums,
            end.traced,
        ))
    }

    fn unloaded(&mut self) -> Collected {
        Collected {
            columns: self.collector.columns(),
            ..Collected::default()
        }
    }
}

/// Sends the sums of a slice, joined to their stacks, where they go: to `slices.send`, or to each target its own
/// (an empty slice, with the set's losses, where it has none); false if nobody took them.
fn deliver<C: Collector>(
    collector: &C,
    step: &Step<'_, '_, C::Skel>,
    stacks: &mut Stacks,
    sums: Vec<Sum>,
    slice: Slicing<'_>,
) -> bool {
    let mut send = |to: &std::sync::mpsc::Sender<super::Slice>, sums| {
        let collected = collected(collector, step.skel, stacks, sums, slice.traced);
        let slice = super::Slice {
            collector: C::KIND,
            at: slice.at,
            collected,
        };
        to.send(slice).is_ok()
    };
    let published = &step.publishing.published;
    if !published.serves() {
        return send(&slice.to.send, sums);
    }
    let mut by_pid: HashMap<u32, Vec<Sum>> = HashMap::new();
    for sum in sums {
        by_pid.entry(sum.pid).or_default().push(sum);
    }
    let mut delivered = false;
    for (pid, to) in published.members() {
        delivered |= send(to, by_pid.remove(pid).unwrap_or_default());
    }
    delivered
}

/// The sums joined to their stacks, with what was lost since the collector attached.
fn collected<C: Collector>(
    collector: &C,
    skel: &Loaded<'_, C>,
    stacks: &mut Stacks,
    sums: Vec<Sum>,
    traced: Duration,
) -> Collected {
    let (rows, undefined) = stacks.join(sums);
    stacks.undefined += undefined;
    let mut lost = C::Skel::lost(skel);
    lost.ringbuf += stacks.malformed + stacks.labels.malformed;
    lost.undefined_stacks += stacks.undefined;
    Collected {
        columns: collector.columns(),
        events: events(&rows, collector.events_column()),
        rows,
        lost,
        traced,
        estimate: None,
        statement_texts: stacks.labels.texts(),
    }
}

/// Forgets the stacks when user space holds too many, on both sides: the kernel's record of the ids sent, and
/// each thread's call-site cache (by a new generation; for several processes, the caller gives each its own), so
/// that every stack is sent again the next time it is seen. Whether it did.
fn forget_past_limit<C: Collector>(skel: &mut Loaded<'_, C>, stacks: &mut Stacks) -> bool {
    if stacks.by_id.len() <= MAX_STACKS_KEPT {
        return false;
    }
    stacks.by_id.clear();
    // stack_ids.h's record of the ids sent.
    if let Some(known) = skel.object().maps().find(|m| m.name() == "known_stacks") {
        let keys: Vec<Vec<u8>> = known.keys().collect();
        for key in keys {
            // One gone already (it made room for another in the LRU) is what was wanted.
            let _ = known.delete(&key);
        }
    }
    let maps = C::Skel::unwind(skel);
    *maps.generation = maps.generation.wrapping_add(1);
    true
}

/// What the rows traced: the sum of their `column`, stopping at `u64::MAX`.
fn events(rows: &[Row], column: usize) -> u64 {
    rows.iter()
        .map(|r| r.values.get(column).copied().unwrap_or(0))
        .fold(0, u64::saturating_add)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_past_the_largest_stop_there() {
        let stack = Arc::new(RawStack {
            user_len: 0,
            ips: Box::new([]),
        });
        let row = |values: &[u64]| Row {
            tid: 1,
            key: 0,
            stack: Arc::clone(&stack),
            values: values.into(),
            statement: None,
        };
        let rows = [row(&[9, u64::MAX]), row(&[1, 2]), row(&[3])];
        assert_eq!(events(&rows, 0), 13);
        assert_eq!(events(&rows, 1), u64::MAX);
    }
}
