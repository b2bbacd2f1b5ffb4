//! `profile cpu` and `profile offcpu --by statement`: each sample under the statement its thread ran, read from the
//! server's memory at the sample, on every server the tests start, beside sysbench.

use crate::common::*;

/// A statement whose CPU goes to a known function: a SHA-256 of each of 300,000 rows (well under a second).
const HASHING: &str =
    "SELECT SUM(LENGTH(SHA2(CONCAT(a.c, b.c), 256))) FROM (SELECT c FROM sbtest1 LIMIT 10000) a, \
                       (SELECT c FROM sbtest1 LIMIT 30) b";
const HASHING_ROOT: &str = "select sum(length(sha2(";
const HASH_FUNCTION: &str = "Item_func_sha2::val_str_ascii";
/// sysbench's point select, on any of its tables.
fn is_point_select(root: &str) -> bool {
    root.starts_with("select c from sbtest") && root.ends_with("where id = ?")
}

/// The stacks of a `--by statement` profile whose root (the statement) `pick` chooses, the root left out.
fn under(stacks: &[(Vec<String>, u64)], pick: impl Fn(&str) -> bool) -> Vec<(Vec<String>, u64)> {
    stacks
        .iter()
        .filter(|(f, _)| pick(&f[0]))
        .map(|(f, v)| (f[1..].to_vec(), *v))
        .collect()
}

/// `profile COLLECTOR --by statement` of `db` into `folded`, tracing until stopped.
fn by_statement_in_background(
    collector: &str,
    db: &TestDb,
    folded: &std::path::Path,
) -> Background {
    let (pid, file) = (db.pid.to_string(), folded.display().to_string());
    let args = [
        "profile",
        collector,
        "-p",
        &pid,
        "-d",
        "60",
        "--by",
        "statement",
        "-o",
        &file,
    ];
    Background::start(&args, "Ctrl-C ends early")
}

fn total(stacks: &[(Vec<String>, u64)]) -> u64 {
    stacks.iter().map(|(_, v)| v).sum()
}

#[test]
fn each_statement_has_its_own_on_cpu_profile_on_every_server() {
    for (kind, db) in every_server() {
        let dir = tempdir("by-statement-cpu");
        let load = db.running_load();
        let mut hashing = db.session_in(Some("sbtest"));
        let folded = dir.join("cpu.folded");
        let mut tracer = myprobe()
            .args(["profile", "cpu", "-p", &db.pid.to_string(), "-d", "3"])
            .args(["-F", "199", "--by", "statement", "-o"])
            .arg(&folded)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // The hashing statement, one after the other, while the profile runs.
        let mut ran = 0;
        while tracer.try_wait().unwrap().is_none() {
            hashing.send(HASHING);
            hashing.read_line();
            ran += 1;
        }
        let out = tracer.wait_with_output().unwrap();
        load.finish();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{kind}: {stderr}");
        let stacks = read_folded(&folded);
        let heavy = under(&stacks, |r| r.starts_with(HASHING_ROOT));
        let heavy_total = total(&heavy);
        assert!(
            heavy_total >= 20,
            "{kind}: {heavy_total} samples under the hashing statement ({ran} run); roots: {:?}\n{stderr}",
            roots(&stacks)
        );
        // Its own graph: the hash function in most of its samples.
        let hashing_samples = value_with_frame(&heavy, |f| f == HASH_FUNCTION);
        assert!(
            hashing_samples * 2 >= heavy_total,
            "{kind}: {HASH_FUNCTION} in {hashing_samples} of the hashing statement's {heavy_total} samples: {heavy:?}"
        );
        // `diff` compares that statement's samples alone: here the run with itself.
        let diff = dir.join("diff.folded");
        run_ok(
            myprobe()
                .args(["diff", "--statement", r"^select sum\(length\(sha2"])
                .arg(&folded)
                .arg(&folded)
                .arg("-o")
                .arg(&diff),
        );
        let diffed: u64 = std::fs::read_to_string(&diff)
            .unwrap()
            .lines()
            .map(|l| {
                let v: Vec<u64> = l
                    .rsplitn(3, ' ')
                    .take(2)
                    .map(|v| v.parse().unwrap())
                    .collect();
                assert_eq!(v[0], v[1], "{kind}: {l}");
                v[0]
            })
            .sum();
        assert_eq!(
            diffed, heavy_total,
            "{kind}: the hashing statement's samples in diff"
        );
        // sysbench's point selects have theirs, without the hash.
        let points = under(&stacks, is_point_select);
        assert!(
            total(&points) > 0,
            "{kind}: no sample under sysbench's point selects; roots: {:?}",
            roots(&stacks)
        );
        assert_eq!(
            value_with_frame(&points, |f| f.contains("sha2") || f.contains("SHA256")),
            0,
            "{kind}: the point selects' samples hold the hashing statement's functions: {points:?}"
        );
        // Every sample is under a statement or says why not.
        for (frames, _) in &stacks {
            let root = &frames[0];
            assert!(
                root.starts_with('[')
                    || root.chars().next().is_some_and(|c| c.is_ascii_lowercase()),
                "{kind}: a stack whose root is no statement: {frames:?}"
            );
        }
    }
}

fn roots(stacks: &[(Vec<String>, u64)]) -> Vec<(String, u64)> {
    let mut by_root: std::collections::BTreeMap<String, u64> = Default::default();
    for (f, v) in stacks {
        *by_root.entry(f[0].clone()).or_default() += v;
    }
    let mut roots: Vec<(String, u64)> = by_root.into_iter().collect();
    roots.sort_by_key(|r| std::cmp::Reverse(r.1));
    roots.truncate(15);
    roots
}

