//! Debug files from debuginfod servers, as gdb and elfutils fetch them: when `DEBUGINFOD_URLS` (URLs
//! separated by spaces) is set and no debug file is installed for a stripped binary with a build-id,
//! `GET URL/buildid/HEX/debuginfo` from each server in turn, into the client cache that elfutils and gdb
//! share (`$DEBUGINFOD_CACHE_PATH`, else `~/.debuginfod_client_cache` when it exists, else
//! `$XDG_CACHE_HOME/debuginfod_client` or `~/.cache/debuginfod_client`; the file is `HEX/debuginfo`).
//!
//! - elfutils' limits are honoured: `DEBUGINFOD_TIMEOUT` (90 s by default) for the connection and the
//!   response, and as libcurl's low-speed limit (at least 100 KiB in every such period, so that a stalled
//!   server is left); `DEBUGINFOD_MAXTIME` (whole transfer) and `DEBUGINFOD_MAXSIZE` (bytes) when set.
//! - A file is used only if its build-id is the binary's: a wrong file would name the wrong functions.
//! - Each build-id is asked for once per run, found or not (the answer is kept for every later binary and
//!   address); each failure is one line on stderr, never an error of the profile.
//! - Written to a temporary name in the cache and renamed when complete and checked, so that another
//!   client never reads half a file.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use object::{Object, ObjectSection};

/// elfutils' default for `DEBUGINFOD_TIMEOUT`.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(90);
/// libcurl's low-speed limit as elfutils sets it: this much in every `DEBUGINFOD_TIMEOUT`.
const LOW_SPEED_BYTES: u64 = 100 * 1024;

/// A debug file found for a build-id: its path and whether it has a `.symtab`.
pub type DebugFile = (PathBuf, bool);

/// Answers of this run by build-id, found or not: each is asked for once, whichever symbolizer asks.
static ANSWERS: Mutex<Vec<(Vec<u8>, Option<DebugFile>)>> = Mutex::new(Vec::new());

/// The debug file of the binary with `build_id` (`name` is the binary for messages): from the client cache,
/// else from the servers of `DEBUGINFOD_URLS`. `None` when the variable is not set, or when no server has it
/// (said once on stderr).
pub fn debug_file(build_id: &[u8], name: &str) -> Option<DebugFile> {
    let env = |k: &str| std::env::var_os(k);
    let urls = urls(env("DEBUGINFOD_URLS")?.to_str()?);
    if urls.is_empty() || build_id.is_empty() {
        return None;
    }
    let mut answers = ANSWERS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, answer)) = answers.iter().find(|(id, _)| id == build_id) {
        return answer.clone();
    }
    let answer = match cache_dir(env, |p| p.is_dir()) {
        Some(cache) => Settings::from_env(env).find(&urls, &cache, build_id, name),
        None => {
            say!("myprobe: debuginfod: no cache directory (set DEBUGINFOD_CACHE_PATH or HOME)");
            None
        }
    };
    answers.push((build_id.to_vec(), answer.clone()));
    answer
}

/// The URLs of `DEBUGINFOD_URLS`, without a trailing `/`; only http and https (elfutils takes what libcurl
/// takes, but a `file://` server is a directory better given as a debug directory).
fn urls(var: &str) -> Vec<String> {
    var.split_ascii_whitespace()
        .filter(|u| u.starts_with("http://") || u.starts_with("https://"))
        .map(|u| u.trim_end_matches('/').to_owned())
        .collect()
}

/// The client cache directory as elfutils (0.188) chooses it; `exists` tells whether a directory exists.
pub(crate) fn cache_dir(
    env: impl Fn(&str) -> Option<OsString>,
    exists: impl Fn(&Path) -> bool,
) -> Option<PathBuf> {
    let set = |k: &str| env(k).filter(|v| !v.is_empty());
    if let Some(p) = set("DEBUGINFOD_CACHE_PATH") {
        return Some(PathBuf::from(p));
    }
    let home = set("HOME").map(PathBuf::from);
    // The cache of older clients, kept when it is there.
    if let Some(old) = home.as_ref().map(|h| h.join(".debuginfod_client_cache")) {
        if exists(&old) {
            return Some(old);
        }
    }
    let xdg = set("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| home.map(|h| h.join(".cache")))?;
    Some(xdg.join("debuginfod_client"))
}

/// The limits of a fetch, from elfutils' variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Settings {
    timeout: Duration,
    max_time: Option<Duration>,
    max_size: Option<u64>,
}

