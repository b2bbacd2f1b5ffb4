//! The report's findings: a few sentences, each naming one dominant cost with its figure, from what every
//! section found. Plain text; the page escapes it.

use std::{collections::HashMap, fmt::Write, rc::Rc};

use super::{Past, PastIncident, ProfileSection, Report};
use crate::{
    history::{
        text::{seconds, state_words, who, NOT_SEEN},
        time, IDLE_IN_TRANSACTION,
    },
    profile::{waits, Profile},
    render::{
        queries::{clip, human_us, why},
        summary::function_values,
    },
    server::Cause,
    stacks::deadlocks,
};

/// Frames of connections that wait for their client to send a statement: idle time, not a cost.
const CLIENT_WAIT_FRAMES: [&str; 3] = ["my_net_read_packet", "vio_read", "vio_socket_io_wait"];

pub fn findings(r: &Report) -> Vec<String> {
    let mut out = Vec::new();
    let meanings = SiteMeanings::of(r);
    if let Some(s) = &r.statements {
        lock_errors(&s.rows, &mut out);
        let running_at_end = r.threads.iter().filter(|t| t.statement.is_some()).count();
        statements(&s.rows, r.traced.as_secs_f64(), running_at_end, &mut out);
        blockers(&s.rows, &mut out);
    }
    for p in &r.profiles {
        match p.id {
            "cpu" => on_cpu(p, &mut out),
            "offcpu" => off_cpu(p, &meanings, &mut out),
            _ => {}
        }
    }
    // The lock statements waited on longest: a pool's idle workers waiting for work are not a finding.
    if let Some(l) = r
        .locks
        .iter()
        .filter(|l| l.kind.is_some_and(|k| k.is_contention()) && l.statement_ns > 0)
        .max_by_key(|l| l.statement_ns)
    {
        let site = l
            .site
            .as_deref()
            .map(|s| {
                let meaning = meanings
                    .meaning(s)
                    .map(|m| format!(", waiting for {m}"))
                    .unwrap_or_default();
                format!(", mostly in {s}{meaning}")
            })
            .unwrap_or_default();
        out.push(format!(
            "The lock statements waited on most is {} ({}): {} of their time, {} waits in all, the longest {}{site}.",
            l.name,
            l.kind.map(|k| k.label()).unwrap_or("lock"),
            human_us(l.statement_ns / 1000),
            l.waits,
            human_us(l.max_ns / 1000),
        ));
    }
    threads(r, &mut out);
    let lost: usize = r.profiles.iter().map(|p| p.lost.len()).sum::<usize>()
        + r.statements
            .as_ref()
            .map_or(0, |s| s.followed.lost.report(s.followed.seen).len());
    if lost > 0 {
        out.push(
            "Some events were lost while tracing: each section says how many; its figures are lower bounds."
                .into(),
        );
    }
    for m in &r.missing {
        out.push(format!("Not in this report: {m}."));
    }
    out
}

/// The sentences of a past range's report: what its load went to, the connections others waited behind longest
/// and what they ran, the top statement, and the flame graphs' hottest functions and waits.
pub fn past(p: &Past) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(r) = &p.range {
        let total: f64 = r.states.iter().map(|s| s.load).sum();
        if let Some(top) = r.states.first().filter(|_| total > 0.0) {
            let mut s = format!(
                "{} was {:.0}% of the DB load from {} to {} ({:.2} of {total:.2} average active sessions)",
                capitalized(&top.key),
                100.0 * top.load / total,
                time::format(p.from),
                time::format(p.to),
                top.load
            );
            let rest: Vec<String> = (r.states.iter().skip(1).take(2))
                .map(|x| format!("{} {:.0}%", x.key, 100.0 * x.load / total))
                .collect();
            if !rest.is_empty() {
                let _ = write!(s, "; then {}", rest.join(", "));
            }
            s.push('.');
            out.push(s);
        }
        for i in &p.incidents {
            out.push(held_up(i));
        }
        if let Some(st) = r.statements.first().filter(|_| total > 0.0) {
            out.push(format!(
                "The statement with the most load was {} ({:.2} average active sessions, {:.0}% of the load).",
                clip(&st.key, 90),
                st.load,
                100.0 * st.load / total
            ));
        }
        if r.per_minute {
            out.push(
                "The range is older than the seconds the history keeps: its load is read from the per-minute sums, \
                 and no moment of it can be shown."
                    .into(),
            );
        }
    }
    if p.windows > 0 && !p.profiles.iter().any(|s| s.id == "cpu") {
        out.push(
            "No on-CPU sample of the server was kept for the range: it was idle on the CPU.".into(),
        );
    }
    for section in &p.profiles {
        match section.id {
            "cpu" => on_cpu(section, &mut out),
            "offcpu" => off_cpu(section, &SiteMeanings(HashMap::new()), &mut out),
            _ => {}
        }
    }
    for m in &p.missing {
        out.push(format!("Not in this report: {m}."));
    }
    out
}

