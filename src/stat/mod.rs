//! `myprobe stat`: one line per interval, vmstat-style, of the machine (/proc/stat, /proc/diskstats), the server
//! process (/proc/PID/stat) and the server's own counters (SHOW GLOBAL STATUS). Each interval reads each
//! counter once; rates are differences of two readings.

use std::{collections::BTreeMap, fmt::Write as _, time::Instant};

use anyhow::{Context, Result};
use serde::Serialize;

use crate::{client::Client, server::StatusCounter};

/// The machine's counters (/proc/stat).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuCounters {
    /// Clock ticks of the `cpu` line: user (with nice), system (with irq and softirq), idle, iowait, steal.
    pub user: u64,
    pub system: u64,
    pub idle: u64,
    pub iowait: u64,
    pub steal: u64,
    pub interrupts: u64,
    pub context_switches: u64,
    /// Gauges: threads runnable, threads blocked on I/O.
    pub running: u64,
    pub blocked: u64,
}

/// Parses /proc/stat.
pub fn parse_proc_stat(text: &str) -> Option<CpuCounters> {
    let mut c = CpuCounters::default();
    let mut seen_cpu = false;
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let key = f.next()?;
        let nums: Vec<u64> = f.map(|v| v.parse().unwrap_or(0)).collect();
        let at = |i: usize| nums.get(i).copied().unwrap_or(0);
        match key {
            // user nice system idle iowait irq softirq steal guest guest_nice (guest is inside user)
            "cpu" => {
                seen_cpu = true;
                c.user = at(0).saturating_add(at(1));
                c.system = at(2).saturating_add(at(5)).saturating_add(at(6));
                c.idle = at(3);
                c.iowait = at(4);
                c.steal = at(7);
            }
            "intr" => c.interrupts = at(0),
            "ctxt" => c.context_switches = at(0),
            "procs_running" => c.running = at(0),
            "procs_blocked" => c.blocked = at(0),
            _ => {}
        }
    }
    seen_cpu.then_some(c)
}

/// One disk's counters (/proc/diskstats).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiskCounters {
    pub reads: u64,
    pub read_sectors: u64,
    pub read_ms: u64,
    pub writes: u64,
    pub write_sectors: u64,
    pub write_ms: u64,
    /// Milliseconds with I/O in flight: iostat's %util.
    pub busy_ms: u64,
}

/// Parses /proc/diskstats: the devices `keep` accepts, by name.
pub fn parse_diskstats(text: &str, keep: impl Fn(&str) -> bool) -> BTreeMap<String, DiskCounters> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let name = *f.get(2)?;
            if !keep(name) {
                return None;
            }
            let n = |i: usize| f.get(i).and_then(|v| v.parse().ok()).unwrap_or(0u64);
            Some((
                name.to_string(),
                DiskCounters {
                    reads: n(3),
                    read_sectors: n(5),
                    read_ms: n(6),
                    writes: n(7),
                    write_sectors: n(9),
                    write_ms: n(10),
                    busy_ms: n(12),
                },
            ))
        })
        .collect()
}

/// The disks iostat shows: whole devices (in /sys/block), not loop, ram or zram devices, that have done I/O
/// since boot.
fn shown_disks() -> BTreeMap<String, DiskCounters> {
    let text = std::fs::read_to_string("/proc/diskstats").unwrap_or_default();
    let all = parse_diskstats(&text, |name| {
        std::path::Path::new("/sys/block").join(name).exists()
            && !["loop", "ram", "zram"].iter().any(|p| name.starts_with(p))
    });
    all.into_iter()
        .filter(|(_, d)| d.reads > 0 || d.writes > 0)
        .collect()
}

/// The server process's counters (/proc/PID/stat).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessCounters {
    /// utime + stime, clock ticks.
    pub cpu_ticks: u64,
    pub threads: u64,
    pub rss_pages: u64,
}

/// Parses /proc/PID/stat (the name in parentheses may hold anything).
pub fn parse_pid_stat(text: &str) -> Option<ProcessCounters> {
    let s = crate::process::Stat::parse(text)?;
    Some(ProcessCounters {
        cpu_ticks: s.utime.saturating_add(s.stime),
        threads: s.threads,
        rss_pages: s.rss_pages,
    })
}

/// One reading of everything.
#[derive(Clone, Debug)]
pub struct Reading {
    at: Instant,
    cpu: Option<CpuCounters>,
    disks: BTreeMap<String, DiskCounters>,
    process: Option<ProcessCounters>,
    status: Option<BTreeMap<String, u64>>,
    /// The server's counters that its columns show (`Server::status_counters`).
    counters: &'static [StatusCounter],
    /// When the server answered: a query under load can take longer than the files, and the machine's rates must
    /// not be divided by its wait.
    status_at: Instant,
}

