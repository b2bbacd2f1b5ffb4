//! `profile cpu` and `profile offcpu` against the throwaway MariaDB under sysbench load: real BPF, real server.

use crate::common::*;

#[test]
fn cpu_profile_under_load_shows_the_command_loop() {
    let db = testdb();
    let dir = tempdir("cpu");
    let load = db.running_load();
    let folded = dir.join("cpu.folded");
    let stderr = run_ok(
        myprobe()
            .args([
                "profile",
                "cpu",
                "-p",
                &db.pid.to_string(),
                "-d",
                "4",
                "-F",
                "199",
                "-o",
            ])
            .arg(&folded),
    );
    load.finish();
    let stacks = read_folded(&folded);
    let total: u64 = stacks.iter().map(|(_, v)| v).sum();
    assert!(
        total > 50,
        "too few samples ({total}) under load; stderr:\n{stderr}"
    );
    for function in ["dispatch_command", "do_command"] {
        let v = value_with_frame(&stacks, |f| f == function);
        assert!(v > 0, "no CPU sample in {function}; stderr:\n{stderr}");
    }
    assert!(
        stderr.contains("results written in"),
        "no time-to-results line:\n{stderr}"
    );
    // Frames are cleaned: no argument lists, no offsets.
    for (frames, _) in &stacks {
        for f in frames {
            assert!(
                !f.contains('(') || f.starts_with("thread "),
                "frame with an argument list: {f}"
            );
            assert!(
                !f.contains("+0x") || f.starts_with("mariadbd+0x") || f.contains(".so"),
                "frame with an offset: {f}"
            );
        }
    }
}

#[test]
fn cpu_profile_with_kernel_frames_marks_them() {
    let db = testdb();
    let dir = tempdir("cpu-kernel");
    let load = db.running_load();
    let folded = dir.join("cpu.folded");
    run_ok(
        myprobe()
            .args([
                "profile",
                "cpu",
                "-p",
                &db.pid.to_string(),
                "-d",
                "3",
                "-F",
                "199",
                "--kernel",
                "-o",
            ])
            .arg(&folded),
    );
    load.finish();
    let stacks = read_folded(&folded);
    assert!(
        value_with_frame(&stacks, |f| f.ends_with("_[k]")) > 0,
        "no kernel frames with --kernel"
    );
    // Kernel frames sit below (after) every user frame of their stack.
    for (frames, _) in &stacks {
        if let Some(first_k) = frames.iter().position(|f| f.ends_with("_[k]")) {
            assert!(
                frames[first_k..].iter().all(|f| f.ends_with("_[k]")),
                "user frame below a kernel frame: {frames:?}"
            );
        }
    }
}

