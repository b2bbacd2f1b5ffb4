//! The history on a terminal: DB load over a range as a small stacked chart with its table, the top statements,
//! users, hosts and blockers; the sessions at a moment with the chains of who blocked whom.

use std::{collections::BTreeMap, fmt::Write};

use super::{
    read::{chains, Moment, Range, Share},
    time, SessionSample, IDLE_IN_TRANSACTION,
};
use crate::render::terminal_safe;

/// Rows of the chart.
const HEIGHT: usize = 8;

/// The range: its chart, its states' table, and its top lists.
pub fn range(r: &Range) -> String {
    let mut out = String::new();
    let source = if r.per_minute {
        "from the per-minute sums"
    } else {
        "from every second sampled"
    };
    let _ = writeln!(
        out,
        "DB load (average active sessions) from {} to {}, {source}; one column = {} s",
        time::format(r.from),
        time::format(r.to),
        r.step
    );
    if r.points.is_empty() {
        let _ = writeln!(
            out,
            "no session ran a statement in that range (nothing sampled, or all idle)"
        );
        return out;
    }
    for s in &r.servers {
        let _ = writeln!(out, "server: {}", terminal_safe(s));
    }
    out.push_str(&chart(r));
    out.push('\n');
    let total: f64 = r.states.iter().map(|s| s.load).sum();
    let _ = writeln!(out, "{:<28} {:>7} {:>6}", "state", "load", "share");
    for s in &r.states {
        let _ = writeln!(
            out,
            "{:<28} {:>7.2} {:>5.0}%",
            s.key,
            s.load,
            100.0 * s.load / total.max(f64::MIN_POSITIVE)
        );
    }
    for (title, shares) in [
        ("top statements", &r.statements),
        ("top users", &r.users),
        ("top hosts", &r.hosts),
        (
            "top blockers (the load that waited behind each)",
            &r.blockers,
        ),
    ] {
        if shares.is_empty() {
            continue;
        }
        let _ = writeln!(out, "\n{title}:");
        for s in shares {
            let _ = writeln!(out, "{:>7.2}  {}", s.load, terminal_safe(&s.key));
        }
    }
    out
}

/// The symbol each state is drawn with: its first letter, else another of its letters, else a digit.
fn symbols(states: &[Share]) -> Vec<(String, char)> {
    let mut used = Vec::new();
    states
        .iter()
        .map(|s| {
            let c = s
                .key
                .chars()
                .filter(|c| c.is_ascii_alphabetic())
                .flat_map(|c| [c.to_ascii_uppercase(), c.to_ascii_lowercase()])
                .chain('1'..='9')
                .find(|c| !used.contains(c))
                .unwrap_or('#');
            used.push(c);
            (s.key.clone(), c)
        })
        .collect()
}

fn chart(r: &Range) -> String {
    let symbols = symbols(&r.states);
    let columns = ((r.to - r.from + r.step - 1) / r.step).max(1) as usize;
    let mut loads: Vec<&BTreeMap<String, f64>> = vec![&EMPTY; columns];
    for p in &r.points {
        if let Some(slot) = loads.get_mut(((p.ts - r.from) / r.step) as usize) {
            *slot = &p.load;
        }
    }
    let peak = loads
        .iter()
        .map(|l| l.values().sum::<f64>())
        .fold(0.0, f64::max)
        .max(1.0);
    let per_row = peak / HEIGHT as f64;
    let mut out = String::new();
    for row in (0..HEIGHT).rev() {
        let level = (row as f64 + 0.5) * per_row;
        let label = if row == HEIGHT - 1 || row == 0 {
            format!("{:>6.1}", (row + 1) as f64 * per_row)
        } else {
            " ".repeat(6)
        };
        out.push_str(&label);
        out.push_str(" │");
        for load in &loads {
            // Stacked in the order of the table (the largest at the bottom).
            let mut height = 0.0;
            let mut cell = ' ';
            for (state, symbol) in &symbols {
                height += load.get(state).copied().unwrap_or(0.0);
                if height >= level {
                    cell = *symbol;
                    break;
                }
            }
            out.push(cell);
        }
        out.push('\n');
    }
    let _ = writeln!(out, "{:>6} └{}", "0", "─".repeat(columns));
    let _ = writeln!(
        out,
        "{:>8}{}{:>width$}",
        "",
        time::clock(r.from),
        time::clock(r.to),
        width = columns.saturating_sub(8)
    );
    let legend: Vec<String> = symbols.iter().map(|(s, c)| format!("{c} {s}")).collect();
    let _ = writeln!(out, "        {}", legend.join("   "));
    out
}

