//! User stacks unwound in the kernel from .eh_frame: complete stacks on Debian's glibc and mariadbd, frame for
//! frame what eu-stack (elfutils) reads from the same thread.

use std::{
    collections::HashSet,
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    time::Duration,
};

use crate::common::*;

/// The outermost frame of a thread created by glibc: stacks that reach it are complete.
const ROOTS: [&str; 3] = ["__clone3", "clone3", "start_thread"];

/// Of the stacks of threads `tids` (from --per-thread output), the share of the value on stacks that start
/// at a thread root.
fn root_share(stacks: &[(Vec<String>, u64)], tids: &HashSet<u32>) -> (f64, u64) {
    let (mut total, mut rooted) = (0, 0);
    for (frames, v) in stacks {
        let tid = frames[0]
            .strip_prefix("thread ")
            .and_then(|t| t.split(' ').next())
            .and_then(|t| t.parse::<u32>().ok());
        if !tid.is_some_and(|t| tids.contains(&t)) {
            continue;
        }
        total += v;
        if frames.get(1).is_some_and(|f| ROOTS.contains(&f.as_str())) {
            rooted += v;
        }
    }
    (
        if total > 0 {
            rooted as f64 / total as f64
        } else {
            0.0
        },
        total,
    )
}

#[test]
fn connection_thread_stacks_reach_the_thread_root_under_load() {
    let db = testdb();
    let dir = tempdir("unwind-load");
    let load = db.running_load();
    // Read again at the end, when this test's load surely runs (another test's may have been the one seen).
    let sysbench = || -> HashSet<u32> {
        db.sql("SELECT TID FROM information_schema.PROCESSLIST WHERE USER = 'sbtest'")
            .lines()
            .map(|l| l.trim().parse().unwrap())
            .collect()
    };
    let mut tids = sysbench();
    let pid = db.pid.to_string();
    let (off, cpu) = (dir.join("off.folded"), dir.join("cpu.folded"));
    let off_err = run_ok(
        myprobe()
            .args([
                "profile",
                "offcpu",
                "-p",
                &pid,
                "-d",
                "3",
                "--per-thread",
                "-o",
            ])
            .arg(&off),
    );
    let cpu_err = run_ok(
        myprobe()
            .args([
                "profile",
                "cpu",
                "-p",
                &pid,
                "-d",
                "3",
                "-F",
                "199",
                "--per-thread",
                "-o",
            ])
            .arg(&cpu),
    );
    tids.extend(sysbench());
    load.finish();
    assert!(!tids.is_empty(), "no sysbench connection threads");
    let (share, total) = root_share(&read_folded(&off), &tids);
    assert!(
        total > 100_000,
        "too little off-CPU time of connection threads: {total} us\n{off_err}"
    );
    assert!(
        share >= 0.90,
        "only {:.1}% of connection threads' off-CPU time reaches the thread root\n{off_err}",
        share * 100.0
    );
    let (share, total) = root_share(&read_folded(&cpu), &tids);
    assert!(
        total > 50,
        "too few CPU samples of connection threads: {total}\n{cpu_err}"
    );
    assert!(
        share >= 0.90,
        "only {:.1}% of connection threads' CPU samples reach the thread root\n{cpu_err}",
        share * 100.0
    );
}