impl Settings {
    pub(crate) fn from_env(env: impl Fn(&str) -> Option<OsString>) -> Self {
        let number = |k: &str| {
            env(k)?
                .to_str()?
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|&n| n > 0)
        };
        // A huge value meaning "no limit" would overflow the HTTP client's deadline: a year is no limit.
        let secs = |n: u64| Duration::from_secs(n.min(365 * 86_400));
        Settings {
            timeout: number("DEBUGINFOD_TIMEOUT").map_or(DEFAULT_TIMEOUT, secs),
            max_time: number("DEBUGINFOD_MAXTIME").map(secs),
            max_size: number("DEBUGINFOD_MAXSIZE"),
        }
    }

    /// The cached file, else the first server's that has it.
    fn find(
        &self,
        urls: &[String],
        cache: &Path,
        build_id: &[u8],
        name: &str,
    ) -> Option<DebugFile> {
        let hex: String = build_id.iter().map(|b| format!("{b:02x}")).collect();
        let dir = cache.join(&hex);
        let path = dir.join("debuginfo");
        if let Ok(has_symtab) = check(&path, build_id) {
            return Some((path, has_symtab));
        }
        let mut failures = Vec::new();
        for url in urls {
            let url = format!("{url}/buildid/{hex}/debuginfo");
            let t0 = Instant::now();
            match self.fetch(&url, &dir, &path, build_id) {
                Ok((size, has_symtab)) => {
                    say!(
                        "myprobe: debuginfod: debug information of {name} ({:.1} MiB) from {url} in {:.1} s",
                        size as f64 / f64::from(1 << 20),
                        t0.elapsed().as_secs_f64()
                    );
                    return Some((path, has_symtab));
                }
                Err(e) => failures.push(format!("{url}: {e}")),
            }
        }
        say!(
            "myprobe: debuginfod: no debug information for {name}: {}",
            failures.join("; ")
        );
        None
    }

    /// Downloads `url` to `path` (in `dir`, made if needed): its size and whether it has a `.symtab`.
    fn fetch(
        &self,
        url: &str,
        dir: &Path,
        path: &Path,
        build_id: &[u8],
    ) -> Result<(u64, bool), String> {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .user_agent(concat!("myprobe/", env!("CARGO_PKG_VERSION")))
            .timeout_connect(Some(self.timeout))
            .timeout_send_request(Some(self.timeout))
            .timeout_recv_response(Some(self.timeout))
            // Each read returns within the timeout, so that the low-speed check below runs.
            .timeout_per_read(Some(self.timeout))
            .timeout_global(self.max_time)
            .build()
            .into();
        let started = Instant::now();
        let response = agent.get(url).call().map_err(|e| e.to_string())?;
        let status = response.status();
        if !status.is_success() {
            return Err(status.to_string());
        }
        let length = response
            .headers()
            .get("content-length")
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if let (Some(len), Some(max)) = (length, self.max_size) {
            if len > max {
                return Err(format!("{len} bytes, over DEBUGINFOD_MAXSIZE ({max})"));
            }
        }
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut tmp = tempfile::Builder::new()
            .prefix(".debuginfo.")
            .tempfile_in(dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut body = response.into_body().into_reader();
        let mut buf = vec![0u8; 1 << 16];
        let (mut size, mut window_start, mut window_bytes) = (0u64, started, 0u64);
        loop {
            let n = body.read(&mut buf).map_err(|e| e.to_string())?;
            if n == 0 {
                break;
            }
            size = size.saturating_add(n as u64);
            window_bytes = window_bytes.saturating_add(n as u64);
            if self.max_size.is_some_and(|max| size > max) {
                return Err("over DEBUGINFOD_MAXSIZE".into());
            }
            tmp.write_all(&buf[..n])
                .map_err(|e| format!("{}: {e}", tmp.path().display()))?;
            if window_start.elapsed() >= self.timeout {
                if window_bytes < LOW_SPEED_BYTES {
                    return Err(format!(
                        "less than 100 KiB in {} s (DEBUGINFOD_TIMEOUT)",
                        self.timeout.as_secs()
                    ));
                }
                (window_start, window_bytes) = (Instant::now(), 0);
            }
        }
        let has_symtab = check(tmp.path(), build_id)?;
        tmp.persist(path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok((size, has_symtab))
    }
}

/// Whether `path` is an ELF file with `build_id`, and if so whether it has a `.symtab`.
fn check(path: &Path, build_id: &[u8]) -> Result<bool, String> {
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let cache = object::read::ReadCache::new(file);
    let obj = object::File::parse(&cache).map_err(|e| format!("not an ELF file: {e}"))?;
    match obj.build_id() {
        Ok(Some(id)) if id == build_id => {}
        _ => return Err("not the binary's build-id".into()),
    }
    Ok(obj.section_by_name(".symtab").is_some_and(|s| s.size() > 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&str, &str)]) -> impl Fn(&str) -> Option<OsString> + 'a {
        move |k| {
            vars.iter()
                .find(|(name, _)| *name == k)
                .map(|(_, v)| OsString::from(v))
        }
    }

    #[test]
    fn the_cache_is_where_elfutils_puts_it() {
        let none = |_: &Path| false;
        let all = |_: &Path| true;
        let cache =
            |vars: &[(&str, &str)], exists: &dyn Fn(&Path) -> bool| cache_dir(env(vars), exists);
        let full = [
            ("DEBUGINFOD_CACHE_PATH", "/c"),
            ("XDG_CACHE_HOME", "/x"),
            ("HOME", "/h"),
        ];
        assert_eq!(cache(&full, &all), Some("/c".into()));
        // An empty variable is as unset.
        let empty_path = [
            ("DEBUGINFOD_CACHE_PATH", ""),
            ("XDG_CACHE_HOME", "/x"),
            ("HOME", "/h"),
        ];
        assert_eq!(
            cache(&empty_path, &none),
            Some("/x/debuginfod_client".into())
        );
        // The old cache in the home directory wins over XDG's, when it exists.
        assert_eq!(
            cache(&empty_path, &all),
            Some("/h/.debuginfod_client_cache".into())
        );
        assert_eq!(
            cache(&[("HOME", "/h")], &none),
            Some("/h/.cache/debuginfod_client".into())
        );
        assert_eq!(
            cache(&[("HOME", "/h"), ("XDG_CACHE_HOME", "")], &none),
            Some("/h/.cache/debuginfod_client".into())
        );
        assert_eq!(
            cache(&[("XDG_CACHE_HOME", "/x")], &none),
            Some("/x/debuginfod_client".into())
        );
        assert_eq!(cache(&[], &all), None);
    }

    #[test]
    fn urls_are_split_on_spaces_and_only_http() {
        assert_eq!(
            urls(" http://a:8002/  https://b/x\tftp://c file:///d\nhttp://e "),
            ["http://a:8002", "https://b/x", "http://e"]
        );
        assert!(urls("   ").is_empty());
    }

    #[test]
    fn limits_come_from_elfutils_variables() {
        assert_eq!(
            Settings::from_env(env(&[])),
            Settings {
                timeout: DEFAULT_TIMEOUT,
                max_time: None,
                max_size: None
            }
        );
        let s = Settings::from_env(env(&[
            ("DEBUGINFOD_TIMEOUT", "5"),
            ("DEBUGINFOD_MAXTIME", " 60 "),
            ("DEBUGINFOD_MAXSIZE", "1000"),
        ]));
        assert_eq!(
            s,
            Settings {
                timeout: Duration::from_secs(5),
                max_time: Some(Duration::from_secs(60)),
                max_size: Some(1000)
            }
        );
        // Nonsense and 0 (elfutils: no limit) are the defaults.
        let s = Settings::from_env(env(&[
            ("DEBUGINFOD_TIMEOUT", "soon"),
            ("DEBUGINFOD_MAXSIZE", "0"),
        ]));
        assert_eq!(s.timeout, DEFAULT_TIMEOUT);
        assert_eq!(s.max_size, None);
    }

    #[test]
    fn a_server_that_is_not_there_is_one_failure_and_asked_once() {
        // A port that was free a moment ago: connection refused.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let cache = tempfile::tempdir().unwrap();
        let s = Settings {
            timeout: Duration::from_secs(5),
            max_time: None,
            max_size: None,
        };
        let urls = [format!("http://127.0.0.1:{port}")];
        let t0 = Instant::now();
        assert_eq!(s.find(&urls, cache.path(), &[0xab; 20], "x"), None);
        assert!(t0.elapsed() < Duration::from_secs(5));
        // Nothing was left in the cache.
        let left: Vec<_> = walk(cache.path());
        assert!(left.iter().all(|p| p.is_dir()), "{left:?}");
    }

    fn walk(dir: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            out.push(e.path());
            if e.path().is_dir() {
                out.extend(walk(&e.path()));
            }
        }
        out
    }
}
