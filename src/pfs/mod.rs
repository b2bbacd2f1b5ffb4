//! The server's own view (`myprobe pfs`): performance_schema's waits, stages and statements as profiles. By
//! default the difference of two snapshots of a summary table (exact totals: no ring to overflow); with
//! `--nest`, the events of the `*_history_long` rings joined by `NESTING_EVENT_ID` (statement → stage → wait),
//! with the share the rings dropped. Instruments and consumers that are off are switched on for the run only
//! ([`Setup`]) and put back as they were.

use std::{
    collections::{BTreeMap, HashMap},
    fmt::Write as _,
};

use anyhow::{bail, Result};

use crate::{
    client::Client,
    profile::{Profile, Unit},
};

/// What `myprobe pfs` reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Kind {
    Waits,
    Stages,
    Statements,
}

impl Kind {
    /// The instruments' class: the first part of their names.
    fn class(self) -> &'static str {
        match self {
            Kind::Waits => "wait",
            Kind::Stages => "stage",
            Kind::Statements => "statement",
        }
    }

    /// Its part of the consumer and table names.
    fn plural(self) -> &'static str {
        match self {
            Kind::Waits => "waits",
            Kind::Stages => "stages",
            Kind::Statements => "statements",
        }
    }

    fn summary_table(self) -> String {
        format!(
            "performance_schema.events_{}_summary_global_by_event_name",
            self.plural()
        )
    }

    fn history_table(self) -> String {
        format!("performance_schema.events_{}_history_long", self.plural())
    }
}

/// Checks that performance_schema is on: it can only be switched on when the server starts.
pub fn check_enabled(client: &mut Client) -> Result<()> {
    let on = client
        .query("SELECT @@performance_schema")?
        .first()
        .and_then(|r| r.first().cloned().flatten());
    if on.as_deref() != Some("1") {
        bail!(
            "performance_schema is OFF on this server (MariaDB's default); it can only be switched on at startup: \
             add `performance_schema=ON` to the [mariadbd] section of the server's option file and restart it"
        );
    }
    Ok(())
}

/// What a run switched on in `setup_instruments` and `setup_consumers`, to put back exactly.
#[derive(Debug, Default)]
pub struct Setup {
    /// Instruments switched on: name → (ENABLED, TIMED) before.
    instruments: Vec<(String, String, String)>,
    /// Consumers switched on: their names (they were NO).
    consumers: Vec<String>,
}

/// A name in an SQL string literal.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "''"))
}

impl Setup {
    /// Reads which instruments of `kinds` (enabled and timed) and which of `consumers` are off: what
    /// [`Setup::apply`] switches on and [`Setup::restore`] puts back. Changes nothing.
    pub fn read(client: &mut Client, kinds: &[Kind], consumers: &[String]) -> Result<Setup> {
        let mut setup = Setup::default();
        for k in kinds {
            let off = client.query(&format!(
                "SELECT NAME, ENABLED, TIMED FROM performance_schema.setup_instruments \
                 WHERE NAME LIKE '{}/%' AND (ENABLED <> 'YES' OR TIMED <> 'YES')",
                k.class()
            ))?;
            setup.instruments.extend(off.into_iter().filter_map(|r| {
                let mut r = r.into_iter();
                Some((r.next()??, r.next()??, r.next()??))
            }));
        }
        if !consumers.is_empty() {
            let list: Vec<String> = consumers.iter().map(|c| quote(c)).collect();
            let off = client.query(&format!(
                "SELECT NAME FROM performance_schema.setup_consumers WHERE ENABLED <> 'YES' AND NAME IN ({})",
                list.join(", ")
            ))?;
            setup.consumers = off
                .into_iter()
                .filter_map(|r| r.into_iter().next().flatten())
                .collect();
        }
        Ok(setup)
    }