/// `Connection 42 (app@10.0.0.5), idle in its transaction, held up 3 sessions (row lock on db.t (PRIMARY, X)) for
/// 40 s, from 03:10:02 to 03:10:41 (95 s waited in all); its transaction ran UPDATE …`.
fn held_up(i: &PastIncident) -> String {
    let x = &i.incident;
    let sessions = i.moment.as_ref().map_or(&[][..], |m| &m.sessions[..]);
    let holder = sessions.iter().find(|s| s.conn == x.root_blocker);
    let mut s = format!("Connection {}", x.root_blocker);
    if let Some(h) = holder {
        let who = who(h);
        if !who.is_empty() {
            let _ = write!(s, " ({who})");
        }
        if h.state == IDLE_IN_TRANSACTION {
            s.push_str(", idle in its transaction,");
        } else {
            let _ = write!(
                s,
                ", running {} ({}),",
                clip(h.statement.as_deref().unwrap_or("?"), 90),
                state_words(h)
            );
        }
    }
    let waited = sessions
        .iter()
        .filter(|w| w.root_blocker == Some(x.root_blocker))
        .map(state_words)
        .next()
        .map(|w| format!(" ({w})"))
        .unwrap_or_default();
    let _ = write!(
        s,
        " held up {} session{}{waited} for {}, from {} to {} ({} waited in all)",
        x.waiters,
        if x.waiters == 1 { "" } else { "s" },
        seconds((x.last - x.first + 1) as f64),
        time::clock(x.first),
        time::clock(x.last),
        seconds(x.session_s as f64),
    );
    match holder {
        Some(h) if !h.holder_statements.is_empty() => {
            let ran: Vec<String> = h.holder_statements.iter().map(|t| clip(t, 90)).collect();
            let _ = write!(s, "; its transaction ran {}", ran.join("; "));
        }
        Some(h) if h.state == IDLE_IN_TRANSACTION => s.push_str(NOT_SEEN),
        _ => {}
    }
    s.push('.');
    s
}

fn capitalized(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map_or_else(String::new, |first| first.to_uppercase().chain(c).collect())
}

/// Deadlocks and lock wait timeouts, first: a statement rolled back is worse than a slow one. Each with its
/// statements, the lock, and the other side.
fn lock_errors(rows: &[crate::query::digest::DigestRow], out: &mut Vec<String>) {
    for cause in [Cause::Deadlock, Cause::LockWaitTimeout] {
        let mut errors: Vec<_> = rows
            .iter()
            .flat_map(|r| r.lock_errors.iter().map(move |e| (&r.fingerprint, e)))
            .filter(|(_, e)| e.cause == cause)
            .collect();
        let total = errors
            .iter()
            .map(|(_, e)| e.count)
            .fold(0, u64::saturating_add);
        if total == 0 {
            continue;
        }
        errors.sort_by(|a, b| b.1.count.cmp(&a.1.count).then(a.0.cmp(b.0)));
        let each: Vec<String> = errors
            .iter()
            .take(3)
            .map(|(fingerprint, e)| {
                format!("{} of {} {}", e.count, clip(fingerprint, 90), e.words())
            })
            .collect();
        let head = match cause {
            Cause::Deadlock => "were rolled back in deadlocks",
            _ => "timed out waiting for a lock (lock wait timeout)",
        };
        out.push(format!("{total} statements {head}: {}.", each.join("; ")));
    }
}