impl Reading {
    /// Whether the server process was there to read.
    pub fn has_process(&self) -> bool {
        self.process.is_some()
    }
}

/// Reads the counters; the server's through `client` when there is one (`None` when it did not answer).
pub fn read(pid: Option<u32>, client: Option<&mut Client>) -> (Reading, Option<anyhow::Error>) {
    let cpu = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|t| parse_proc_stat(&t));
    let process = pid.and_then(|p| {
        let t = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
        parse_pid_stat(&t)
    });
    let disks = shown_disks();
    let at = Instant::now();
    let counters = client
        .as_ref()
        .map_or(&[][..], |c| c.server().status_counters());
    let (status, error) = match client.map(|c| read_status(c, counters)) {
        Some(Ok(s)) => (Some(s), None),
        Some(Err(e)) => (None, Some(e)),
        None => (None, None),
    };
    (
        Reading {
            at,
            cpu,
            disks,
            process,
            status,
            counters,
            status_at: Instant::now(),
        },
        error,
    )
}

fn read_status(client: &mut Client, counters: &[StatusCounter]) -> Result<BTreeMap<String, u64>> {
    let names: Vec<String> = counters.iter().map(|c| format!("'{}'", c.name)).collect();
    let rows = client
        .query(&format!(
            "SHOW GLOBAL STATUS WHERE Variable_name IN ({})",
            names.join(", ")
        ))
        .context("reading the server's status")?;
    Ok(rows
        .into_iter()
        .filter_map(|r| {
            let mut r = r.into_iter();
            Some((r.next()??, r.next()??.parse().ok()?))
        })
        .collect())
}

/// One interval's line.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Line {
    /// Seconds the interval lasted.
    pub seconds: f64,
    pub running: u64,
    pub blocked: u64,
    pub context_switches_per_s: f64,
    pub interrupts_per_s: f64,
    /// % of all CPUs' time.
    pub user_pct: f64,
    pub system_pct: f64,
    pub iowait_pct: f64,
    pub idle_pct: f64,
    pub steal_pct: f64,
    pub disks: BTreeMap<String, DiskLine>,
    /// The server process: % of one CPU, resident MiB, threads.
    pub server_cpu_pct: Option<f64>,
    pub server_rss_mib: Option<f64>,
    pub server_threads: Option<u64>,
    /// SHOW GLOBAL STATUS: per second, but Threads_running (a gauge); absent without a connection.
    pub status: Option<BTreeMap<String, f64>>,
    /// The columns of `status`, as the server names its counters.
    #[serde(skip)]
    pub counters: &'static [StatusCounter],
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct DiskLine {
    pub util_pct: f64,
    pub read_mib_per_s: f64,
    pub write_mib_per_s: f64,
    pub read_await_ms: f64,
    pub write_await_ms: f64,
}

/// The span between two reads, never zero (rates are divided by it).
fn seconds_between(a: Instant, b: Instant) -> f64 {
    b.duration_since(a).as_secs_f64().max(1e-3)
}

