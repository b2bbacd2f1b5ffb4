//! `myprobe trace`: any function (by demangled name or glob) or static probe of the server, as DTrace's pid
//! and usdt providers. functions.rs finds the functions, usdt.rs lists static probes; the collector is
//! collect/trace.rs; here, what it found as tables: per function and key, the latency histograms, and what
//! threads did inside the functions.

pub mod functions;
pub mod points;
pub mod usdt;

use std::{collections::BTreeMap, fmt::Write};

use serde_json::json;

use crate::{
    collect::{
        syscalls,
        trace::{Inside, InsideStats, KeyedStats, ProbePoint, Traced},
    },
    render::terminal_safe,
};

/// What the rows are keyed by, beside the function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum By {
    Function,
    Thread,
    Stack,
    /// An argument, from 0.
    Arg(u32),
}

/// How an argument is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgShow {
    Int,
    Ptr,
    Str,
}

/// The rows of the table: per probe and key, largest total time (or calls) first.
pub fn table(
    traced: &Traced,
    probes: &[ProbePoint],
    by: By,
    arg: Option<ArgShow>,
    timed: bool,
    thread_name: &mut dyn FnMut(u32) -> String,
    top: usize,
) -> String {
    let mut rows = merged(&traced.stats, by);
    rows.sort_by(|a, b| {
        (b.total_ns, b.calls)
            .cmp(&(a.total_ns, a.calls))
            .then(a.probe.cmp(&b.probe))
    });
    let key_header = match by {
        By::Function | By::Stack => None,
        By::Thread => Some("thread".to_string()),
        By::Arg(n) => Some(format!("arg{n}")),
    };
    let mut out = String::new();
    let name_width = rows
        .iter()
        .map(|r| probes[r.probe].label.chars().count())
        .max()
        .unwrap_or(8)
        .clamp(8, 60);
    let _ = write!(out, "{:<name_width$}", "function");
    if let Some(h) = &key_header {
        let _ = write!(out, "  {h:<24}");
    }
    if timed {
        let _ = writeln!(
            out,
            " {:>10} {:>8} {:>12} {:>10} {:>10}",
            "calls", "errors", "total ms", "mean us", "max us"
        );
    } else {
        let _ = writeln!(out, " {:>10}", "calls");
    }
    for r in rows.iter().take(top) {
        let label = terminal_safe(&probes[r.probe].label);
        let _ = write!(out, "{label:<name_width$}");
        if key_header.is_some() {
            let key = match by {
                By::Thread => format!("{} ({})", r.tid, thread_name(r.tid)),
                _ => arg_text(r, arg),
            };
            let _ = write!(out, "  {:<24}", terminal_safe(&key));
        }
        if timed {
            let mean = r.total_ns as f64 / r.calls.max(1) as f64 / 1e3;
            let _ = writeln!(
                out,
                " {:>10} {:>8} {:>12.3} {:>10.1} {:>10.1}",
                r.calls,
                r.errors,
                r.total_ns as f64 / 1e6,
                mean,
                r.max_ns as f64 / 1e3
            );
        } else {
            let _ = writeln!(out, " {:>10}", r.calls);
        }
    }
    if rows.len() > top {
        let _ = writeln!(out, "({} more rows; --top N shows more)", rows.len() - top);
    }
    out
}

/// An argument as the user asked to see it.
fn arg_text(r: &KeyedStats, arg: Option<ArgShow>) -> String {
    match (arg, &r.text) {
        (Some(ArgShow::Str), Some(t)) if !t.is_empty() || r.arg == 0 => format!("{t:?}"),
        (Some(ArgShow::Str), _) => format!("(unreadable {:#x})", r.arg),
        (Some(ArgShow::Ptr), _) => format!("{:#x}", r.arg as u64),
        _ => r.arg.to_string(),
    }
}

/// The stats summed per probe and the key shown (stacks are summed away: the profile has them).
fn merged(stats: &[KeyedStats], by: By) -> Vec<KeyedStats> {
    let mut sums: BTreeMap<(usize, u32, i64, Option<String>), KeyedStats> = BTreeMap::new();
    for s in stats {
        let key = match by {
            By::Function | By::Stack => (s.probe, 0, 0, None),
            By::Thread => (s.probe, s.tid, 0, None),
            By::Arg(_) => (s.probe, 0, s.arg, s.text.clone()),
        };
        let e = sums.entry(key).or_insert_with(|| KeyedStats {
            probe: s.probe,
            tid: s.tid,
            arg: s.arg,
            text: s.text.clone(),
            hist: vec![0; s.hist.len()],
            ..KeyedStats::default()
        });
        e.calls += s.calls;
        e.errors += s.errors;
        e.total_ns += s.total_ns;
        e.max_ns = e.max_ns.max(s.max_ns);
        for (a, b) in e.hist.iter_mut().zip(&s.hist) {
            *a += b;
        }
    }
    sums.into_values().collect()
}

