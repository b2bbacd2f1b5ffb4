//! The statements each connection ran lately, as the statement pipeline saw them: what a holder idle in its
//! transaction ran in it, for `queries`' and `report`'s holders and the agent's session history.

use std::{collections::VecDeque, sync::Mutex};

// Keyed by connection ids, which no client chooses: hashed the fast way.
use rustc_hash::FxHashMap as HashMap;

use super::record::{QueryRecord, Ran, Text};
use crate::wire::fingerprint;

/// The statements each connection ran lately, each with when it ended (ns since the epoch).
#[derive(Default)]
pub struct Recent {
    by_conn: Mutex<HashMap<u64, VecDeque<(i64, Text)>>>,
}

/// Statements kept per connection, connections kept, and for how long.
const RECENT_PER_CONN: usize = 8;
const RECENT_CONNS: usize = 20_000;
const RECENT_NS: i64 = 3600 * SECOND_NS;

pub const SECOND_NS: i64 = 1_000_000_000;

impl Recent {
    /// Connection `conn` ran `text` ending at `ts` (ns since the epoch).
    pub fn add(&self, conn: u64, text: &str, ts: i64) {
        self.add_normalized(conn, fingerprint::normalize(text).into(), ts);
    }

    /// The same, its literals already hidden. The same text as the last kept of `conn` is kept once: a statement
    /// both sampled while it ran and traced when it ended, or run twice in a row.
    pub fn add_normalized(&self, conn: u64, text: Text, ts: i64) {
        self.add_all(std::iter::once((conn, text, ts)));
    }

    /// Many at once, `(conn, text, ts)` each, under one lock.
    pub fn add_all(&self, ran: impl Iterator<Item = (u64, Text, i64)>) {
        let mut by_conn = self.by_conn.lock().unwrap_or_else(|e| e.into_inner());
        for (conn, text, ts) in ran {
            Recent::add_one(&mut by_conn, conn, text, ts);
        }
    }

    fn add_one(by_conn: &mut HashMap<u64, VecDeque<(i64, Text)>>, conn: u64, text: Text, ts: i64) {
        if by_conn.len() >= RECENT_CONNS && !by_conn.contains_key(&conn) {
            by_conn.retain(|_, q| q.back().is_some_and(|(t, _)| *t >= ts - RECENT_NS));
            if by_conn.len() >= RECENT_CONNS {
                return;
            }
        }
        let q = by_conn.entry(conn).or_default();
        if let Some(last) = q.back_mut().filter(|(_, t)| **t == *text) {
            last.0 = last.0.max(ts);
            return;
        }
        if q.len() == RECENT_PER_CONN {
            q.pop_front();
        }
        q.push_back((ts, text));
    }

    /// What `conn` ran since `since` (all it kept without it), oldest first: from the last statement that began a
    /// transaction, where one is among them (`since` is when the transaction was first seen open, less a second).
    pub fn of(&self, conn: u64, since: Option<i64>) -> Vec<(i64, Text)> {
        self.between(conn, since, i64::MAX)
    }

    /// The same, of what ended by `until` (ns since the epoch): a holder's transaction as it was while a statement
    /// waited for it.
    pub fn between(&self, conn: u64, since: Option<i64>, until: i64) -> Vec<(i64, Text)> {
        let by_conn = self.by_conn.lock().unwrap_or_else(|e| e.into_inner());
        let mut ran: Vec<(i64, Text)> = by_conn.get(&conn).map_or_else(Vec::new, |q| {
            q.iter()
                .filter(|(t, _)| since.is_none_or(|s| *t >= s) && *t <= until)
                .cloned()
                .collect()
        });
        if let Some(begun) = ran.iter().rposition(|(_, t)| begins_transaction(t)) {
            ran.drain(..begun);
        }
        ran
    }

    /// What `conn`'s open transaction had run by `until` (ns since the epoch), oldest first: from its last `BEGIN`,
    /// where one is kept and no COMMIT or ROLLBACK came after it (else nothing: where it began is not known).
    pub fn transaction_until(&self, conn: u64, until: i64) -> Vec<(i64, Text)> {
        let ran = self.between(conn, None, until);
        let begun = ran.first().is_some_and(|(_, t)| begins_transaction(t));
        if !begun || ran.iter().skip(1).any(|(_, t)| ends_transaction(t)) {
            return Vec::new();
        }
        ran
    }

    /// [`Recent::of`]'s texts.
    pub fn texts_of(&self, conn: u64, since: Option<i64>) -> Vec<String> {
        self.of(conn, since)
            .into_iter()
            .map(|(_, t)| t.to_string())
            .collect()
    }

