//! The client conformance suite (tests/clients/README.md): real client libraries, each in every mode it has,
//! against each server, traced; every statement a library says it sent is recorded exactly once, on its
//! connection, by its user, with its command and its exact text, and nothing else carries the run's tag.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::Value;

use crate::common::{json_lines, other_server, tempdir, testdb, Background, TestDb};

/// One statement a configuration sent (a `statement` line of its `run`).
#[derive(Debug)]
struct Sent {
    configuration: String,
    mode: String,
    connection: u64,
    user: String,
    command: String,
    length: usize,
    text: String,
}

/// What one configuration printed: its statements and the modes it does not have, with the reason.
struct Run {
    sent: Vec<Sent>,
    unsupported: Vec<(String, String)>,
}

fn clients_dir(language: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/clients")
        .join(language)
}

/// `\\`, `\t`, `\n`, `\r` as the README writes them.
fn unescape(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut chars = field.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('\\') => out.push('\\'),
            other => panic!("a bad escape \\{other:?} in {field:?}"),
        }
    }
    out
}

fn parse_run(configuration: &str, stdout: &str) -> Run {
    let mut run = Run {
        sent: Vec::new(),
        unsupported: Vec::new(),
    };
    for line in stdout.lines() {
        let fields: Vec<&str> = line.splitn(7, '\t').collect();
        match fields[..] {
            ["statement", mode, connection, user, command, length, text] => run.sent.push(Sent {
                configuration: configuration.into(),
                mode: mode.into(),
                connection: connection.parse().unwrap_or_else(|_| panic!("{line}")),
                user: user.into(),
                command: command.into(),
                length: length.parse().unwrap_or_else(|_| panic!("{line}")),
                text: unescape(text),
            }),
            ["unsupported", mode, reason] => run.unsupported.push((mode.into(), reason.into())),
            _ => panic!("{configuration}: a line the README does not define: {line:?}"),
        }
    }
    run
}

/// The record's text matches what was sent: the same, or, marked truncated, its beginning (a character cut by
/// the capture limit shows as U+FFFD).
fn text_matches(record: &Value, sent: &Sent) -> bool {
    let Some(query) = record["query"].as_str() else {
        return false;
    };
    if record["truncated"] == true {
        let kept = query.trim_end_matches('\u{fffd}');
        sent.length > query.len() && !kept.is_empty() && sent.text.starts_with(kept)
    } else {
        sent.length == sent.text.len() && query == sent.text
    }
}

/// Every failure of one configuration's statements against the records, by mode, one line each. Statements
/// sent alike (connection, command, text) are counted together: as many records as were sent, in the same order
/// of users.
fn check(records: &[Value], sent: &[Sent], tag: &str) -> Vec<(String, String)> {
    let mut failures = Vec::new();
    let short = |s: &str| s.chars().take(120).collect::<String>();
    let alike = |r: &Value, s: &Sent| {
        r["conn"].as_u64() == Some(s.connection)
            && r["command"] == s.command.as_str()
            && text_matches(r, s)
    };
    let mut done = vec![false; sent.len()];
    for (i, s) in sent.iter().enumerate() {
        if done[i] {
            continue;
        }
        let same: Vec<&Sent> = sent[i..]
            .iter()
            .filter(|o| o.connection == s.connection && o.command == s.command && o.text == s.text)
            .collect();
        for (j, o) in sent.iter().enumerate().skip(i) {
            done[j] |= o.connection == s.connection && o.command == s.command && o.text == s.text;
        }
        let found: Vec<&Value> = records.iter().filter(|r| alike(r, s)).collect();
        let what = format!(
            "{} {} `{}` on connection {}",
            s.configuration,
            s.command,
            short(&s.text),
            s.connection
        );
        if found.len() != same.len() {
            failures.push((
                s.mode.clone(),
                format!("{what}: {} records of {} sent", found.len(), same.len()),
            ));
            continue;
        }
        for (r, o) in found.iter().zip(&same) {
            if r["user"] != o.user.as_str() {
                failures.push((
                    o.mode.clone(),
                    format!("{what}: user {} where {} sent it", r["user"], o.user),
                ));
            }
        }
    }
    // Anything else with the tag was never sent as such.
    for r in records {
        let Some(query) = r["query"].as_str() else {
            continue;
        };
        if query.contains(tag) && !sent.iter().any(|s| alike(r, s)) {
            failures.push((
                "?".into(),
                format!(
                    "a record of nothing sent: {} `{}` on connection {}",
                    r["command"],
                    short(query),
                    r["conn"]
                ),
            ));
        }
    }
    failures
}

