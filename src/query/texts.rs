//! The texts of statements prepared before tracing, from the server's own process list. While a prepared
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

use std::collections::{HashMap, HashSet, VecDeque};

use super::fingerprint::fingerprint;

/// A prepared statement: the socket of its connection (how the tracker knows connections) and its id.
pub type StatementKey = (i32, u32);

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
/// Executions and samples kept at most (a busy server runs tens of thousands of statements a second).
const MAX_EXECUTIONS: usize = 500_000;
const MAX_SAMPLES: usize = 1_000;

#[derive(Default)]
pub struct TextFinder {
    executions: VecDeque<Execution>,
    /// The reader's own statements, traced: (thread, start).
    own: VecDeque<(u32, u64)>,
    /// The start of the latest execution seen per thread.
    latest_start: HashMap<u32, u64>,
    samples: VecDeque<Sample>,
    /// Statements whose executions were seen without their text, and not found yet.
    wanted: HashSet<StatementKey>,
    found: HashMap<StatementKey, String>,
    /// The fingerprint of each statement whose text is known (traced, or found).
    fingerprints: HashMap<StatementKey, String>,
    /// Samples joined, and those that named one statement.
    pub samples_joined: u64,
    pub samples_named: u64,
}

impl TextFinder {
    /// An execution traced, with its fingerprint when its text is known.
    pub fn execution(&mut self, e: Execution, known: Option<&str>) {
        match known {
            Some(fp) if self.fingerprints.get(&e.key).is_none_or(|f| f != fp) => {
                self.fingerprints.insert(e.key, fp.to_string());
            }
            None if !self.found.contains_key(&e.key) => {
                self.wanted.insert(e.key);
            }
            _ => {}
        }
        let latest = self.latest_start.entry(e.tid).or_default();
        *latest = (*latest).max(e.start_ns);
        if self.executions.len() >= MAX_EXECUTIONS {
            self.executions.pop_front();
        }
        self.executions.push_back(e);
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
                let key = match instant {
                    // The latest execution of the thread that began by the row's start.
                    Some(instant) => {
                        let began = instant.saturating_sub(row.time_us.saturating_mul(1000));
                        self.executions
                            .iter()
                            .filter(|e| {
                                e.tid == row.tid
                                    && e.start_ns <= began.saturating_add(DISPATCH_SLACK_NS)
                            })
                            .max_by_key(|e| e.start_ns)
                            .filter(|e| e.end_ns.saturating_add(DISPATCH_SLACK_NS) >= instant)
                            .map(|e| e.key)
                            .filter(|k| self.fingerprints.get(k).is_none_or(|fp| *fp == shown))
                    }
                    // Without the own statement: the one statement of the thread in the window that may be the
                    // one shown (those known by another text are not).
                    None => {
                        let mut keys = self
                            .executions
                            .iter()
                            .filter(|e| {
                                e.tid == row.tid
                                    && e.start_ns <= sample.after_ns
                                    && e.end_ns >= sample.before_ns
                            })
                            .map(|e| e.key)
                            .filter(|k| self.fingerprints.get(k).is_none_or(|fp| *fp == shown));
                        keys.next().filter(|&k| keys.all(|other| other == k))
                    }
                };
                let Some(key) = key else { continue };
                let text = &row.text;
                self.samples_named += 1;
                if self.wanted.remove(&key) {
                    self.found.insert(key, text.clone());
                    self.fingerprints.insert(key, shown.clone());
                    named.push((key, text.clone()));
                }
            }
        }
        self.samples = waiting;
        while self
            .executions
            .front()
            .is_some_and(|e| now_ns.saturating_sub(e.end_ns) > KEEP_NS)
        {
            self.executions.pop_front();
        }
        while self
            .own
            .front()
            .is_some_and(|&(_, start)| now_ns.saturating_sub(start) > KEEP_NS)
        {
            self.own.pop_front();
        }
        named
    }

    /// A statement closed, or its connection gone: a later statement may reuse the id.
    pub fn forget(&mut self, key: &StatementKey) {
        self.found.remove(key);
        self.wanted.remove(key);
        self.fingerprints.remove(key);
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
        f.execution(exec(2, 100, 200, 8), Some(&fingerprint(insert)));
        f.execution(exec(2, 300, 400, 8), Some(&fingerprint(insert)));
        f.sample(sample(150, 160, &[(2, insert)]));
        assert!(f.join(1000, false).is_empty());
        assert!(f.text(&(7, 8)).is_none());
    }

    #[test]
    fn a_statement_known_by_another_text_is_not_the_one_shown() {
        // 5 (unknown) and 6 (known: an UPDATE) both ran in the window, and the list shows a DELETE: it is 5.
        let mut f = TextFinder::default();
        let update = fingerprint("UPDATE t SET v = ?");
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
