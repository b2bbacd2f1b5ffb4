//! What a collector returns ([`Collected`]: rows of stacks and values, what was lost, how it was estimated), and
//! which collector it was ([`Kind`]).

use std::{sync::Arc, time::Duration};

/// The collectors, as the commands that run several at once name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Cpu,
    Offcpu,
    Locks,
    Alloc,
    Syscalls,
    Statements,
    Trace,
}

impl Kind {
    /// The stack collectors that `report` and the agent run.
    pub const PROFILES: [Kind; 3] = [Kind::Cpu, Kind::Offcpu, Kind::Locks];

    /// Its short name: `cpu`, `offcpu`, …, `queries` (as files and metrics name it).
    pub fn name(self) -> &'static str {
        match self {
            Kind::Cpu => "cpu",
            Kind::Offcpu => "offcpu",
            Kind::Locks => "locks",
            Kind::Alloc => "alloc",
            Kind::Syscalls => "syscalls",
            Kind::Statements => "queries",
            Kind::Trace => "trace",
        }
    }

    /// What it traces, for people.
    pub fn label(self) -> &'static str {
        match self {
            Kind::Cpu => "on-CPU",
            Kind::Offcpu => "off-CPU",
            Kind::Locks => "lock waits",
            Kind::Alloc => "allocations",
            Kind::Syscalls => "syscalls",
            Kind::Statements => "statements",
            Kind::Trace => "functions",
        }
    }
}

/// A collector's sums of the time since the slice before. Its `lost` counts from the attaching.
pub struct Slice {
    pub collector: Kind,
    /// When it was taken: what it covers ends here.
    pub at: std::time::Instant,
    pub collected: Collected,
}

/// A stack as captured: user frames then kernel frames, both leaf first.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RawStack {
    pub user_len: u16,
    pub ips: Box<[u64]>,
}

impl RawStack {
    pub fn user(&self) -> &[u64] {
        &self.ips[..self.user_len as usize]
    }
    pub fn kernel(&self) -> &[u64] {
        &self.ips[self.user_len as usize..]
    }
}

/// One result of a collector: a stack, what else the values were summed by, and the values, in the order of
/// [`Collected::columns`].
#[derive(Clone, Debug)]
pub struct Row {
    /// The thread, for collectors that sum per thread (cpu, offcpu); 0 for the others.
    pub tid: u32,
    /// What else the collector sums by: the lock word (locks), the syscall number (syscalls); 0 otherwise.
    pub key: u64,
    /// Shared by the rows of one stack; `Arc`, so that what a collector found can be handed to another thread.
    pub stack: Arc<RawStack>,
    pub values: Box<[u64]>,
    /// The statement its thread ran (src/bpf/statement.h), where the collector labels its sums.
    pub statement: Option<Arc<super::labels::Statement>>,
}

/// What was lost while tracing, by cause (`struct lost_counts` of src/bpf/lost.h, and what user space adds):
/// reported, never dropped silently.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lost {
    /// Events dropped: the ring buffer was full.
    pub ringbuf: u64,
    /// Stacks kept without user frames: the user stack was unreadable.
    pub user_stack: u64,
    /// Stacks kept without kernel frames.
    pub kernel_stack: u64,
    /// Not counted: a per-thread or summing map was full.
    pub state: u64,
    /// Amounts whose stack never reached user space (its definition was dropped): left out.
    pub undefined_stacks: u64,
}

impl Lost {
    /// Every loss, summed; stops at `u64::MAX`.
    pub fn total(&self) -> u64 {
        [
            self.ringbuf,
            self.user_stack,
            self.kernel_stack,
            self.state,
            self.undefined_stacks,
        ]
        .into_iter()
        .fold(0, u64::saturating_add)
    }

