//! The pure half of finding the texts of statements prepared before tracing from the process list ([`TextFinder`]):
//! no thread, no connection; it is given executions traced and samples read, and says what they name.
//!
//! The texts of statements prepared before tracing, and the users of connections opened before it, from what the
//! server says of them. Where performance_schema is on, its table of prepared statements names each exactly;
//! where it is off, the executions themselves do (`executed.rs`, read from the server's statement objects).
//! Failing those, the process list does, sampled as follows. While a prepared
//! statement executes, `information_schema.PROCESSLIST` shows its text (with its placeholders) on the row of
//! the OS thread running it (`TID`, command `Execute`). A sample of the list, read between two monotonic
//! instants, is joined with the executions the tracer saw on the same thread in that window: when one statement
//! of unknown text ran there, and every other one that did is known by another text (compared by fingerprint),
//! the text is that statement's.
//!
//! The window is narrowed to the instant: the list is read with the reader's own row, whose `TIME_MS` is the time
//! since its own statement began (the server takes one clock reading for all rows), and that statement is traced
//! too. So the instant is the own statement's traced start plus its `TIME_MS`, and each row's statement began
//! its own `TIME_MS` before that instant: the execution of the row's thread that began then is the one shown
//! (the latest that began by then, a few microseconds of dispatching apart).
//!
//! A thread runs one statement at a time and its executions arrive in order, so a sample is joined only once
//! an execution of its thread that began after the sample has arrived: everything that overlapped it is in.

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::{collections::VecDeque, sync::Arc};

use super::record::{StatementKey, Text};
use crate::wire::fingerprint::fingerprint;

/// One execution of a prepared statement, as traced.
#[derive(Clone, Copy, Debug)]
pub struct Execution {
    pub tid: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    pub key: StatementKey,
}

/// The process list's executing prepared statements, read between two `CLOCK_MONOTONIC` instants.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    pub before_ns: u64,
    pub after_ns: u64,
    /// The reader's own row: its OS thread and the time since its statement began (µs).
    pub own: Option<(u32, u64)>,
    pub rows: Vec<SampleRow>,
}

#[derive(Clone, Debug, Default)]
pub struct SampleRow {
    pub tid: u32,
    /// Since the statement began (`TIME_MS`, in µs).
    pub time_us: u64,
    pub text: String,
}

/// How far before the instant a statement may have begun and still be the one its row shows (its dispatching,
/// before the server notes its start).
const DISPATCH_SLACK_NS: u64 = 50_000;

/// How long executions and samples are kept for joining.
const KEEP_NS: u64 = 5_000_000_000;
/// Executions kept per thread, and samples, at most (a busy thread runs thousands of statements a second).
pub(super) const MAX_EXECUTIONS: usize = 100_000;
const MAX_SAMPLES: usize = 1_000;

#[derive(Default)]
pub struct TextFinder {
    /// Per thread, in the order they began (a thread runs one statement at a time).
    executions: HashMap<u32, VecDeque<Execution>>,
    /// The reader's own statements, traced: (thread, start).
    own: VecDeque<(u32, u64)>,
    /// The start of the latest execution seen per thread.
    latest_start: HashMap<u32, u64>,
    samples: VecDeque<Sample>,
    /// Statements whose executions were seen without their text, and not found yet.
    wanted: HashSet<StatementKey>,
    found: HashMap<StatementKey, String>,
    /// The fingerprint of each statement whose text is known (traced, or found): the record's own (the same
    /// `Arc` at each execution, so that it is compared by address).
    fingerprints: HashMap<StatementKey, Text>,
    /// Samples joined, and those that named one statement.
    pub samples_joined: u64,
    pub samples_named: u64,
}

impl TextFinder {
    /// An execution traced, with its fingerprint when its text is known; true if it is of a statement newly
    /// wanted.
    pub fn execution(&mut self, e: Execution, known: Option<&Text>) -> bool {
        let mut new = false;
        match known {
            Some(fp)
                if self
                    .fingerprints
                    .get(&e.key)
                    .is_none_or(|f| !Arc::ptr_eq(f, fp)) =>
            {
                self.fingerprints.insert(e.key, fp.clone());
            }
            None if !self.found.contains_key(&e.key) => {
                new = self.wanted.insert(e.key);
            }
            _ => {}
        }
        let latest = self.latest_start.entry(e.tid).or_default();
        *latest = (*latest).max(e.start_ns);
        let thread = self.executions.entry(e.tid).or_default();
        if thread.len() >= MAX_EXECUTIONS {
            thread.pop_front();
        }
        thread.push_back(e);
        new
    }

