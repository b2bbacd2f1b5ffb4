//! `profile alloc` on a fixture with known allocations, and on the throwaway MariaDB under load.

use std::{process::Command, time::Duration};

use crate::common::*;

/// tests/fixtures/alloc/leaky.c, running and waiting for its go (which makes its 100 leaks and 600
/// short-lived allocations). `args`: e.g. `steady`, leaking at a known rate from the start; `sources`: more
/// files of tests/fixtures/alloc to build it with; `env`: e.g. LD_PRELOAD.
fn start_leaky(
    dir: &std::path::Path,
    args: &[&str],
    sources: &[&str],
    env: &[(&str, &str)],
) -> Fixture {
    let sources: Vec<String> = ["leaky.c"]
        .iter()
        .chain(sources)
        .map(|s| format!("alloc/{s}"))
        .collect();
    let sources: Vec<&str> = sources.iter().map(String::as_str).collect();
    let exe = compile_fixture(dir, "leaky", &sources, &["-pthread", "-rdynamic"]);
    Fixture::start(Command::new(exe).args(args).envs(env.iter().copied()))
}

/// Traces the fixture's allocations with `extra` options; returns the folded stacks.
fn traced_allocations(name: &str, extra: &[&str]) -> Vec<(Vec<String>, u64)> {
    traced(name, "alloc", extra).0
}

/// Runs `profile <what>` on the fixture while it allocates; returns the folded stacks and stderr.
fn traced(name: &str, what: &str, extra: &[&str]) -> (Vec<(Vec<String>, u64)>, String) {
    traced_built_with(name, &[], &[], what, extra, &[])
}

/// The same, with the fixture built with more `sources` and run with `env`, and myprobe with `tracer_env`.
fn traced_built_with(
    name: &str,
    sources: &[&str],
    env: &[(&str, &str)],
    what: &str,
    extra: &[&str],
    tracer_env: &[(&str, &str)],
) -> (Vec<(Vec<String>, u64)>, String) {
    let dir = tempdir(name);
    let mut leaky = start_leaky(&dir, &[], sources, env);
    leaky.profile(&dir, what, extra, tracer_env)
}

#[test]
fn memleak_reports_exactly_the_known_leak() {
    let (stacks, stderr) = traced("memleak", "memleak", &["--sample", "1", "--interval", "1"]);
    assert_eq!(
        value_with_frame(&stacks, |f| f == "leak_here"),
        409_600,
        "{stacks:?}\n{stderr}"
    );
    // Everything else the fixture allocated while traced was freed.
    assert_eq!(value_with_frame(&stacks, |f| f == "churn"), 0, "{stacks:?}");
    // The final table's (an interval's report may have come while the fixture was still leaking).
    let line = stderr
        .lines()
        .rfind(|l| l.contains(" allocations from") && l.contains("leak_here"))
        .unwrap_or_else(|| panic!("no table line for leak_here:\n{stderr}"));
    assert!(
        line.trim_start()
            .starts_with("409600 bytes in 100 allocations from"),
        "{line}"
    );
    // One a second (counted from the command's start, so the first may say 2 s on a slow host).
    let reports: Vec<u64> = stderr
        .lines()
        .filter_map(|l| {
            l.split("after ")
                .nth(1)?
                .split(" s, top ")
                .next()?
                .parse()
                .ok()
        })
        .collect();
    assert!(
        reports.len() >= 2 && reports.windows(2).all(|w| w[0] < w[1]),
        "no interval reports:\n{stderr}"
    );
    // A kernel memory budget that holds fewer outstanding allocations than memleak asks for: said, and the
    // leak is still exact.
    let (stacks, stderr) = traced(
        "memleak-budget",
        "memleak",
        &["--sample", "1", "--max-kernel-mem", "24"],
    );
    assert_eq!(
        value_with_frame(&stacks, |f| f == "leak_here"),
        409_600,
        "{stacks:?}\n{stderr}"
    );
    assert!(
        stderr.contains("to keep within --max-kernel-mem 24 MiB: at most "),
        "{stderr}"
    );
    // --older: the leaks are younger than 60 s when tracing ends.
    let (stacks, _) = traced(
        "memleak-older",
        "memleak",
        &["--sample", "1", "--older", "60000"],
    );
    assert_eq!(
        value_with_frame(&stacks, |f| f == "leak_here"),
        0,
        "{stacks:?}"
    );
}