static EMPTY: BTreeMap<String, f64> = BTreeMap::new();

/// The sessions of each server at a moment, and who blocked whom.
pub fn moment(m: &Moment) -> String {
    let mut out = String::new();
    if m.servers.is_empty() {
        let _ = writeln!(
            out,
            "nothing sampled at {} (nor in the 5 s before): the agent was not running, or no session ran a \
             statement or held a transaction open",
            time::format(m.asked)
        );
        return out;
    }
    for s in &m.servers {
        let active = s.sessions.iter().filter(|x| x.is_active()).count();
        let _ = writeln!(
            out,
            "At {}, {}: {active} sessions running a statement, {} idle in a transaction",
            time::format(s.ts),
            terminal_safe(&s.server),
            s.sessions.len() - active
        );
        let _ = writeln!(
            out,
            "{:>8}  {:<22} {:<12} {:>8}  {:<44} statement",
            "conn", "user@host", "db", "for", "state"
        );
        for x in &s.sessions {
            let _ = writeln!(
                out,
                "{:>8}  {:<22} {:<12} {:>8}  {:<44} {}",
                x.conn,
                terminal_safe(&who(x)),
                terminal_safe(x.db.as_deref().unwrap_or("")),
                x.statement_s.map_or(String::new(), seconds),
                terminal_safe(&state_words(x)),
                terminal_safe(x.statement.as_deref().unwrap_or(""))
            );
        }
        let chains = chains(&s.sessions);
        if !chains.is_empty() {
            let _ = writeln!(out, "\nwho blocked whom:");
        }
        for (root, waiters) in chains {
            let holder = s.sessions.iter().find(|x| x.conn == root);
            let _ = writeln!(out, "  {}", holder_words(root, holder));
            for w in waiters {
                let _ = writeln!(out, "    ← {}", terminal_safe(&waiter_words(w)));
            }
        }
        out.push('\n');
    }
    out
}

pub fn who(x: &SessionSample) -> String {
    match (&x.user, &x.host) {
        (Some(u), Some(h)) => format!("{u}@{h}"),
        (Some(u), None) => u.to_string(),
        _ => String::new(),
    }
}

pub fn seconds(s: f64) -> String {
    if s < 10.0 {
        format!("{s:.1} s")
    } else {
        format!("{s:.0} s")
    }
}

/// `row lock on sbtest.sbtest1 (PRIMARY, X)`, `CPU`, `idle in transaction`.
pub fn state_words(x: &SessionSample) -> String {
    match &x.object {
        Some(o) => format!("{} on {o}", x.state),
        None => x.state.to_string(),
    }
}

/// `connection 43 waits for a row lock on db.t (PRIMARY, X) for 3.0 s (queued behind 44): UPDATE …`.
pub fn waiter_words(w: &SessionSample) -> String {
    let behind = match w.blocker {
        Some(b) if Some(b) != w.root_blocker => format!(" (queued behind {b})"),
        _ => String::new(),
    };
    format!(
        "connection {} waits for a {} for {}{behind}: {}",
        w.conn,
        state_words(w),
        w.statement_s.map_or("?".into(), seconds),
        w.statement.as_deref().unwrap_or("?")
    )
}

/// `connection 42 (app@10.0.0.1), idle in its transaction for 40 s; it ran: UPDATE …`.
pub fn holder_words(conn: u64, holder: Option<&SessionSample>) -> String {
    let Some(h) = holder else {
        return format!("connection {conn} (not sampled at that second)");
    };
    let mut s = format!("connection {conn} ({})", who(h));
    if h.state == IDLE_IN_TRANSACTION {
        s.push_str(", idle in its transaction");
        if let Some(t) = h.transaction_s {
            let _ = write!(s, " (open for {} at least)", seconds(t));
        }
    } else {
        let _ = write!(
            s,
            ", running {} ({})",
            h.statement.as_deref().unwrap_or("?"),
            state_words(h)
        );
    }
    if !h.holder_statements.is_empty() {
        let _ = write!(
            s,
            "; its transaction ran: {}",
            h.holder_statements.join("; ")
        );
    } else if h.state == IDLE_IN_TRANSACTION {
        s.push_str(NOT_SEEN);
    }
    s
}

/// What is said of a holder idle in its transaction whose statements none of the agent's saw.
pub use crate::query::record::RAN_NOT_SEEN as NOT_SEEN;
