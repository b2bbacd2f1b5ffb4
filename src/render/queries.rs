//! Terminal output of `myprobe queries`: one aligned line per statement, and the digest table.

use std::fmt::Write;

use super::terminal_safe;
use crate::query::{digest::DigestRow, CauseWait, QueryRecord, TimeParts};

/// Microseconds in an adaptive unit, at most 7 characters: `812us`, `3.25ms`, `312.5ms`, `1.234s`, `2m05s`.
pub fn human_us(us: u64) -> String {
    match us {
        0..=999 => format!("{us}us"),
        1_000..=9_999 => format!("{:.2}ms", us as f64 / 1e3),
        10_000..=999_999 => format!("{:.1}ms", us as f64 / 1e3),
        1_000_000..=59_999_999 => format!("{:.3}s", us as f64 / 1e6),
        _ => format!("{}m{:02}s", us / 60_000_000, us / 1_000_000 % 60),
    }
}

pub const LINE_HEADER: &str =
    "TIME(UTC)        TID     CONN  USER       DB          DURATION   CPU      RUNQ     LOCK     IO       NET      ERR   WHY            QUERY";

/// One statement on one line; `-` where nothing is known or nothing was spent.
pub fn line(r: &QueryRecord) -> String {
    let ts = r.ts.to_string();
    let time = ts.get(11..26).unwrap_or(&ts);
    let opt = |v: u64| if v == 0 { "-".to_string() } else { human_us(v) };
    let text = match (&r.query, &r.fingerprint) {
        (Some(q), _) => terminal_safe(q).into_owned(),
        (None, Some(f)) => format!("[{}] {}", terminal_safe(r.command), terminal_safe(f)),
        (None, None) => format!("[{}]", terminal_safe(r.command)),
    };
    let mut out = String::with_capacity(160);
    let _ = write!(
        out,
        "{time:<16} {:<7} {:<5} {:<10} {:<11} {:<10} {:<8} {:<8} {:<8} {:<8} {:<8} {:<5} {:<14} ",
        r.tid,
        r.conn.map(|c| c.to_string()).unwrap_or_else(|| "?".into()),
        clip(&terminal_safe(r.user.as_deref().unwrap_or("?")), 10),
        clip(&terminal_safe(r.db.as_deref().unwrap_or("?")), 11),
        human_us(r.duration_us),
        opt(r.time.user_us.saturating_add(r.time.sys_us)),
        opt(r.time.runq_us),
        opt(r.time.lock_us),
        opt(r
            .time
            .read_us
            .saturating_add(r.time.write_us)
            .saturating_add(r.time.sync_us)),
        opt(r.time.net_us),
        r.error.map(|e| e.to_string()).unwrap_or_else(|| "-".into()),
        clip(r.cause.map_or("-", |c| c.label()), 14),
    );
    if r.command != "Query" && r.query.is_some() {
        let _ = write!(out, "[{}] ", terminal_safe(r.command));
    }
    out.push_str(&text);
    if r.in_flight {
        out.push_str("  (still running)");
    }
    if r.before_tracing {
        out.push_str("  (began before tracing)");
    }
    if r.pipelined {
        out.push_str("  (pipelined: within the time of the statement before it)");
    }
    // What it waited for and who held it, where known: its cause's wait first.
    let named = |w: &&CauseWait| w.holder.is_some() || w.object.is_some();
    let mut all = r.waits.iter().chain(&r.io);
    if let Some(w) = all
        .clone()
        .find(|w| Some(w.cause) == r.cause && named(w))
        .or_else(|| all.find(|w| w.holder.is_some()))
    {
        let _ = write!(out, "  ({})", terminal_safe(&w.phrase()));
    }
    if let Some(spilled) = r.spilled() {
        match r.cause.filter(|c| Some(*c) == r.spill()) {
            Some(c) => {
                let _ = write!(out, "  ({}: {spilled})", c.phrase());
            }
            None => {
                let _ = write!(out, "  ({spilled})");
            }
        }
    }
    // A sleep's wait is no lock's.
    if let Some(sym) = r.lock_symbol.as_ref().filter(|_| r.time.lock_us > 0) {
        let _ = write!(
            out,
            "  (lock: {}, {} waits, max {}",
            terminal_safe(sym),
            r.lock_waits,
            human_us(r.lock_max_us)
        );
        // An anonymous lock's name already says where it was waited for.
        if let Some(site) = r.lock_site.as_ref().filter(|_| !sym.contains("(in ")) {
            let _ = write!(out, ", in {}", terminal_safe(site));
        }
        out.push(')');
    }
    out
}

/// `s` cut to `n` characters, the last an ellipsis when cut.
pub fn clip(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut c: String = s.chars().take(n - 1).collect();
        c.push('…');
        c
    }
}