#[test]
fn sampled_memleak_estimates_a_steady_leak() {
    // By default memleak traces the allocations of one 100 ms period in 10 and scales by the time traced over
    // the time sampled: a leak at a steady rate is estimated from about a tenth of its calls.
    let dir = tempdir("memleak-sampled");
    let leaky = start_leaky(&dir, &["steady"], &[], &[]);
    let folded = dir.join("memleak.folded");
    let pid = leaky.child.id().to_string();
    let out = myprobe()
        .args([
            "profile",
            "memleak",
            "--any-process",
            "-p",
            &pid,
            "-d",
            "4",
            "-o",
        ])
        .arg(&folded)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("one 100 ms period in 10"), "{stderr}");
    let traced_secs: f64 = stderr
        .lines()
        .find_map(|l| l.split(" traced in ").nth(1))
        .and_then(|rest| rest.trim_end_matches(" s").parse().ok())
        .unwrap_or_else(|| panic!("no time traced:\n{stderr}"));
    let stacks = read_folded(&folded);
    let leaked = value_with_frame(&stacks, |f| f == "leak_here") as f64;
    let expected = 2_048_000.0 * traced_secs;
    assert!(
        (0.8..=1.2).contains(&(leaked / expected)),
        "estimated {leaked} bytes from leak_here, expected about {expected}:\n{stderr}"
    );
    assert_eq!(value_with_frame(&stacks, |f| f == "churn"), 0, "{stacks:?}");
    // Scaled figures say so; enough allocations were traced to estimate from, so no warning.
    assert!(
        stderr.contains("top 1 stacks by bytes not freed, estimated (scaled ×"),
        "{stderr}"
    );
    assert!(!stderr.contains("allocations were traced"), "{stderr}");
}

