//! The history read back: DB load (average active sessions) over a range by state, the top statements, users,
//! hosts and blockers of the range, and the sessions at a moment with who blocked whom. The same answers for
//! `myprobe history`, the agent's HTTP API and its page.

use std::collections::{BTreeMap, HashMap};

use anyhow::Result;
use rusqlite::{params, Connection};
use serde::{Deserialize, Serialize};

use super::{store::sample_of, SessionSample, IDLE_IN_TRANSACTION};

/// DB load over a range.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Range {
    pub from: i64,
    pub to: i64,
    /// Seconds per point.
    pub step: i64,
    /// Whether it was read from every sample, or from the per-minute sums (a range older than the samples kept).
    pub per_minute: bool,
    /// The servers of the range.
    pub servers: Vec<String>,
    /// Each point's start and its load by state (average active sessions over its step).
    pub points: Vec<Point>,
    /// The range's load by state, most first.
    pub states: Vec<Share>,
    pub statements: Vec<Share>,
    pub users: Vec<Share>,
    pub hosts: Vec<Share>,
    /// The connections others waited behind (the roots of their chains), by the load they held up.
    pub blockers: Vec<Share>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Point {
    pub ts: i64,
    pub load: BTreeMap<String, f64>,
}

/// One key's load over the range: average active sessions.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Share {
    pub key: String,
    pub load: f64,
}

/// The sessions at a moment.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Moment {
    /// The second asked for, and the second sampled nearest before it (none within `NEAR_S`).
    pub asked: i64,
    pub servers: Vec<ServerMoment>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ServerMoment {
    pub server: String,
    pub ts: i64,
    pub sessions: Vec<SessionSample>,
}

/// How far before the second asked a sample may be and still stand for it.
const NEAR_S: i64 = 5;

/// How many keys each top list shows.
pub const TOP: usize = 10;

