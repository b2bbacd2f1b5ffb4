//! A server's DB load for `/metrics`, from the session history's seconds: each second sampled adds the active
//! sessions (those running a statement) to counters by state, by statement, by user and by client host, so that a
//! counter's rate is the average active sessions (AWS Performance Insights' "DB load"); and what the last second
//! showed, as gauges: the sessions by state, and how long a blocker has been holding others up.
//!
//! Statements, users and hosts are ranked as the statement series are: the first `top` to come have series of
//! their own, the rest add to `other`, and at a window's end one that took more than twice the load of the least
//! loaded with series takes its place. A second costs no allocation, except for a name seen for the first time in
//! the window.

use std::{
    collections::HashMap,
    hash::{BuildHasher, BuildHasherDefault, DefaultHasher},
    time::{Duration, Instant},
};

use crate::history::{Second, SessionSample};

/// Users and client hosts with series of their own per server, at most (fewer if `--top` says so): a server has
/// a few accounts and hosts that matter, while a fleet of pods, each at an address of its own, would make a series
/// per pod and server.
pub const TOP_NAMES: usize = 20;

/// Names remembered per window as candidates for series of their own; the rest only add to `other`.
const MAX_CANDIDATES: usize = 10_000;

/// How long a blocker no waiter is seen behind still counts as holding others up: a waiter whose lock wait timed
/// out (`innodb_lock_wait_timeout`, 50 s by default) tries again a moment later, behind the same holder.
const HOLDING_GAP_S: i64 = 5;

/// How long the last second's gauges stand: past it (the sampler stopped), they are not exported.
const FRESH: Duration = Duration::from_secs(5);

/// What a session without a statement's text, a user or a host is counted under.
pub const UNKNOWN: &str = "(unknown)";

/// Session-seconds of one name with series of its own.
#[derive(Debug)]
struct Ranking {
    names: Box<[String]>,
    total: u64,
    /// In the window under way: what ranks them.
    window: u64,
}

/// Load by a name (a statement in its database, a user, a host), its series bounded to `top` and `other`.
#[derive(Debug)]
pub struct Ranked {
    top: usize,
    /// By the names' hash: a second's lookup makes no key.
    exposed: HashMap<u64, Ranking>,
    other: u64,
    candidates: HashMap<u64, Candidate>,
}

/// A name without series of its own, and its load in the window under way.
#[derive(Debug)]
struct Candidate {
    names: Box<[String]>,
    window: u64,
}

impl Ranked {
    fn new(top: usize) -> Ranked {
        Ranked {
            top,
            exposed: HashMap::new(),
            other: 0,
            candidates: HashMap::new(),
        }
    }

    /// One session-second of `names` (hashed as `key`).
    fn add(&mut self, key: u64, names: &[&str]) {
        let owned = || names.iter().map(|n| n.to_string()).collect();
        if let Some(r) = self.exposed.get_mut(&key) {
            r.total += 1;
            r.window += 1;
        } else if self.exposed.len() < self.top {
            let names = owned();
            self.exposed.insert(
                key,
                Ranking {
                    names,
                    total: 1,
                    window: 1,
                },
            );
        } else {
            self.other += 1;
            if let Some(c) = self.candidates.get_mut(&key) {
                c.window += 1;
            } else if self.candidates.len() < MAX_CANDIDATES {
                let names = owned();
                self.candidates.insert(key, Candidate { names, window: 1 });
            }
        }
    }

    /// A window ended: the names that took the most load in it get series, in place of those that took less than
    /// half as much.
    fn end_window(&mut self) {
        let mut candidates: Vec<(u64, Candidate)> = self.candidates.drain().collect();
        candidates
            .sort_by(|(_, a), (_, b)| b.window.cmp(&a.window).then_with(|| a.names.cmp(&b.names)));
        let mut least: Vec<(u64, u64, &[String])> = self
            .exposed
            .iter()
            .map(|(k, r)| (*k, r.window, &r.names[..]))
            .collect();
        least.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| a.2.cmp(b.2)));
        let least: Vec<(u64, u64)> = least.into_iter().map(|(k, w, _)| (k, w)).collect();
        for ((key, c), (evicted, its_load)) in candidates.into_iter().zip(least) {
            if c.window <= its_load.saturating_mul(2) {
                break;
            }
            self.exposed.remove(&evicted);
            self.exposed.insert(
                key,
                Ranking {
                    names: c.names,
                    total: 0,
                    window: 0,
                },
            );
        }
        for r in self.exposed.values_mut() {
            r.window = 0;
        }
    }

    /// Each name with series of its own and its session-seconds, sorted by name; then `other`'s, once it has any.
    pub fn rows(&self) -> (Vec<(&[String], u64)>, u64) {
        let mut rows: Vec<(&[String], u64)> = self
            .exposed
            .values()
            .map(|r| (&r.names[..], r.total))
            .collect();
        rows.sort();
        (rows, self.other)
    }
}