    /// One of the reader's own statements (which read the list), traced.
    pub fn own_statement(&mut self, tid: u32, start_ns: u64) {
        if self.own.len() >= MAX_SAMPLES {
            self.own.pop_front();
        }
        self.own.push_back((tid, start_ns));
    }

    pub fn sample(&mut self, s: Sample) {
        if self.samples.len() >= MAX_SAMPLES {
            self.samples.pop_front();
        }
        self.samples.push_back(s);
    }

    /// Whether texts are still wanted: statements seen without one.
    pub fn wants_texts(&self) -> bool {
        !self.wanted.is_empty()
    }

    /// A statement's text, found elsewhere (the server's table of prepared statements): true if it was wanted.
    pub fn found_elsewhere(&mut self, key: StatementKey, text: &str) -> bool {
        let wanted = self.wanted.remove(&key);
        if let std::collections::hash_map::Entry::Vacant(e) = self.found.entry(key) {
            e.insert(text.to_string());
            self.fingerprints.insert(key, fingerprint(text).into());
        }
        wanted
    }

    /// The text found for a statement, if any.
    pub fn text(&self, key: &StatementKey) -> Option<&str> {
        self.found.get(key).map(String::as_str)
    }

    /// Joins the samples whose threads have moved on (all of them with `all`, when tracing ended); returns the
    /// statements named by this join, with their texts. Forgets what is older than a few seconds at `now_ns`.
    pub fn join(&mut self, now_ns: u64, all: bool) -> Vec<(StatementKey, String)> {
        let mut named = Vec::new();
        let mut waiting = VecDeque::new();
        while let Some(sample) = self.samples.pop_front() {
            let settled = all
                || sample.rows.iter().all(|r| {
                    self.latest_start
                        .get(&r.tid)
                        .is_some_and(|&start| start > sample.after_ns)
                });
            if !settled {
                if now_ns.saturating_sub(sample.after_ns) < KEEP_NS {
                    waiting.push_back(sample);
                }
                continue;
            }
            self.samples_joined += 1;
            // The instant the server read its clock for the list: the own statement's start plus its TIME_MS.
            let instant = sample.own.and_then(|(own_tid, own_us)| {
                self.own
                    .iter()
                    .find(|&&(tid, start)| {
                        tid == own_tid && (sample.before_ns..=sample.after_ns).contains(&start)
                    })
                    .map(|&(_, start)| start.saturating_add(own_us.saturating_mul(1000)))
            });
            for row in &sample.rows {
                let shown = fingerprint(&row.text);
                let Some(thread) = self.executions.get(&row.tid) else {
                    continue;
                };
                let may_be_shown =
                    |k: &StatementKey| self.fingerprints.get(k).is_none_or(|fp| **fp == *shown);
                let key = match instant {
                    // The latest execution of the thread that began by the row's start.
                    Some(instant) => {
                        let began = instant.saturating_sub(row.time_us.saturating_mul(1000));
                        let by = thread.partition_point(|e| {
                            e.start_ns <= began.saturating_add(DISPATCH_SLACK_NS)
                        });
                        by.checked_sub(1)
                            .and_then(|i| thread.get(i))
                            .filter(|e| e.end_ns.saturating_add(DISPATCH_SLACK_NS) >= instant)
                            .map(|e| e.key)
                            .filter(may_be_shown)
                    }
                    // Without the own statement: the one statement of the thread in the window that may be the
                    // one shown (those known by another text are not).
                    None => {
                        let by = thread.partition_point(|e| e.start_ns <= sample.after_ns);
                        let mut keys = thread
                            .range(..by)
                            .rev()
                            .take_while(|e| e.end_ns >= sample.before_ns)
                            .map(|e| e.key)
                            .filter(may_be_shown);
                        keys.next().filter(|&k| keys.all(|other| other == k))
                    }
                };
                let Some(key) = key else { continue };
                let text = &row.text;
                self.samples_named += 1;
                if self.wanted.remove(&key) {
                    self.found.insert(key, text.clone());
                    self.fingerprints.insert(key, shown.as_str().into());
                    named.push((key, text.clone()));
                }
            }
        }
        self.samples = waiting;
        self.executions.retain(|_, thread| {
            while thread
                .front()
                .is_some_and(|e| now_ns.saturating_sub(e.end_ns) > KEEP_NS)
            {
                thread.pop_front();
            }
            !thread.is_empty()
        });
        while self
            .own
            .front()
            .is_some_and(|&(_, start)| now_ns.saturating_sub(start) > KEEP_NS)
        {
            self.own.pop_front();
        }
        named
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exec(tid: u32, start_ns: u64, end_ns: u64, id: u32) -> Execution {
        Execution {
            tid,
            start_ns,
            end_ns,
            key: (7, id),
        }
    }

    fn sample(before_ns: u64, after_ns: u64, rows: &[(u32, &str)]) -> Sample {
        Sample {
            before_ns,
            after_ns,
            own: None,
            rows: rows
                .iter()
                .map(|(tid, text)| SampleRow {
                    tid: *tid,
                    time_us: 0,
                    text: text.to_string(),
                })
                .collect(),
        }
    }

    #[test]
    fn the_own_statement_pins_the_instant_of_the_list() {
        // Thread 1 ran 5, 6, 5, 6 back to back within the window; the list was read 10 µs into the second 6.
        let mut f = TextFinder::default();
        for (start, id) in [(100_000, 5), (150_000, 6), (200_000, 5), (250_000, 6)] {
            f.execution(exec(1, start, start + 45_000, id), None);
        }
        f.execution(exec(1, 400_000, 410_000, 5), None);
        f.own_statement(9, 90_000);
        let mut s = sample(80_000, 300_000, &[(1, "UPDATE t SET v=?")]);
        s.own = Some((9, 170)); // the instant: 90 µs + 170 µs = 260 µs
        s.rows[0].time_us = 10;
        f.sample(s);
        assert_eq!(
            f.join(1_000_000, false),
            [((7, 6), "UPDATE t SET v=?".to_string())]
        );
    }

    #[test]
    fn a_sample_names_the_one_statement_its_thread_ran_then() {
        let mut f = TextFinder::default();
        f.execution(exec(1, 100, 200, 5), None);
        f.execution(exec(1, 210, 300, 5), None);
        f.sample(sample(150, 250, &[(1, "SELECT c FROM t WHERE id=?")]));
        // Thread 1 has not moved past the sample yet: nothing is joined.
        assert!(f.join(1000, false).is_empty());
        f.execution(exec(1, 310, 400, 6), None);
        assert_eq!(
            f.join(1000, false),
            [((7, 5), "SELECT c FROM t WHERE id=?".to_string())]
        );
        assert_eq!(f.text(&(7, 5)), Some("SELECT c FROM t WHERE id=?"));
        assert!(f.wants_texts(), "statement 6 is still unknown");
    }

    #[test]
    fn two_statements_in_the_window_name_neither() {
        let mut f = TextFinder::default();
        f.execution(exec(1, 100, 200, 5), None);
        f.execution(exec(1, 210, 300, 6), None);
        f.execution(exec(1, 400, 500, 6), None);
        f.sample(sample(150, 250, &[(1, "DELETE FROM t WHERE id=?")]));
        assert!(f.join(1000, false).is_empty());
        assert_eq!(f.samples_named, 0);
        // Nor one whose text is known already.
        let insert = "INSERT INTO t VALUES (?)";
        f.execution(exec(2, 100, 200, 8), Some(&fingerprint(insert).into()));
        f.execution(exec(2, 300, 400, 8), Some(&fingerprint(insert).into()));
        f.sample(sample(150, 160, &[(2, insert)]));
        assert!(f.join(1000, false).is_empty());
        assert!(f.text(&(7, 8)).is_none());
    }

    #[test]
    fn a_statement_known_by_another_text_is_not_the_one_shown() {
        // 5 (unknown) and 6 (known: an UPDATE) both ran in the window, and the list shows a DELETE: it is 5.
        let mut f = TextFinder::default();
        let update: Text = fingerprint("UPDATE t SET v = ?").into();
        f.execution(exec(1, 100, 200, 5), None);
        f.execution(exec(1, 210, 300, 6), Some(&update));
        f.execution(exec(1, 400, 500, 6), Some(&update));
        f.sample(sample(150, 250, &[(1, "DELETE FROM t WHERE id=?")]));
        assert_eq!(
            f.join(1000, false),
            [((7, 5), "DELETE FROM t WHERE id=?".to_string())]
        );
    }

    #[test]
    fn old_executions_and_samples_are_forgotten() {
        let mut f = TextFinder::default();
        f.execution(exec(1, 100, 200, 5), None);
        f.sample(sample(150, 250, &[(3, "SELECT ?")]));
        assert!(f.join(KEEP_NS + 1000, false).is_empty());
        assert!(f.samples.is_empty() && f.executions.is_empty());
    }
}