/// A failure the suite knows of (tests/clients/known-failures): shown, not failed.
struct Known {
    configuration: String,
    /// A mode, or `*`: any of the configuration's.
    mode: String,
    why: String,
}

/// The known failures of `language`'s configurations against `server` (`mariadb` or `mysql`).
fn known_failures(server: &str, language: &str) -> Vec<Known> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/known-failures");
    let text = std::fs::read_to_string(&path).unwrap();
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| {
            let fields: Vec<&str> = l.splitn(5, char::is_whitespace).collect();
            let [on, lang, configuration, mode, why] = fields[..] else {
                panic!(
                    "{}: a line of fewer than five fields: {l:?}",
                    path.display()
                );
            };
            (on == server && lang == language).then(|| Known {
                configuration: configuration.into(),
                mode: mode.into(),
                why: why.trim().into(),
            })
        })
        .collect()
}

/// Runs every configuration of `language` against `db` under one tracer, and fails with every statement not
/// recorded as sent.
fn suite(language: &str, db: &TestDb) {
    let dir = clients_dir(language);
    let run = dir.join("run");
    let configurations = configurations(&run, language);
    let work = tempdir(&format!("clients-{language}"));
    let infile = work.join("infile.tsv");
    std::fs::write(
        &infile,
        (1..=10)
            .map(|i| format!("{i}\tword{i}\n"))
            .collect::<String>(),
    )
    .unwrap();
    let server = if db.sql("SELECT VERSION()").contains("MariaDB") {
        "mariadb"
    } else {
        "mysql"
    };
    let pid = db.pid.to_string();
    let tracer = Background::start(
        &[
            "queries",
            "-p",
            &pid,
            "--json",
            "--raw-sql",
            "--sample-every",
            "1",
        ],
        "myprobe: tracing the statements",
    );
    let mut runs = Vec::new();
    for (i, configuration) in configurations.iter().enumerate() {
        let tag = format!("t{}_{language}_{i}", std::process::id());
        let client = Client {
            language,
            server,
            db,
            infile: &infile,
        };
        let stdout = client.run(&run, configuration, &tag);
        runs.push((configuration, tag, parse_run(configuration, &stdout)));
    }
    // The last replies are in before the tracer stops (records are sent at a statement's end).
    std::thread::sleep(std::time::Duration::from_millis(500));
    let (stdout, stderr) = tracer.stop();
    let records = json_lines(&stdout);
    let (failures, table) = compared(&records, &runs, &known_failures(server, language));
    eprintln!("{language} against {server}:\n{table}");
    if failures.is_empty() {
        return;
    }
    let tagged = tagged_records(&records, &runs);
    panic!(
        "{language} against {server}: {} failures:\n{}\n\n{table}\nthe records with a tag:\n{tagged}\nmyprobe's stderr:\n{stderr}",
        failures.len(),
        failures.join("\n")
    );
}

/// What `run --list` says: the configurations of a language.
fn configurations(run: &Path, language: &str) -> Vec<String> {
    let list = Command::new(run).arg("--list").output().unwrap();
    assert!(
        list.status.success(),
        "{} --list: {}",
        run.display(),
        String::from_utf8_lossy(&list.stderr)
    );
    let configurations: Vec<String> = String::from_utf8(list.stdout)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    assert!(!configurations.is_empty(), "{language}: no configuration");
    configurations
}

/// What a language's `run` is told of the server (the README's environment).
struct Client<'a> {
    language: &'a str,
    /// `mariadb` or `mysql`.
    server: &'a str,
    db: &'a TestDb,
    infile: &'a Path,
}