/// What happened between two readings.
pub fn line(a: &Reading, b: &Reading, ticks_per_s: u64, page_size: u64) -> Line {
    let secs = seconds_between(a.at, b.at);
    let rate = |x: u64, y: u64| y.saturating_sub(x) as f64 / secs;
    let mut l = Line {
        seconds: secs,
        ..Line::default()
    };
    if let (Some(x), Some(y)) = (&a.cpu, &b.cpu) {
        l.running = y.running;
        l.blocked = y.blocked;
        l.context_switches_per_s = rate(x.context_switches, y.context_switches);
        l.interrupts_per_s = rate(x.interrupts, y.interrupts);
        let d = |f: fn(&CpuCounters) -> u64| f(y).saturating_sub(f(x)) as f64;
        let total =
            d(|c| c.user) + d(|c| c.system) + d(|c| c.idle) + d(|c| c.iowait) + d(|c| c.steal);
        if total > 0.0 {
            let pct = |v: f64| 100.0 * v / total;
            l.user_pct = pct(d(|c| c.user));
            l.system_pct = pct(d(|c| c.system));
            l.idle_pct = pct(d(|c| c.idle));
            l.iowait_pct = pct(d(|c| c.iowait));
            l.steal_pct = pct(d(|c| c.steal));
        }
    }
    for (name, y) in &b.disks {
        let Some(x) = a.disks.get(name) else { continue };
        let reads = y.reads.saturating_sub(x.reads);
        let writes = y.writes.saturating_sub(x.writes);
        let per = |ms: u64, n: u64| if n > 0 { ms as f64 / n as f64 } else { 0.0 };
        l.disks.insert(
            name.clone(),
            DiskLine {
                util_pct: (100.0 * y.busy_ms.saturating_sub(x.busy_ms) as f64 / (secs * 1000.0))
                    .min(100.0),
                read_mib_per_s: rate(x.read_sectors, y.read_sectors) * 512.0 / 1048576.0,
                write_mib_per_s: rate(x.write_sectors, y.write_sectors) * 512.0 / 1048576.0,
                read_await_ms: per(y.read_ms.saturating_sub(x.read_ms), reads),
                write_await_ms: per(y.write_ms.saturating_sub(x.write_ms), writes),
            },
        );
    }
    if let (Some(x), Some(y)) = (&a.process, &b.process) {
        l.server_cpu_pct = Some(100.0 * rate(x.cpu_ticks, y.cpu_ticks) / ticks_per_s as f64);
        l.server_rss_mib = Some(y.rss_pages as f64 * page_size as f64 / 1048576.0);
        l.server_threads = Some(y.threads);
    }
    if let (Some(x), Some(y)) = (&a.status, &b.status) {
        let secs = seconds_between(a.status_at, b.status_at);
        let status_rate = |x: u64, y: u64| y.saturating_sub(x) as f64 / secs;
        l.counters = b.counters;
        l.status = Some(
            b.counters
                .iter()
                .filter_map(|c| {
                    let v = *y.get(c.name)?;
                    let value = if c.gauge {
                        v as f64
                    } else {
                        status_rate(*x.get(c.name)?, v)
                    };
                    Some((c.name.to_string(), value))
                })
                .collect(),
        );
    }
    l
}

/// The column headers, two lines, for the disks and what is known.
pub fn header(l: &Line) -> String {
    let mut top = format!("{:-^24} {:-^19}", "procs", "cpu %");
    let mut names = format!(
        "{:>3} {:>3} {:>7} {:>7} {:>4} {:>4} {:>4} {:>4}",
        "r", "b", "cs/s", "in/s", "us", "sy", "wa", "id"
    );
    if l.server_cpu_pct.is_some() {
        let _ = write!(top, " {:-^21}", "server");
        let _ = write!(names, " {:>6} {:>7} {:>5}", "cpu%", "rssMiB", "thr");
    }
    if l.status.is_some() {
        let mut heads = String::new();
        for c in l.counters {
            let _ = write!(heads, " {:>w$}", c.column, w = column_width(c));
        }
        let _ = write!(top, " {:-^w$}", "server status /s", w = heads.len() - 1);
        names.push_str(&heads);
    }
    for d in l.disks.keys() {
        let _ = write!(top, " {:-^38}", d);
        let _ = write!(
            names,
            " {:>5} {:>7} {:>7} {:>7} {:>7}",
            "util%", "rMiB/s", "wMiB/s", "r_await", "w_await"
        );
    }
    format!("{top}\n{names}")
}

/// A server counter's column: its heading's width, with room for six digits.
fn column_width(c: &StatusCounter) -> usize {
    c.column.len().max(6)
}

