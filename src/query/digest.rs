//! The digest of `myprobe queries --summary`: per fingerprint (as pt-query-digest groups them) the count, total and
//! latency percentiles, and where the time went: on CPU, waiting for a CPU, in lock waits, disk I/O, network and
//! other syscalls. Latencies go into an HDR histogram, so memory stays bounded however long the run.

use std::collections::HashMap;

use hdrhistogram::Histogram;
use serde::Serialize;

use super::QueryRecord;

/// Distinct fingerprints kept at most; the rest are counted under one `(other)` row.
const MAX_FINGERPRINTS: usize = 10_000;
const OTHER: &str = "(other)";

struct Entry {
    count: u64,
    errors: u64,
    latency_us: Histogram<u64>,
    total_us: u64,
    cpu_us: u64,
    runq_us: u64,
    lock_us: u64,
    io_us: u64,
    net_us: u64,
    sys_us: u64,
    /// The lock word whose waits were longest, and their total.
    lock_symbols: HashMap<String, u64>,
}

impl Entry {
    fn new() -> Self {
        Entry {
            count: 0,
            errors: 0,
            // 1 µs to 1 hour, 2 significant digits: a few KiB per fingerprint.
            latency_us: Histogram::new_with_bounds(1, 3_600_000_000, 2)
                .expect("valid histogram bounds"),
            total_us: 0,
            cpu_us: 0,
            runq_us: 0,
            lock_us: 0,
            io_us: 0,
            net_us: 0,
            sys_us: 0,
            lock_symbols: HashMap::new(),
        }
    }
}

#[derive(Default)]
pub struct Digest {
    entries: HashMap<String, Entry>,
}

/// One row of the digest, largest total first.
#[derive(Clone, Debug, Serialize)]
pub struct DigestRow {
    pub fingerprint: String,
    pub count: u64,
    pub errors: u64,
    pub total_us: u64,
    pub avg_us: u64,
    pub p50_us: u64,
    pub p95_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
    /// Shares of the total duration, in percent. Syscall classes are wall time inside the syscalls, which
    /// includes their own CPU time: the shares can add up to a little more than 100.
    pub cpu_pct: f64,
    pub runq_pct: f64,
    pub lock_pct: f64,
    pub io_pct: f64,
    pub net_pct: f64,
    pub sys_pct: f64,
    /// The lock the statements waited on longest, by name.
    pub top_lock: Option<String>,
}

impl Digest {
    pub fn add(&mut self, r: &QueryRecord) {
        let key = r
            .fingerprint
            .clone()
            .unwrap_or_else(|| format!("({})", r.command.to_lowercase()));
        let key = if self.entries.len() >= MAX_FINGERPRINTS && !self.entries.contains_key(&key) {
            OTHER.to_string()
        } else {
            key
        };
        let e = self.entries.entry(key).or_insert_with(Entry::new);
        e.count += 1;
        e.errors += r.error.is_some() as u64;
        e.latency_us.saturating_record(r.duration_us.max(1));
        e.total_us += r.duration_us;
        e.cpu_us += r.cpu_us;
        e.runq_us += r.runq_us;
        e.lock_us += r.lock_us;
        e.io_us += r.read_us + r.write_us + r.sync_us;
        e.net_us += r.net_us;
        e.sys_us += r.other_sys_us;
        if let Some(sym) = &r.lock_symbol {
            if e.lock_symbols.len() < 64 || e.lock_symbols.contains_key(sym) {
                *e.lock_symbols.entry(sym.clone()).or_default() += r.lock_max_us;
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn rows(&self) -> Vec<DigestRow> {
        let mut rows: Vec<DigestRow> = self
            .entries
            .iter()
            .map(|(fp, e)| {
                let pct = |v: u64| {
                    if e.total_us > 0 {
                        (v as f64 * 1000.0 / e.total_us as f64).round() / 10.0
                    } else {
                        0.0
                    }
                };
                DigestRow {
                    fingerprint: fp.clone(),
                    count: e.count,
                    errors: e.errors,
                    total_us: e.total_us,
                    avg_us: e.total_us / e.count.max(1),
                    p50_us: e.latency_us.value_at_quantile(0.50),
                    p95_us: e.latency_us.value_at_quantile(0.95),
                    p99_us: e.latency_us.value_at_quantile(0.99),
                    max_us: e.latency_us.max(),
                    cpu_pct: pct(e.cpu_us),
                    runq_pct: pct(e.runq_us),
                    lock_pct: pct(e.lock_us),
                    io_pct: pct(e.io_us),
                    net_pct: pct(e.net_us),
                    sys_pct: pct(e.sys_us),
                    top_lock: e
                        .lock_symbols
                        .iter()
                        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
                        .map(|(s, _)| s.clone()),
                }
            })
            .collect();
        rows.sort_by(|a, b| {
            b.total_us
                .cmp(&a.total_us)
                .then(a.fingerprint.cmp(&b.fingerprint))
        });
        rows
    }
}