#[test]
fn sampled_memleak_warns_when_a_burst_leaves_few_allocations_traced() {
    // tests/fixtures/alloc/burst.c: 50 allocations in well under a millisecond, made between the periods
    // memleak probes by default (the first 100 ms of each second, from when the probes are in place).
    let dir = tempdir("memleak-burst");
    let exe = compile_fixture(&dir, "burst", &["alloc/burst.c"], &["-rdynamic"]);
    let mut burst = Fixture::start(&mut Command::new(&exe));
    let json = dir.join("memleak.json");
    let pid = burst.child.id().to_string();
    let tracer = Background::start(
        &[
            "profile",
            "memleak",
            "--any-process",
            "-p",
            &pid,
            "-d",
            "2",
            "-o",
            json.to_str().unwrap(),
        ],
        "Ctrl-C ends early",
    );
    std::thread::sleep(Duration::from_millis(300));
    burst.go();
    let (_, stderr) = tracer.wait();
    let warning = stderr
        .lines()
        .find(|l| {
            l.starts_with("myprobe: warning: ")
                && (l.contains(" was traced in the periods probed")
                    || l.contains(" were traced in the periods probed"))
        })
        .unwrap_or_else(|| panic!("no warning that few allocations were traced:\n{stderr}"));
    assert!(
        warning.contains("one 100 ms period in 10")
            && warning.contains("--sample 1 traces every allocation, exactly")
            && warning.contains("about twice the cost"),
        "{warning}"
    );
    assert!(
        stderr.contains("stacks by bytes not freed, estimated (scaled ×"),
        "the table says it is estimated:\n{stderr}"
    );
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(doc["estimated"], true, "{doc}");
    let estimate = &doc["meta"]["estimate"];
    assert!(estimate["scale"].as_f64().unwrap() > 1.0, "{doc}");
    assert!(estimate["traced"].as_u64().unwrap() < 100, "{doc}");

    // Every allocation traced: the burst exactly, and nothing to warn about or estimate.
    let mut burst = Fixture::start(&mut Command::new(&exe));
    let (stacks, stderr) = burst.profile(&dir, "memleak", &["--sample", "1"], &[]);
    assert_eq!(
        value_with_frame(&stacks, |f| f == "burst_here"),
        50_000,
        "{stacks:?}\n{stderr}"
    );
    assert!(
        stderr.contains("  50000 bytes in 50 allocations from"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("warning") && !stderr.contains("estimated"),
        "{stderr}"
    );
}

#[test]
fn sampled_memleak_warns_when_a_burst_is_missed_among_freed_allocations() {
    // The burst of tests/fixtures/alloc/burst.c while another thread allocates and frees all the time: the
    // periods probed see many allocations, nearly all freed, and the burst between them, or in one of them, is
    // (nearly) nothing next to them. A reader of "~0 bytes" must not conclude that nothing leaks.
    let dir = tempdir("memleak-burst-churn");
    let exe = compile_fixture(&dir, "burst", &["alloc/burst.c"], &["-rdynamic"]);
    let mut burst = Fixture::start(Command::new(&exe).arg("churn"));
    let pid = burst.child.id().to_string();
    let tracer = Background::start(
        &["profile", "memleak", "--any-process", "-p", &pid, "-d", "2"],
        "Ctrl-C ends early",
    );
    std::thread::sleep(Duration::from_millis(300));
    burst.go();
    let (_, stderr) = tracer.wait();
    let warning = stderr
        .lines()
        .find(|l| l.starts_with("myprobe: warning: ") && l.contains("nearly all were freed again"))
        .unwrap_or_else(|| panic!("no warning that the outstanding bytes say nothing:\n{stderr}"));
    assert!(
        warning.contains("one 100 ms period in 10")
            && warning.contains("does not mean nothing leaks")
            && warning.contains("--sample 1 traces every allocation, exactly"),
        "{warning}"
    );

    // Every allocation traced: the burst exactly, the churn freed.
    let mut burst = Fixture::start(Command::new(&exe).arg("churn"));
    let (stacks, stderr) = burst.profile(&dir, "memleak", &["--sample", "1"], &[]);
    assert_eq!(
        value_with_frame(&stacks, |f| f == "burst_here"),
        50_000,
        "{stacks:?}\n{stderr}"
    );
    assert!(!stderr.contains("warning"), "{stderr}");
}

#[test]
fn older_kernels_probes_give_the_same_exact_results() {
    // Without uprobe_multi links (before 6.6) and without uprobe sessions (before 6.13): a uprobe (and for
    // memleak a uretprobe) per function.
    for version in ["uprobe_multi,uprobe_session", "uprobe_session"] {
        let older = [("MYPROBE_DISABLE", version)];
        let (stacks, stderr) = traced_built_with(
            "memleak-older-kernel",
            &[],
            &[],
            "memleak",
            &["--sample", "1"],
            &older,
        );
        assert_eq!(
            value_with_frame(&stacks, |f| f == "leak_here"),
            409_600,
            "{version}: {stacks:?}\n{stderr}"
        );
        assert_eq!(
            value_with_frame(&stacks, |f| f == "churn"),
            0,
            "{version}: {stacks:?}"
        );
        let (stacks, stderr) =
            traced_built_with("alloc-older-kernel", &[], &[], "alloc", &[], &older);
        assert_eq!(
            value_with_frame(&stacks, |f| f == "leak_here"),
            409_600,
            "{version}: {stacks:?}\n{stderr}"
        );
    }
}

#[test]
fn allocation_bytes_of_a_known_leak_are_exact() {
    let stacks = traced_allocations("alloc-exact", &[]);
    let leak = value_with_frame(&stacks, |f| f == "leak_here");
    assert_eq!(leak, 409_600, "bytes allocated by leak_here: {stacks:?}");
    let churn = value_with_frame(&stacks, |f| f == "churn");
    // 100 iterations of six mallocs of 64 + 8k + i % 5 bytes.
    let expected: u64 = (0..100u64)
        .map(|i| (0..6u64).map(|k| 64 + 8 * k + i % 5).sum::<u64>())
        .sum();
    assert_eq!(churn, expected, "bytes allocated by churn: {stacks:?}");
    for (frames, _) in stacks
        .iter()
        .filter(|(f, _)| f.iter().any(|x| x == "leak_here"))
    {
        assert_eq!(
            frames.last().map(String::as_str),
            Some("malloc"),
            "{frames:?}"
        );
        assert_eq!(
            frames.first().map(String::as_str),
            Some("_start"),
            "the stack is complete: {frames:?}"
        );
    }
}

#[test]
fn an_allocator_of_the_program_own_is_the_one_traced() {
    // The fixture with a malloc family of its own: libc's malloc is never called.
    let (stacks, stderr) =
        traced_built_with("alloc-own", &["own_malloc.c"], &[], "alloc", &[], &[]);
    assert!(
        stderr.contains("/leaky (it defines malloc"),
        "the allocator is named:\n{stderr}"
    );
    assert_eq!(
        value_with_frame(&stacks, |f| f == "leak_here"),
        409_600,
        "{stacks:?}\n{stderr}"
    );
}

#[test]
fn jemalloc_in_ld_preload_is_the_allocator_traced() {
    // Debian's libjemalloc2 (scripts/setup), preloaded as mysqld_safe --malloc-lib does.
    let jemalloc = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";
    assert!(
        std::path::Path::new(jemalloc).exists(),
        "{jemalloc} is missing: run scripts/setup"
    );
    let env = [("LD_PRELOAD", jemalloc)];
    let (stacks, stderr) = traced_built_with(
        "memleak-jemalloc",
        &[],
        &env,
        "memleak",
        &["--sample", "1"],
        &[],
    );
    assert!(
        stderr.contains("libjemalloc.so.2 (it defines malloc"),
        "the allocator is named:\n{stderr}"
    );
    assert_eq!(
        value_with_frame(&stacks, |f| f == "leak_here"),
        409_600,
        "{stacks:?}\n{stderr}"
    );
    assert_eq!(value_with_frame(&stacks, |f| f == "churn"), 0, "{stacks:?}");
}

#[test]
fn sampled_allocations_are_scaled() {
    let (stacks, stderr) = traced("alloc-sampled", "alloc", &["--sample", "10"]);
    assert!(
        stderr.contains("estimated: ~")
            && stderr.contains("scaled ×10.00 from every 10th allocation call"),
        "{stderr}"
    );
    let leak = value_with_frame(&stacks, |f| f == "leak_here");
    assert!(
        (368_640..=450_560).contains(&leak),
        "sampled bytes of leak_here {leak} are not within 10% of 409600"
    );
    let calls = traced_allocations("alloc-calls", &["--calls", "-z", "4096", "-Z", "4096"]);
    assert_eq!(
        value_with_frame(&calls, |f| f == "leak_here"),
        100,
        "calls of exactly 4096 bytes: {calls:?}"
    );
    assert_eq!(
        value_with_frame(&calls, |f| f == "churn"),
        0,
        "-z/-Z leave out the small ones: {calls:?}"
    );
}

#[test]
fn allocation_profile_of_the_server_under_load() {
    let db = testdb();
    let dir = tempdir("alloc-server");
    // Time for sysbench to connect on a busy machine before the 2 s traced.
    let load = db.running_load();
    let svg = dir.join("alloc.svg");
    let folded = dir.join("alloc.folded");
    let pid = db.pid.to_string();
    run_ok(
        myprobe()
            .args(["profile", "alloc", "-p", &pid, "-d", "2", "-o"])
            .arg(&folded),
    );
    load.finish();
    run_ok(
        myprobe()
            .args(["flame"])
            .arg(&folded)
            .args(["--colors", "mem", "--countname", "bytes", "-o"])
            .arg(&svg),
    );
    let stacks = read_folded(&folded);
    assert!(
        value_with_frame(&stacks, |f| f == "do_command") > 0,
        "no allocation under do_command: {} stacks",
        stacks.len()
    );
    assert!(std::fs::read_to_string(&svg).unwrap().contains("malloc"));
}