/// One line of columns, as [`header`] names them.
pub fn columns(l: &Line) -> String {
    let mut s = format!(
        "{:>3} {:>3} {:>7.0} {:>7.0} {:>4.0} {:>4.0} {:>4.0} {:>4.0}",
        l.running,
        l.blocked,
        l.context_switches_per_s,
        l.interrupts_per_s,
        l.user_pct,
        l.system_pct,
        l.iowait_pct,
        l.idle_pct
    );
    if let (Some(cpu), Some(rss), Some(thr)) =
        (l.server_cpu_pct, l.server_rss_mib, l.server_threads)
    {
        let _ = write!(s, " {cpu:>6.1} {rss:>7.0} {thr:>5}");
    }
    if let Some(st) = &l.status {
        for c in l.counters {
            let v = st.get(c.name).copied().unwrap_or(0.0) / c.unit;
            let _ = write!(s, " {v:>w$.0}", w = column_width(c));
        }
    }
    for d in l.disks.values() {
        let _ = write!(
            s,
            " {:>5.1} {:>7.2} {:>7.2} {:>7.2} {:>7.2}",
            d.util_pct, d.read_mib_per_s, d.write_mib_per_s, d.read_await_ms, d.write_await_ms
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_counters() {
        let text = "cpu  388298 10 94375 1623008 4053 7 2979 172 5 0\ncpu0 1 2 3 4 5 6 7 8 9 0\n\
                    intr 13379672 0 0 0\nctxt 53128301\nbtime 1\nprocs_running 3\nprocs_blocked 1\n";
        let c = parse_proc_stat(text).unwrap();
        assert_eq!(
            c,
            CpuCounters {
                user: 388_308,
                system: 94_375 + 7 + 2_979,
                idle: 1_623_008,
                iowait: 4_053,
                steal: 172,
                interrupts: 13_379_672,
                context_switches: 53_128_301,
                running: 3,
                blocked: 1,
            }
        );
        assert_eq!(parse_proc_stat("intr 1\n"), None);
    }

    #[test]
    fn diskstats_and_pid_stat() {
        let text = " 253       0 vda 1000 5 80000 300 2000 9 160000 900 0 1200 1300 0 0 0 0\n\
                    \x20  7       0 loop0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n";
        let d = parse_diskstats(text, |n| n == "vda");
        assert_eq!(d.len(), 1);
        assert_eq!(
            d["vda"],
            DiskCounters {
                reads: 1000,
                read_sectors: 80000,
                read_ms: 300,
                writes: 2000,
                write_sectors: 160000,
                write_ms: 900,
                busy_ms: 1200,
            }
        );
        let stat =
            "4242 (my (odd) name) S 1 4242 4242 0 -1 4194560 5000 0 0 0 700 300 0 0 20 0 37 0 \
                    12345 1234567890 25600 18446744073709551615";
        assert_eq!(
            parse_pid_stat(stat),
            Some(ProcessCounters {
                cpu_ticks: 1000,
                threads: 37,
                rss_pages: 25600
            })
        );
    }

    #[test]
    fn a_line_is_the_rates_between_two_readings() {
        let t0 = Instant::now();
        let a = Reading {
            at: t0,
            cpu: Some(CpuCounters {
                user: 100,
                system: 50,
                idle: 800,
                iowait: 50,
                steal: 0,
                interrupts: 1000,
                context_switches: 5000,
                running: 1,
                blocked: 0,
            }),
            disks: [(
                "vda".to_string(),
                DiskCounters {
                    reads: 10,
                    read_ms: 10,
                    busy_ms: 100,
                    ..Default::default()
                },
            )]
            .into(),
            process: Some(ProcessCounters {
                cpu_ticks: 100,
                threads: 10,
                rss_pages: 256,
            }),
            status: Some(
                [
                    ("Questions".to_string(), 100),
                    ("Threads_running".to_string(), 3),
                ]
                .into(),
            ),
            counters: crate::server::of_version("9.7.4").status_counters(),
            status_at: t0,
        };
        let mut b = a.clone();
        b.at = t0 + std::time::Duration::from_secs(2);
        // The server answered 2 s after the files were read: its rates are over its own 4 s, the machine's over 2 s.
        b.status_at = t0 + std::time::Duration::from_secs(4);
        b.cpu = Some(CpuCounters {
            user: 140,
            system: 70,
            idle: 820,
            iowait: 70,
            steal: 0,
            interrupts: 3000,
            context_switches: 9000,
            running: 4,
            blocked: 2,
        });
        b.disks.get_mut("vda").unwrap().reads = 30;
        b.disks.get_mut("vda").unwrap().read_ms = 50;
        b.disks.get_mut("vda").unwrap().busy_ms = 600;
        b.process.as_mut().unwrap().cpu_ticks = 250;
        b.status = Some(
            [
                ("Questions".to_string(), 2100),
                ("Threads_running".to_string(), 5),
            ]
            .into(),
        );
        let l = line(&a, &b, 100, 4096);
        assert_eq!((l.running, l.blocked), (4, 2));
        assert_eq!(l.context_switches_per_s, 2000.0);
        assert_eq!(l.interrupts_per_s, 1000.0);
        assert_eq!(
            (l.user_pct, l.system_pct, l.idle_pct, l.iowait_pct),
            (40.0, 20.0, 20.0, 20.0)
        );
        assert_eq!(l.disks["vda"].util_pct, 25.0);
        assert_eq!(l.disks["vda"].read_await_ms, 2.0);
        assert_eq!(l.server_cpu_pct, Some(75.0));
        assert_eq!(l.server_rss_mib, Some(1.0));
        let st = l.status.as_ref().unwrap();
        assert_eq!((st["Questions"], st["Threads_running"]), (500.0, 5.0));
        // Each counter the server names has its column, those it did not answer with as 0.
        let (head, row) = (header(&l), columns(&l));
        let names = head.lines().nth(1).unwrap();
        assert!(
            names.contains("    qps    run     rd     wr  fsync redoKiB redofs  lockw   slow"),
            "{names}"
        );
        assert!(
            row.contains("    500      5      0      0      0       0      0      0      0"),
            "{row}"
        );
    }
}
