//! The digest of `myprobe queries --summary`: per fingerprint (as pt-query-digest groups them) the count, total and
//! latency percentiles, and where the time went, as shares of the parts of `TimeParts` that add up to 100%
//! (Method R's response-time profile), with the site of the longest lock waits. Latencies go into an HDR
//! histogram, so memory stays bounded however long the run.

use std::collections::HashMap;

use hdrhistogram::Histogram;
use serde::Serialize;

use super::record::{largest_remainder, spill_counts, CauseWait, QueryRecord, TimeParts, PARTS};
use crate::server::Cause;

/// Distinct fingerprints kept at most; the rest are counted under one `(other)` row.
const MAX_FINGERPRINTS: usize = 10_000;
const OTHER: &str = "(other)";

struct Entry {
    count: u64,
    errors: u64,
    latency_us: Histogram<u64>,
    total_us: u64,
    parts_us: [u64; PARTS],
    /// The time by cause (`QueryRecord::by_cause`), in the order of `Cause::ALL`.
    causes_us: [u64; Cause::ALL.len()],
    /// The longest wait of each cause whose object or holder the server named (at most one per cause).
    named: Vec<CauseWait>,
    /// Longest lock waits' time by lock word, and by the site they were waited at.
    lock_symbols: HashMap<String, u64, foldhash::fast::RandomState>,
    lock_sites: HashMap<String, u64, foldhash::fast::RandomState>,
    lock_errors: Vec<LockError>,
    spills: Spills,
}

/// What a fingerprint's statements spilled to disk (`QueryRecord::tmp_disk_tables`, `sort_merge_passes`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Spills {
    /// The statements that spilled.
    pub statements: u64,
    pub tmp_disk_tables: u64,
    pub sort_merge_passes: u64,
}

impl Spills {
    fn is_none(&self) -> bool {
        self.statements == 0
    }

    fn add(&mut self, r: &QueryRecord) {
        if r.spill().is_some() {
            self.statements += 1;
            self.tmp_disk_tables += u64::from(r.tmp_disk_tables);
            self.sort_merge_passes += u64::from(r.sort_merge_passes);
        }
    }

    /// `3 of its 10 executions spilled to disk (3 temporary tables on disk, 12 sort merge passes)`, or nothing.
    pub fn words(&self, count: u64) -> Option<String> {
        let what = spill_counts(self.tmp_disk_tables, self.sort_merge_passes)?;
        Some(format!(
            "{} of its {count} executions spilled to disk ({what})",
            self.statements
        ))
    }
}

/// Statements of a fingerprint that ended in a deadlock or a lock wait timeout, on one lock, with one other side.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LockError {
    pub cause: Cause,
    pub count: u64,
    /// The lock waited for: `dl.t (PRIMARY, X,REC_NOT_GAP)`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object: Option<String>,
    /// The other side: a deadlock's other statement (its fingerprint), a timeout's holder (in words).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub with: Option<String>,
}

/// The kinds of lock errors kept per fingerprint; past it, the rest are counted without their lock and other side.
const MAX_LOCK_ERRORS: usize = 16;

impl LockError {
    /// The record's, if it ended in one: the other side of a deadlock by its statement's fingerprint, a timeout's
    /// holder by its connection.
    fn of(r: &QueryRecord) -> Option<LockError> {
        let w = r.waits.iter().find(|w| w.cause.is_lock_error())?;
        let with = w.holder.as_ref().map(|h| match (w.cause, &h.statement) {
            (Cause::Deadlock, Some(s)) => crate::wire::fingerprint::fingerprint(s),
            _ => h.describe(),
        });
        Some(LockError {
            cause: w.cause,
            count: 1,
            object: w.object.clone(),
            with,
        })
    }

    /// In a DBA's words, after a count of statements: `rolled back in deadlocks with UPDATE … over dl.t (PRIMARY,
    /// X)`, `timed out waiting for a lock on dl.t (PRIMARY, X) held by connection 42, idle in its transaction for
    /// 3 s`.
    pub fn words(&self) -> String {
        let mut s = String::new();
        if self.cause == Cause::Deadlock {
            s.push_str("rolled back in deadlocks");
            match &self.with {
                Some(w) => s.push_str(&format!(" with {w}")),
                None => s.push_str(
                    " (the other side not read: the server keeps only its latest deadlock)",
                ),
            }
            if let Some(o) = &self.object {
                s.push_str(&format!(" over {o}"));
            }
        } else {
            s.push_str("timed out waiting for a lock");
            if let Some(o) = &self.object {
                s.push_str(&format!(" on {o}"));
            }
            if let Some(w) = &self.with {
                s.push_str(&format!(" held by {w}"));
            }
        }
        s
    }

