//! `myprobe diff` and `myprobe flame` on small handmade folded files: exact differential values,
//! the normalized BEFORE column, the deltas inferno writes in the SVG, and clear input errors.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use quick_xml::events::Event;

const BEFORE: &str = "main;a;x 10\nmain;b 5\n";
const AFTER: &str = "main;a;x 15\nmain;b 2\nmain;c 4\n";

/// A temporary directory removed on drop (folded files only: nothing is run from it).
struct TempDir(tempfile::TempDir);

impl TempDir {
    fn new(name: &str) -> Self {
        let prefix = format!("myprobe-test-{name}-");
        TempDir(tempfile::Builder::new().prefix(&prefix).tempdir().unwrap())
    }

    fn path(&self) -> &Path {
        self.0.path()
    }

    fn file(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

fn myprobe(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_myprobe"))
        .args(args)
        .output()
        .expect("run myprobe")
}

fn ok(args: &[&str]) -> Output {
    let out = myprobe(args);
    assert!(
        out.status.success(),
        "myprobe {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The differential folded lines written by `diff -o X.folded`, sorted.
fn diff_folded(dir: &TempDir, extra: &[&str], out_name: &str) -> Vec<String> {
    let before = dir.file("before.folded", BEFORE);
    let after = dir.file("after.folded", AFTER);
    let out = dir.path().join(out_name);
    let mut args = vec!["diff", s(&before), s(&after), "-o", s(&out)];
    args.extend_from_slice(extra);
    let run = ok(&args);
    assert!(run.stdout.is_empty(), "nothing on stdout with -o");
    let mut lines: Vec<String> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    lines.sort();
    lines
}

/// `<title>` texts of an SVG, which must parse as XML.
fn svg_titles(svg: &str) -> Vec<String> {
    let mut reader = quick_xml::Reader::from_str(svg);
    let mut titles = Vec::new();
    let mut in_title = false;
    let mut saw_svg = false;
    loop {
        match reader.read_event().expect("SVG is well-formed XML") {
            Event::Start(e) if e.name().as_ref() == b"svg" => saw_svg = true,
            Event::Start(e) if e.name().as_ref() == b"title" => in_title = true,
            Event::End(e) if e.name().as_ref() == b"title" => in_title = false,
            Event::Text(t) if in_title => titles.push(t.unescape().unwrap().into_owned()),
            Event::Eof => break,
            _ => {}
        }
    }
    assert!(saw_svg, "no <svg> element");
    titles
}

/// The title of the frame named `name` (inferno's `name (N samples, P%; ±D%)`).
fn title_of<'a>(titles: &'a [String], name: &str) -> &'a str {
    let prefix = format!("{name} (");
    let found: Vec<&String> = titles.iter().filter(|t| t.starts_with(&prefix)).collect();
    assert_eq!(found.len(), 1, "frame {name} in {titles:?}");
    found[0]
}

#[test]
fn differential_folded_lines_are_exact() {
    let dir = TempDir::new("diff-folded");
    assert_eq!(
        diff_folded(&dir, &[], "d.folded"),
        ["main;a;x 10 15", "main;b 5 2", "main;c 0 4"]
    );
    // .txt is folded too.
    assert_eq!(
        diff_folded(&dir, &[], "d.txt"),
        ["main;a;x 10 15", "main;b 5 2", "main;c 0 4"]
    );
}

#[test]
fn normalize_scales_before_to_after_total() {
    let dir = TempDir::new("diff-normalize");
    // BEFORE total 15, AFTER total 21: BEFORE × 21/15 → 10 → 14, 5 → 7 (inferno truncates).
    assert_eq!(
        diff_folded(&dir, &["--normalize"], "d.folded"),
        ["main;a;x 14 15", "main;b 7 2", "main;c 0 4"]
    );
}

#[test]
fn differential_svg_titles_carry_deltas() {
    let dir = TempDir::new("diff-svg");
    let before = dir.file("before.folded", BEFORE);
    let after = dir.file("after.folded", AFTER);

    // Without -o: SVG on stdout. Drawn on AFTER (total 21); delta % of AFTER's total.
    let out = ok(&["diff", s(&before), s(&after), "--title", "Before vs after"]);
    let svg = String::from_utf8(out.stdout).unwrap();
    assert!(svg.contains("Before vs after"));
    let titles = svg_titles(&svg);
    assert_eq!(
        title_of(&titles, "main"),
        "main (21 samples, 100.00%; 0.00%)"
    );
    // `a` is not a leaf: flamegraph.pl and inferno give inner frames a zero delta.
    assert_eq!(title_of(&titles, "a"), "a (15 samples, 71.43%; 0.00%)");
    assert_eq!(title_of(&titles, "x"), "x (15 samples, 71.43%; +23.81%)"); // +5/21
    assert_eq!(title_of(&titles, "b"), "b (2 samples, 9.52%; -14.29%)"); // -3/21
    assert_eq!(title_of(&titles, "c"), "c (4 samples, 19.05%; +19.05%)"); // +4/21

    // Same with -o X.svg and --normalize: deltas against the scaled BEFORE (14, 7, 0).
    let svg_path = dir.path().join("d.svg");
    let run = ok(&[
        "diff",
        s(&before),
        s(&after),
        "--normalize",
        "-o",
        s(&svg_path),
    ]);
    assert!(run.stdout.is_empty());
    let titles = svg_titles(&std::fs::read_to_string(&svg_path).unwrap());
    assert_eq!(title_of(&titles, "a"), "a (15 samples, 71.43%; 0.00%)");
    assert_eq!(title_of(&titles, "x"), "x (15 samples, 71.43%; +4.76%)"); // +1/21
    assert_eq!(title_of(&titles, "b"), "b (2 samples, 9.52%; -23.81%)"); // -5/21
    assert_eq!(title_of(&titles, "c"), "c (4 samples, 19.05%; +19.05%)");
}

#[test]
fn diff_rejects_other_formats_and_bad_input() {
    let dir = TempDir::new("diff-errors");
    let before = dir.file("before.folded", BEFORE);
    let after = dir.file("after.folded", "main;a;x 15\nmain;b two\n");
    let out = myprobe(&["diff", s(&before), s(&after)]);
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("after.folded: line 2: expected `frame;frame VALUE`"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");

    let good = dir.file("good.folded", AFTER);
    let out = myprobe(&[
        "diff",
        s(&before),
        s(&good),
        "-o",
        s(&dir.path().join("d.json")),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("diff writes .svg or .folded/.txt"));
}

#[test]
fn flame_corrupt_line_names_the_line() {
    let dir = TempDir::new("flame-corrupt");
    let input = dir.file(
        "bad.folded",
        "main;a 1\nmain;b 2\n\nmain;c 3\nmain;d 4\nmain;e 5\nmain;f\nmain;g 7\n",
    );
    let out = myprobe(&["flame", s(&input)]);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "no SVG on error");
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(
        err.contains("bad.folded: line 7: expected `frame;frame VALUE`"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn flame_missing_file_and_bad_regex_are_one_line() {
    let dir = TempDir::new("flame-errors");
    let out = myprobe(&["flame", s(&dir.path().join("nope.folded"))]);
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("nope.folded") && err.contains("No such file"),
        "{err}"
    );

    let input = dir.file("in.folded", AFTER);
    let out = myprobe(&["flame", s(&input), "--grep", "a("]);
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(
        err.trim_end(),
        "myprobe: error: invalid --grep regex \"a(\": unclosed group"
    );
}

#[test]
fn flame_grep_exclude_and_formats() {
    let dir = TempDir::new("flame-grep");
    let input = dir.file(
        "in.folded",
        "start_thread;do_command;dispatch_command 10\nstart_thread;buf_flush_page_cleaner 3\nmain;poll 5\n",
    );
    let out = dir.path().join("out.folded");
    ok(&[
        "flame",
        s(&input),
        "--grep",
        "start_thread",
        "--exclude",
        "page_cleaner",
        "-o",
        s(&out),
    ]);
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        "start_thread;do_command;dispatch_command 10\n"
    );

    // Standard input, SVG on stdout, count name and title.
    let mut child = Command::new(env!("CARGO_BIN_EXE_myprobe"))
        .args([
            "flame",
            "-",
            "--countname",
            "ns",
            "--title",
            "Off-CPU",
            "--colors",
            "io",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"main;poll 5\nmain;read 15\n")
        .unwrap();
    let run = child.wait_with_output().unwrap();
    assert!(run.status.success());
    let svg = String::from_utf8(run.stdout).unwrap();
    assert!(svg.contains("Off-CPU"));
    let titles = svg_titles(&svg);
    assert_eq!(title_of(&titles, "poll"), "poll (5 ns, 25.00%)");
    assert_eq!(title_of(&titles, "read"), "read (15 ns, 75.00%)");

    // Filtering everything away still gives a valid SVG.
    let run = ok(&["flame", s(&input), "--grep", "no_such_function"]);
    svg_titles(&String::from_utf8(run.stdout).unwrap());
    assert!(String::from_utf8_lossy(&run.stderr).contains("no stacks left"));

    let out = myprobe(&["flame", s(&input), "-o", s(&dir.path().join("out.png"))]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains(".folded, .txt, .svg, .json, .pb.gz"));
}