/// The statements' sentences; `running_at_end`: the threads running a statement when tracing ended, which an idle
/// server has none of.
fn statements(
    rows: &[crate::query::digest::DigestRow],
    secs: f64,
    running_at_end: usize,
    out: &mut Vec<String>,
) {
    let total = rows.iter().map(|r| r.total_us).fold(0, u64::saturating_add);
    let count = rows.iter().map(|r| r.count).fold(0, u64::saturating_add);
    if (count == 0 || total == 0) && running_at_end > 0 {
        out.push(format!(
            "No statement was traced, yet {running_at_end} were running when tracing ended: they began before it, \
             and the server's memory, where they would have been read, could not be (said on stderr)."
        ));
        return;
    }
    if count == 0 || total == 0 {
        out.push(
            "No statement was traced: the server was idle, or its clients use TLS or compression."
                .into(),
        );
        return;
    }
    // What the statements' time went to, all fingerprints together, by cause.
    let mut causes: Vec<(Cause, u64)> = Vec::new();
    for c in rows.iter().flat_map(|r| &r.causes) {
        match causes.iter_mut().find(|(cause, _)| *cause == c.cause) {
            Some((_, us)) => *us = us.saturating_add(c.us),
            None => causes.push((c.cause, c.us)),
        }
    }
    causes.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let top = causes
        .iter()
        .find(|(c, _)| *c != Cause::Unseen)
        .or(causes.first());
    let mut s = format!(
        "{count} statements in {secs:.0} s ({:.0}/s) took {} of server time",
        count as f64 / secs.max(0.001),
        human_us(total),
    );
    if let Some(&(cause, us)) = top {
        // In the words of its longest wait the server named (its object and holder), where there is one.
        let named = rows
            .iter()
            .flat_map(|r| &r.causes)
            .filter(|c| c.cause == cause && (c.holder.is_some() || c.object.is_some()))
            .max_by_key(|c| c.us);
        let _ = write!(
            s,
            "; {:.0}% of it {} ({})",
            us as f64 * 100.0 / total as f64,
            named.map_or_else(|| cause.phrase().to_string(), |c| c.phrase()),
            cause.label()
        );
    }
    s.push('.');
    out.push(s);
    for r in rows.iter().take(3).filter(|r| r.total_us > 0) {
        out.push(format!(
            "{} takes {:.0}% of statement time ({} executions, p99 {}); {}.",
            clip(&r.fingerprint, 90),
            r.total_us as f64 * 100.0 / total as f64,
            r.count,
            human_us(r.p99_us),
            why(r),
        ));
    }
}

/// The connections holding the locks statements waited for (the roots of their chains), the longest waited for
/// first: who to look at, or kill.
fn blockers(rows: &[crate::query::digest::DigestRow], out: &mut Vec<String>) {
    let mut by_holder: Vec<(&crate::query::Holder, u64, Vec<String>)> = Vec::new();
    // A deadlock's other side held a lock too, but waited as long: it is in the deadlocks' finding.
    for c in rows
        .iter()
        .flat_map(|r| &r.causes)
        .filter(|c| c.cause != Cause::Deadlock)
    {
        let Some(h) = &c.holder else { continue };
        let what = match &c.object {
            Some(o) => format!("{} on {o}", c.cause),
            None => c.cause.to_string(),
        };
        match by_holder.iter_mut().find(|(held, ..)| held.conn == h.conn) {
            Some((_, us, whats)) => {
                *us = us.saturating_add(c.us);
                if !whats.contains(&what) {
                    whats.push(what);
                }
            }
            None => by_holder.push((h, c.us, vec![what])),
        }
    }
    by_holder.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.conn.cmp(&b.0.conn)));
    for (h, us, whats) in by_holder.iter().take(5) {
        let who = h.describe();
        let who = who
            .strip_prefix("connection")
            .map_or(who.clone(), |rest| format!("Connection{rest}"));
        out.push(format!(
            "{who}, held the locks statements waited {} for ({}).",
            human_us(*us),
            whats.iter().take(3).cloned().collect::<Vec<_>>().join(", ")
        ));
    }
}