    /// Adds `e` to the kinds kept in `kept`, bounded.
    fn add_to(mut e: LockError, kept: &mut Vec<LockError>) {
        // A timeout's holder is in words that change by the second: the same connection is the same side.
        let same_side = |a: &Option<String>, b: &Option<String>| match (a, b) {
            (Some(a), Some(b)) if e.cause == Cause::LockWaitTimeout => {
                a.split(',').next() == b.split(',').next()
            }
            _ => a == b,
        };
        if kept.len() >= MAX_LOCK_ERRORS {
            (e.object, e.with) = (None, None);
        }
        match kept
            .iter_mut()
            .find(|k| k.cause == e.cause && k.object == e.object && same_side(&k.with, &e.with))
        {
            Some(k) => {
                k.count += 1;
                k.with = e.with;
            }
            None => kept.push(e),
        }
    }
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
            parts_us: [0; PARTS],
            causes_us: [0; Cause::ALL.len()],
            named: Vec::new(),
            lock_symbols: HashMap::default(),
            lock_sites: HashMap::default(),
            lock_errors: Vec::new(),
            spills: Spills::default(),
        }
    }
}

#[derive(Default)]
pub struct Digest {
    /// By fingerprint, hashed with foldhash: a client's texts are its own choice, so the hash is seeded (not
    /// FxHash), and SipHash was 7% of myprobe's time.
    entries: HashMap<String, Entry, foldhash::fast::RandomState>,
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
    /// The parts of the total, as the statements' own (`TimeParts`).
    #[serde(flatten)]
    pub time: TimeParts,
    /// The parts' shares of the total in percent, to 0.1, adding up to 100 (when the total is not 0).
    #[serde(flatten)]
    pub shares: Shares,
    /// The lock the statements waited on longest, by name, and the site where they waited on locks longest.
    pub top_lock: Option<String>,
    pub top_lock_site: Option<String>,
    /// The total by cause, largest first (`us` the cause's time; `site` unset; `object` and `holder` its longest
    /// named wait's).
    pub causes: Vec<CauseWait>,
    /// Its deadlocks and lock wait timeouts, by lock and other side, the most first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub lock_errors: Vec<LockError>,
    /// Its statements' temporary tables and sorts on disk.
    #[serde(skip_serializing_if = "Spills::is_none")]
    pub spills: Spills,
    /// Counts and times scaled up by this from a sample (`queries --sample-every`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scaled_by: Option<f64>,
}

impl DigestRow {
    /// Counts and times scaled up from the share of the time traced; latencies, shares and the average stay as
    /// measured.
    pub fn scale(&mut self, by: f64) {
        let scaled = |v: u64| (v as f64 * by).round() as u64;
        self.count = scaled(self.count);
        self.errors = scaled(self.errors);
        self.total_us = scaled(self.total_us);
        self.time = TimeParts::from_values(self.time.values().map(scaled));
        for c in &mut self.causes {
            c.us = scaled(c.us);
        }
        for e in &mut self.lock_errors {
            e.count = scaled(e.count);
        }
        let spills = &mut self.spills;
        for n in [
            &mut spills.statements,
            &mut spills.tmp_disk_tables,
            &mut spills.sort_merge_passes,
        ] {
            *n = scaled(*n);
        }
        self.scaled_by = Some(by);
    }
}

/// The causes with time, largest first, each with the object and holder of its longest wait the server named.
fn causes_of(us: &[u64; Cause::ALL.len()], named: &[CauseWait]) -> Vec<CauseWait> {
    let mut causes: Vec<CauseWait> = Cause::ALL
        .iter()
        .zip(us)
        .filter(|(_, us)| **us > 0)
        .map(|(&cause, &us)| {
            let named = named.iter().find(|n| n.cause == cause);
            CauseWait {
                cause,
                us,
                site: None,
                object: named.and_then(|n| n.object.clone()),
                holder: named.and_then(|n| n.holder.clone()),
            }
        })
        .collect();
    causes.sort_by(|a, b| b.us.cmp(&a.us).then(a.cause.cmp(&b.cause)));
    causes
}

impl DigestRow {
    /// What most of its time went to, other than the time not seen, with that time.
    pub fn top_cause(&self) -> Option<&CauseWait> {
        self.causes
            .iter()
            .find(|c| c.cause != Cause::Unseen)
            .or(self.causes.first())
    }
}