#[test]
fn offcpu_profile_of_an_idle_connection_shows_the_socket_wait() {
    let db = testdb();
    let dir = tempdir("offcpu");
    let mut session = db.session();
    let tid = session.server_tid();
    let folded = dir.join("offcpu.folded");
    let tracer = myprobe()
        .args([
            "profile",
            "offcpu",
            "-p",
            &db.pid.to_string(),
            "-d",
            "2",
            "--per-thread",
            "-o",
        ])
        .arg(&folded)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // A connection that sits idle between short statements: its thread waits for the next request.
    let started = std::time::Instant::now();
    while started.elapsed() < std::time::Duration::from_millis(2600) {
        assert_eq!(session.query_row("SELECT 1"), "1");
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    let out = tracer.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stacks = read_folded(&folded);
    let thread_prefix = format!("thread {tid}");
    let mine: Vec<_> = stacks
        .iter()
        .filter(|(f, _)| f[0].starts_with(&thread_prefix))
        .cloned()
        .collect();
    assert!(
        !mine.is_empty(),
        "no off-CPU stacks for the idle connection's thread {tid}; stderr:\n{stderr}"
    );
    let total: u64 = mine.iter().map(|(_, v)| v).sum();
    let waiting = value_with_frame(&mine, |f| f == "vio_socket_io_wait" || f.contains("poll"));
    assert!(
        waiting > 0,
        "idle thread's stacks lack the socket wait: {mine:?}"
    );
    // Idle for almost all of the 2 s traced: most of its off-CPU time is that wait, and blocked, not runnable.
    assert!(
        waiting * 10 >= total * 9,
        "socket wait is only {waiting} of {total} us: {mine:?}"
    );
    assert!(
        waiting >= 1_500_000,
        "idle wait of {waiting} us is far below the 2 s traced"
    );
    assert!(value_with_frame(&mine, |f| f == "[blocked]") * 10 >= waiting * 9);
}

#[test]
fn offcpu_profile_shows_a_thread_blocked_throughout() {
    // A statement in SLEEP() since before tracing: its thread never leaves the CPU while traced, and is found
    // by the task iterator at the end, with its whole stack and all of the time traced. SLEEP wakes every 5 s
    // to look at its connection (`Interruptible_wait`): a trace that ends later than that after the statement
    // began may hold a wake, and is taken again.
    let db = testdb();
    let dir = tempdir("offcpu-blocked");
    let folded = dir.join("offcpu.folded");
    let mut attempts = 0;
    let (tid, stderr) = loop {
        attempts += 1;
        let mut session = db.session();
        let tid = session.server_tid();
        let conn = session.connection_id();
        let began = std::time::Instant::now();
        let sleeper = std::thread::spawn(move || session.query_row("SELECT SLEEP(60)"));
        db.wait_for_state(tid, "User sleep");
        let out = myprobe()
            .args([
                "profile",
                "offcpu",
                "-p",
                &db.pid.to_string(),
                "-d",
                "1",
                "--per-thread",
                "-o",
            ])
            .arg(&folded)
            .output()
            .unwrap();
        let took = began.elapsed();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        // Interrupted (the client, in batch mode, then exits on the error).
        db.sql(&format!("KILL QUERY {conn}"));
        let _ = sleeper.join();
        if took < std::time::Duration::from_millis(4800) {
            break (tid, stderr);
        }
        assert!(
            attempts < 4,
            "each trace ended more than 4.8 s after its SLEEP began, the last {took:?}: {stderr}"
        );
    };
    let stacks = read_folded(&folded);
    let thread_prefix = format!("thread {tid}");
    let mine: Vec<_> = stacks
        .iter()
        .filter(|(f, _)| f[0].starts_with(&thread_prefix))
        .cloned()
        .collect();
    let sleeping = value_with_frame(&mine, |f| f == "Item_func_sleep::val_int");
    assert!(
        sleeping >= 950_000,
        "the sleeping thread {tid} has {sleeping} us in SLEEP: {mine:?}\n{stderr}"
    );
    let (frames, _) = mine
        .iter()
        .find(|(f, _)| f.iter().any(|x| x == "Item_func_sleep::val_int"))
        .unwrap();
    assert!(
        frames.iter().any(|f| f == "start_thread") && frames.iter().any(|f| f == "do_command"),
        "{frames:?}"
    );
    assert_eq!(
        frames.last().map(String::as_str),
        Some("[blocked]"),
        "{frames:?}"
    );
}

#[test]
fn offcpu_profile_under_load_splits_blocked_and_runnable() {
    let db = testdb();
    let dir = tempdir("offcpu-load");
    let load = db.running_load();
    let folded = dir.join("offcpu.folded");
    let stderr = run_ok(
        myprobe()
            .args([
                "profile",
                "offcpu",
                "-p",
                &db.pid.to_string(),
                "-d",
                "3",
                "-o",
            ])
            .arg(&folded),
    );
    load.finish();
    let stacks = read_folded(&folded);
    for (frames, _) in &stacks {
        let leaf = frames.last().unwrap();
        assert!(
            leaf == "[blocked]" || leaf == "[runnable]",
            "leaf is not the wait kind: {frames:?}"
        );
    }
    assert!(
        value_with_frame(&stacks, |f| f == "[blocked]") > 0,
        "no blocked time under load; stderr:\n{stderr}"
    );
    // 4 sysbench threads on 2 CPUs: the server's threads must queue for a CPU at times.
    assert!(
        value_with_frame(&stacks, |f| f == "[runnable]") > 0,
        "no runnable time under load; stderr:\n{stderr}"
    );
}

/// `profile offcpu` of a fixture while it does its work once: the folded stacks, stderr, and the waits
/// counted; asserts that nothing was lost.
fn offcpu_of_fixture(
    dir: &std::path::Path,
    fixture: &mut Fixture,
    env: &[(&str, &str)],
) -> (Vec<(Vec<String>, u64)>, String, u64) {
    let pid = fixture.child.id().to_string();
    let folded = dir.join("offcpu.folded");
    let folded_arg = folded.to_string_lossy().into_owned();
    let tracer = Background::start_with_env(
        &[
            "profile",
            "offcpu",
            "--any-process",
            "-p",
            &pid,
            "-d",
            "120",
            "-o",
            &folded_arg,
        ],
        env,
        "tracing off-CPU time",
    );
    fixture.go();
    let (_, stderr) = tracer.stop();
    assert!(
        !stderr.contains("not counted") && !stderr.contains("left out"),
        "{stderr}"
    );
    let events: u64 = stderr
        .lines()
        .find_map(|l| l.strip_prefix("myprobe: ")?.split_once(" events,"))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("no event count:\n{stderr}"));
    (read_folded(&folded), stderr, events)
}

