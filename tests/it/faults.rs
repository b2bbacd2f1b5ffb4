//! Faults around a run: signals, a reader that goes away, a stderr that is closed. myprobe ends promptly and
//! cleanly, writes what it found when it can, and leaves nothing in the kernel.

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::common::*;

/// Waits up to `secs` for `child` to exit; kills it and fails if it does not.
fn exits_within(child: &mut Child, secs: u64, what: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("myprobe did not end within {secs} s after {what}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn signal(child_pid: u32, sig: i32) {
    // SAFETY: kill has no memory-safety preconditions.
    assert_eq!(unsafe { libc::kill(child_pid as i32, sig) }, 0);
}

#[test]
fn every_command_closes_only_what_it_owns() {
    // A descriptor handed to libbpf (a perf event, a program, a map) is libbpf's to close: closed by myprobe too,
    // the second close fails, or closes whoever was given the number meanwhile, whose own close then fails.
    // strace records each close that fails, for every command that opens BPF objects, files or connections.
    let db = testdb();
    let dir = tempdir("closes");
    let pid = db.pid.to_string();
    let load = db.running_load();
    let runs: &[&[&str]] = &[
        &["profile", "cpu", "-d", "2", "--kernel"],
        &["profile", "offcpu", "-d", "2"],
        &["profile", "locks", "-d", "2"],
        &["profile", "syscalls", "-d", "2"],
        &["profile", "alloc", "-d", "2"],
        &["profile", "memleak", "-d", "2"],
        &["queries", "-d", "2", "--summary"],
        &["stacks"],
        &["trace", "dispatch_command", "-d", "2", "--max-rate", "0"],
        &["stat", "-c", "2"],
    ];
    // And the compat build's, which read threads' stacks and unwind rows their own way.
    let compat: &[&[&str]] = &[
        &["profile", "cpu", "-d", "2"],
        &["profile", "offcpu", "-d", "2"],
        &["stacks"],
    ];
    let all = runs
        .iter()
        .map(|r| (r, None))
        .chain(compat.iter().map(|r| (r, Some("bpf_loop"))));
    for (n, (args, disable)) in all.enumerate() {
        let log = dir.join(format!("closes-{n}"));
        let mut args = args.to_vec();
        args.extend_from_slice(&["-p", &pid]);
        let mut cmd = closes_watched(&log, &args);
        if let Some(features) = disable {
            cmd.env("MYPROBE_DISABLE", features);
        }
        let out = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "myprobe {args:?} ({disable:?} disabled) failed:\n{stderr}"
        );
        let failed = failed_closes(&log);
        assert!(
            failed.is_empty(),
            "myprobe {args:?} ({disable:?} disabled): closes that failed:\n{failed}\nstderr:\n{stderr}"
        );
    }
    load.finish();
}

#[test]
fn sigterm_ends_tracing_with_results() {
    let db = testdb();
    let pid = db.pid.to_string();
    // Every fingerprint in the digest: other tests' loads on the same server fill the top 30.
    let queries = Background::start(
        &["queries", "-p", &pid, "--summary", "--top", "100000"],
        "tracing the statements",
    );
    db.sql("SELECT 'before sigterm'");
    let profile = Background::start(&["profile", "offcpu", "-p", &pid, "-d", "60"], "for 60 s");
    std::thread::sleep(Duration::from_millis(500));
    signal(queries.pid(), libc::SIGTERM);
    signal(profile.pid(), libc::SIGTERM);
    let (digest, err) = queries.wait();
    assert!(err.contains("statements traced"), "{err}");
    assert!(
        digest.contains("select ?"),
        "the digest is written:\n{digest}\n{err}"
    );
    let (folded, err) = profile.wait();
    assert!(!folded.trim().is_empty(), "the profile is written:\n{err}");
    assert!(err.contains("traced in"), "{err}");
}

#[test]
fn a_reader_that_goes_away_ends_tracing() {
    let db = testdb();
    let mut tracer = myprobe()
        .args(["queries", "-p", &db.pid.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(tracer.stdout.take().unwrap());
    let mut header = String::new();
    out.read_line(&mut header).unwrap();
    assert!(header.starts_with("TIME"), "{header}");
    // `| head -1`: the reader exits.
    drop(out);
    let deadline = Instant::now() + Duration::from_secs(120);
    while tracer.try_wait().unwrap().is_none() && Instant::now() < deadline {
        db.sql("SELECT 'nobody reads this'");
        std::thread::sleep(Duration::from_millis(300));
    }
    let status = exits_within(&mut tracer, 1, "its stdout was closed");
    assert!(status.success(), "{status}");
}

#[test]
fn a_closed_stderr_is_no_crash() {
    let db = testdb();
    let mut tracer = myprobe()
        .args(["queries", "-p", &db.pid.to_string(), "-d", "3"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(tracer.stderr.take());
    std::thread::sleep(Duration::from_millis(1500));
    // A compressed connection makes the tracer warn from inside the ring buffer callback.
    let compressed = db
        .client()
        .args(["--compress", "-e", "SELECT 1"])
        .output()
        .unwrap();
    assert!(compressed.status.success());
    db.sql("SELECT 2");
    let status = exits_within(&mut tracer, 60, "its duration");
    assert!(status.success(), "{status}");
}

#[test]
fn sigkill_leaves_nothing_in_the_kernel() {
    let db = testdb();
    let pid = db.pid.to_string();
    let tracer = Background::start(&["queries", "-p", &pid], "tracing the statements");
    let held = bpf_objects(tracer.pid());
    assert!(
        held.iter().any(|(k, _)| k == "prog") && held.iter().any(|(k, _)| k == "link"),
        "{held:?}"
    );
    signal(tracer.pid(), libc::SIGKILL);
    drop(tracer);
    let left = |held: &[(String, u32)]| -> Vec<(String, u32)> {
        held.iter()
            .filter(|(kind, id)| {
                Command::new("bpftool")
                    .args([kind.as_str(), "show", "id", &id.to_string()])
                    .output()
                    .unwrap()
                    .status
                    .success()
            })
            .cloned()
            .collect()
    };
    // The kernel frees them once the last reference goes, after an RCU grace period.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut remaining = left(&held);
    while !remaining.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        remaining = left(&remaining);
    }
    assert!(remaining.is_empty(), "still in the kernel: {remaining:?}");
}

#[test]
fn a_server_that_exits_ends_tracing_with_results() {
    let db = testdb();
    let dir = tempdir("restarted");
    let server = db.start_another(&dir.join("server"), &[]);
    let other = &server.0;
    let pid = other.pid.to_string();
    let queries = Background::start(
        &["queries", "-p", &pid, "--summary"],
        "tracing the statements",
    );
    let profile = Background::start(&["profile", "offcpu", "-p", &pid, "-d", "120"], "for 120 s");
    other.sql("SELECT 'before the restart'");
    // A restart begins with the old server's exit.
    other.stop();
    let (digest, err) = queries.wait_within(60, "the server exited");
    assert!(err.contains("exited (a restart?)"), "{err}");
    assert!(
        digest.contains("select ?"),
        "the digest is written:\n{digest}\n{err}"
    );
    let (folded, err) = profile.wait_within(60, "the server exited");
    assert!(err.contains("exited (a restart?)"), "{err}");
    assert!(!folded.trim().is_empty(), "the profile is written:\n{err}");
}
