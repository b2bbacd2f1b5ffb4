//! The tables some profiles print on stderr beside their flame graph: locks, allocations not freed, syscalls.

use std::{collections::HashMap, fmt::Write};

use crate::{
    collect::{offcpu::Preemption, syscalls, Collected},
    profile::{
        locks::LockSummary,
        stacks::{innermost, StackNamer},
    },
};

fn ms(ns: u64) -> String {
    format!("{:.3} ms", ns as f64 / 1e6)
}

/// The lock table: contention first (mutexes, rw-locks, metadata locks, futex words of no known primitive),
/// at most `top` locks; condition and event waits (idle workers, timers) summed in one line, or with `all`
/// listed after them.
pub fn locks(locks: Vec<LockSummary>, top: usize, all: bool) -> String {
    let contended = |l: &LockSummary| l.kind.is_none_or(|k| k.is_contention());
    let (mut contention, mut idle): (Vec<_>, Vec<_>) = locks.into_iter().partition(contended);
    let mut out = String::new();
    if contention.is_empty() {
        out.push_str("no lock contention: no thread waited for a lock another held\n");
    } else {
        let _ = writeln!(
            out,
            "top {} contended locks by time waited (mutexes, rw-locks, metadata locks, other lock words, \
             statements waiting for another thread):",
            top.min(contention.len())
        );
        for l in contention.iter_mut().take(top) {
            lock(&mut out, l);
        }
    }
    let waited = idle.iter().fold(0u64, |a, l| a.saturating_add(l.total_ns));
    if idle.is_empty() {
        return out;
    }
    if !all {
        let waits = idle.iter().fold(0u64, |a, l| a.saturating_add(l.waits));
        let _ = writeln!(
            out,
            "not contention: {waits} waits on {} condition variables and events, {} in all (threads waiting \
             for work or for a timer); --all lists them",
            idle.len(),
            ms(waited)
        );
        return out;
    }
    let _ = writeln!(
        out,
        "condition variables and events by time waited (threads waiting for work, a timer or another thread):"
    );
    for l in idle.iter_mut().take(top) {
        lock(&mut out, l);
    }
    out
}

/// One lock of the table: its name, kind, waits, histogram, top waiters and wakers.
fn lock(out: &mut String, l: &mut LockSummary) {
    // An anonymous lock's name already has its address.
    let addr = format!("{:#x}", l.addr);
    let addr = if l.name.contains(&addr) {
        String::new()
    } else {
        format!("{addr}, ")
    };
    let _ = writeln!(
        out,
        "  {} ({addr}{}): {} waits, {} in all, longest {}",
        l.name,
        l.kind.map_or("?", |k| k.label()),
        l.waits,
        ms(l.total_ns),
        ms(l.max_ns)
    );
    let hist: Vec<String> = l
        .hist
        .iter()
        .enumerate()
        .filter(|(_, n)| **n > 0)
        .map(|(i, n)| {
            if i == 0 {
                format!("<2us:{n}")
            } else {
                format!("{}us:{n}", 1u64 << i)
            }
        })
        .collect();
    let _ = writeln!(out, "    waits by length: {}", hist.join(" "));
    l.waiters.sort_by_key(|w| std::cmp::Reverse(w.0));
    for (ns, stack) in l.waiters.iter().take(3) {
        let _ = writeln!(out, "    waiter {}: {stack}", ms(*ns));
    }
    l.wakers.sort_by_key(|w| std::cmp::Reverse(w.0));
    for (n, stack) in l.wakers.iter().take(3) {
        let _ = writeln!(out, "    woken {n} times by: {stack}");
    }
}

/// memleak's table: the `top` stacks holding the most bytes, with their allocation counts and innermost
/// frames (leaf last), like bcc's memleak prints them.
pub fn outstanding(namer: &mut StackNamer, collected: &Collected, top: usize) -> String {
    let (bytes, calls) = (collected.column("bytes"), collected.column("calls"));
    let mut rows: Vec<_> = collected.rows.iter().collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.values[bytes]));
    // Scaled figures say so: in the heading, and with `~` on each.
    let (estimated, about) = match &collected.estimate {
        Some(e) => (format!(", estimated ({})", e.describe()), "~"),
        None => (String::new(), ""),
    };
    let mut out = format!(
        "top {} stacks by bytes not freed{estimated}:\n",
        top.min(rows.len())
    );
    for row in rows.into_iter().take(top) {
        let frames = innermost(&namer.user_frames(&row.stack));
        let _ = writeln!(
            out,
            "  {about}{} bytes in {about}{} allocations from {frames}",
            row.values[bytes], row.values[calls]
        );
    }
    out
}