    /// Switches on what was off. On an error part of it may be on: [`Setup::restore`] puts all back.
    pub fn apply(&self, client: &mut Client) -> Result<()> {
        for chunk in self.instruments.chunks(200) {
            let names: Vec<String> = chunk.iter().map(|i| quote(&i.0)).collect();
            client.query(&format!(
                "UPDATE performance_schema.setup_instruments SET ENABLED = 'YES', TIMED = 'YES' \
                 WHERE NAME IN ({})",
                names.join(", ")
            ))?;
        }
        if !self.consumers.is_empty() {
            let names: Vec<String> = self.consumers.iter().map(|c| quote(c)).collect();
            client.query(&format!(
                "UPDATE performance_schema.setup_consumers SET ENABLED = 'YES' WHERE NAME IN ({})",
                names.join(", ")
            ))?;
        }
        Ok(())
    }

    /// How much the run switched on, for stderr.
    pub fn describe(&self) -> Option<String> {
        if self.instruments.is_empty() && self.consumers.is_empty() {
            return None;
        }
        Some(format!(
            "{} instruments and {} consumers switched on for this run; they are switched back at its end",
            self.instruments.len(),
            self.consumers.len()
        ))
    }

    /// The statements that put the settings back as they were.
    pub fn restore_statements(&self) -> Vec<String> {
        let mut by_state: BTreeMap<(&str, &str), Vec<String>> = BTreeMap::new();
        for (name, enabled, timed) in &self.instruments {
            by_state
                .entry((enabled, timed))
                .or_default()
                .push(quote(name));
        }
        let mut sql = Vec::new();
        for ((enabled, timed), names) in by_state {
            for chunk in names.chunks(200) {
                sql.push(format!(
                    "UPDATE performance_schema.setup_instruments SET ENABLED = {}, TIMED = {} WHERE NAME IN ({})",
                    quote(enabled),
                    quote(timed),
                    chunk.join(", ")
                ));
            }
        }
        if !self.consumers.is_empty() {
            let names: Vec<String> = self.consumers.iter().map(|c| quote(c)).collect();
            sql.push(format!(
                "UPDATE performance_schema.setup_consumers SET ENABLED = 'NO' WHERE NAME IN ({})",
                names.join(", ")
            ));
        }
        sql
    }

    /// Puts the settings back; an error names the statements left to run.
    pub fn restore(&self, client: &mut Client) -> Result<()> {
        let statements = self.restore_statements();
        for (i, sql) in statements.iter().enumerate() {
            if let Err(e) = client.query(sql) {
                bail!(
                    "performance_schema's settings could not be put back ({e:#}); run: {};",
                    statements[i..].join("; ")
                );
            }
        }
        Ok(())
    }
}

/// One row of a summary table: count and total time (ps).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub count: u64,
    pub time_ps: u64,
}

/// A summary table by event name, read now.
pub fn read_summary(client: &mut Client, kind: Kind) -> Result<HashMap<String, Totals>> {
    let rows = client.query(&format!(
        "SELECT EVENT_NAME, COUNT_STAR, SUM_TIMER_WAIT FROM {} WHERE COUNT_STAR > 0",
        kind.summary_table()
    ))?;
    Ok(rows
        .into_iter()
        .filter_map(|r| {
            let mut r = r.into_iter();
            let name = r.next()??;
            let count = r.next()??.parse().ok()?;
            let time_ps = r.next()??.parse().ok()?;
            Some((name, Totals { count, time_ps }))
        })
        .collect())
}

/// What happened between two summaries (a table truncated meanwhile counts from zero).
pub fn difference(
    before: &HashMap<String, Totals>,
    after: &HashMap<String, Totals>,
) -> BTreeMap<String, Totals> {
    after
        .iter()
        .filter_map(|(name, a)| {
            let b = before.get(name).copied().unwrap_or_default();
            let (count, time_ps) = if a.count >= b.count {
                (a.count - b.count, a.time_ps.saturating_sub(b.time_ps))
            } else {
                (a.count, a.time_ps)
            };
            (count > 0).then(|| (name.clone(), Totals { count, time_ps }))
        })
        .collect()
}

