//! `myprobe report`: one trace of a loaded server with every collector, opened in a real browser (Debian's
//! headless Chromium): the page's DOM after its scripts ran, a search through the flame graphs' own script
//! against the frames each SVG holds, and a screenshot kept as the test's artefact. `report --from --to`: the
//! report of a past incident from what the agent kept, opened in the same browser.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use crate::common::*;
use regex::Regex;

/// Headless Chromium as root in a container: no sandbox, no GPU, a profile of its own. `virtual-time-budget`
/// lets the page's timers (inferno's drawing) run before the DOM is dumped or the screenshot taken.
pub(crate) fn chromium(profile: &Path, args: &[&str], url: &str) -> Vec<u8> {
    let out = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            "--virtual-time-budget=10000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .output()
        .expect("running chromium (scripts/setup installs it)");
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// The text of an attribute value as the page holds it.
pub(crate) fn unescape(s: &str) -> String {
    s.replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

/// Where the test keeps what it made for a person to look at: `tmp/report/` of the target directory (make test:
/// /var/cache/myprobe/target/tmp/report/).
fn artefacts() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("report");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn report_of_a_loaded_server_in_chromium() {
    let db = testdb();
    let dir = tempdir("report");
    let page = dir.join("report.html");
    let load = db.running_load();
    let stderr = report_closes_what_it_owns(&db, &dir, &page, load);
    assert!(
        stderr.contains("with 4 of 4 collectors"),
        "every collector traces: {stderr}"
    );
    assert!(
        stderr.contains("report: 5/8 s traced"),
        "progress: {stderr}"
    );
    let html = std::fs::read_to_string(&page).unwrap();
    std::fs::copy(&page, artefacts().join("report.html")).unwrap();
    // Self-contained: nothing is fetched from anywhere.
    for outside in ["src=\"http", "href=\"http", "@import", "url(http"] {
        assert!(!html.contains(outside), "the page loads {outside}…");
    }

    // The DOM once Chromium ran the page's scripts, with a search for do_command through every flame graph's
    // own script (report.html#search=…).
    let profile = dir.join("chromium");
    let url = format!("file://{}#search=do_command", page.display());
    let dom = String::from_utf8(chromium(&profile, &["--dump-dom"], &url)).unwrap();
    the_digest_shows_sysbench_s_statements(&dom);
    each_flame_graph_searches_its_own_frames(&dom);
    a_statement_opens_its_own_flame_graphs(&dom);
    the_findings_locks_and_threads_are_shown(&dom);
    a_screenshot_is_kept(&profile, &url);
}

/// `myprobe report` of the server under `load`, which ends with it, run under strace: its stderr. Its four
/// collectors end on threads of their own: each closes only what it owns (strace sees every close that fails), and
/// none leaves a descriptor behind while tracing goes on.
fn report_closes_what_it_owns(db: &TestDb, dir: &Path, page: &Path, load: Load) -> String {
    let closes = dir.join("closes");
    let pid = db.pid.to_string();
    let args = [
        "report",
        "-p",
        &pid,
        "-d",
        "8",
        "-o",
        page.to_str().unwrap(),
    ];
    let mut running = Background::start_command(closes_watched(&closes, &args), "of 4 collectors");
    let report_pid = running.myprobe_pid();
    let mut descriptors = Vec::new();
    while !running
        .stderr_so_far()
        .contains("myprobe: report: 5/8 s traced")
    {
        descriptors.push(descriptors_and_rss(report_pid).0);
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    let (_, stderr) = running.wait();
    load.finish();
    let failed = failed_closes(&closes);
    assert!(
        failed.is_empty(),
        "closes that failed:\n{failed}\nstderr:\n{stderr}"
    );
    // A descriptor left behind by each second, or by each read of the process list, would add up: the last
    // seconds have at most those the first had, give or take the statements' connection to the server.
    let (early, late) = descriptors.split_at(descriptors.len() / 2);
    assert!(
        late.iter().max() <= Some(&(early.iter().max().unwrap() + 2)),
        "descriptors while tracing: {descriptors:?}"
    );
    stderr
}

/// The digest's rows: sysbench's statements, each with a bar whose parts add up to 100%.
fn the_digest_shows_sysbench_s_statements(dom: &str) {
    let digest = Regex::new(r#"(?s)<table id="digest"[^>]*>.*?<tbody>(.*?)</tbody>"#).unwrap();
    let rows = &digest.captures(dom).expect("a digest table")[1];
    let fingerprints: Vec<String> = Regex::new(r#"<td class="fp" title="([^"]*)""#)
        .unwrap()
        .captures_iter(rows)
        .map(|c| unescape(&c[1]))
        .collect();
    assert!(
        fingerprints.len() >= 10,
        "sysbench's statements: {fingerprints:?}"
    );
    for sysbench in [
        "commit",
        "select c from sbtest1 where id = ?",
        "update sbtest1 set k = k + ? where id = ?",
    ] {
        assert!(
            fingerprints.iter().any(|f| f == sysbench),
            "{sysbench} in {fingerprints:?}"
        );
    }
    // Each row's bar: parts whose widths add up to 100%.
    let bar = Regex::new(r#"(?s)<div class="bar">(.*?)</div>"#).unwrap();
    let width = Regex::new(r"width:([0-9.]+)%").unwrap();
    let bars: Vec<f64> = bar
        .captures_iter(rows)
        .map(|b| {
            width
                .captures_iter(&b[1])
                .map(|w| w[1].parse::<f64>().unwrap())
                .sum()
        })
        .collect();
    assert_eq!(bars.len(), fingerprints.len());
    for sum in &bars {
        assert!((sum - 100.0).abs() < 0.2, "a bar adds up to {sum}%");
    }
}

/// One flame graph per profile, each drawn and searched by its own script: the frames highlighted are exactly the
/// frames whose name matches, counted here from the SVG the page holds.
fn each_flame_graph_searches_its_own_frames(dom: &str) {
    let section = Regex::new(
        r#"(?s)<section class="profile" id="profile-(\w+)" data-profile="\w+" data-highlighted="(\d+)">.*?<iframe class="flame"[^>]* srcdoc="([^"]*)"></iframe>"#,
    )
    .unwrap();
    let title = Regex::new(r"<g><title>([^<]*)</title>").unwrap();
    let mut searched = Vec::new();
    let mut total = 0;
    for c in section.captures_iter(dom) {
        let (id, highlighted) = (c[1].to_string(), c[2].parse::<usize>().unwrap());
        let svg = unescape(&c[3]);
        assert_eq!(svg.matches("<svg").count(), 2, "{id}: one flame graph");
        let frames = title.captures_iter(&svg).count();
        let matching = title
            .captures_iter(&svg)
            .filter(|t| t[1].contains("do_command"))
            .count();
        assert!(frames > 20, "{id}: {frames} frames");
        assert_eq!(
            highlighted, matching,
            "{id}: frames highlighted by the page's search"
        );
        total += highlighted;
        searched.push(id);
    }
    assert_eq!(searched, ["cpu", "offcpu", "locks"]);
    assert!(total >= 2, "do_command is on the CPU and off it: {total}");
    // Every flame graph of the page, the statements' own too.
    let all: usize = Regex::new(r#"<section class="profile"[^>]* data-highlighted="(\d+)""#)
        .unwrap()
        .captures_iter(dom)
        .map(|c| c[1].parse::<usize>().unwrap())
        .sum();
    let graphs = dom.matches("<iframe class=\"flame\"").count();
    assert!(
        graphs > 3,
        "the statements' own flame graphs: {graphs} in all"
    );
    assert!(
        dom.contains(&format!(
            "data-highlighted=\"{all}\">{all} frames highlighted in {graphs} flame graphs"
        )),
        "the search's status line"
    );
}

/// A statement's row links to its own flame graphs, which the link opens: the point select's on-CPU and off-CPU
/// graphs, made of its samples alone.
fn a_statement_opens_its_own_flame_graphs(dom: &str) {
    let point_select = "select c from sbtest1 where id = ?";
    let row = Regex::new(
        r##"<td class="fp" title="([^"]*)">[^<]*<a class="graphs" href="#(graphs-\d+)">"##,
    )
    .unwrap();
    let links: Vec<(String, String)> = row
        .captures_iter(dom)
        .map(|c| (unescape(&c[1]), c[2].to_string()))
        .collect();
    let (_, id) = links
        .iter()
        .find(|(fp, _)| fp == point_select)
        .unwrap_or_else(|| panic!("no link to the point select's flame graphs: {links:?}"));
    let graphs = Regex::new(&format!(
        r#"(?s)<details id="{id}"[^>]*><summary>([^<]*)</summary>(.*?)</details>"#
    ))
    .unwrap();
    let c = graphs.captures(dom).expect("the linked flame graphs");
    assert_eq!(unescape(&c[1]), point_select);
    for kind in ["cpu", "offcpu"] {
        assert!(
            c[2].contains(&format!("data-profile=\"{kind}\"")),
            "the point select's {kind} graph: {}",
            &c[2][..c[2].len().min(2000)]
        );
    }
    // Its samples alone: no frame of sysbench's range selects' sort.
    assert!(
        !c[2].contains("filesort"),
        "another statement's frames in the point select's graphs"
    );
}

/// The findings' sentences, the lock table's rows and the threads' stacks.
fn the_findings_locks_and_threads_are_shown(dom: &str) {
    let findings = Regex::new(r#"(?s)<section id="findings">.*?</section>"#).unwrap();
    let findings = &findings.find(dom).expect("findings").as_str();
    let items: Vec<&str> = findings.matches("<li>").collect();
    assert!(items.len() >= 4, "findings: {findings}");
    assert!(
        findings.contains("statements in") && findings.contains("On CPU ("),
        "findings name the statements and the CPU: {findings}"
    );
    // InnoDB's pool workers wait for their next task on a mutex all the time: not what statements waited on.
    assert!(
        !findings.contains("wait_for_tasks") && !findings.contains("most waited-for lock"),
        "the lock finding is the statements': {findings}"
    );
    let locks = Regex::new(r#"(?s)<table id="lock-table".*?<tbody>(.*?)</tbody>"#).unwrap();
    let locks = &locks.captures(dom).expect("a lock table")[1];
    assert!(locks.matches("<tr>").count() >= 1, "lock rows: {locks}");
    let threads = Regex::new(r#"(?s)<pre class="threads">(.*?)</pre>"#).unwrap();
    let threads = &threads.captures(dom).expect("the threads")[1];
    assert!(
        threads.contains("do_command"),
        "connection threads: {threads}"
    );
}

/// What a person sees, kept for a look.
fn a_screenshot_is_kept(profile: &Path, url: &str) {
    let shot = artefacts().join("report.png");
    let _ = std::fs::remove_file(&shot);
    chromium(
        profile,
        &[
            "--window-size=1400,3000",
            &format!("--screenshot={}", shot.display()),
        ],
        url,
    );
    let png = std::fs::read(&shot).expect("a screenshot");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 50_000,
        "{} bytes",
        png.len()
    );
    eprintln!("report: screenshot in {}", shot.display());
}

#[test]
fn report_bad_input_is_one_line() {
    let db = testdb();
    let dir = tempdir("report-bad");
    let one_line = |args: &[&str], says: &str| {
        let out = myprobe().args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    };
    let page = dir.join("r.html");
    let page = page.to_str().unwrap();
    one_line(
        &["report", "-p", "999999", "-o", page],
        "no process with PID 999999",
    );
    one_line(
        &[
            "report",
            "-p",
            &db.pid.to_string(),
            "-o",
            "/nonexistent/dir/r.html",
        ],
        "cannot create /nonexistent/dir/r.html",
    );
    one_line(
        &["report", "-d", "0", "-o", page],
        "-d must be at least 1 second",
    );
}

#[test]
fn a_collector_that_cannot_load_leaves_the_others_tracing() {
    // The lock waits' maps (22 MiB) do not fit 16 MiB of kernel memory; the on-CPU, off-CPU and statements' do.
    let db = testdb();
    let dir = tempdir("report-missing");
    let page = dir.join("r.html");
    let _load = db.running_load();
    let out = myprobe()
        .args([
            "report",
            "-p",
            &db.pid.to_string(),
            "-d",
            "2",
            "--max-kernel-mem",
            "16",
        ])
        .arg("-o")
        .arg(&page)
        .arg("--socket")
        .arg(&db.socket)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let missing: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("myprobe: ") && l.contains("not traced"))
        .collect();
    assert_eq!(missing.len(), 1, "{stderr}");
    assert!(
        missing[0].starts_with("myprobe: warning: lock waits not traced: ")
            && missing[0].contains("--max-kernel-mem"),
        "{stderr}"
    );
    assert!(
        stderr.contains("with 3 of 4 collectors (on-CPU at 99 Hz, off-CPU, statements)"),
        "{stderr}"
    );
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.contains("lock waits: not traced"),
        "missing not in the page"
    );
    assert!(
        html.contains("On-CPU") && html.contains("Off-CPU"),
        "profiles not in the page"
    );
}

/// An incident under the agent (2-second windows), over before the report is asked for: `report --from --to --dir`
/// from the agent's history and windows alone, opened in Chromium.
#[test]
fn report_of_a_past_incident_from_what_the_agent_kept() {
    use crate::history::{agent_with, free_port, hot_row_on, now_s};
    let db = testdb();
    let dir = tempdir("past-report");
    let kept = dir.join("agent");
    let agent = agent_with(&db, free_port(), &kept, &["--window", "2s"]);
    let from = now_s() - 1;
    let t1 = hot_row_on(&db, "pastreport.t");
    // The windows of the incident written, the last when the agent ends.
    std::thread::sleep(std::time::Duration::from_secs(2));
    let to = now_s() + 1;
    agent.stop();
    let page = dir.join("past.html");
    let range = [
        "--from".to_string(),
        from.to_string(),
        "--to".into(),
        to.to_string(),
    ];
    let stderr = past_report(&range, &kept, &page);
    assert!(!stderr.contains("not in the report"), "{stderr}");
    std::fs::copy(&page, artefacts().join("past.html")).unwrap();
    let url = format!("file://{}", page.display());
    let dom = String::from_utf8(chromium(&dir.join("chromium"), &["--dump-dom"], &url)).unwrap();
    the_past_load_and_blocker_are_shown(&dom, t1.holder, &t1.waiters);
    a_past_flame_graph_holds_the_server_s_frames(&dom);
    what_is_missing_is_said_and_nothing_is_an_error(&dir, &kept, &range);
}

/// The load chart's row-lock parts, the holder among the blockers and in the moment's chain, the findings' words.
fn the_past_load_and_blocker_are_shown(dom: &str, holder: u64, waiters: &[u64]) {
    let chart = Regex::new(r#"(?s)<svg class="load-chart".*?</svg>"#).unwrap();
    let chart = chart.find(dom).expect("a load chart").as_str();
    assert!(
        chart.contains("data-state=\"row lock\"") && chart.contains(">row lock</text>"),
        "the chart shows the row lock: {chart}"
    );
    let blockers = Regex::new(r#"(?s)<table id="top-blockers".*?</table>"#).unwrap();
    let blockers = blockers.find(dom).expect("a blockers' table").as_str();
    assert!(
        blockers.contains(&format!(">connection {holder}<")),
        "the holder among the blockers: {blockers}"
    );
    // Its moment, among those of any incident a test beside this one made meanwhile.
    let moment = Regex::new(&format!(
        r#"(?s)<section class="moment" id="moment-\d" data-blocker="{holder}">.*?</section>"#
    ))
    .unwrap();
    let moment = moment.find(dom).expect("the holder's moment").as_str();
    let chain = format!("<li class=\"holder\" data-conn=\"{holder}\">connection {holder} (");
    assert!(moment.contains(&chain), "{moment}");
    assert!(moment.contains("idle in its transaction"), "{moment}");
    for w in waiters {
        assert!(
            moment.contains(&format!(
                "← connection {w} waits for a row lock on pastreport.t "
            )),
            "{moment}"
        );
    }
    let findings = Regex::new(r#"(?s)<section id="findings">.*?</section>"#).unwrap();
    let findings = findings.find(dom).expect("findings").as_str();
    let held_up = Regex::new(&format!(
        r"<li>Connection {holder}\b[^<]* held up {} sessions \(row lock on pastreport.t ",
        waiters.len()
    ))
    .unwrap();
    assert!(
        held_up.is_match(findings),
        "the holder in the findings: {findings}"
    );
}

/// At least one of the windows' flame graphs, drawn by inferno in its frame, with the server's own functions.
fn a_past_flame_graph_holds_the_server_s_frames(dom: &str) {
    let frame = Regex::new(r#"<iframe class="flame"[^>]* srcdoc="([^"]*)"></iframe>"#).unwrap();
    let title = Regex::new(r"<g><title>([^<]*)</title>").unwrap();
    let graphs: Vec<String> = frame.captures_iter(dom).map(|c| unescape(&c[1])).collect();
    assert!(!graphs.is_empty(), "no flame graph");
    let server_frames = graphs
        .iter()
        .flat_map(|svg| {
            title
                .captures_iter(svg)
                .map(|t| t[1].to_string())
                .collect::<Vec<_>>()
        })
        .filter(|t| t.starts_with("do_command") || t.starts_with("dispatch_command"))
        .count();
    assert!(
        server_frames > 0,
        "no frame of mariadbd in {} flame graphs",
        graphs.len()
    );
}

/// Windows without a history: said in a line, the page still written; a range of which nothing was kept: an error;
/// a past range with an option of tracing now: clap's conflict, with what to do.
/// `myprobe report` of the past `range` (`--from … --to …`) from what the agent kept in `kept`, written to `page`;
/// asserts it succeeded and gives its stderr.
fn past_report(range: &[String], kept: &Path, page: &Path) -> String {
    run_ok(
        myprobe()
            .arg("report")
            .args(range)
            .arg("--dir")
            .arg(kept)
            .arg("-o")
            .arg(page),
    )
}

fn what_is_missing_is_said_and_nothing_is_an_error(dir: &Path, kept: &Path, range: &[String]) {
    let windows_only = dir.join("windows-only");
    std::fs::create_dir_all(&windows_only).unwrap();
    for f in std::fs::read_dir(kept).unwrap().flatten() {
        if f.file_name().to_string_lossy().ends_with(".pb.gz") {
            std::fs::copy(f.path(), windows_only.join(f.file_name())).unwrap();
        }
    }
    let page = dir.join("windows-only.html");
    let stderr = past_report(range, &windows_only, &page);
    let said: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("myprobe: not in the report: "))
        .collect();
    assert_eq!(said.len(), 1, "{stderr}");
    assert!(said[0].contains("no history.sqlite in"), "{stderr}");
    assert!(std::fs::read_to_string(&page)
        .unwrap()
        .contains("<iframe class=\"flame\""));
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let fails = |args: &[&str], says: &str| {
        let out = myprobe().arg("report").args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        stderr.to_string()
    };
    let one = fails(
        &[
            "--from",
            "-2h",
            "--to",
            "-1h",
            "--dir",
            empty.to_str().unwrap(),
        ],
        "nothing kept in",
    );
    assert_eq!(one.lines().count(), 1, "{one}");
    fails(
        &["--from", "-1h", "-p", "1"],
        "tip: --from/--to write the report of a past range",
    );
}
