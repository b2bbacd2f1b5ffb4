//! The agent's page at `/`, in a real browser (Debian's headless Chromium): a hot row held by a connection idle in
//! its transaction while the agent runs (history.rs's incident, on a table whose name is markup), then the page of
//! that range and moment as a link gives it (`/?from=…&to=…&at=…`): the chart's states, the top blockers, the
//! sessions at that second, who blocked whom, the windows kept for it, and a screenshot kept in
//! target/tmp/history-page/.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant, UNIX_EPOCH},
};

use regex::Regex;

use crate::{
    common::*,
    history::{agent_with, free_port, hot_row_on, now_s, HotRow},
    report::chromium,
};

/// Where the screenshot is kept: `tmp/history-page/` of the target directory.
fn artefacts() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("history-page");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn the_agent_s_page_shows_an_incident_in_chromium() {
    let db = testdb();
    let dir = tempdir("history-page");
    let port = free_port();
    // Windows of 5 s, so that one covering the moment is kept within the test.
    let agent = agent_with(&db, port, &dir, &["--window", "5s"]);
    // Its text reaches the page as untrusted text: never as markup.
    let t1 = hot_row_on(&db, "hist.`hot<b>row`");
    window_written_after(&dir, t1.at + 5);
    // Within the seconds kept (the agent started a few seconds before): drawn from every second.
    let url = format!(
        "http://127.0.0.1:{port}/?from={}&to={}&at={}",
        t1.at - 40,
        now_s() + 2,
        t1.at
    );
    let profile = dir.join("chromium");
    let dom = String::from_utf8(chromium(&profile, &["--dump-dom"], &url)).unwrap();
    std::fs::write(artefacts().join("page.html"), &dom).unwrap();
    the_page_read_everything(&dom);
    the_chart_and_top_lists_show_the_incident(&dom, &t1);
    the_moment_shows_the_waiters_and_their_chain(&dom, &t1);
    the_windows_kept_for_the_moment_are_linked(&dom, t1.at);
    a_screenshot_is_kept(&profile, &url);
    agent.stop();
}

/// Waits (20 s at most) for a window file written at `t` or later: the window under way at the moment, which
/// started before it, is kept by then.
fn window_written_after(dir: &Path, t: i64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let written_after = || {
        std::fs::read_dir(dir).unwrap().flatten().any(|e| {
            e.file_name().to_string_lossy().ends_with(".pb.gz")
                && e.metadata()
                    .and_then(|m| m.modified())
                    .is_ok_and(|m| m.duration_since(UNIX_EPOCH).unwrap().as_secs() as i64 >= t)
        })
    };
    while !written_after() {
        assert!(Instant::now() < deadline, "no window written after {t}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The part of the DOM from the element with `id` to its end, or the test fails.
fn part<'d>(dom: &'d str, pattern: &str) -> &'d str {
    Regex::new(pattern)
        .unwrap()
        .find(dom)
        .unwrap_or_else(|| panic!("{pattern} not in the page:\n{dom}"))
        .as_str()
}

fn the_page_read_everything(dom: &str) {
    let status = part(dom, r#"<p id="status"[^>]*>[^<]*</p>"#);
    assert!(
        status.ends_with("></p>"),
        "the page says something went wrong: {status}"
    );
    // The table's name is shown as text: escaped in the DOM, never an element.
    assert!(dom.contains("hot&lt;b&gt;row"), "{dom}");
    assert!(!dom.contains("hot<b>row"), "markup from the server: {dom}");
}

fn the_chart_and_top_lists_show_the_incident(dom: &str, t1: &HotRow) {
    let legend = part(dom, r#"(?s)<ul id="legend">.*?</ul>"#);
    assert!(
        legend.contains(r#"<li data-state="row lock">"#),
        "the legend: {legend}"
    );
    let chart = part(dom, r#"(?s)<div id="chart">.*?</svg>"#);
    assert!(
        chart.contains(r#"data-state="row lock""#),
        "no bar of row locks: {chart}"
    );
    let blockers = part(dom, r#"(?s)<table id="top-blockers".*?</table>"#);
    assert!(
        blockers.contains(&format!(">connection {}<", t1.holder)),
        "the top blockers: {blockers}"
    );
    let statements = part(dom, r#"(?s)<table id="top-statements".*?</table>"#);
    assert!(
        statements.contains("UPDATE hist.`hot&lt;b&gt;row` SET k = k + ?"),
        "the top statements: {statements}"
    );
}

fn the_moment_shows_the_waiters_and_their_chain(dom: &str, t1: &HotRow) {
    let moment = part(dom, r#"(?s)<section id="moment">.*?</section>"#);
    for w in &t1.waiters {
        let row = part(moment, &format!(r#"(?s)<tr data-conn="{w}">.*?</tr>"#));
        assert!(
            row.contains(r#"<td class="state" data-state="row lock">"#),
            "waiter {w}: {row}"
        );
    }
    let holder = part(
        moment,
        &format!(r#"(?s)<tr data-conn="{}".*?</tr>"#, t1.holder),
    );
    assert!(holder.contains("idle in transaction"), "{holder}");
    let chain = part(
        moment,
        &format!(
            r#"(?s)<li class="root" data-conn="{}">.*?</ul></li>"#,
            t1.holder
        ),
    );
    let holder = part(chain, r#"<span class="holder">[^<]*</span>"#);
    assert!(
        holder.starts_with(&format!(
            r#"<span class="holder">connection {} ("#,
            t1.holder
        )) && holder.contains(", idle in its transaction"),
        "the chain's root: {holder}"
    );
    // Its own statement, which the waiters' statements are not.
    assert!(
        holder.contains("its transaction ran: ")
            && holder.contains("UPDATE hist.`hot&lt;b&gt;row` SET k = k + ? WHERE id = ?"),
        "the holder's own statement: {holder}"
    );
    for w in &t1.waiters {
        assert!(
            chain.contains(&format!(
                r#"<li class="waiter" data-conn="{w}">← connection {w} waits for a row lock"#
            )),
            "waiter {w} in the chain: {chain}"
        );
    }
}

/// A link to a window that started at most a window (5 s, and a second's slack) before the moment.
fn the_windows_kept_for_the_moment_are_linked(dom: &str, at: i64) {
    let windows = part(dom, r#"(?s)<ul id="windows">.*?</ul>"#);
    let link = Regex::new(
        r#"href="/debug/pprof/windows/((?:cpu|offcpu|locks)-\d+-(\d{8}T\d{6}Z)\.pb\.gz)""#,
    )
    .unwrap();
    let starts: Vec<i64> = link
        .captures_iter(windows)
        .map(|c| {
            chrono::NaiveDateTime::parse_from_str(&c[2], "%Y%m%dT%H%M%SZ")
                .unwrap()
                .and_utc()
                .timestamp()
        })
        .collect();
    assert!(!starts.is_empty(), "no window linked: {windows}");
    for s in &starts {
        assert!(
            (at - 6..=at).contains(s),
            "a window from {s} linked for {at}: {windows}"
        );
    }
}

fn a_screenshot_is_kept(profile: &Path, url: &str) {
    let shot = artefacts().join("page.png");
    let _ = std::fs::remove_file(&shot);
    chromium(
        profile,
        &[
            "--window-size=1400,1300",
            &format!("--screenshot={}", shot.display()),
        ],
        url,
    );
    let png = std::fs::read(&shot).expect("a screenshot");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 30_000,
        "{} bytes",
        png.len()
    );
    eprintln!("history page: screenshot in {}", shot.display());
}