/// The unit of a profile's values, and picoseconds per unit.
pub fn unit_scale(unit: &str) -> Result<(Unit, u64)> {
    Ok(match unit {
        "ps" => (Unit::Picoseconds, 1),
        "ns" => (Unit::Nanoseconds, 1_000),
        "us" => (Unit::Microseconds, 1_000_000),
        _ => bail!("--unit: ps, ns or us"),
    })
}

/// An event name as frames, one per `/` part (`stage/sql/Commit` → `stage;sql;Commit`).
fn frames_of(event: &str) -> impl Iterator<Item = &str> {
    event.split('/').filter(|p| !p.is_empty())
}

/// `idle`: a connection waiting for its next statement. Left out of profiles: it is no wait of the server's,
/// and with many connections it dwarfs everything else.
fn is_idle(event: &str) -> bool {
    event == "idle"
}

/// A profile of summary differences: one stack per event name (but `idle`).
pub fn summary_profile(totals: &BTreeMap<String, Totals>, unit: Unit, per_unit: u64) -> Profile {
    let mut p = Profile::new(unit);
    for (name, t) in totals.iter().filter(|(n, _)| !is_idle(n)) {
        let frames: Vec<&str> = frames_of(name).collect();
        p.add(&frames, t.time_ps / per_unit);
    }
    p
}

/// The stage of a nested profile with the most time that no wait nested in it explains (its waits' time is
/// less than half of the rest): where performance_schema is blind. (stage, time without waits, time in waits),
/// in the profile's unit.
pub fn unexplained_stage(profile: &Profile) -> Option<(String, u64, u64)> {
    let mut by_stage: HashMap<String, (u64, u64)> = HashMap::new();
    for (frames, v) in profile.stacks() {
        let Some(at) = frames.iter().position(|f| *f == "stage") else {
            continue;
        };
        let wait = frames[at..]
            .iter()
            .position(|f| *f == "wait")
            .map(|w| at + w);
        let entry = by_stage
            .entry(frames[at..wait.unwrap_or(frames.len())].join("/"))
            .or_default();
        match wait {
            Some(_) => entry.1 = entry.1.saturating_add(v),
            None => entry.0 = entry.0.saturating_add(v),
        }
    }
    let all = by_stage.values().fold(0u64, |all, (own, waited)| {
        all.saturating_add(own.saturating_add(*waited))
    });
    let (stage, (own, waited)) = by_stage.into_iter().max_by_key(|(_, (own, _))| *own)?;
    // A stage that matters (a quarter of all stage time) and whose waits explain less than half of it.
    (own > 0 && own >= all / 4 && waited < own / 2).then_some((stage, own, waited))
}

/// The one line that says a stage is not explained by any wait.
pub fn unexplained_line(stage: &str, own_ps: u64, waited_ps: u64) -> String {
    let known = if stage.ends_with("/Commit") {
        " (on MariaDB, the redo log's write and flush at commit records no wait)"
    } else {
        ""
    };
    format!(
        "{stage} took {} that no wait explains (waits inside it: {}): performance_schema does not see what it \
         waits for{known}; `myprobe queries` shows each statement's time in syscalls such as fsync",
        seconds(own_ps),
        seconds(waited_ps)
    )
}

fn seconds(ps: u64) -> String {
    format!("{:.3} s", ps as f64 / 1e12)
}

/// The largest rows of a summary difference, for stderr.
pub fn top_table(totals: &BTreeMap<String, Totals>, rows: usize) -> String {
    let mut sorted: Vec<(&String, &Totals)> = totals.iter().collect();
    sorted.sort_by(|a, b| b.1.time_ps.cmp(&a.1.time_ps).then(a.0.cmp(b.0)));
    let mut out = format!("{:>12} {:>12} {:>10}  event\n", "total", "count", "avg");
    for (name, t) in sorted.into_iter().take(rows) {
        let avg_us = t.time_ps as f64 / t.count.max(1) as f64 / 1e6;
        let _ = writeln!(
            out,
            "{:>12} {:>12} {:>8.1}us  {name}",
            seconds(t.time_ps),
            t.count,
            avg_us
        );
    }
    out
}

