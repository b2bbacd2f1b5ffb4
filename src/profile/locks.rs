//! Lock waits by lock: the rows of `collect::locks` summed per lock word, with their waiter and waker stacks,
//! and the flame graph of waits with the lock as root frame.

use std::collections::HashMap;

use super::{
    stacks::{build, innermost, Part, StackNamer},
    waits::{self, FutexOp},
    Profile, Unit,
};
use crate::{collect::Collected, server::WaitKind, symbolize::data::DataSymbolizer};

/// One lock word's waits, with its waiter and waker stacks (innermost frames).
#[derive(Debug, Default)]
pub struct LockSummary {
    pub addr: u64,
    /// The variable that holds it; a word in none also by its address and site (`waits::lock_name`).
    pub name: String,
    /// The kind of most of its time waited, and the site where it was waited for longest.
    pub kind: Option<WaitKind>,
    pub site: Option<String>,
    pub waits: u64,
    pub total_ns: u64,
    pub max_ns: u64,
    /// Of `total_ns`, what connections running a statement waited (their stacks pass through `do_command`): an idle
    /// worker's wait for its next task is not a statement's.
    pub statement_ns: u64,
    /// Waits of [2^i, 2^(i+1)) µs; bucket 0 below 2 µs.
    pub hist: Vec<u64>,
    /// (ns waited, stack)
    pub waiters: Vec<(u64, String)>,
    /// (wakes, stack)
    pub wakers: Vec<(u64, String)>,
}

impl LockSummary {
    /// Adds one waiter stack's waits: how many, their total and longest, and their histogram; sums stop at
    /// `u64::MAX`.
    fn add_waits(
        &mut self,
        waits: u64,
        total_ns: u64,
        max_ns: u64,
        hist: impl Iterator<Item = u64>,
    ) {
        self.waits = self.waits.saturating_add(waits);
        self.total_ns = self.total_ns.saturating_add(total_ns);
        self.max_ns = self.max_ns.max(max_ns);
        for (h, n) in self.hist.iter_mut().zip(hist) {
            *h = h.saturating_add(n);
        }
    }
}

/// The profile of time waited (µs) by lock and stack, and the locks by time waited, longest first.
pub fn summarize(
    collected: &Collected,
    namer: &mut StackNamer,
    names: &mut DataSymbolizer,
) -> (Profile, Vec<LockSummary>) {
    let mut lock_names: HashMap<u64, String> = HashMap::new();
    let mut name_of = |addr: u64| {
        lock_names
            .entry(addr)
            .or_insert_with(|| names.name(addr))
            .clone()
    };
    let profile = build(collected, namer, Unit::Microseconds, |c, row| {
        let wait_ns = c.value(row, "wait_ns");
        vec![Part {
            root: Some(format!("lock {}", name_of(row.key))),
            leaf: None,
            value: wait_ns / 1000,
        }]
    });
    let hist_columns: Vec<usize> = (0..)
        .map(|i| format!("hist_{i}"))
        .map_while(|c| collected.columns.iter().position(|n| *n == c))
        .collect();
    let mut locks: HashMap<u64, LockSummary> = HashMap::new();
    // Per lock: time waited by kind and by site.
    let mut kinds: HashMap<u64, HashMap<WaitKind, u64>> = HashMap::new();
    let mut sites: HashMap<u64, HashMap<String, u64>> = HashMap::new();
    for row in &collected.rows {
        let l = locks.entry(row.key).or_insert_with(|| LockSummary {
            addr: row.key,
            name: name_of(row.key),
            hist: vec![0; hist_columns.len()],
            ..LockSummary::default()
        });
        let frames = namer.user_frames(&row.stack);
        let stack = innermost(&frames);
        let (waits, wakes) = (collected.value(row, "waits"), collected.value(row, "wakes"));
        if waits > 0 {
            let wait_ns = collected.value(row, "wait_ns");
            let hist = hist_columns.iter().map(|&c| row.values[c]);
            l.add_waits(waits, wait_ns, collected.value(row, "max_wait_ns"), hist);
            l.waiters.push((wait_ns, stack.clone()));
            if frames.iter().any(|f| &**f == waits::STATEMENT_FRAME) {
                l.statement_ns = l.statement_ns.saturating_add(wait_ns);
            }
            let op = FutexOp::of_set(collected.value(row, "futex_ops"));
            let kind = kinds
                .entry(row.key)
                .or_default()
                .entry(waits::kind(&frames, op))
                .or_default();
            *kind = kind.saturating_add(wait_ns);
            if let Some(site) = waits::site(&frames) {
                let site = sites.entry(row.key).or_default().entry(site).or_default();
                *site = site.saturating_add(wait_ns);
            }
        }
        if wakes > 0 {
            l.wakers.push((wakes, stack));
        }
    }
    for l in locks.values_mut() {
        // Rows of one stack by statement: one entry.
        merge_by_stack(&mut l.waiters);
        merge_by_stack(&mut l.wakers);
        l.kind = kinds
            .get(&l.addr)
            .and_then(|k| {
                k.iter()
                    .max_by_key(|(kind, ns)| (**ns, std::cmp::Reverse(**kind)))
            })
            .map(|(kind, _)| *kind);
        l.site = sites
            .get(&l.addr)
            .and_then(|s| s.iter().max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0))))
            .map(|(site, _)| site.clone());
        l.name = waits::lock_word_name(names, l.addr, l.site.as_deref());
    }
    // Wakes of words nobody was seen waiting on while traced are not locks of this run.
    let mut locks: Vec<LockSummary> = locks.into_values().filter(|l| l.waits > 0).collect();
    locks.sort_by_key(|l| std::cmp::Reverse(l.total_ns));
    (profile, locks)
}

/// Entries of the same stack summed into one.
fn merge_by_stack(entries: &mut Vec<(u64, String)>) {
    let mut by_stack: HashMap<String, u64> = HashMap::with_capacity(entries.len());
    for (n, stack) in entries.drain(..) {
        let sum = by_stack.entry(stack).or_default();
        *sum = sum.saturating_add(n);
    }
    entries.extend(by_stack.into_iter().map(|(stack, n)| (n, stack)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_past_the_largest_stop_there() {
        let mut l = LockSummary {
            hist: vec![0; 3],
            ..LockSummary::default()
        };
        l.add_waits(u64::MAX, u64::MAX - 5, 7, [u64::MAX, 1, 0].into_iter());
        l.add_waits(2, 10, 9, [1, 2, 3].into_iter());
        assert_eq!((l.waits, l.total_ns, l.max_ns), (u64::MAX, u64::MAX, 9));
        assert_eq!(l.hist, [u64::MAX, 3, 3]);
    }
}