/// Each part of `TimeParts` as a share of the total, in percent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Shares {
    pub user_pct: f64,
    pub sys_pct: f64,
    pub runq_pct: f64,
    pub lock_pct: f64,
    pub read_pct: f64,
    pub write_pct: f64,
    pub sync_pct: f64,
    pub net_pct: f64,
    pub other_pct: f64,
    pub sleep_pct: f64,
    pub unseen_pct: f64,
}

impl Shares {
    /// Shares to 0.1% that add up to exactly 100% (0 for a total of 0).
    pub fn of(parts: &TimeParts) -> Self {
        let v = parts.values();
        let total = v.iter().fold(0u64, |a, &x| a.saturating_add(x));
        if total == 0 {
            return Shares::default();
        }
        // In millionths of the total (widened: no product overflows), rounded to thousandths.
        let exact: [u64; PARTS] = v.map(|x| ((x as u128 * 1_000_000) / total as u128) as u64);
        let p = largest_remainder(&exact, 1000, 1000);
        let [user, sys, runq, lock, read, write, sync, net, other, sleep, unseen] =
            p.map(|x| x as f64 / 10.0);
        Shares {
            user_pct: user,
            sys_pct: sys,
            runq_pct: runq,
            lock_pct: lock,
            read_pct: read,
            write_pct: write,
            sync_pct: sync,
            net_pct: net,
            other_pct: other,
            sleep_pct: sleep,
            unseen_pct: unseen,
        }
    }

    pub fn values(&self) -> [f64; PARTS] {
        [
            self.user_pct,
            self.sys_pct,
            self.runq_pct,
            self.lock_pct,
            self.read_pct,
            self.write_pct,
            self.sync_pct,
            self.net_pct,
            self.other_pct,
            self.sleep_pct,
            self.unseen_pct,
        ]
    }
}

impl Digest {
    pub fn add(&mut self, r: &QueryRecord) {
        let unnamed;
        let key = match &r.fingerprint {
            Some(f) => f,
            None => {
                unnamed = format!("({})", r.command.to_lowercase());
                unnamed.as_str()
            }
        };
        // Looked up before any key is made: the fingerprint is not copied for each statement.
        if !self.entries.contains_key(key) {
            let key = if self.entries.len() >= MAX_FINGERPRINTS {
                OTHER
            } else {
                key
            };
            self.entries
                .entry(key.to_string())
                .or_insert_with(Entry::new);
        }
        let e = match self.entries.get_mut(key) {
            Some(e) => e,
            None => self.entries.get_mut(OTHER).expect("made above"),
        };
        e.count += 1;
        e.errors += r.error.is_some() as u64;
        if let Some(error) = LockError::of(r) {
            LockError::add_to(error, &mut e.lock_errors);
        }
        e.spills.add(r);
        e.latency_us.saturating_record(r.duration_us.max(1));
        e.total_us = e.total_us.saturating_add(r.duration_us);
        for (sum, v) in e.parts_us.iter_mut().zip(r.time.values()) {
            *sum = sum.saturating_add(v);
        }
        for (cause, us) in r.by_cause() {
            let sum = &mut e.causes_us[cause as usize];
            *sum = sum.saturating_add(us);
        }
        for w in r
            .waits
            .iter()
            .chain(&r.io)
            .filter(|w| w.holder.is_some() || w.object.is_some())
        {
            match e.named.iter_mut().find(|n| n.cause == w.cause) {
                Some(n) if n.us < w.us => *n = w.clone(),
                Some(_) => {}
                None => e.named.push(w.clone()),
            }
        }
        for (names, name) in [
            (&mut e.lock_symbols, &r.lock_symbol),
            (&mut e.lock_sites, &r.lock_site),
        ] {
            if let Some(name) = name {
                if names.len() < 64 || names.contains_key(name) {
                    let time = names.entry(name.clone()).or_default();
                    *time = time.saturating_add(r.lock_max_us);
                }
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
                let top = |names: &HashMap<String, u64, foldhash::fast::RandomState>| {
                    names
                        .iter()
                        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
                        .map(|(s, _)| s.clone())
                };
                let time = TimeParts::from_values(e.parts_us);
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
                    time,
                    shares: Shares::of(&time),
                    top_lock: top(&e.lock_symbols),
                    top_lock_site: top(&e.lock_sites),
                    causes: causes_of(&e.causes_us, &e.named),
                    lock_errors: {
                        let mut errors = e.lock_errors.clone();
                        errors.sort_by(|a, b| b.count.cmp(&a.count).then(a.cause.cmp(&b.cause)));
                        errors
                    },
                    spills: e.spills,
                    scaled_by: None,
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