/// The consumers `--nest` needs: each kind's current events and its long history.
pub fn nest_consumers() -> Vec<String> {
    NEST_KINDS
        .iter()
        .flat_map(|k| {
            [
                format!("events_{}_current", k.plural()),
                format!("events_{}_history_long", k.plural()),
            ]
        })
        .collect()
}

pub const NEST_KINDS: [Kind; 3] = [Kind::Statements, Kind::Stages, Kind::Waits];

/// Events kept at most over a run (about 100 bytes each): past it the rings are no longer read, and that is
/// said.
const MAX_RING_EVENTS: usize = 500_000;

/// One event of a history ring.
#[derive(Clone, Debug)]
struct Event {
    name: String,
    nesting: Option<u64>,
    time_ps: u64,
}

/// An event's TIMER_WAIT, unless its timer ran backwards. performance_schema computes it as `end - start` in
/// unsigned arithmetic: a timer that went back (a cycle counter read on another CPU, a wall clock set back)
/// wraps it to nearly 2^64 ps, which would swamp every sum it is added to.
fn forward_time(time_ps: u64) -> Option<u64> {
    (time_ps <= i64::MAX as u64).then_some(time_ps)
}

/// The history rings read during a run (`--nest`). A ring keeps the last N events (N is fixed at the server's
/// start, 1,000 to 10,000), far fewer than a busy server has in a second: each read takes the events added
/// since the last one, so that reads spread over the run give a sample of all of it.
#[derive(Debug, Default)]
pub struct Rings {
    /// Per kind and thread, the last event id read.
    last: HashMap<(Kind, u64), u64>,
    events: HashMap<Kind, HashMap<(u64, u64), Event>>,
    /// Reads that found the ring had moved past the last event read: events were dropped in between.
    pub full: bool,
    /// Events whose timer ran backwards (kept with no time of their own).
    pub backwards: u64,
}

impl Rings {
    /// Notes where the rings stand: their events before now are not the run's.
    pub fn start(client: &mut Client) -> Result<Rings> {
        let mut rings = Rings::default();
        for k in NEST_KINDS {
            for r in client.query(&format!(
                "SELECT THREAD_ID, MAX(EVENT_ID) FROM {} GROUP BY THREAD_ID",
                k.history_table()
            ))? {
                let mut r = r.into_iter();
                if let (Some(Some(t)), Some(Some(e))) = (r.next(), r.next()) {
                    if let (Ok(t), Ok(e)) = (t.parse(), e.parse()) {
                        rings.last.insert((k, t), e);
                    }
                }
            }
        }
        Ok(rings)
    }

    /// Whether the events kept reached their bound: reading more is pointless.
    pub fn is_full(&self) -> bool {
        self.events.values().map(HashMap::len).sum::<usize>() >= MAX_RING_EVENTS
    }

    /// Reads the events the rings gained since the last read.
    pub fn read(&mut self, client: &mut Client) -> Result<()> {
        if self.is_full() {
            return Ok(());
        }
        for k in NEST_KINDS {
            let name = if k == Kind::Statements {
                "COALESCE(DIGEST_TEXT, SQL_TEXT, EVENT_NAME)"
            } else {
                "EVENT_NAME"
            };
            let rows = client.query(&format!(
                "SELECT THREAD_ID, EVENT_ID, NESTING_EVENT_ID, {name}, TIMER_WAIT FROM {} \
                 WHERE TIMER_WAIT IS NOT NULL",
                k.history_table()
            ))?;
            let mut newest: HashMap<u64, u64> = HashMap::new();
            for r in rows {
                let mut r = r.into_iter();
                let (
                    Some(Some(thread)),
                    Some(Some(id)),
                    Some(nesting),
                    Some(Some(name)),
                    Some(Some(t)),
                ) = (r.next(), r.next(), r.next(), r.next(), r.next())
                else {
                    continue;
                };
                let (Ok(thread), Ok(id), Ok(time_ps)) = (thread.parse(), id.parse(), t.parse())
                else {
                    continue;
                };
                if self.last.get(&(k, thread)).is_some_and(|&last| id <= last) {
                    continue;
                }
                let newest = newest.entry(thread).or_insert(id);
                *newest = (*newest).max(id);
                let name = if k == Kind::Statements {
                    crate::wire::fingerprint::normalize(&name)
                } else {
                    name
                };
                let nesting = nesting.and_then(|n| n.parse().ok());
                let time_ps = forward_time(time_ps).unwrap_or_else(|| {
                    self.backwards += 1;
                    0
                });
                self.events.entry(k).or_default().insert(
                    (thread, id),
                    Event {
                        name,
                        nesting,
                        time_ps,
                    },
                );
            }
            self.last
                .extend(newest.into_iter().map(|(thread, id)| ((k, thread), id)));
        }
        Ok(())
    }