/// bcc funclatency's histogram of each probe with calls, most time first: `nsecs : count distribution`.
pub fn histograms(traced: &Traced, probes: &[ProbePoint], max: usize) -> String {
    let mut per_probe = merged(&traced.stats, By::Function);
    per_probe.sort_by_key(|s| std::cmp::Reverse(s.total_ns));
    let mut out = String::new();
    for s in per_probe.iter().filter(|s| s.calls > 0).take(max) {
        let _ = writeln!(out, "\n{}:", terminal_safe(&probes[s.probe].label));
        let first = s.hist.iter().position(|&n| n > 0).unwrap_or(0);
        let last = s.hist.iter().rposition(|&n| n > 0).unwrap_or(0);
        let peak = s.hist.iter().copied().max().unwrap_or(1).max(1);
        let _ = writeln!(out, "{:>26} : {:<8} distribution", "nsecs", "count");
        for (i, &n) in s.hist.iter().enumerate().take(last + 1).skip(first) {
            let low = if i == 0 { 0 } else { 1u64 << i };
            let high = (1u64 << (i + 1)) - 1;
            let bar = "*".repeat((n * 40).div_ceil(peak) as usize);
            let _ = writeln!(out, "{low:>12} -> {high:<12}: {n:<8} |{bar:<40}|");
        }
    }
    out
}

/// What the threads did inside each function (outermost traced call): syscalls, lock waits, off-CPU time.
pub fn inside(
    traced: &Traced,
    probes: &[ProbePoint],
    lock_name: &mut dyn FnMut(u64) -> String,
    top: usize,
) -> String {
    let totals = merged(&traced.stats, By::Function);
    let mut by_probe: BTreeMap<usize, Vec<&InsideStats>> = BTreeMap::new();
    for s in &traced.inside {
        by_probe.entry(s.probe).or_default().push(s);
    }
    let mut out = String::new();
    for t in totals.iter().filter(|t| t.calls > 0) {
        let _ = writeln!(
            out,
            "\ninside {}: {} calls, {:.3} ms",
            terminal_safe(&probes[t.probe].label),
            t.calls,
            t.total_ns as f64 / 1e6
        );
        let mut rows = by_probe.remove(&t.probe).unwrap_or_default();
        if rows.is_empty() {
            let _ = writeln!(out, "  no syscall, lock wait or time off CPU");
            continue;
        }
        rows.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then(a.what.cmp(&b.what)));
        let _ = writeln!(
            out,
            "  {:<32} {:>10} {:>12} {:>10} {:>10}",
            "", "count", "total ms", "mean us", "max us"
        );
        let more = rows.len().saturating_sub(top);
        for r in rows.into_iter().take(top) {
            let what = match r.what {
                Inside::Syscall(nr) => format!("syscall {}", syscalls::name(nr.into())),
                Inside::LockWait(addr) => format!("lock wait {}", lock_name(addr)),
                Inside::OffCpu => "off CPU".to_string(),
            };
            let _ = writeln!(
                out,
                "  {:<32} {:>10} {:>12.3} {:>10.1} {:>10.1}",
                terminal_safe(&what),
                r.count,
                r.total_ns as f64 / 1e6,
                r.total_ns as f64 / r.count.max(1) as f64 / 1e3,
                r.max_ns as f64 / 1e3
            );
        }
        if more > 0 {
            let _ = writeln!(out, "  ({more} more rows; --top N shows more)");
        }
    }
    out
}

/// Everything as one JSON document.
pub fn to_json(
    traced: &Traced,
    probes: &[ProbePoint],
    by: By,
    arg: Option<ArgShow>,
    seconds: f64,
) -> serde_json::Value {
    let rows: Vec<serde_json::Value> = merged(&traced.stats, by)
        .iter()
        .map(|r| {
            let mut v = json!({
                "function": probes[r.probe].label,
                "calls": r.calls,
                "errors": r.errors,
                "total_ns": r.total_ns,
                "max_ns": r.max_ns,
                "hist_log2_ns": r.hist,
            });
            match by {
                By::Thread => v["tid"] = r.tid.into(),
                By::Arg(n) => v[format!("arg{n}")] = arg_text(r, arg).into(),
                _ => {}
            }
            v
        })
        .collect();
    let inside: Vec<serde_json::Value> = traced
        .inside
        .iter()
        .map(|r| {
            let (what, detail) = match r.what {
                Inside::Syscall(nr) => ("syscall", syscalls::name(nr.into())),
                Inside::LockWait(addr) => ("lock_wait", format!("{addr:#x}")),
                Inside::OffCpu => ("off_cpu", String::new()),
            };
            json!({
                "function": probes[r.probe].label,
                "what": what,
                "detail": detail,
                "count": r.count,
                "total_ns": r.total_ns,
                "max_ns": r.max_ns,
            })
        })
        .collect();
    json!({
        "seconds": seconds,
        "rows": rows,
        "inside": inside,
        "calls_per_s_before": traced.rate.as_ref().map(|r| r.total()),
        "too_deep": traced.too_deep,
    })
}