/// The load of `from..to` in about `points` points, from every sample where they are kept, else the minutes.
pub fn range(db: &Connection, from: i64, to: i64, points: i64) -> Result<Range> {
    let to = to.max(from + 1);
    let oldest: Option<i64> = db.query_row("SELECT min(ts) FROM samples", [], |r| r.get(0))?;
    let per_minute = oldest.is_none_or(|o| from < o - 60);
    let mut step = ((to - from) / points.max(1)).max(1);
    if per_minute {
        step = step.max(60).div_euclid(60) * 60;
    }
    let seconds = (to - from) as f64;
    let (table, ts, count) = if per_minute {
        ("minutes", "minute", "samples")
    } else {
        ("samples", "ts", "1")
    };
    let active = format!("{ts} >= ?1 AND {ts} < ?2 AND state != '{IDLE_IN_TRANSACTION}'");
    let mut points: BTreeMap<i64, BTreeMap<String, f64>> = BTreeMap::new();
    {
        let sql = format!(
            "SELECT ({ts} - ?1) / ?3, state, sum({count}) FROM {table} WHERE {active} GROUP BY 1, 2"
        );
        let mut q = db.prepare(&sql)?;
        let mut rows = q.query(params![from, to, step])?;
        while let Some(r) = rows.next()? {
            let (bucket, state, n): (i64, String, i64) = (r.get(0)?, r.get(1)?, r.get(2)?);
            // The last point may be shorter than a step.
            let start = from + bucket * step;
            let width = (to.min(start + step) - start).max(1) as f64;
            *points.entry(start).or_default().entry(state).or_default() += n as f64 / width;
        }
    }
    let shares = |key: &str, join: &str, filter: &str| -> Result<Vec<Share>> {
        let sql = format!(
            "SELECT {key}, sum({count}) FROM {table} {join} WHERE {active} {filter} GROUP BY 1 \
             ORDER BY 2 DESC LIMIT {TOP}"
        );
        let mut q = db.prepare(&sql)?;
        let rows = q.query_map(params![from, to], |r| {
            Ok(Share {
                key: r.get::<_, Option<String>>(0)?.unwrap_or_default(),
                load: r.get::<_, i64>(1)? as f64 / seconds,
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    };
    let statement_join = format!("LEFT JOIN statements s ON s.id = {table}.statement");
    let blocker_filter = if per_minute {
        "AND root_blocker != 0"
    } else {
        "AND root_blocker IS NOT NULL"
    };
    let servers = {
        let sql = format!(
            "SELECT DISTINCT v.name FROM {table} JOIN servers v ON v.id = {table}.server WHERE {ts} >= ?1 \
             AND {ts} < ?2 ORDER BY 1"
        );
        let mut q = db.prepare(&sql)?;
        let rows = q.query_map(params![from, to], |r| r.get(0))?;
        rows.collect::<rusqlite::Result<Vec<String>>>()?
    };
    Ok(Range {
        from,
        to,
        step,
        per_minute,
        servers,
        points: points
            .into_iter()
            .map(|(ts, load)| Point { ts, load })
            .collect(),
        states: shares("state", "", "")?,
        statements: shares("s.text", &statement_join, "AND s.text IS NOT NULL")?,
        users: shares("user", "", "AND user IS NOT NULL AND user != ''")?,
        hosts: shares("host", "", "AND host IS NOT NULL AND host != ''")?,
        blockers: shares(
            "'connection ' || CAST(root_blocker AS TEXT)",
            "",
            blocker_filter,
        )?,
    })
}

/// The sessions of each server at the last second sampled at or before `at` (within `NEAR_S`).
pub fn moment(db: &Connection, at: i64) -> Result<Moment> {
    let mut q = db.prepare(
        "SELECT server, max(ts) FROM samples WHERE ts <= ?1 AND ts > ?2 GROUP BY server ORDER BY server",
    )?;
    let seconds: Vec<(i64, i64)> = q
        .query_map(params![at, at - NEAR_S], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let mut servers = Vec::new();
    for (server, ts) in seconds {
        let name: String =
            db.query_row("SELECT name FROM servers WHERE id = ?1", [server], |r| {
                r.get(0)
            })?;
        let mut q = db.prepare_cached(
            "SELECT samples.*, s.text, s.fingerprint FROM samples LEFT JOIN statements s ON s.id = \
             samples.statement WHERE ts = ?1 AND server = ?2 ORDER BY statement_ms DESC, conn",
        )?;
        let sessions = q
            .query_map(params![ts, server], sample_of)?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        servers.push(ServerMoment {
            server: name,
            ts,
            sessions,
        });
    }
    Ok(Moment { asked: at, servers })
}

/// A connection others waited behind over a range (the root of their chains), on one server.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Incident {
    pub server: String,
    pub root_blocker: u64,
    /// How many connections waited behind it, directly or through others.
    pub waiters: u64,
    /// The first and the last second one waited.
    pub first: i64,
    pub last: i64,
    /// The seconds they waited, summed over the sessions.
    pub session_s: i64,
    /// The second the most sessions waited behind it, the longest waiting of such seconds: the moment to look at.
    pub worst: i64,
}

/// The `n` connections that held up the most session time over `from..to`, from every sample (none where the
/// samples are gone: the minutes keep no moment).
pub fn incidents(db: &Connection, from: i64, to: i64, n: usize) -> Result<Vec<Incident>> {
    let mut q = db.prepare(&format!(
        "SELECT samples.server, v.name, root_blocker, count(DISTINCT conn), min(ts), max(ts), count(*) \
         FROM samples JOIN servers v ON v.id = samples.server WHERE ts >= ?1 AND ts < ?2 \
         AND root_blocker IS NOT NULL AND state != '{IDLE_IN_TRANSACTION}' \
         GROUP BY samples.server, root_blocker ORDER BY 7 DESC, 5 LIMIT ?3"
    ))?;
    let rows = q
        .query_map(params![from, to, n as i64], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                Incident {
                    server: r.get(1)?,
                    root_blocker: r.get::<_, i64>(2)? as u64,
                    waiters: r.get::<_, i64>(3)? as u64,
                    first: r.get(4)?,
                    last: r.get(5)?,
                    session_s: r.get(6)?,
                    worst: r.get(4)?,
                },
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let mut worst = db.prepare(
        "SELECT ts FROM samples WHERE server = ?1 AND root_blocker = ?2 AND ts >= ?3 AND ts < ?4 \
         GROUP BY ts ORDER BY count(*) DESC, sum(statement_ms) DESC, ts LIMIT 1",
    )?;
    let mut out = Vec::with_capacity(rows.len());
    for (server, mut incident) in rows {
        incident.worst = worst.query_row(
            params![server, incident.root_blocker as i64, from, to],
            |r| r.get(0),
        )?;
        out.push(incident);
    }
    Ok(out)
}

/// A moment's chains of who blocked whom: each root blocker (a connection that waits for nothing) with the
/// connections waiting behind it, directly or through others, in the order of the chain.
pub fn chains(sessions: &[SessionSample]) -> Vec<(u64, Vec<&SessionSample>)> {
    let mut by_root: HashMap<u64, Vec<&SessionSample>> = HashMap::new();
    for s in sessions.iter().filter(|s| s.root_blocker.is_some()) {
        by_root
            .entry(s.root_blocker.unwrap_or_default())
            .or_default()
            .push(s);
    }
    let mut out: Vec<(u64, Vec<&SessionSample>)> = by_root.into_iter().collect();
    for (_, waiters) in &mut out {
        // Those directly behind the root first, then the longest waiting.
        waiters.sort_by(|a, b| {
            (a.blocker != a.root_blocker)
                .cmp(&(b.blocker != b.root_blocker))
                .then(
                    b.statement_s
                        .partial_cmp(&a.statement_s)
                        .unwrap_or(std::cmp::Ordering::Equal),
                )
        });
    }
    out.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(&b.0)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{
        store::{Retention, Store},
        Second,
    };

    fn sample(conn: u64, state: &str, text: Option<&str>, root: Option<u64>) -> SessionSample {
        SessionSample {
            conn,
            user: Some("app".into()),
            host: Some("10.0.0.1".into()),
            db: Some("sbtest".into()),
            statement: text.map(str::to_string),
            fingerprint: text.map(|t| t.to_lowercase()),
            statement_s: Some(1.5),
            transaction_s: None,
            state: state.to_string().into(),
            object: None,
            blocker: root,
            root_blocker: root,
            holder_statements: Vec::new(),
        }
    }

    #[test]
    fn a_range_and_a_moment_read_back_what_was_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.sqlite");
        let mut store = Store::open(&path, Retention::default()).unwrap();
        let t0 = 1_796_526_600;
        for i in 0..120 {
            let mut sessions = vec![
                sample(1, "CPU", Some("SELECT ?"), None),
                sample(4, "CPU", Some("SELECT ?"), None),
            ];
            if (30..90).contains(&i) {
                let mut holder = sample(7, IDLE_IN_TRANSACTION, None, None);
                holder.holder_statements = vec!["UPDATE t SET k = k + ? WHERE id = ?".into()];
                sessions.push(holder);
                sessions.push(sample(
                    2,
                    "row lock",
                    Some("UPDATE t SET k = ? WHERE id = ?"),
                    Some(7),
                ));
                sessions.push(sample(
                    3,
                    "row lock",
                    Some("UPDATE t SET k = ? WHERE id = ?"),
                    Some(7),
                ));
            }
            store
                .write(&Second {
                    ts: t0 + i,
                    server: "one".into(),
                    sessions,
                })
                .unwrap();
        }
        let db = Store::open_read(&path).unwrap();
        let r = range(&db, t0, t0 + 120, 12).unwrap();
        assert!(!r.per_minute);
        assert_eq!(r.step, 10);
        assert_eq!(r.points.len(), 12);
        assert_eq!(r.points[0].load.get("CPU"), Some(&2.0));
        assert_eq!(r.points[4].load.get("row lock"), Some(&2.0));
        // Idle in a transaction is no load.
        assert!(r
            .points
            .iter()
            .all(|p| !p.load.contains_key(IDLE_IN_TRANSACTION)));
        assert_eq!(r.states[0].key, "CPU");
        assert!((r.states[1].load - 1.0).abs() < 1e-9, "{:?}", r.states);
        assert_eq!(r.statements[0].key, "SELECT ?");
        assert_eq!(r.blockers[0].key, "connection 7");
        let m = moment(&db, t0 + 60).unwrap();
        assert_eq!(m.servers.len(), 1);
        assert_eq!(m.servers[0].ts, t0 + 60);
        assert_eq!(m.servers[0].sessions.len(), 5);
        let holder = m.servers[0].sessions.iter().find(|s| s.conn == 7).unwrap();
        assert_eq!(holder.holder_statements.len(), 1);
        let chains = chains(&m.servers[0].sessions);
        assert_eq!(chains.len(), 1);
        assert_eq!(chains[0].0, 7);
        assert_eq!(chains[0].1.len(), 2);
        let incidents = incidents(&db, t0, t0 + 120, 3).unwrap();
        assert_eq!(incidents.len(), 1, "{incidents:?}");
        let i = &incidents[0];
        assert_eq!((i.root_blocker, i.waiters), (7, 2));
        assert_eq!((i.first, i.last, i.session_s), (t0 + 30, t0 + 89, 120));
        assert_eq!(i.worst, t0 + 30);
        assert!(super::incidents(&db, t0, t0 + 30, 3).unwrap().is_empty());
        // Nothing sampled near it.
        assert!(moment(&db, t0 - 100).unwrap().servers.is_empty());
        // A range before the samples kept is read from the minutes.
        let old = range(&db, t0 - 3600, t0 + 120, 10).unwrap();
        assert!(old.per_minute);
        let total: f64 = old.states.iter().map(|s| s.load).sum();
        assert!((total * (3720.0) - 360.0).abs() < 1e-6, "{:?}", old.states);
    }

    #[test]
    fn retention_keeps_the_store_within_its_age_and_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.sqlite");
        let mut store = Store::open(&path, Retention::default()).unwrap();
        let t0 = 1_796_526_600;
        let text = "SELECT c FROM sbtest1 WHERE id = ? AND pad = ? AND k IN (?+)".repeat(4);
        for i in 0..2_000 {
            let mut sessions: Vec<SessionSample> = (0..20)
                .map(|c| sample(c, "CPU", Some(&format!("{text} /* {c} */")), None))
                .collect();
            // A statement seen in the first minutes only.
            if i < 100 {
                sessions.push(sample(20, "CPU", Some("SELECT early"), None));
            }
            store
                .write(&Second {
                    ts: t0 + i,
                    server: "one".into(),
                    sessions,
                })
                .unwrap();
        }
        let small = Retention {
            samples_s: 1_000,
            minutes_s: 86_400,
            max_bytes: 1 << 20,
        };
        store.retain(t0 + 2_000, &small).unwrap();
        let db = Store::open_read(&path).unwrap();
        let count = |sql: &str| -> i64 { db.query_row(sql, [], |r| r.get(0)).unwrap() };
        let early = "SELECT count(*) FROM statements WHERE text = 'SELECT early'";
        // Its minutes still refer to it.
        assert_eq!(count(early), 1);
        store
            .retain(
                t0 + 2_000,
                &Retention {
                    minutes_s: 1_000,
                    ..small
                },
            )
            .unwrap();
        assert_eq!(count(early), 0);
        let dangling =
            "SELECT count(*) FROM samples WHERE statement NOT IN (SELECT id FROM statements)";
        assert_eq!(count(dangling), 0);
        assert_eq!(count("SELECT count(DISTINCT statement) FROM samples"), 20);
        let oldest: i64 = db
            .query_row("SELECT min(ts) FROM samples", [], |r| r.get(0))
            .unwrap();
        assert!(oldest >= t0 + 1_000, "{oldest}");
        let used: i64 = db
            .query_row(
                "SELECT (page_count - freelist_count) * page_size FROM pragma_page_count, \
                 pragma_freelist_count, pragma_page_size",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert!(used <= 1 << 20, "{used}");
        let size = std::fs::metadata(&path).unwrap().len();
        assert!(size <= 2 << 20, "{size}");
    }
}