    /// How many events of each kind were read.
    pub fn counts(&self) -> Vec<(Kind, u64)> {
        NEST_KINDS
            .iter()
            .map(|&k| (k, self.events.get(&k).map_or(0, |l| l.len() as u64)))
            .collect()
    }

    /// The nested profile: for each statement (its digest text) → stage → wait, the time of each stage not
    /// spent in the waits below it, and the waits' time. An event whose parent the rings did not keep starts
    /// at `[parent not kept]`.
    pub fn profile(&self, unit: Unit, per_unit: u64) -> Profile {
        let empty = HashMap::new();
        let of = |k: Kind| self.events.get(&k).unwrap_or(&empty);
        let (statements, stages, waits) = (of(Kind::Statements), of(Kind::Stages), of(Kind::Waits));
        let parent_of = |thread: u64, nesting: Option<u64>| -> Option<(Kind, u64)> {
            let n = nesting?;
            if stages.contains_key(&(thread, n)) {
                Some((Kind::Stages, n))
            } else if statements.contains_key(&(thread, n)) {
                Some((Kind::Statements, n))
            } else {
                None
            }
        };
        let mut in_children: HashMap<(Kind, u64, u64), u64> = HashMap::new();
        for list in [stages, waits] {
            for (&(thread, _), e) in list {
                if let Some((pk, pid)) = parent_of(thread, e.nesting) {
                    let sum = in_children.entry((pk, thread, pid)).or_insert(0);
                    *sum = sum.saturating_add(e.time_ps);
                }
            }
        }
        let mut profile = Profile::new(unit);
        // A statement's time outside its stages is not shown: the stage ring drops most of a statement's
        // stages (it fills many times faster), and what it dropped would be counted as the statement's own.
        for (kind, list) in [(Kind::Stages, stages), (Kind::Waits, waits)] {
            for (&(thread, id), e) in list.iter().filter(|(_, e)| !is_idle(&e.name)) {
                // Ancestors, innermost first: a stage nests in a statement, a wait in a stage or a statement.
                let mut chain = vec![(kind, e)];
                let mut at = (kind != Kind::Statements)
                    .then(|| parent_of(thread, e.nesting))
                    .flatten();
                while let Some((k, i)) = at {
                    let parent = &of(k)[&(thread, i)];
                    chain.push((k, parent));
                    at = (k != Kind::Statements)
                        .then(|| parent_of(thread, parent.nesting))
                        .flatten();
                }
                let mut stack: Vec<String> = Vec::new();
                if chain
                    .last()
                    .is_some_and(|(k, e)| *k != Kind::Statements && e.nesting.is_some())
                {
                    stack.push("[parent not kept]".to_string());
                }
                for (k, e) in chain.iter().rev() {
                    if *k == Kind::Statements {
                        stack.push(e.name.clone());
                    } else {
                        stack.extend(frames_of(&e.name).map(str::to_string));
                    }
                }
                let children = in_children.get(&(kind, thread, id)).copied().unwrap_or(0);
                profile.add(&stack, e.time_ps.saturating_sub(children) / per_unit);
            }
        }
        profile
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn totals(rows: &[(&str, u64, u64)]) -> HashMap<String, Totals> {
        rows.iter()
            .map(|&(n, count, time_ps)| (n.to_string(), Totals { count, time_ps }))
            .collect()
    }

    #[test]
    fn differences_of_summaries_count_a_truncated_table_from_zero() {
        let before = totals(&[("stage/sql/Commit", 10, 1000), ("stage/sql/init", 5, 50)]);
        let after = totals(&[
            ("stage/sql/Commit", 25, 4000),
            ("stage/sql/init", 2, 20),
            ("stage/sql/new", 1, 7),
        ]);
        let d = difference(&before, &after);
        assert_eq!(
            d["stage/sql/Commit"],
            Totals {
                count: 15,
                time_ps: 3000
            }
        );
        assert_eq!(
            d["stage/sql/init"],
            Totals {
                count: 2,
                time_ps: 20
            }
        );
        assert_eq!(
            d["stage/sql/new"],
            Totals {
                count: 1,
                time_ps: 7
            }
        );
        let p = summary_profile(&d, Unit::Nanoseconds, 1000);
        assert_eq!(p.stacks(), vec![(vec!["stage", "sql", "Commit"], 3)]);
    }

    #[test]
    fn restore_puts_each_setting_back_as_it_was() {
        let setup = Setup {
            instruments: vec![
                ("wait/io/a".into(), "NO".into(), "NO".into()),
                ("wait/io/b'x".into(), "YES".into(), "NO".into()),
                ("wait/io/c".into(), "NO".into(), "NO".into()),
            ],
            consumers: vec!["events_waits_current".into()],
        };
        assert_eq!(
            setup.restore_statements(),
            vec![
                "UPDATE performance_schema.setup_instruments SET ENABLED = 'NO', TIMED = 'NO' WHERE NAME IN \
                 ('wait/io/a', 'wait/io/c')",
                "UPDATE performance_schema.setup_instruments SET ENABLED = 'YES', TIMED = 'NO' WHERE NAME IN \
                 ('wait/io/b''x')",
                "UPDATE performance_schema.setup_consumers SET ENABLED = 'NO' WHERE NAME IN \
                 ('events_waits_current')",
            ]
        );
    }

    #[test]
    fn a_stage_without_waits_inside_is_unexplained() {
        let mut p = Profile::new(Unit::Microseconds);
        p.add(
            &["INSERT INTO t VALUES (?)", "stage", "sql", "Commit"],
            7_000,
        );
        p.add(
            &[
                "INSERT INTO t VALUES (?)",
                "stage",
                "sql",
                "Commit",
                "wait",
                "io",
                "file",
                "x",
            ],
            300,
        );
        p.add(
            &["INSERT INTO t VALUES (?)", "stage", "sql", "Updating"],
            800,
        );
        assert_eq!(
            unexplained_stage(&p),
            Some(("stage/sql/Commit".to_string(), 7_000, 300))
        );
        p.add(
            &[
                "UPDATE t SET x = ?",
                "stage",
                "sql",
                "Commit",
                "wait",
                "io",
                "file",
                "x",
            ],
            6_000,
        );
        assert_eq!(unexplained_stage(&p), None);
    }

    #[test]
    fn a_timer_that_ran_backwards_is_no_time_and_sums_cannot_overflow() {
        assert_eq!(forward_time(5_000), Some(5_000));
        // end 3 µs of cycles before start, times a factor: what the server shows as TIMER_WAIT.
        assert_eq!(forward_time(0u64.wrapping_sub(3_000_000)), None);
        let mut p = Profile::new(Unit::Picoseconds);
        p.add(&["q", "stage", "sql", "Commit"], u64::MAX - 1);
        p.add(&["r", "stage", "sql", "Commit"], u64::MAX - 1);
        p.add(&["q", "stage", "sql", "Commit", "wait", "x"], 10);
        assert_eq!(
            unexplained_stage(&p),
            Some(("stage/sql/Commit".to_string(), u64::MAX, 10))
        );
    }
}