#[test]
fn offcpu_counts_every_wait_of_threads_that_come_and_go() {
    // Connection churn: 30,000 threads that each wait on three stacks and exit make 90,000 (thread, stack)
    // sums, more than the kernel's map holds at once (65,536). They are moved to user space as tracing goes,
    // so that none is lost.
    every_wait_of_threads_that_come_and_go(&[], &[]);
}

#[test]
fn without_bpf_loop_the_compat_build_counts_every_wait_of_threads_that_come_and_go() {
    // Kernels before 5.17 run the compat build, whose threads' states are a hash by thread id of 16,384
    // entries: each is freed at its thread's last switch, so 30,000 threads fit. Its stacks follow frame pointers,
    // which the fixture keeps, and glibc's frames (nanosleep, the thread's start) by the rows user space looks up
    // for their addresses: but for the waits before it answered, they reach the thread's root through the
    // fixture's caller of nanosleep, which frame pointers alone miss.
    let stacks = every_wait_of_threads_that_come_and_go(
        &["-fno-omit-frame-pointer"],
        &[("MYPROBE_DISABLE", "bpf_loop")],
    );
    let waited = value_with_frame(&stacks, |f| f == "first_wait");
    let rooted: u64 = stacks
        .iter()
        .filter(|(f, _)| f[0] == "__clone3" && f.iter().any(|f| f == "first_wait"))
        .filter(|(f, _)| f.iter().any(|f| f == "pause_briefly"))
        .map(|(_, us)| us)
        .sum();
    assert!(
        rooted * 2 > waited,
        "{rooted} of {waited} µs in first_wait from __clone3 through pause_briefly: {stacks:?}"
    );
}

/// The off-CPU stacks of the churn fixture (built with `cflags`) traced with `env`, once every wait is checked.
fn every_wait_of_threads_that_come_and_go(
    cflags: &[&str],
    env: &[(&str, &str)],
) -> Vec<(Vec<String>, u64)> {
    let dir = tempdir("offcpu-churn");
    let flags: Vec<&str> = ["-pthread"].iter().chain(cflags).copied().collect();
    let exe = compile_fixture(&dir, "thread_churn", &["offcpu/thread_churn.c"], &flags);
    let mut fixture = Fixture::start(&mut std::process::Command::new(&exe));
    let (stacks, stderr, events) = offcpu_of_fixture(&dir, &mut fixture, env);
    assert!(events >= 90_000, "{events} waits traced:\n{stderr}");
    for function in ["first_wait", "second_wait", "third_wait"] {
        // 30,000 waits of at least 20 µs each.
        let us = value_with_frame(&stacks, |f| f == function);
        assert!(us >= 600_000, "{us} µs in {function}:\n{stderr}");
    }
    stacks
}

#[test]
fn offcpu_follows_every_thread_of_thousands() {
    // 8300 threads, each woken once to serve a request and then waiting again until the end: a table of 8192
    // threads counted the others as lost.
    let dir = tempdir("offcpu-many");
    let exe = compile_fixture(
        &dir,
        "many_threads",
        &["protocol/many_threads.c"],
        &["-pthread"],
    );
    let mut fixture = Fixture::start(&mut std::process::Command::new(&exe));
    let (stacks, stderr, events) = offcpu_of_fixture(&dir, &mut fixture, &[]);
    assert!(events >= 8300, "{events} waits traced:\n{stderr}");
    // Each waits in connection() until the end: a wait still open, from the task iterator.
    let waiting = stacks
        .iter()
        .filter(|(f, _)| f.iter().any(|x| x == "connection"))
        .count();
    assert!(waiting > 0, "{stacks:?}");
}

