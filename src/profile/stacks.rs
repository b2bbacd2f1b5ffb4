//! From a collector's rows to a profile: each stack symbolized once, its frames root first, with the frames
//! the rows add (a thread, a lock, a leaf naming what the time was).

use std::{collections::HashMap, rc::Rc};

use super::{Profile, Unit};
use crate::{
    collect::{labels::Statement, Collected, RawStack, Row},
    process,
    symbolize::Symbolizer,
};

/// How stacks are named.
#[derive(Clone, Copy, Debug)]
pub struct StackOptions {
    pub pid: u32,
    /// Start every stack with a frame naming its thread (rows that are per thread).
    pub per_thread: bool,
    /// Raw addresses (0x…) instead of function names.
    pub addresses: bool,
    /// Start every stack with a frame naming the statement it was taken in (rows labelled by statement).
    pub by_statement: bool,
}

/// The frame of a stack with no frames at all: threads of the process that never run user code (io_uring's
/// workers), or an unreadable stack.
pub const NO_STACK: &str = "[no user stack]";

/// Names the stacks of rows, each unique stack once.
pub struct StackNamer<'a> {
    symbolizer: &'a mut Symbolizer,
    opts: StackOptions,
    threads: HashMap<u32, Rc<str>>,
    /// Root first, by the stack's address: rows share their stacks.
    named: HashMap<*const RawStack, Rc<[Rc<str>]>>,
    /// Only the rows of the statements whose frame this matches (`--statement`).
    statement_filter: Option<regex::Regex>,
}

impl<'a> StackNamer<'a> {
    pub fn new(symbolizer: &'a mut Symbolizer, opts: StackOptions) -> Self {
        StackNamer {
            symbolizer,
            opts,
            threads: HashMap::new(),
            named: HashMap::new(),
            statement_filter: None,
        }
    }

    /// The same, keeping only the rows of the statements whose frame (`labels::Statement::frame`) `filter`
    /// matches.
    pub fn with_statement_filter(mut self, filter: Option<regex::Regex>) -> Self {
        self.statement_filter = filter;
        self
    }

    /// The frame naming a row's statement, with `by_statement`: the root of its every stack.
    pub fn statement_frame(&self, row: &Row) -> Option<String> {
        let statement = row.statement.as_ref().filter(|_| self.opts.by_statement)?;
        Some(statement.frame())
    }

    /// Whether a row is kept (`--statement`).
    pub fn keeps(&self, row: &Row) -> bool {
        match (&self.statement_filter, &row.statement) {
            (None, _) => true,
            (Some(f), Some(s)) => f.is_match(&s.frame()),
            (Some(_), None) => false,
        }
    }

    /// The frames of a row's stack, root first: its thread (with `per_thread`), user frames, kernel frames.
    pub fn frames(&mut self, row: &Row) -> Vec<Rc<str>> {
        let mut frames = Vec::with_capacity(row.stack.ips.len() + 2);
        if self.opts.per_thread && row.tid != 0 {
            let pid = self.opts.pid;
            let thread = self
                .threads
                .entry(row.tid)
                .or_insert_with(|| thread_frame(pid, row.tid));
            frames.push(Rc::clone(thread));
        }
        frames.extend(self.stack(&row.stack).iter().cloned());
        frames
    }

    fn stack(&mut self, raw: &std::sync::Arc<RawStack>) -> Rc<[Rc<str>]> {
        if let Some(named) = self.named.get(&std::sync::Arc::as_ptr(raw)) {
            return Rc::clone(named);
        }
        let mut frames: Vec<Rc<str>> = Vec::with_capacity(raw.ips.len());
        if self.opts.addresses {
            frames.extend(raw.ips.iter().rev().map(|ip| Rc::from(format!("{ip:#x}"))));
        } else {
            frames.extend(self.symbolizer.user_stack(raw.user()).into_iter().rev());
            frames.extend(self.symbolizer.kernel_stack(raw.kernel()).into_iter().rev());
            if raw.ips.is_empty() {
                frames.push(Rc::from(NO_STACK));
            }
        }
        let frames: Rc<[Rc<str>]> = frames.into();
        self.named
            .insert(std::sync::Arc::as_ptr(raw), Rc::clone(&frames));
        frames
    }

