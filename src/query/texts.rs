//! The texts of statements prepared before tracing, from the server's own process list. While a prepared
//! statement executes, `information_schema.PROCESSLIST` shows its text (with its placeholders) on the row of
//! the OS thread running it (`TID`, command `Execute`). A sample of the list, read between two monotonic
//! instants, is joined with the executions the tracer saw on the same thread in that window: when every
//! execution there was of one prepared statement, the text is that statement's.
//!
//! A thread runs one statement at a time and its executions arrive in order, so a sample is joined only once
//! an execution of its thread that began after the sample has arrived: everything that overlapped it is in.

use std::collections::{HashMap, HashSet, VecDeque};

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
    /// (OS thread id, statement text)
    pub rows: Vec<(u32, String)>,
}

/// How long executions and samples are kept for joining.
const KEEP_NS: u64 = 5_000_000_000;
/// Executions and samples kept at most (a busy server runs tens of thousands of statements a second).
const MAX_EXECUTIONS: usize = 500_000;
const MAX_SAMPLES: usize = 1_000;

#[derive(Default)]
pub struct TextFinder {
    executions: VecDeque<Execution>,
    /// The start of the latest execution seen per thread.
    latest_start: HashMap<u32, u64>,
    samples: VecDeque<Sample>,
    /// Statements whose executions were seen without their text, and not found yet.
    wanted: HashSet<StatementKey>,
    found: HashMap<StatementKey, String>,
    /// Samples joined, and those that named one statement.
    pub samples_joined: u64,
    pub samples_named: u64,
}

impl TextFinder {
    /// An execution traced; `known`: its text is known already.
    pub fn execution(&mut self, e: Execution, known: bool) {
        if !known && !self.found.contains_key(&e.key) {
            self.wanted.insert(e.key);
        }
        let latest = self.latest_start.entry(e.tid).or_default();
        *latest = (*latest).max(e.start_ns);
        if self.executions.len() >= MAX_EXECUTIONS {
            self.executions.pop_front();
        }
        self.executions.push_back(e);
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
                || sample.rows.iter().all(|(tid, _)| {
                    self.latest_start
                        .get(tid)
                        .is_some_and(|&start| start > sample.after_ns)
                });
            if !settled {
                if now_ns.saturating_sub(sample.after_ns) < KEEP_NS {
                    waiting.push_back(sample);
                }
                continue;
            }
            self.samples_joined += 1;
            for (tid, text) in &sample.rows {
                let mut keys = self
                    .executions
                    .iter()
                    .filter(|e| {
                        e.tid == *tid && e.start_ns <= sample.after_ns && e.end_ns >= sample.before_ns
                    })
                    .map(|e| e.key);
                let Some(key) = keys.next() else { continue };
                if keys.any(|k| k != key) {
                    continue; // two statements ran in the window: which one it showed is unknown
                }
                self.samples_named += 1;
                if self.wanted.remove(&key) {
                    self.found.insert(key, text.clone());
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
        named
    }

    /// A statement closed, or its connection gone: a later statement may reuse the id.
    pub fn forget(&mut self, key: &StatementKey) {
        self.found.remove(key);
        self.wanted.remove(key);
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
            rows: rows.iter().map(|(t, s)| (*t, s.to_string())).collect(),
        }
    }

    #[test]
    fn a_sample_names_the_one_statement_its_thread_ran_then() {
        let mut f = TextFinder::default();
        f.execution(exec(1, 100, 200, 5), false);
        f.execution(exec(1, 210, 300, 5), false);
        f.sample(sample(150, 250, &[(1, "SELECT c FROM t WHERE id=?")]));
        // Thread 1 has not moved past the sample yet: nothing is joined.
        assert!(f.join(1000, false).is_empty());
        f.execution(exec(1, 310, 400, 6), false);
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
        f.execution(exec(1, 100, 200, 5), false);
        f.execution(exec(1, 210, 300, 6), false);
        f.execution(exec(1, 400, 500, 6), false);
        f.sample(sample(150, 250, &[(1, "DELETE FROM t WHERE id=?")]));
        assert!(f.join(1000, false).is_empty());
        assert_eq!(f.samples_named, 0);
        // Nor one whose text is known already: its text is not the unknown one's.
        f.execution(exec(2, 100, 200, 8), true);
        f.execution(exec(2, 300, 400, 8), true);
        f.sample(sample(150, 160, &[(2, "INSERT INTO t VALUES (?)")]));
        assert!(f.join(1000, false).is_empty());
        assert!(f.text(&(7, 8)).is_none());
    }

    #[test]
    fn old_executions_and_samples_are_forgotten() {
        let mut f = TextFinder::default();
        f.execution(exec(1, 100, 200, 5), false);
        f.sample(sample(150, 250, &[(3, "SELECT ?")]));
        assert!(f.join(KEEP_NS + 1000, false).is_empty());
        assert!(f.samples.is_empty() && f.executions.is_empty());
    }
}
