//! Function names without debug symbols installed: debug files from a real `debuginfod` server (elfutils',
//! Debian's `debuginfod` package) for a stripped fixture whose hot function is static, profiled with and
//! without `DEBUGINFOD_URLS`; virtual methods without symbols named from vtables; the line that says how
//! much is unnamed.

use crate::common::*;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use object::{Object, ObjectSymbol};

/// A `debuginfod` serving the ELF files of one directory on a free port of 127.0.0.1; killed on drop.
struct Server {
    child: Child,
    url: String,
}

impl Server {
    /// Starts it and waits until it serves the debug file of each of `build_ids`.
    fn start(dir: &Path, served: &Path, build_ids: &[String]) -> Server {
        for attempt in 0.. {
            // A port free a moment ago; another process may take it first, hence the attempts.
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let log = dir.join(format!("debuginfod-{attempt}.log"));
            let child = Command::new("debuginfod")
                .arg("-F")
                .args(["-p", &port.to_string()])
                .arg("-d")
                .arg(dir.join(format!("debuginfod-{attempt}.sqlite")))
                .arg(served)
                .stdin(Stdio::null())
                .stdout(std::fs::File::create(&log).unwrap())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .expect("running debuginfod (scripts/setup installs it)");
            let mut server = Server {
                child,
                url: format!("http://127.0.0.1:{port}"),
            };
            if server.wait_until_serving(build_ids) {
                return server;
            }
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            assert!(
                attempt < 3 && server.child.try_wait().unwrap().is_some(),
                "debuginfod does not serve {build_ids:?}:\n{log}"
            );
        }
        unreachable!()
    }