/// The syscalls by time spent in them: calls, total, mean and longest, and the failed calls by errno.
pub fn syscalls(found: &syscalls::Found, top: usize) -> String {
    #[derive(Default)]
    struct Sums {
        calls: u64,
        total_ns: u64,
        max_ns: u64,
        errors: Vec<(u64, String)>,
    }
    let c = &found.collected;
    let mut by_nr: HashMap<u64, Sums> = HashMap::new();
    for row in &c.rows {
        let s = by_nr.entry(row.key).or_default();
        s.calls = s.calls.saturating_add(c.value(row, "calls"));
        s.total_ns = s.total_ns.saturating_add(c.value(row, "total_ns"));
        s.max_ns = s.max_ns.max(c.value(row, "max_ns"));
    }
    for f in &found.errors {
        let s = by_nr.entry(f.nr.into()).or_default();
        s.errors.push((f.calls, syscalls::errno_name(f.errno)));
    }
    let mut rows: Vec<(u64, Sums)> = by_nr.into_iter().filter(|(_, s)| s.calls > 0).collect();
    rows.sort_by_key(|(nr, s)| (std::cmp::Reverse(s.total_ns), *nr));
    let mut out = format!(
        "top {} syscalls by time spent in them:\n",
        top.min(rows.len())
    );
    let _ = writeln!(
        out,
        "  {:<20} {:>10} {:>14} {:>12} {:>12}  errors",
        "syscall", "calls", "total ms", "mean us", "max us"
    );
    for (nr, s) in rows.iter_mut().take(top) {
        s.errors
            .sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        let errors: Vec<String> = s
            .errors
            .iter()
            .map(|(n, name)| format!("{name}:{n}"))
            .collect();
        let _ = writeln!(
            out,
            "  {:<20} {:>10} {:>14.3} {:>12.1} {:>12.1}  {}",
            syscalls::name(*nr),
            s.calls,
            s.total_ns as f64 / 1e6,
            s.total_ns as f64 / 1e3 / s.calls as f64,
            s.max_ns as f64 / 1e3,
            errors.join(" ")
        );
    }
    out
}

/// The kernel's prio as people say it: `nice N`, or `RT N` for a real-time priority.
fn priority(prio: i32) -> String {
    if prio < 100 {
        format!("RT {}", 99 - prio)
    } else {
        format!("nice {}", prio - 120)
    }
}

/// Who preempts whom: the tasks that took the CPU from the process's threads while they could still run,
/// with the run-queue time that caused them, most first; at most `top` rows.
pub fn preemptors(
    mut rows: Vec<Preemption>,
    top: usize,
    thread_name: &mut dyn FnMut(u32) -> String,
) -> String {
    rows.sort_by(|a, b| {
        (b.runq_ns, b.count)
            .cmp(&(a.runq_ns, a.count))
            .then(a.preemptor_tid.cmp(&b.preemptor_tid))
    });
    if rows.is_empty() {
        return "no thread was preempted while tracing\n".to_string();
    }
    let mut out = format!(
        "top {} preemptors (tasks that took the CPU from a runnable thread):\n",
        top.min(rows.len())
    );
    let _ = writeln!(
        out,
        "  {:<36} {:<8} {:<28} {:<8} {:>8} {:>12}",
        "preemptor (process/thread tid)", "prio", "preempted thread", "prio", "count", "runq ms"
    );
    for r in rows.iter().take(top) {
        let preemptor = format!(
            "{}/{} {}",
            crate::render::terminal_safe(&r.preemptor_process),
            crate::render::terminal_safe(&r.preemptor_comm),
            r.preemptor_tid
        );
        let preempted = format!(
            "{} {}",
            crate::render::terminal_safe(&thread_name(r.preempted_tid)),
            r.preempted_tid
        );
        let _ = writeln!(
            out,
            "  {:<36} {:<8} {:<28} {:<8} {:>8} {:>12.3}",
            preemptor,
            priority(r.preemptor_prio),
            preempted,
            priority(r.preempted_prio),
            r.count,
            r.runq_ns as f64 / 1e6
        );
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn priorities_read_as_nice_or_real_time() {
        assert_eq!(super::priority(120), "nice 0");
        assert_eq!(super::priority(110), "nice -10");
        assert_eq!(super::priority(98), "RT 1");
        assert_eq!(super::priority(0), "RT 99");
    }

    use super::*;
    use crate::collect::{RawStack, Row};

    #[test]
    fn syscall_sums_past_the_largest_stop_there() {
        let row = |stack: &[u64], calls: u64, total_ns: u64| Row {
            statement: None,
            tid: 0,
            key: 0,
            stack: std::sync::Arc::new(RawStack {
                user_len: stack.len() as u16,
                ips: stack.into(),
            }),
            values: Box::new([calls, total_ns, 7, 0]),
        };
        let found = syscalls::Found {
            collected: Collected {
                columns: ["calls", "total_ns", "max_ns", "errors"]
                    .map(String::from)
                    .into(),
                rows: vec![row(&[1], u64::MAX, u64::MAX), row(&[2], 3, 5)],
                ..Collected::default()
            },
            errors: Vec::new(),
        };
        let table = syscalls(&found, 10);
        let line = table.lines().nth(2).unwrap();
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(fields[1], u64::MAX.to_string(), "{table}");
        assert_eq!(
            fields[2],
            format!("{:.3}", u64::MAX as f64 / 1e6),
            "{table}"
        );
    }
}