/// A state's session-seconds, and its sessions at the last second.
#[derive(Debug)]
pub struct StateLoad {
    pub state: String,
    /// Active session-seconds (none for `IDLE_IN_TRANSACTION`, which is not load).
    pub seconds: u64,
    pub now: u32,
}

/// Since when a root blocker has been holding others up, and when it last did.
#[derive(Debug)]
struct Holding {
    since: f64,
    seen: i64,
}

/// One server's DB load.
#[derive(Debug)]
pub struct Load {
    /// Few (the project's causes): looked up by a scan, which makes no key.
    states: Vec<StateLoad>,
    pub statements: Ranked,
    pub users: Ranked,
    pub hosts: Ranked,
    /// The root blockers seen lately, by connection.
    holding: HashMap<u64, Holding>,
    held_s: f64,
    sampled: Option<Instant>,
}

impl Load {
    /// `top` statements with series of their own; users and hosts, up to [`TOP_NAMES`].
    pub fn new(top: usize) -> Load {
        Load {
            states: Vec::new(),
            statements: Ranked::new(top),
            users: Ranked::new(top.min(TOP_NAMES)),
            hosts: Ranked::new(top.min(TOP_NAMES)),
            holding: HashMap::new(),
            held_s: 0.0,
            sampled: None,
        }
    }

    /// A second sampled: each active session adds a second to its state, statement, user and host.
    pub fn add_second(&mut self, second: &Second) {
        for s in &mut self.states {
            s.now = 0;
        }
        for s in &second.sessions {
            let state = match self.states.iter().position(|l| l.state == s.state) {
                Some(i) => &mut self.states[i],
                None => {
                    self.states.push(StateLoad {
                        state: s.state.to_string(),
                        seconds: 0,
                        now: 0,
                    });
                    self.states.last_mut().expect("just pushed")
                }
            };
            state.now += 1;
            if !s.is_active() {
                continue;
            }
            state.seconds += 1;
            let db = s.db.as_deref().unwrap_or_default();
            let fingerprint = s.fingerprint.as_deref().unwrap_or(UNKNOWN);
            self.statements
                .add(hash(&[db, fingerprint]), &[db, fingerprint]);
            let user = s.user.as_deref().unwrap_or(UNKNOWN);
            self.users.add(hash(&[user]), &[user]);
            let host = s.host.as_deref().unwrap_or(UNKNOWN);
            self.hosts.add(hash(&[host]), &[host]);
        }
        self.follow_blockers(second.ts, &second.sessions);
        self.sampled = Some(Instant::now());
    }

    /// How long each root blocker has been holding others up: since the longest waiter behind it began its
    /// statement, when first seen, and from then on for as long as someone waits behind it (with gaps of
    /// [`HOLDING_GAP_S`] at most).
    fn follow_blockers(&mut self, ts: i64, sessions: &[SessionSample]) {
        for s in sessions {
            let Some(root) = s.root_blocker else { continue };
            let began = ts as f64 - s.statement_s.unwrap_or(0.0);
            let h = self.holding.entry(root).or_insert(Holding {
                since: began,
                seen: ts,
            });
            h.since = h.since.min(began);
            h.seen = ts;
        }
        self.holding.retain(|_, h| ts - h.seen <= HOLDING_GAP_S);
        let held_s = self
            .holding
            .values()
            .map(|h| (h.seen as f64 - h.since).max(0.0))
            .fold(0.0, f64::max);
        // To the millisecond, as the samples' times are.
        self.held_s = (held_s * 1000.0).round() / 1000.0;
    }

    /// A window ended: statements, users and hosts ranked again.
    pub fn end_window(&mut self) {
        self.statements.end_window();
        self.users.end_window();
        self.hosts.end_window();
    }

    /// Each state seen since the server was attached, sorted.
    pub fn states(&self) -> Vec<&StateLoad> {
        let mut states: Vec<&StateLoad> = self.states.iter().collect();
        states.sort_by(|a, b| a.state.cmp(&b.state));
        states
    }

    /// Whether the last second is recent enough for its gauges to stand.
    pub fn fresh(&self) -> bool {
        self.sampled.is_some_and(|at| at.elapsed() < FRESH)
    }