/// The frames eu-stack prints for thread `tid` of `pid`, leaf first.
fn eu_stack(pid: u32, tid: u32) -> Vec<u64> {
    let out = Command::new("eu-stack")
        .args(["-p", &pid.to_string()])
        .output()
        .expect("running eu-stack");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut frames = Vec::new();
    let mut mine = false;
    for line in text.lines() {
        if let Some(t) = line.strip_prefix("TID ") {
            mine = t.trim_end_matches(':') == tid.to_string();
        } else if mine {
            if let Some(addr) = line
                .split_whitespace()
                .nth(1)
                .and_then(|a| a.strip_prefix("0x"))
            {
                frames.push(u64::from_str_radix(addr, 16).unwrap());
            }
        }
    }
    assert!(
        !frames.is_empty(),
        "eu-stack printed no frames for thread {tid}:\n{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    frames
}

/// The user frames (as addresses, leaf first) of the largest off-CPU stack of thread `tid` in `--per-thread
/// --addresses` output.
fn traced_stack(stacks: &[(Vec<String>, u64)], tid: u32) -> Vec<u64> {
    let prefix = format!("thread {tid}");
    let (frames, _) = stacks
        .iter()
        .filter(|(f, _)| f[0].starts_with(&prefix))
        .max_by_key(|(_, v)| *v)
        .unwrap_or_else(|| panic!("no stack of thread {tid}: {stacks:?}"));
    frames[1..]
        .iter()
        .filter_map(|f| {
            f.strip_prefix("0x")
                .map(|a| u64::from_str_radix(a, 16).unwrap())
        })
        .rev()
        .collect()
}

/// eu-stack's frames are ours, in order; ours may go one frame further (`_start`, whose return address is
/// undefined, where eu-stack stops before it). The leaf is where the thread left the CPU, which offcpu names
/// by the start of its unwind row: at most that instruction, in the same function.
fn assert_same_frames(ours: &[u64], eu: &[u64], what: &str) {
    let hex = |v: &[u64]| {
        v.iter()
            .map(|a| format!("{a:#x}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert!(
        ours.len() >= eu.len()
            && ours.len() <= eu.len() + 1
            && !eu.is_empty()
            && (eu[0].saturating_sub(4096)..=eu[0]).contains(&ours[0])
            && ours[1..eu.len()] == eu[1..],
        "{what}: frames differ\n  myprobe:  {}\n  eu-stack: {}",
        hex(ours),
        hex(eu)
    );
}

#[test]
fn fixture_frames_equal_eu_stack() {
    let dir = tempdir("unwind-fixture");
    let exe = compile_fixture(
        &dir,
        "known_stack",
        &["unwind/known_stack.c"],
        &["-fomit-frame-pointer"],
    );
    let mut child = Command::new(&exe).stdout(Stdio::piped()).spawn().unwrap();
    let pid = child.id();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");

    let folded = dir.join("fixture.folded");
    let names = dir.join("names.folded");
    let p = pid.to_string();
    let common = [
        "profile",
        "offcpu",
        "--any-process",
        "-p",
        &p,
        "-d",
        "1",
        "--per-thread",
    ];
    let result = std::panic::catch_unwind(|| {
        run_ok(
            myprobe()
                .args(common)
                .arg("--addresses")
                .arg("-o")
                .arg(&folded),
        );
        run_ok(myprobe().args(common).arg("-o").arg(&names));
        let ours = traced_stack(&read_folded(&folded), pid);
        let eu = eu_stack(pid, pid);
        assert_same_frames(&ours, &eu, "fixture");
        // And by name: the fixture's own functions, in order, under glibc's nanosleep.
        let named = read_folded(&names);
        let chain = ["main", "outer_frame", "middle_frame", "inner_frame"];
        assert!(
            named.iter().any(|(f, _)| f.windows(4).any(|w| w == chain)),
            "no stack with main;outer_frame;middle_frame;inner_frame: {named:?}"
        );
    });
    let _ = child.kill();
    let _ = child.wait();
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

#[test]
fn server_thread_frames_equal_eu_stack() {
    crate::common::servers_alone();
    let db = testdb();
    let dir = tempdir("unwind-server");
    let mut s = db.session();
    let tid = s.server_tid();
    let conn = s.connection_id();
    let folded = dir.join("server.folded");
    let pid = db.pid.to_string();
    let tracer = Background::start(
        &[
            "profile",
            "offcpu",
            "-p",
            &pid,
            "-d",
            "600",
            "--per-thread",
            "--addresses",
            "-o",
            folded.to_str().unwrap(),
        ],
        "Ctrl-C ends early",
    );
    // The thread waits inside SLEEP() from before eu-stack looks at it until the tracer has ended.
    s.send("SELECT SLEEP(60)");
    db.wait_for_state(tid, "User sleep");
    let eu = eu_stack(db.pid, tid);
    tracer.stop();
    // Interrupted (the client, in batch mode, then exits on the error).
    db.sql(&format!("KILL QUERY {conn}"));
    let ours = traced_stack(&read_folded(&folded), tid);
    assert_same_frames(&ours, &eu, "mariadbd connection thread in SLEEP()");
    assert!(
        ours.len() >= 10,
        "a suspiciously short server stack: {ours:x?}"
    );
}

#[test]
fn library_loaded_while_tracing_is_unwound() {
    let dir = tempdir("unwind-late");
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/unwind");
    let (lib, exe) = (dir.join("liblate.so"), dir.join("late_loader"));
    for args in [
        vec![
            "-O1",
            "-g",
            "-fomit-frame-pointer",
            "-shared",
            "-fPIC",
            "-o",
            lib.to_str().unwrap(),
            &format!("{fixtures}/late_library.c"),
        ],
        vec![
            "-O1",
            "-g",
            "-fomit-frame-pointer",
            "-o",
            exe.to_str().unwrap(),
            &format!("{fixtures}/late_loader.c"),
            "-ldl",
        ],
    ] {
        let cc = Command::new("cc").args(&args).output().unwrap();
        assert!(
            cc.status.success(),
            "{}",
            String::from_utf8_lossy(&cc.stderr)
        );
    }
    let mut child = Command::new(&exe)
        .arg(&lib)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");

    let folded = dir.join("late.folded");
    let tracer = myprobe()
        .args([
            "profile",
            "offcpu",
            "--any-process",
            "-p",
            &child.id().to_string(),
            "-d",
            "3",
            "-o",
        ])
        .arg(&folded)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    // The library appears only now, while tracing.
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), b"load\n").unwrap();
    line.clear();
    stdout.read_line(&mut line).unwrap();
    let out = tracer.wait_with_output().unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(line.trim(), "loaded");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stacks = read_folded(&folded);
    let chain = ["main", "late_outer", "late_inner"];
    let complete: u64 = stacks
        .iter()
        .filter(|(f, _)| {
            f.first().is_some_and(|r| r == "_start") && f.windows(3).any(|w| w == chain)
        })
        .map(|(_, v)| v)
        .sum();
    assert!(
        complete >= 1_000_000,
        "no complete stack through the library loaded while tracing: {stacks:?}"
    );
}