impl Client<'_> {
    /// Runs one configuration, tagging its statements with `tag`: what it printed.
    fn run(&self, run: &Path, configuration: &str, tag: &str) -> String {
        let (language, server, db) = (self.language, self.server, self.db);
        let out = Command::new(run)
            .arg(configuration)
            .env("MYPROBE_CLIENT_HOST", "127.0.0.1")
            .env("MYPROBE_CLIENT_PORT", db.port())
            .env("MYPROBE_CLIENT_USER", "sbtest")
            .env("MYPROBE_CLIENT_PASSWORD", "sbtest")
            .env("MYPROBE_CLIENT_USER2", "sbtest2")
            .env("MYPROBE_CLIENT_PASSWORD2", "sbtest2")
            .env("MYPROBE_CLIENT_DB", "sbtest")
            .env("MYPROBE_CLIENT_SERVER", server)
            .env("MYPROBE_CLIENT_TAG", tag)
            .env("MYPROBE_CLIENT_INFILE", self.infile)
            .env(
                "MYPROBE_CLIENT_ROOT",
                db.env("MYPROBE_TEST_ROOT").unwrap_or_default(),
            )
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            out.status.success(),
            "{language} {configuration} failed against {server}:\n{stderr}\nit printed:\n{stdout}"
        );
        stdout
    }
}

/// Each configuration's statements against the records: the failures not known, and a table of every mode.
fn compared(
    records: &[Value],
    runs: &[(&String, String, Run)],
    known: &[Known],
) -> (Vec<String>, String) {
    let mut failures = Vec::new();
    let mut table = String::new();
    let mut known_seen = vec![false; known.len()];
    for (configuration, tag, run) in runs {
        let found = check(records, &run.sent, tag);
        let mut modes: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
        for s in &run.sent {
            modes.entry(&s.mode).or_default().0 += 1;
        }
        for (mode, _) in &found {
            if let Some(m) = modes.get_mut(mode.as_str()) {
                m.1 += 1;
            }
        }
        let known_as = |mode: &str| {
            known.iter().position(|k| {
                k.configuration == **configuration && (k.mode == mode || k.mode == "*")
            })
        };
        for (mode, (count, failed)) in &modes {
            let shown = match (*failed, known_as(mode)) {
                (0, _) => format!("{count} exact"),
                (_, Some(k)) => format!("{failed} of {count} failed, known: {}", known[k].why),
                (_, None) => format!("{failed} of {count} FAILED"),
            };
            table += &format!("  {configuration:<24} {mode:<12} {shown}\n");
        }
        for (mode, reason) in &run.unsupported {
            table += &format!("  {configuration:<24} {mode:<12} unsupported: {reason}\n");
        }
        for (mode, f) in found {
            match known_as(&mode) {
                Some(k) => known_seen[k] = true,
                None => failures.push(format!("{configuration} {mode}: {f}")),
            }
        }
    }
    // What is listed and did not fail this time is said: the list is to shrink.
    for (k, seen) in known.iter().zip(&known_seen) {
        if !seen {
            table += &format!(
                "  {:<24} {:<12} listed as a known failure, and exact this time\n",
                k.configuration, k.mode
            );
        }
    }
    (failures, table)
}

/// The records that carry a run's tag, a line each, for a failure's message.
fn tagged_records(records: &[Value], runs: &[(&String, String, Run)]) -> String {
    records
        .iter()
        .filter(|r| {
            r["query"]
                .as_str()
                .is_some_and(|q| runs.iter().any(|(_, tag, _)| q.contains(tag.as_str())))
        })
        .map(|r| {
            format!(
                "  conn {} user {} {} `{}`{}\n",
                r["conn"],
                r["user"],
                r["command"],
                r["query"]
                    .as_str()
                    .unwrap()
                    .chars()
                    .take(100)
                    .collect::<String>(),
                if r["truncated"] == true {
                    " (truncated)"
                } else {
                    ""
                }
            )
        })
        .collect()
}

fn on_mysql(language: &str) {
    match other_server("mysql-9.7") {
        Some(db) => suite(language, &db),
        None => eprintln!("mysql-9.7 was not started (MYPROBE_TEST_SERVERS): nothing to test"),
    }
}

macro_rules! on_both_servers {
    ($($language:ident: $on_mariadb:ident, $on_mysql:ident;)*) => {$(
        #[test]
        fn $on_mariadb() {
            suite(stringify!($language), &testdb());
        }

        #[test]
        fn $on_mysql() {
            on_mysql(stringify!($language));
        }
    )*};
}

on_both_servers! {
    python: python_on_mariadb, python_on_mysql;
    java: java_on_mariadb, java_on_mysql;
    node: node_on_mariadb, node_on_mysql;
    go: go_on_mariadb, go_on_mysql;
    c: c_on_mariadb, c_on_mysql;
    php: php_on_mariadb, php_on_mysql;
}