    /// The longest a root blocker has been holding others up, seconds, as of the last second.
    pub fn held_s(&self) -> f64 {
        self.held_s
    }
}

/// The names' hash, the same for the same names throughout the agent's run.
fn hash(names: &[&str]) -> u64 {
    BuildHasherDefault::<DefaultHasher>::default().hash_one(names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::IDLE_IN_TRANSACTION;

    fn session(conn: u64, state: &str, fingerprint: &str, user: &str) -> SessionSample {
        SessionSample {
            conn,
            user: Some(user.into()),
            host: Some("10.0.0.1".into()),
            db: Some("d".into()),
            statement: None,
            fingerprint: Some(fingerprint.into()),
            statement_s: Some(1.0),
            transaction_s: None,
            state: state.to_string().into(),
            object: None,
            blocker: None,
            root_blocker: None,
            holder_statements: Vec::new(),
        }
    }

    fn second(ts: i64, sessions: Vec<SessionSample>) -> Second {
        Second {
            ts,
            server: "s".into(),
            sessions,
        }
    }

    fn state<'a>(l: &'a Load, name: &str) -> &'a StateLoad {
        l.states.iter().find(|s| s.state == name).unwrap()
    }

    #[test]
    fn each_second_adds_the_active_sessions_by_state_and_not_the_idle_ones() {
        let mut l = Load::new(10);
        for ts in 0..3 {
            l.add_second(&second(
                ts,
                vec![
                    session(1, "CPU", "SELECT ?", "app"),
                    session(2, "row lock", "UPDATE t SET k = ?", "app"),
                    session(3, "row lock", "UPDATE t SET k = ?", "batch"),
                    session(4, IDLE_IN_TRANSACTION, "", "app"),
                ],
            ));
        }
        assert_eq!(
            (state(&l, "CPU").seconds, state(&l, "row lock").seconds),
            (3, 6)
        );
        assert_eq!(state(&l, "row lock").now, 2);
        assert_eq!(
            (
                state(&l, IDLE_IN_TRANSACTION).seconds,
                state(&l, IDLE_IN_TRANSACTION).now
            ),
            (0, 1)
        );
        let (users, other) = l.users.rows();
        assert_eq!(users.len(), 2);
        assert_eq!(users[0], (&["app".to_string()][..], 6));
        assert_eq!(other, 0);
        // The next second without row locks: none now, the seconds stay.
        l.add_second(&second(3, vec![session(1, "CPU", "SELECT ?", "app")]));
        assert_eq!(state(&l, "row lock").now, 0);
        assert_eq!(state(&l, "row lock").seconds, 6);
    }

    #[test]
    fn past_the_top_names_load_adds_to_other_until_it_takes_more() {
        let mut l = Load::new(1);
        l.add_second(&second(0, vec![session(1, "CPU", "SELECT a", "u")]));
        for ts in 1..4 {
            l.add_second(&second(ts, vec![session(2, "CPU", "SELECT b", "u")]));
        }
        let (rows, other) = l.statements.rows();
        assert_eq!(
            rows,
            vec![(&["d".to_string(), "SELECT a".to_string()][..], 1)]
        );
        assert_eq!(other, 3);
        // b took three times a's load in the window: it takes a's place, from zero.
        l.end_window();
        l.add_second(&second(4, vec![session(2, "CPU", "SELECT b", "u")]));
        let (rows, other) = l.statements.rows();
        assert_eq!(
            rows,
            vec![(&["d".to_string(), "SELECT b".to_string()][..], 1)]
        );
        assert_eq!(other, 3);
    }

    #[test]
    fn a_blocker_holds_others_up_across_a_waiter_s_retry() {
        let mut l = Load::new(10);
        let waiter = |conn, waited| SessionSample {
            root_blocker: Some(7),
            statement_s: Some(waited),
            ..session(conn, "row lock", "UPDATE t SET k = ?", "app")
        };
        // Seen first when its waiter had waited 10 s.
        l.add_second(&second(100, vec![waiter(1, 10.0)]));
        assert_eq!(l.held_s(), 10.0);
        // The waiter timed out; two seconds later another waits behind the same holder.
        l.add_second(&second(101, vec![]));
        l.add_second(&second(102, vec![]));
        l.add_second(&second(103, vec![waiter(2, 0.5)]));
        assert_eq!(l.held_s(), 13.0);
        // Nobody behind it for longer than the gap: it holds no one up.
        for ts in 104..=109 {
            l.add_second(&second(ts, vec![]));
        }
        assert_eq!(l.held_s(), 0.0);
        assert!(l.fresh());
    }
}
