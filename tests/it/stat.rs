//! `myprobe stat`: its columns against vmstat's and iostat's over the same seconds of a loaded machine (a real
//! server under sysbench), the server's QPS against its own Questions counter, and what it does without a
//! server to ask.

use std::{
    process::{Command, Stdio},
    time::Instant,
};

use crate::common::*;
use serde_json::Value;

const LINES: usize = 7;

/// The numbers of whitespace-separated lines whose first word passes `keep`.
fn table(text: &str, keep: impl Fn(&str) -> bool) -> Vec<Vec<f64>> {
    text.lines()
        .filter(|l| l.split_whitespace().next().is_some_and(&keep))
        .map(|l| {
            l.split_whitespace()
                .map(|w| w.parse().unwrap_or(f64::NAN))
                .collect()
        })
        .collect()
}

/// What a per-second column of myprobe's lines counted, each line over its own seconds.
fn counted(lines: &[Value], rate: impl Fn(&Value) -> f64) -> f64 {
    lines
        .iter()
        .map(|l| rate(l) * l["seconds"].as_f64().unwrap())
        .sum()
}

fn near(ours: f64, theirs: f64, rel: f64, abs: f64, what: &str) {
    assert!(
        (ours - theirs).abs() <= (theirs.abs() * rel).max(abs),
        "{what}: myprobe {ours:.1}, the other tool {theirs:.1}"
    );
}

#[test]
fn columns_agree_with_vmstat_and_iostat_under_load() {
    crate::common::servers_alone();
    let db = testdb();
    let load = db.running_load();
    let side_by_side = run_with_vmstat_and_iostat(&db);
    load.finish();
    let ours = &side_by_side.ours;
    assert!(
        ours.status.success(),
        "{}",
        String::from_utf8_lossy(&ours.stderr)
    );
    let lines: Vec<Value> = String::from_utf8_lossy(&ours.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), LINES);
    agrees_with_vmstat(&lines, &side_by_side.vmstat, side_by_side.vmstat_secs);
    agrees_with_iostat(&lines, &side_by_side.iostat);
    agrees_with_the_server(&lines, side_by_side.questions);
}

/// `myprobe stat`, vmstat and iostat run over the same seconds, and the server's own count of its statements
/// meanwhile.
struct SideBySide {
    ours: std::process::Output,
    vmstat: String,
    /// The wall time vmstat's lines cover.
    vmstat_secs: f64,
    iostat: String,
    /// The server's `Questions` over the run.
    questions: f64,
}