    /// The user frames of a stack, leaf first.
    pub fn user_frames(&mut self, raw: &RawStack) -> Vec<Rc<str>> {
        self.symbolizer.user_stack(raw.user())
    }
}

/// What one row adds to a profile: its value, under an optional root frame and above an optional leaf frame.
pub struct Part {
    pub root: Option<String>,
    pub leaf: Option<String>,
    pub value: u64,
}

impl Part {
    pub fn value(value: u64) -> Self {
        Part {
            root: None,
            leaf: None,
            value,
        }
    }

    pub fn leaf(leaf: impl Into<String>, value: u64) -> Self {
        Part {
            root: None,
            leaf: Some(leaf.into()),
            value,
        }
    }
}

/// A profile of every row of `collected`: `parts` says what each row adds.
pub fn build(
    collected: &Collected,
    namer: &mut StackNamer,
    unit: Unit,
    mut parts: impl FnMut(&Collected, &Row) -> Vec<Part>,
) -> Profile {
    let mut profile = Profile::new(unit);
    // Each statement's labels, by its address: rows share their statements.
    let mut labels: HashMap<*const Statement, u32> = HashMap::new();
    for row in &collected.rows {
        if !namer.keeps(row) {
            continue;
        }
        let parts = parts(collected, row);
        if parts.iter().all(|p| p.value == 0) {
            continue;
        }
        let frames = namer.frames(row);
        let statement = namer.statement_frame(row).map(|s| profile.intern(&s));
        let labels = row.statement.as_ref().map_or(0, |s| {
            *labels
                .entry(std::sync::Arc::as_ptr(s))
                .or_insert_with(|| profile.intern_labels(s.labels()))
        });
        for part in parts.into_iter().filter(|p| p.value > 0) {
            let mut ids = Vec::with_capacity(frames.len() + 3);
            ids.extend(statement);
            ids.extend(part.root.as_deref().map(|r| profile.intern(r)));
            ids.extend(frames.iter().map(|f| profile.intern(f)));
            ids.extend(part.leaf.as_deref().map(|l| profile.intern(l)));
            profile.add_labelled(ids, labels, part.value);
        }
    }
    profile
}

/// The on-CPU profile of the cpu collector's rows: samples per stack.
pub fn on_cpu(collected: &Collected, namer: &mut StackNamer) -> Profile {
    build(collected, namer, Unit::Samples, |c, row| {
        vec![Part::value(c.value(row, "samples"))]
    })
}

/// The off-CPU profile of the offcpu collector's rows: microseconds, as offcputime and the users' flame graphs
/// count; blocked and runnable split by the leaf frame.
pub fn off_cpu(collected: &Collected, namer: &mut StackNamer) -> Profile {
    build(collected, namer, Unit::Microseconds, |c, row| {
        vec![
            Part::leaf("[blocked]", c.value(row, "blocked_ns") / 1000),
            Part::leaf("[runnable]", c.value(row, "runnable_ns") / 1000),
        ]
    })
}

/// `thread 1234 (name)`.
fn thread_frame(pid: u32, tid: u32) -> Rc<str> {
    let name = process::thread_name(pid, tid);
    if name.is_empty() {
        format!("thread {tid}").into()
    } else {
        format!("thread {tid} ({name})").into()
    }
}

/// The innermost frames of a stack given leaf first, leaf last, for one line of a table.
pub fn innermost(frames: &[Rc<str>]) -> String {
    let shown: Vec<&str> = frames.iter().take(8).rev().map(|f| f.as_ref()).collect();
    shown.join(";")
}