/// The functions with the most self time, and the one with the most total time below the thread roots.
fn on_cpu(p: &ProfileSection, out: &mut Vec<String>) {
    let total = p.profile.total();
    if total == 0 {
        out.push("No on-CPU sample of the server was taken: it was idle.".into());
        return;
    }
    let values = function_values(&p.profile, false);
    let mut by_self: Vec<(&str, u64)> = values.iter().map(|(f, v)| (*f, v.0)).collect();
    by_self.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let hot: Vec<String> = by_self
        .iter()
        .take(3)
        .filter(|(_, v)| *v > 0)
        .map(|(f, v)| format!("{f} ({:.1}%)", *v as f64 * 100.0 / total as f64))
        .collect();
    out.push(format!(
        "On CPU ({total} samples), the hottest functions are {}.",
        hot.join(", ")
    ));
}

/// What the wait sites wait for: by their names (`waits::site_meaning`), else by the cause the statements' waits
/// there were given (a function without a name of its own that announces its waits to `thd_wait_begin`).
pub(super) struct SiteMeanings<'r>(HashMap<&'r str, Cause>);

impl<'r> SiteMeanings<'r> {
    pub(super) fn of(r: &'r Report) -> Self {
        let named = r.statements.iter().flat_map(|s| &s.followed.site_causes);
        SiteMeanings(named.map(|(site, cause)| (site.as_str(), *cause)).collect())
    }

    /// `the redo log's write and sync`, for "waiting for …".
    pub(super) fn meaning(&self, site: &str) -> Option<String> {
        if let Some(m) = waits::site_meaning(site) {
            return Some(m.to_string());
        }
        let phrase = self.0.get(site)?.phrase();
        phrase.strip_prefix("waits for ").map(str::to_string)
    }
}

/// Where connections were blocked while running statements, by the site of each wait.
fn off_cpu(p: &ProfileSection, meanings: &SiteMeanings<'_>, out: &mut Vec<String>) {
    let (by_site, idle) = statement_waits(&p.profile);
    let total = by_site.values().fold(0u64, |a, &v| a.saturating_add(v));
    if total == 0 {
        return;
    }
    let mut sites: Vec<(String, u64)> = by_site.into_iter().collect();
    sites.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let top: Vec<String> = sites
        .iter()
        .take(3)
        .map(|(site, v)| {
            let meaning = meanings
                .meaning(site)
                .map(|m| format!(", waiting for {m}"))
                .unwrap_or_default();
            format!("{site} ({:.0}%{meaning})", *v as f64 * 100.0 / total as f64)
        })
        .collect();
    out.push(format!(
        "Off CPU, connections were blocked {} while running statements (and {} waiting for their clients' next \
         statement); most of it in {}.",
        human_us(total),
        human_us(idle),
        top.join(", ")
    ));
}

/// Blocked time of connections within a statement (below `do_command`, not reading the next one) by the
/// site of the wait; and the time connections waited for their clients.
fn statement_waits(profile: &Profile) -> (HashMap<String, u64>, u64) {
    let mut by_site: HashMap<String, u64> = HashMap::new();
    let mut idle = 0u64;
    for (frames, value) in profile.stacks() {
        if frames.last() != Some(&"[blocked]") || !frames.contains(&waits::STATEMENT_FRAME) {
            continue;
        }
        if frames.iter().any(|f| CLIENT_WAIT_FRAMES.contains(f)) {
            idle = idle.saturating_add(value);
            continue;
        }
        let leaf_first: Vec<Rc<str>> = frames.iter().rev().skip(1).map(|f| Rc::from(*f)).collect();
        if let Some(site) = waits::site(&leaf_first) {
            let v = by_site.entry(site).or_default();
            *v = v.saturating_add(value);
        }
    }
    (by_site, idle)
}