    /// Polls until each build-id's debug file is there (the first scan takes a moment); false if the server
    /// ended (its port was taken).
    fn wait_until_serving(&mut self, build_ids: &[String]) -> bool {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(5)))
            .build()
            .into();
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if self.child.try_wait().unwrap().is_some() {
                return false;
            }
            let served = build_ids.iter().all(|id| {
                agent
                    .get(format!("{}/buildid/{id}/debuginfo", self.url))
                    .call()
                    .is_ok_and(|r| r.status() == 200)
            });
            if served {
                return true;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("debuginfod did not serve {build_ids:?} within 60 s");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One build of the fixture: the stripped binary that runs, and facts of the unstripped one.
struct Built {
    stripped: PathBuf,
    build_id: String,
    /// ELF virtual address of `hidden_hot`.
    hidden_hot: u64,
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Builds variant `variant` as `dir/name`, stripped (`strip --strip-all` keeps the build-id note), and its
/// separate debug file `served/name.debug` (`objcopy --only-keep-debug`; `dwarf_only`: without the symbol
/// table, as some distributions ship them).
fn build(dir: &Path, served: &Path, name: &str, variant: u32, dwarf_only: bool) -> Built {
    let plain = compile_fixture(
        dir,
        &format!("{name}.full"),
        &["debuginfod/hidden_hot.c"],
        &[
            "-rdynamic",
            "-fno-inline",
            "-fno-optimize-sibling-calls",
            "-Wl,--build-id",
            &format!("-DVARIANT={variant}"),
        ],
    );
    let debug = served.join(format!("{name}.debug"));
    run(Command::new("objcopy")
        .arg("--only-keep-debug")
        .arg(&plain)
        .arg(&debug));
    if dwarf_only {
        run(Command::new("objcopy")
            .args(["--strip-all", "--keep-section=.debug_*"])
            .arg(&debug));
    }
    let stripped = dir.join(name);
    run(Command::new("strip")
        .arg("--strip-all")
        .arg("-o")
        .arg(&stripped)
        .arg(&plain));
    let data = std::fs::read(&plain).unwrap();
    let obj = object::File::parse(&*data).unwrap();
    let build_id: String = obj
        .build_id()
        .unwrap()
        .expect("a build-id")
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let hidden_hot = obj
        .symbols()
        .find(|s| s.name() == Ok("hidden_hot"))
        .expect("hidden_hot in the unstripped build")
        .address();
    Built {
        stripped,
        build_id,
        hidden_hot,
    }
}

/// `profile cpu` of the fixture while it spins once, with `env` for myprobe: the folded stacks and stderr.
fn profile(dir: &Path, exe: &Path, env: &[(&str, &str)]) -> (Vec<(Vec<String>, u64)>, String) {
    let mut fixture = Fixture::start(&mut Command::new(exe));
    let mut all_env = vec![("DEBUGINFOD_URLS", ""), ("DEBUGINFOD_CACHE_PATH", "")];
    for (k, v) in env {
        all_env.retain(|(name, _)| name != k);
        all_env.push((k, v));
    }
    fixture.profile_until_done(dir, "cpu", &["-F", "199"], &all_env)
}

/// The line on stderr that says how much has no function name.
fn unnamed_line(stderr: &str) -> Option<&str> {
    stderr.lines().find(|l| l.contains("have no function name"))
}

/// The samples of stacks whose leaf is `leaf`, and whether each such stack has `exported_caller` above it.
fn leaf_samples(stacks: &[(Vec<String>, u64)], leaf: &str) -> u64 {
    let mut total = 0;
    for (frames, v) in stacks {
        if frames.last().is_some_and(|f| f == leaf) {
            assert!(
                frames.iter().any(|f| f == "exported_caller"),
                "{leaf} without its caller: {frames:?}"
            );
            total += v;
        }
    }
    total
}

#[test]
fn a_stripped_binary_is_named_from_a_debuginfod_server() {
    let dir = tempdir("debuginfod");
    let served = dir.join("served");
    std::fs::create_dir(&served).unwrap();
    let with_symtab = build(&dir, &served, "hidden_hot", 1, false);
    let dwarf_only = build(&dir, &served, "hidden_hot_dwarf", 2, true);
    let not_served = build(&dir, &dir, "hidden_hot_other", 3, false);
    let server = Server::start(
        &dir,
        &served,
        &[with_symtab.build_id.clone(), dwarf_only.build_id.clone()],
    );
    let cache = dir.join("cache");
    let cache_str = cache.to_str().unwrap();

    // Without DEBUGINFOD_URLS: the start of the function, from .eh_frame.
    let (stacks, stderr) = profile(&dir, &with_symtab.stripped, &[]);
    let unnamed = format!("hidden_hot+0x{:x}", with_symtab.hidden_hot);
    assert!(
        leaf_samples(&stacks, &unnamed) >= 50,
        "{stacks:?}\n{stderr}"
    );
    assert!(!stderr.contains("myprobe: debuginfod"), "{stderr}");

    // With it: named, once the file is fetched into the cache, where elfutils puts it.
    for built in [&with_symtab, &dwarf_only] {
        let (stacks, stderr) = profile(
            &dir,
            &built.stripped,
            &[
                ("DEBUGINFOD_URLS", &server.url),
                ("DEBUGINFOD_CACHE_PATH", cache_str),
            ],
        );
        assert!(
            leaf_samples(&stacks, "hidden_hot") >= 50,
            "{}: {stacks:?}\n{stderr}",
            built.stripped.display()
        );
        let name = built.stripped.file_name().unwrap().to_str().unwrap();
        assert!(
            stderr.contains(&format!("debug information of {name} (")),
            "{stderr}"
        );
        let cached = cache.join(&built.build_id).join("debuginfo");
        assert!(cached.is_file(), "{} missing", cached.display());
        assert_eq!(unnamed_line(&stderr), None, "{stderr}");
    }

    // elfutils' own client finds what was cached, and so does the next run with the server gone.
    drop(server);
    let find = Command::new("debuginfod-find")
        .args(["debuginfo", &with_symtab.build_id])
        .env("DEBUGINFOD_URLS", "http://127.0.0.1:9")
        .env("DEBUGINFOD_CACHE_PATH", &cache)
        .output()
        .unwrap();
    assert!(
        find.status.success(),
        "{}",
        String::from_utf8_lossy(&find.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&find.stdout).trim(),
        cache
            .join(&with_symtab.build_id)
            .join("debuginfo")
            .to_str()
            .unwrap()
    );
    let gone = "http://127.0.0.1:9";
    let (stacks, stderr) = profile(
        &dir,
        &with_symtab.stripped,
        &[
            ("DEBUGINFOD_URLS", gone),
            ("DEBUGINFOD_CACHE_PATH", cache_str),
        ],
    );
    assert!(leaf_samples(&stacks, "hidden_hot") >= 50, "{stderr}");

    // A server that does not answer: one line, and the profile as without one.
    let (stacks, stderr) = profile(
        &dir,
        &not_served.stripped,
        &[
            ("DEBUGINFOD_URLS", gone),
            ("DEBUGINFOD_CACHE_PATH", cache_str),
        ],
    );
    let unnamed = format!("hidden_hot_other+0x{:x}", not_served.hidden_hot);
    assert!(leaf_samples(&stacks, &unnamed) >= 50, "{stderr}");
    // (Other stripped files of the process may have no local debug file either, here or elsewhere.)
    let failures: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("myprobe: debuginfod") && l.contains("hidden_hot"))
        .collect();
    assert_eq!(failures.len(), 1, "{stderr}");
    assert!(
        failures[0]
            .contains("no debug information for hidden_hot_other: http://127.0.0.1:9/buildid/"),
        "{stderr}"
    );
}

#[test]
fn virtual_methods_are_named_from_vtables_in_a_profile() {
    let dir = tempdir("vtables");
    let exe = dir.join("hidden_overrides");
    let full = dir.join("hidden_overrides.full");
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/vtables/hidden_overrides.cc");
    run(Command::new("g++")
        .args([
            "-O1",
            "-g",
            "-fPIE",
            "-pie",
            "-rdynamic",
            "-fno-inline",
            "-o",
        ])
        .arg(&full)
        .arg(&source));
    run(Command::new("strip")
        .arg("--strip-all")
        .arg("-o")
        .arg(&exe)
        .arg(&full));
    let (stacks, stderr) = profile(&dir, &exe, &[]);
    let anon = "(anonymous namespace)";
    // Each spins 0.3 s: about 60 samples at 199 Hz.
    for method in [
        "Exported::work".to_string(),
        format!("{anon}::Hidden::work"),
        format!("{anon}::Hidden::other"),
        format!("{anon}::Deeper::other"),
    ] {
        let samples = value_with_frame(&stacks, |f| f == method);
        assert!(samples >= 30, "{method}: {samples} samples\n{stderr}");
        for (frames, _) in stacks.iter().filter(|(f, _)| f.contains(&method)) {
            let at = frames.iter().position(|f| *f == method).unwrap();
            assert_eq!(frames[at - 1], "main", "{frames:?}");
        }
    }
    // spin, below each, is in no vtable: unnamed, and said so.
    assert!(
        value_with_frame(&stacks, |f| f.starts_with("hidden_overrides+0x")) >= 120,
        "{stacks:?}"
    );
    let line = unnamed_line(&stderr).expect("a line on the unnamed share");
    assert!(line.contains("in hidden_overrides "), "{line}");
}