/// The digest as an aligned table, largest total first, at most `top` rows.
pub fn digest_table(rows: &[DigestRow], top: usize) -> String {
    let mut out = String::new();
    if let Some(by) = rows.first().and_then(|r| r.scaled_by) {
        let _ = writeln!(
            out,
            "Estimated: counts and totals scaled ×{by:.1} from the time statements were followed (--sample-every); \
             a statement that came only between those times is missing, not absent: --min-ms N or \
             --sample-every 1 follows every one"
        );
    }
    let grand = rows.iter().fold(0u64, |a, r| a.saturating_add(r.total_us));
    let _ = write!(
        out,
        "{:>4} {:>8} {:>6} {:>8} {:>5} {:>8} {:>8} {:>8} {:>8}",
        "RANK", "COUNT", "ERRORS", "TOTAL", "SHARE", "P50", "P95", "P99", "MAX"
    );
    for name in TimeParts::NAMES {
        let _ = write!(out, " {:>6}", format!("{}%", name.to_uppercase()));
    }
    let _ = writeln!(out, "  FINGERPRINT");
    for (i, r) in rows.iter().take(top).enumerate() {
        let share = if grand > 0 {
            r.total_us as f64 * 100.0 / grand as f64
        } else {
            0.0
        };
        let _ = write!(
            out,
            "{:>4} {:>8} {:>6} {:>8} {:>4.1}% {:>8} {:>8} {:>8} {:>8}",
            i + 1,
            r.count,
            r.errors,
            human_us(r.total_us),
            share,
            human_us(r.p50_us),
            human_us(r.p95_us),
            human_us(r.p99_us),
            human_us(r.max_us),
        );
        for pct in r.shares.values() {
            let _ = write!(out, " {pct:>6.1}");
        }
        let _ = write!(out, "  {}", terminal_safe(&r.fingerprint));
        if let Some(lock) = &r.top_lock {
            let _ = write!(out, "  (top lock: {})", terminal_safe(lock));
        }
        out.push('\n');
    }
    if rows.len() > top {
        let _ = writeln!(out, "... {} more fingerprints", rows.len() - top);
    }
    out
}

/// One sentence per fingerprint of the `top` first: what most of its time went to, and where it waits.
pub fn digest_findings(rows: &[DigestRow], top: usize) -> String {
    let mut out = String::new();
    for r in rows.iter().take(top).filter(|r| r.total_us > 0) {
        let _ = writeln!(
            out,
            "{}: {}.",
            terminal_safe(&clip(&r.fingerprint, 60)),
            terminal_safe(&why(r))
        );
    }
    out
}

/// What most of a fingerprint's time went to: `62% of its time waits for a row lock (in lock_wait)`; and the
/// next cause where it is a lock's and takes a tenth or more.
pub fn why(r: &DigestRow) -> String {
    let total = r.total_us.max(1) as f64;
    let pct = |us: u64| us as f64 * 100.0 / total;
    let Some(top) = r.top_cause() else {
        return "no time traced".into();
    };
    let mut s = format!("{:.0}% of its time {}", pct(top.us), top.phrase());
    let site = r.top_lock_site.as_deref();
    if let Some(site) = site.filter(|_| top.cause.is_lock()) {
        let _ = write!(s, " (in {site})");
    }
    if let Some(next) = r
        .causes
        .iter()
        .find(|c| c.cause != top.cause && c.cause.is_lock() && pct(c.us) >= 10.0)
    {
        let _ = write!(s, "; {:.0}% {}", pct(next.us), next.cause.phrase());
        if let Some(site) = site.filter(|_| !top.cause.is_lock()) {
            let _ = write!(s, " (in {site})");
        }
    }
    for e in r.lock_errors.iter().take(2) {
        let _ = write!(s, "; {} {}", e.count, e.words());
    }
    if let Some(spills) = r.spills.words(r.count) {
        let _ = write!(s, "; {spills}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_control_byte_reaches_the_terminal() {
        let hostile = "ro\u{1b}]0;pwned\u{7}ot\u{9b}31m\u{7f}\tdb\r\nx";
        let safe = terminal_safe(hostile);
        assert!(!safe.chars().any(char::is_control), "{safe:?}");
        assert_eq!(safe, "ro\\x1b]0;pwned\\x07ot\\u{9b}31m\\x7f db  x");
        assert_eq!(terminal_safe("SELECT 'é' -- fine"), "SELECT 'é' -- fine");
        let record = QueryRecord {
            user: Some(hostile.into()),
            db: Some(hostile.into()),
            query: Some(hostile.into()),
            lock_symbol: Some(hostile.into()),
            ..QueryRecord::default()
        };
        let shown = line(&record);
        assert!(!shown.chars().any(char::is_control), "{shown:?}");
    }

    #[test]
    fn times_that_add_up_past_the_largest_stop_there() {
        let record = QueryRecord {
            time: TimeParts {
                read_us: u64::MAX,
                write_us: 1,
                sync_us: 1,
                ..TimeParts::default()
            },
            ..QueryRecord::default()
        };
        assert!(line(&record).contains(&human_us(u64::MAX)));
        let row = |fingerprint: &str, total_us: u64| DigestRow {
            fingerprint: fingerprint.into(),
            count: 1,
            errors: 0,
            total_us,
            avg_us: 0,
            p50_us: 0,
            p95_us: 0,
            p99_us: 0,
            max_us: 0,
            time: TimeParts::default(),
            shares: Default::default(),
            top_lock: None,
            top_lock_site: None,
            causes: Vec::new(),
            lock_errors: Vec::new(),
            spills: Default::default(),
            scaled_by: None,
        };
        let table = digest_table(&[row("SELECT ?", u64::MAX), row("COMMIT", 2)], 10);
        let shares: Vec<&str> = table
            .lines()
            .skip(1)
            .map(|l| l.split_whitespace().nth(4).unwrap())
            .collect();
        assert_eq!(shares, ["100.0%", "0.0%"], "{table}");
    }

    #[test]
    fn adaptive_units() {
        assert_eq!(human_us(0), "0us");
        assert_eq!(human_us(812), "812us");
        assert_eq!(human_us(3_254), "3.25ms");
        assert_eq!(human_us(312_460), "312.5ms");
        assert_eq!(human_us(1_234_000), "1.234s");
        assert_eq!(human_us(125_000_000), "2m05s");
    }
}