fn threads(r: &Report, out: &mut Vec<String>) {
    if r.threads.is_empty() {
        return;
    }
    let running = r.threads.iter().filter(|t| t.running).count();
    let contended = r
        .threads
        .iter()
        .filter(|t| {
            t.waits
                .as_ref()
                .is_some_and(|w| w.kind != crate::server::WaitKind::Condition.label())
        })
        .count();
    let with_statement = r.threads.iter().filter(|t| t.statement.is_some()).count();
    out.push(format!(
        "When tracing ended the server had {} threads: {running} on a CPU, {contended} waiting for a lock, \
         {with_statement} running a statement.",
        r.threads.len()
    ));
    for cycle in deadlocks(&r.threads) {
        let tids: Vec<String> = cycle.iter().map(u32::to_string).collect();
        out.push(format!(
            "Deadlock: threads {} wait for each other's locks.",
            tids.join(" → ")
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_is_named_with_what_it_held_up_and_ran() {
        use crate::history::{
            read::{Incident, ServerMoment},
            SessionSample,
        };
        let sample = |conn, state: &str, root: Option<u64>| SessionSample {
            conn,
            user: Some("app".into()),
            host: Some("10.0.0.5".into()),
            db: None,
            statement: (state != IDLE_IN_TRANSACTION)
                .then(|| "UPDATE t SET k = ? WHERE id = ?".into()),
            fingerprint: None,
            statement_s: Some(3.0),
            transaction_s: None,
            state: state.to_string().into(),
            object: root.map(|_| "db.t (PRIMARY, X)".into()),
            blocker: root,
            root_blocker: root,
            holder_statements: Vec::new(),
        };
        let mut holder = sample(42, IDLE_IN_TRANSACTION, None);
        holder.holder_statements = vec!["UPDATE t SET k = k + ? WHERE id = ?".into()];
        let i = PastIncident {
            incident: Incident {
                server: "one".into(),
                root_blocker: 42,
                waiters: 3,
                first: 1_795_000_000,
                last: 1_795_000_039,
                session_s: 95,
                worst: 1_795_000_030,
            },
            moment: Some(ServerMoment {
                server: "one".into(),
                ts: 1_795_000_030,
                sessions: vec![holder, sample(43, "row lock", Some(42))],
            }),
        };
        let s = held_up(&i);
        assert!(
            s.starts_with(
                "Connection 42 (app@10.0.0.5), idle in its transaction, held up 3 sessions (row lock on db.t \
                 (PRIMARY, X)) for 40 s, from "
            ),
            "{s}"
        );
        assert!(
            s.ends_with(
                "(95 s waited in all); its transaction ran UPDATE t SET k = k + ? WHERE id = ?."
            ),
            "{s}"
        );
        // None of its statements seen: said so, not left out.
        let mut unseen = i;
        if let Some(m) = &mut unseen.moment {
            m.sessions[0].holder_statements.clear();
        }
        let s = held_up(&unseen);
        assert!(
            s.ends_with(&format!("(95 s waited in all){NOT_SEEN}.")),
            "{s}"
        );
    }

    #[test]
    fn no_statement_traced_is_idle_only_when_none_runs() {
        let mut out = Vec::new();
        statements(&[], 5.0, 0, &mut out);
        assert!(out[0].contains("the server was idle"), "{out:?}");
        let mut out = Vec::new();
        statements(&[], 5.0, 3, &mut out);
        assert!(
            out[0].starts_with("No statement was traced, yet 3 were running")
                && !out[0].contains("idle"),
            "{out:?}"
        );
    }

    #[test]
    fn the_connection_holding_what_statements_wait_for_is_named_once_with_all_it_held() {
        use crate::query::{digest::Digest, CauseWait, Holder, QueryRecord, TimeParts};
        let holder = Holder {
            conn: 27,
            user: Some("app".into()),
            host: Some("10.0.0.5".into()),
            command: Some("Sleep".into()),
            command_s: Some(38),
            transaction_s: Some(40),
            ..Holder::default()
        };
        let mut digest = Digest::default();
        for (query, cause, object, us) in [
            (
                "UPDATE t SET v = 1",
                Cause::RowLock,
                "db.t (PRIMARY, X)",
                3_000_000,
            ),
            (
                "ALTER TABLE t2 FORCE",
                Cause::MetadataLock,
                "db.t2 (SHARED_READ)",
                1_000_000,
            ),
        ] {
            let mut r = QueryRecord {
                fingerprint: Some(query.into()),
                duration_us: us,
                time: TimeParts {
                    lock_us: us,
                    ..TimeParts::default()
                },
                ..QueryRecord::default()
            };
            r.waits = vec![CauseWait {
                cause,
                us,
                site: None,
                object: Some(object.into()),
                holder: Some(holder.clone()),
            }];
            digest.add(&r);
        }
        let mut out = Vec::new();
        blockers(&digest.rows(), &mut out);
        assert_eq!(
            out,
            ["Connection 27 (app@10.0.0.5), idle in its transaction for 40 s, held the locks statements waited 4.000s \
              for (row lock on db.t (PRIMARY, X), metadata lock on db.t2 (SHARED_READ))."]
        );
    }

    #[test]
    fn deadlocks_and_timeouts_come_first_with_their_statements_lock_and_other_side() {
        use crate::query::{digest::Digest, CauseWait, Holder, QueryRecord};
        let holder = |conn: u64, command: &str, statement: Option<&str>| Holder {
            conn,
            command: Some(command.into()),
            transaction_s: Some(40),
            statement: statement.map(String::from),
            ..Holder::default()
        };
        let mut digest = Digest::default();
        let deadlock = Some(holder(
            6,
            "Query",
            Some("UPDATE t SET v = v + 1 WHERE id = 2"),
        ));
        let idle = Some(holder(9, "Sleep", None));
        for (n, cause, fingerprint, other) in [
            (
                3,
                Cause::Deadlock,
                "UPDATE t SET v = v + ? WHERE id = ?",
                deadlock,
            ),
            (
                1,
                Cause::Deadlock,
                "UPDATE t SET v = v + ? WHERE id = ?",
                None,
            ),
            (2, Cause::LockWaitTimeout, "DELETE FROM t", idle),
        ] {
            for _ in 0..n {
                digest.add(&QueryRecord {
                    fingerprint: Some(fingerprint.into()),
                    duration_us: 10,
                    time: crate::query::TimeParts {
                        lock_us: 10,
                        ..Default::default()
                    },
                    cause: Some(cause),
                    waits: vec![CauseWait {
                        cause,
                        us: 10,
                        site: None,
                        object: Some("db.t (PRIMARY, X)".into()),
                        holder: other.clone(),
                    }],
                    ..QueryRecord::default()
                });
            }
        }
        let rows = digest.rows();
        let mut out = Vec::new();
        lock_errors(&rows, &mut out);
        assert_eq!(
            out,
            [
                "4 statements were rolled back in deadlocks: 3 of UPDATE t SET v = v + ? WHERE id = ? rolled back \
                 in deadlocks with update t set v = v + ? where id = ? over db.t (PRIMARY, X); 1 of UPDATE t SET v \
                 = v + ? WHERE id = ? rolled back in deadlocks (the other side not read: the server keeps only its \
                 latest deadlock) over db.t (PRIMARY, X).",
                "2 statements timed out waiting for a lock (lock wait timeout): 2 of DELETE FROM t timed out \
                 waiting for a lock on db.t (PRIMARY, X) held by connection 9, idle in its transaction for 40 s."
            ]
        );
        // The deadlock's other side is no blocker of its own.
        let mut out = Vec::new();
        blockers(&rows, &mut out);
        assert_eq!(out.len(), 1);
        assert!(out[0].starts_with("Connection 9, idle"), "{out:?}");
    }

    #[test]
    fn the_lock_finding_is_the_one_statements_waited_on_not_an_idle_worker_s() {
        use crate::{profile::locks::LockSummary, server::WaitKind};
        let lock = |name: &str, site: &str, total_ns: u64, statement_ns: u64| LockSummary {
            name: name.into(),
            kind: Some(WaitKind::Mutex),
            site: Some(site.into()),
            waits: 3,
            total_ns,
            max_ns: total_ns / 2,
            statement_ns,
            ..LockSummary::default()
        };
        let report = |locks| Report {
            target: "mariadbd".into(),
            host: "h".into(),
            started: String::new(),
            traced: std::time::Duration::from_secs(5),
            profiles: Vec::new(),
            statements: None,
            locks,
            threads: Vec::new(),
            missing: Vec::new(),
            findings: Vec::new(),
            top: 10,
        };
        let idle = || {
            lock(
                "[heap] 0x10 (in wait_for_tasks)",
                "wait_for_tasks",
                9_000_000,
                0,
            )
        };
        assert!(
            findings(&report(vec![idle()])).is_empty(),
            "an idle worker's wait"
        );
        let mut locks = vec![
            idle(),
            lock("LOCK_open", "open_table", 4_000_000, 3_000_000),
        ];
        locks.push(lock("LOCK_thd_data", "mysqld_list", 5_000_000, 1_000_000));
        assert_eq!(
            findings(&report(locks)),
            ["The lock statements waited on most is LOCK_open (mutex): 3.00ms of their time, 3 waits in all, the \
              longest 2.00ms, mostly in open_table."]
        );
    }
}