#[test]
fn svg_and_json_outputs_are_well_formed() {
    let db = testdb();
    let dir = tempdir("formats");
    let load = db.running_load();
    let svg = dir.join("cpu.svg");
    let json = dir.join("off.json");
    run_ok(
        myprobe()
            .args(["profile", "cpu", "-p", &db.pid.to_string(), "-d", "2", "-o"])
            .arg(&svg),
    );
    run_ok(
        myprobe()
            .args([
                "profile",
                "offcpu",
                "-p",
                &db.pid.to_string(),
                "-d",
                "1",
                "-o",
            ])
            .arg(&json),
    );
    load.finish();

    let text = std::fs::read_to_string(&svg).unwrap();
    let mut reader = quick_xml::Reader::from_str(&text);
    let mut elements = 0;
    loop {
        match reader.read_event() {
            Ok(quick_xml::events::Event::Eof) => break,
            Ok(quick_xml::events::Event::Start(_)) | Ok(quick_xml::events::Event::Empty(_)) => {
                elements += 1
            }
            Ok(_) => {}
            Err(e) => panic!(
                "SVG is not well-formed XML at {}: {e}",
                reader.buffer_position()
            ),
        }
    }
    assert!(elements > 10, "SVG has only {elements} elements");
    assert!(
        text.contains("do_command"),
        "SVG lacks the do_command frame"
    );

    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).expect("JSON parses");
    assert_eq!(v["unit"], "microseconds");
    assert_eq!(v["meta"]["pid"], db.pid);
    // Off-CPU time is measured, not sampled.
    assert_eq!(v["estimated"], false);
    assert!(v["meta"].get("estimate").is_none());
    assert!(v["stacks"].as_array().is_some_and(|s| !s.is_empty()));
}

#[test]
fn folded_output_goes_to_stdout_without_o() {
    let db = testdb();
    let out = myprobe()
        .args(["profile", "offcpu", "-p", &db.pid.to_string(), "-d", "1"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(!stdout.is_empty());
    for line in stdout.lines() {
        let (_, value) = line.rsplit_once(' ').expect("folded line");
        value
            .parse::<u64>()
            .unwrap_or_else(|_| panic!("stdout has a non-folded line: {line}"));
    }
    assert!(
        !String::from_utf8_lossy(&out.stderr).is_empty(),
        "diagnostics belong on stderr"
    );
}

/// tests/fixtures/offcpu/preempt.c: a spinning thread and a CPU hog pinned to the same CPU; the hog must be the
/// top preemptor of the traced thread, and with `--preempted-leaf-only` the spinning thread's waits are on its
/// function alone.
#[test]
fn offcpu_preemptors_name_the_hog_sharing_the_cpu() {
    crate::common::servers_alone();
    let dir = tempdir("preempt");
    let exe = compile_fixture(&dir, "preempt", &["offcpu/preempt.c"], &[]);
    let mut fixture = Fixture::start(&mut std::process::Command::new(&exe));
    let mut hog = std::process::Command::new(&exe).arg("hog").spawn().unwrap();
    let pid = fixture.child.id();
    let run = Background::start(
        &[
            "profile",
            "offcpu",
            "--any-process",
            "-p",
            &pid.to_string(),
            "-d",
            "4",
            "--preemptors",
            "--preempted-leaf-only",
            "-o",
            dir.join("offcpu.folded").to_str().unwrap(),
        ],
        "myprobe: tracing",
    );
    fixture.go();
    let (_, stderr) = run.wait();
    let _ = hog.kill();
    let _ = hog.wait();
    let table: Vec<&str> = stderr
        .lines()
        .skip_while(|l| !l.starts_with("top ") || !l.contains("preemptors"))
        .skip(2)
        .collect();
    assert!(!table.is_empty(), "no preemptor table:\n{stderr}");
    // Among them (anything else on its CPU preempts it too: a busy host's own work).
    let hog_name = format!("myprobe-hog/myprobe-hog {}", hog.id());
    let first = table
        .iter()
        .find(|l| l.trim_start().starts_with(&hog_name))
        .unwrap_or_else(|| panic!("the hog is not among the preemptors:\n{stderr}"));
    let fields: Vec<&str> = first.split_whitespace().collect();
    let (count, runq_ms): (u64, f64) = (
        fields[fields.len() - 2].parse().unwrap(),
        fields[fields.len() - 1].parse().unwrap(),
    );
    assert!(count > 0 && runq_ms > 0.0, "{first}");
    assert!(first.contains(&format!("preempt {pid}")), "{first}");
    // Preempted at any instruction of its loop: not unwound, its function alone under the leaf-only root.
    let stacks = read_folded(&dir.join("offcpu.folded"));
    let leaf_only: Vec<&Vec<String>> = stacks
        .iter()
        .map(|(frames, _)| frames)
        .filter(|frames| frames.first().map(String::as_str) == Some("[preempted: leaf only]"))
        .collect();
    assert!(
        leaf_only
            .iter()
            .any(|f| f.len() == 3 && f[1] == "main" && f[2] == "[runnable]"),
        "no runnable time of main under [preempted: leaf only]: {stacks:?}"
    );
    assert!(
        leaf_only
            .iter()
            .all(|f| f.len() == 3 && f[2] == "[runnable]"),
        "{leaf_only:?}"
    );
}