    /// Gives each of `record`'s waits' holders what its transaction ran: since its transaction began, where the
    /// server said when, else since its last `BEGIN` for one idle in its transaction.
    pub fn name_holders(&self, record: &mut QueryRecord) {
        let ended = record.ended_ns();
        for h in record.waits.iter_mut().filter_map(|w| w.holder.as_mut()) {
            let until = if h.seen_at_ns > 0 {
                h.seen_at_ns
            } else {
                ended
            };
            let since = h
                .transaction_s
                .map(|t| (ended / SECOND_NS - t as i64 - 1) * SECOND_NS);
            if since.is_none() && h.command.as_deref() != Some("Sleep") {
                continue;
            }
            h.ran = self
                .between(h.conn, since, until)
                .into_iter()
                .rev()
                .map(|(at, text)| Ran::new(at, &text))
                .collect();
            h.ran_not_seen = h.ran.is_empty() && h.command.as_deref() == Some("Sleep");
        }
    }

    /// Forgets a connection that ended its transaction (its next holds none of these).
    pub fn forget(&self, conns: impl Iterator<Item = u64>) {
        let mut by_conn = self.by_conn.lock().unwrap_or_else(|e| e.into_inner());
        for c in conns {
            by_conn.remove(&c);
        }
    }
}

impl std::fmt::Debug for Recent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Recent")
    }
}

/// `BEGIN`, `START TRANSACTION` (any case, any options after).
fn begins_transaction(text: &str) -> bool {
    let words: Vec<String> = text
        .split_whitespace()
        .take(2)
        .map(str::to_ascii_uppercase)
        .collect();
    matches!(words.first().map(String::as_str), Some("BEGIN" | "BEGIN;"))
        || (words.first().map(String::as_str) == Some("START")
            && words.get(1).is_some_and(|w| w.starts_with("TRANSACTION")))
}

/// `COMMIT`, `ROLLBACK` (any case, not `ROLLBACK TO SAVEPOINT`).
fn ends_transaction(text: &str) -> bool {
    let mut words = text
        .split_whitespace()
        .map(|w| w.trim_end_matches(';').to_ascii_uppercase());
    match words.next().as_deref() {
        Some("COMMIT") => true,
        Some("ROLLBACK") => words.next().as_deref() != Some("TO"),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_s_statements_start_at_its_transaction() {
        let recent = Recent::default();
        for (i, text) in [
            "SELECT CONNECTION_ID()",
            "begin",
            "UPDATE t SET k = 1 WHERE id = 2",
            "SELECT 'held'",
        ]
        .into_iter()
        .enumerate()
        {
            recent.add(7, text, (100 + i as i64) * SECOND_NS);
        }
        assert_eq!(
            recent.texts_of(7, Some(100 * SECOND_NS)),
            ["begin", "UPDATE t SET k = ? WHERE id = ?", "SELECT ?"]
        );
        // Without a statement that began it (autocommit off), what was seen since.
        assert_eq!(
            recent.texts_of(7, Some(102 * SECOND_NS)),
            ["UPDATE t SET k = ? WHERE id = ?", "SELECT ?"]
        );
        // Sampled while it ran, then traced when it ended: kept once.
        recent.add(7, "SELECT 'held'", 104 * SECOND_NS);
        assert_eq!(
            recent.of(7, Some(103 * SECOND_NS)),
            [(104 * SECOND_NS, "SELECT ?".into())]
        );
        // As it was while another statement waited for it, which ended before its last.
        assert_eq!(
            recent.between(7, None, 103 * SECOND_NS),
            [
                (101 * SECOND_NS, "begin".into()),
                (102 * SECOND_NS, "UPDATE t SET k = ? WHERE id = ?".into())
            ]
        );
        // A releaser's open transaction by the time it let a wait go: from its BEGIN, if nothing ended it since.
        assert_eq!(
            recent.transaction_until(7, 103 * SECOND_NS),
            recent.between(7, None, 103 * SECOND_NS)
        );
        assert!(recent.transaction_until(7, 100 * SECOND_NS).is_empty());
        recent.add(7, "COMMIT", 105 * SECOND_NS);
        assert!(recent.transaction_until(7, 106 * SECOND_NS).is_empty());
        assert!(ends_transaction("rollback;") && !ends_transaction("ROLLBACK TO SAVEPOINT a"));
        assert!(begins_transaction("START TRANSACTION READ ONLY"));
        assert!(!begins_transaction("STARTLE"));
        assert!(recent.of(8, None).is_empty());
    }
}