fn run_with_vmstat_and_iostat(db: &TestDb) -> SideBySide {
    let questions = |db: &TestDb| -> f64 {
        let out = db.sql("SHOW GLOBAL STATUS LIKE 'Questions'");
        out.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    let q0 = questions(db);
    // The three start together; each prints a line per second.
    let ours = myprobe()
        .args([
            "stat",
            "--json",
            "-c",
            &LINES.to_string(),
            "-p",
            &db.pid.to_string(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // vmstat prints each interval's count as its per-second rate, and its `sleep(1)` intervals run long when
    // the loaded machine is slow to wake it: its wall time is the span its counts cover.
    let vmstat_started = Instant::now();
    let vmstat = Command::new("vmstat")
        .args(["1", &(LINES + 1).to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let vmstat = std::thread::spawn(move || {
        let out = vmstat.wait_with_output().unwrap();
        (out, vmstat_started.elapsed().as_secs_f64())
    });
    let iostat = Command::new("iostat")
        .args(["-dxy", "1", &LINES.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let ours = ours.wait_with_output().unwrap();
    let q1 = questions(db);
    let (vmstat, vmstat_secs) = vmstat.join().unwrap();
    let vmstat = String::from_utf8_lossy(&vmstat.stdout).into_owned();
    let iostat = String::from_utf8_lossy(&iostat.wait_with_output().unwrap().stdout).into_owned();
    SideBySide {
        ours,
        vmstat,
        vmstat_secs,
        iostat,
        questions: q1 - q0,
    }
}

fn sum(lines: &[Value], key: &str) -> f64 {
    lines.iter().map(|l| l[key].as_f64().unwrap()).sum::<f64>()
}

/// Interrupts, context switches and CPU shares against vmstat's.
fn agrees_with_vmstat(lines: &[Value], vmstat: &str, vmstat_secs: f64) {
    let sum = |key: &str| sum(lines, key);
    // vmstat: r b swpd free buff cache si so bi bo in cs us sy id wa st; its first line counts since boot.
    let v = table(vmstat, |w| w.parse::<u64>().is_ok());
    assert_eq!(v.len(), LINES + 1, "{vmstat}");
    let v = &v[1..];
    let col = |i: usize| v.iter().map(|l| l[i]).sum::<f64>();
    // Each tool's mean rate over its span: ours from its lines' own seconds.
    let our_secs = sum("seconds");
    let mean = |key: &str| counted(lines, |l| l[key].as_f64().unwrap()) / our_secs;
    // At least a second each; a busy host's timer comes late.
    assert!(
        (LINES as f64 - 0.1..2.0 * LINES as f64).contains(&our_secs),
        "{LINES} lines of 1 s took {our_secs:.2} s"
    );
    near(
        mean("interrupts_per_s"),
        col(10) / vmstat_secs,
        0.10,
        0.0,
        "interrupts/s",
    );
    near(
        mean("context_switches_per_s"),
        col(11) / vmstat_secs,
        0.10,
        0.0,
        "context switches/s",
    );
    let n = LINES as f64;
    near(sum("user_pct") / n, col(12) / n, 0.10, 3.0, "user %");
    near(sum("system_pct") / n, col(13) / n, 0.10, 3.0, "system %");
    near(sum("idle_pct") / n, col(14) / n, 0.10, 3.0, "idle %");
}

/// iostat -x: the busiest disk's wkB/s and %util (the last column).
fn agrees_with_iostat(lines: &[Value], iostat: &str) {
    let header = iostat
        .lines()
        .find(|l| l.starts_with("Device"))
        .expect("iostat header");
    let names: Vec<&str> = header.split_whitespace().collect();
    let wkb = names.iter().position(|&n| n == "wkB/s").unwrap();
    let disks: Vec<String> = lines[0]["disks"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    let busiest = disks
        .iter()
        .max_by(|a, b| {
            let w = |d: &str| {
                lines
                    .iter()
                    .map(|l| l["disks"][d]["write_mib_per_s"].as_f64().unwrap())
                    .sum::<f64>()
            };
            w(a).total_cmp(&w(b))
        })
        .expect("no disk shown");
    let io = table(iostat, |w| w == busiest);
    assert_eq!(io.len(), LINES, "{iostat}");
    let disk_sum = |key: &str| {
        lines
            .iter()
            .map(|l| l["disks"][busiest.as_str()][key].as_f64().unwrap())
            .sum::<f64>()
    };
    let io_col = |i: usize| io.iter().map(|l| l[i]).sum::<f64>();
    assert!(
        io_col(wkb) > 0.0,
        "no writes on {busiest} under load:\n{iostat}"
    );
    near(
        disk_sum("write_mib_per_s") * 1024.0,
        io_col(wkb),
        0.10,
        0.0,
        "write kB/s",
    );
    let n = LINES as f64;
    near(
        disk_sum("util_pct") / n,
        io_col(names.len() - 1) / n,
        0.10,
        2.0,
        "%util",
    );
}

/// The server's own counters: its Questions over the run (ours, plus the test's reads), and its process.
fn agrees_with_the_server(lines: &[Value], questions: f64) {
    let qps = counted(lines, |l| l["status"]["Questions"].as_f64().unwrap());
    assert!(qps > 0.0);
    near(qps, questions, 0.10, 0.0, "queries counted");
    assert!(lines
        .iter()
        .all(|l| l["status"]["Threads_running"].as_f64().unwrap() >= 1.0));
    assert!(lines
        .iter()
        .all(|l| l["server_threads"].as_u64().unwrap() > 1));
    assert!(sum(lines, "server_cpu_pct") > 0.0);
}

#[test]
fn without_a_server_the_machine_columns_go_on() {
    let db = testdb();
    // A server that does not answer: one line on stderr, the other columns on stdout.
    let run = myprobe()
        .args([
            "stat",
            "-c",
            "2",
            "-i",
            "0.2",
            "--socket",
            "/nonexistent.sock",
            "-p",
        ])
        .arg(db.pid.to_string())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&run.stderr);
    let out = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("no server columns"), "{err}");
    assert!(out.contains("cs/s") && !out.contains("qps"), "{out}");
    assert_eq!(out.lines().count(), 4, "{out}");
    // A wrong PID: one line, no output.
    let run = myprobe()
        .args(["stat", "-c", "1", "-p", "999999"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("no process with PID 999999"), "{err}");
}