    /// One line per kind of loss, for stderr; empty when nothing was lost. `events`: what was traced.
    pub fn report(&self, events: u64) -> Vec<String> {
        let reasons = [
            (self.ringbuf, "events dropped: ring buffer full"),
            (
                self.user_stack,
                "stacks without user frames: user stack unreadable",
            ),
            (
                self.kernel_stack,
                "stacks without kernel frames: kernel stack unreadable",
            ),
            (
                self.state,
                "not counted: a per-thread or per-stack map is full",
            ),
            (
                self.undefined_stacks,
                "left out: amounts whose stack was never received",
            ),
        ];
        let attempted = events
            .saturating_add(self.ringbuf)
            .saturating_add(self.state);
        reasons
            .iter()
            .filter(|(n, _)| *n > 0)
            .map(|(n, why)| {
                let pct = if attempted > 0 {
                    *n as f64 * 100.0 / attempted as f64
                } else {
                    100.0
                };
                format!("{why}: {n} ({pct:.2}% of {attempted} events)")
            })
            .collect()
    }

    /// For JSON metadata.
    pub fn to_json(self) -> serde_json::Value {
        serde_json::json!({
            "ringbuf": self.ringbuf,
            "user_stack": self.user_stack,
            "kernel_stack": self.kernel_stack,
            "state": self.state,
            "undefined_stacks": self.undefined_stacks,
        })
    }
}

/// The [`Lost`] counted in the kernel, from a skeleton's generated `struct lost_counts` (src/bpf/lost.h):
/// each skeleton has its own type of it, so this is a macro rather than a function.
macro_rules! lost_in_kernel {
    ($counts:expr) => {{
        let l = $counts;
        $crate::collect::Lost {
            ringbuf: l.ringbuf,
            user_stack: l.user_stack,
            kernel_stack: l.kernel_stack,
            state: l.state,
            undefined_stacks: 0,
        }
    }};
}
pub(crate) use lost_in_kernel;

/// The result of a tracing run, before symbolization: every collector returns this.
#[derive(Clone, Debug, Default)]
pub struct Collected {
    /// The names of the values of every row, e.g. `["blocked_ns", "runnable_ns", "periods"]`.
    pub columns: Vec<String>,
    pub rows: Vec<Row>,
    /// What was traced: samples, waits, calls, allocations.
    pub events: u64,
    pub lost: Lost,
    pub traced: Duration,
    /// When the values were scaled up from a sample: how (every figure shown from them says it is estimated).
    pub estimate: Option<Estimate>,
    /// Where samples were labelled by statement: the statements' texts read.
    pub statement_texts: Option<super::labels::StatementTexts>,
}

/// Figures scaled up from a sample of what happened.
#[derive(Clone, Debug, PartialEq)]
pub struct Estimate {
    /// How the sample was taken, e.g. `the allocations of one 100 ms period in 10 (0.4 s of 4.0 s)`.
    pub sampling: String,
    /// What every value traced was multiplied by.
    pub scale: f64,
    /// The events traced before scaling, e.g. allocation calls.
    pub traced: u64,
    /// For stderr, when the sample is too small to estimate from: what it misses, and what exact figures cost.
    pub warning: Option<String>,
}

impl Estimate {
    /// One line: `scaled ×9.87 from the allocations of ...`.
    pub fn describe(&self) -> String {
        format!("scaled ×{:.2} from {}", self.scale, self.sampling)
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "sampling": self.sampling,
            "scale": self.scale,
            "traced": self.traced,
        })
    }
}

impl Collected {
    /// The index of the column `name` in every row's values.
    ///
    /// Panics if the collector has no such column: a mistake in the code, not in the input.
    pub fn column(&self, name: &str) -> usize {
        self.columns
            .iter()
            .position(|c| c == name)
            .unwrap_or_else(|| {
                panic!("no column {name} among {:?}", self.columns);
            })
    }

    /// The value of column `name` in `row`.
    pub fn value(&self, row: &Row, name: &str) -> u64 {
        row.values[self.column(name)]
    }
}