#[test]
fn a_statement_s_waits_are_under_it_even_one_begun_before_tracing_on_every_server() {
    for (kind, db) in every_server() {
        let dir = tempdir("by-statement-offcpu");
        let load = db.running_load();
        // In SLEEP() from before tracing to after: its thread is off CPU throughout (found at the end by the
        // task iterator, its statement read from its memory then).
        let mut sleeper = db.session();
        sleeper.send("SELECT SLEEP(4)");
        db.wait_until("the sleep to start", || {
            db.sql("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE 'SELECT SLEEP(4)%'")
                .trim()
                == "1"
        });
        let folded = dir.join("offcpu.folded");
        let stderr = run_ok(
            myprobe()
                .args(["profile", "offcpu", "-p", &db.pid.to_string(), "-d", "2"])
                .args(["--by", "statement", "-o"])
                .arg(&folded),
        );
        load.finish();
        assert_eq!(sleeper.read_line(), "0", "{kind}: SLEEP(4) was cut short");
        let stacks = read_folded(&folded);
        let sleeping = under(&stacks, |r| r == "select sleep(?)");
        let slept = value_with_frame(&sleeping, |f| f == "Item_func_sleep::val_int");
        assert!(
            slept >= 1_500_000,
            "{kind}: {slept} µs in Item_func_sleep::val_int under the sleeping statement (2 s traced): {sleeping:?}; roots: {:?}\n{stderr}",
            roots(&stacks)
        );
        // sysbench's statements wait too (a commit for its log), each under its own.
        assert!(
            total(&under(&stacks, |r| r == "commit")) > 0,
            "{kind}: no off-CPU time under sysbench's commits; roots: {:?}",
            roots(&stacks)
        );
        let points = under(&stacks, is_point_select);
        assert_eq!(
            value_with_frame(&points, |f| f.contains("sleep")),
            0,
            "{kind}: the point selects' waits hold the sleeping statement's: {points:?}"
        );
    }
}

#[test]
fn a_row_lock_wait_is_under_the_statement_that_waited_on_every_server() {
    for (kind, db) in every_server() {
        let dir = tempdir("by-statement-locks");
        db.sql("CREATE DATABASE IF NOT EXISTS by_statement");
        db.sql(
            "CREATE TABLE IF NOT EXISTS by_statement.t (id INT PRIMARY KEY, v INT) ENGINE=InnoDB",
        );
        db.sql("INSERT IGNORE INTO by_statement.t VALUES (1, 0)");
        let folded = dir.join("locks.folded");
        let profile = by_statement_in_background("locks", &db, &folded);
        let mut holder = db.session();
        holder.exec("BEGIN; UPDATE by_statement.t SET v = v + 1 WHERE id = 1");
        let mut waiter = db.session();
        waiter.send("UPDATE by_statement.t SET v = v + 10 WHERE id = 1; SELECT 'updated'");
        db.wait_for_row_lock_wait("v + 10");
        std::thread::sleep(std::time::Duration::from_millis(800));
        holder.exec("COMMIT");
        assert_eq!(waiter.read_line(), "updated");
        let (_, stderr) = profile.stop();
        let stacks = read_folded(&folded);
        let waited = total(&under(&stacks, |r| {
            r == "update by_statement.t set v = v + ? where id = ?"
        }));
        assert!(
            waited >= 700_000,
            "{kind}: {waited} µs of lock waits under the waiting update (about 800 ms waited); roots: {:?}\n{stderr}",
            roots(&stacks)
        );
    }
}

#[test]
fn an_allocation_is_under_the_statement_that_made_it_on_every_server() {
    for (kind, db) in every_server() {
        let dir = tempdir("by-statement-alloc");
        let load = db.running_load();
        let folded = dir.join("alloc.folded");
        let profile = by_statement_in_background("alloc", &db, &folded);
        // A string of 10 MB, made by REPEAT: its buffer allocated in Item_func_repeat::val_str. Each with its own
        // literals, which make no label of their own.
        let mut session = db.session();
        for (i, (literal, chars)) in [("x", 1), ("it\\'s", 4), ("10", 2)].into_iter().enumerate() {
            let times = 10_000_000 / chars + i;
            let got = session.query_row(&format!("SELECT LENGTH(REPEAT('{literal}', {times}))"));
            assert_eq!(got, (times * chars).to_string());
        }
        let (_, stderr) = profile.stop();
        let texts = stderr
            .lines()
            .find_map(|l| l.strip_prefix("myprobe: statements: "))
            .unwrap_or_else(|| panic!("{kind}: no count of the statements' texts: {stderr}"));
        let (fingerprints, read) = texts
            .split_once(" fingerprints, from ")
            .unwrap_or_else(|| panic!("{kind}: {texts}"));
        assert_eq!(
            read.strip_suffix(" texts read"),
            Some(fingerprints),
            "{kind}: a statement's literals made a label of their own: {fingerprints} fingerprints from {read}"
        );
        load.finish();
        let stacks = read_folded(&folded);
        let repeating = under(&stacks, |r| r == "select length(repeat(?, ?))");
        let bytes = value_with_frame(&repeating, |f| f == "Item_func_repeat::val_str");
        assert!(
            bytes >= 30_000_000,
            "{kind}: {bytes} bytes allocated in Item_func_repeat::val_str under the repeating statement (3 × 10 MB): \
             {repeating:?}; roots: {:?}\n{stderr}",
            roots(&stacks)
        );
        let points = under(&stacks, is_point_select);
        assert!(
            total(&points) > 0,
            "{kind}: no allocation under sysbench's point selects"
        );
        assert_eq!(
            value_with_frame(&points, |f| f.contains("repeat")),
            0,
            "{kind}: the point selects' allocations hold the repeating statement's: {points:?}"
        );
    }
}
