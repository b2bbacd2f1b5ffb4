//! The windows kept as pprof files (`KIND-PID-YYYYMMDDTHHMMSSZ.pb.gz` in the agent's directory: a window of each
//! server), for `--retain` and within a size: past either, the oldest go first.

use std::{
    collections::VecDeque,
    fs,
    io::Write,
    path::{Path, PathBuf},
    sync::{Mutex, MutexGuard},
    time::{Duration, SystemTime},
};

use anyhow::{Context, Result};

pub struct Retention {
    dir: PathBuf,
    keep: Duration,
    max_bytes: u64,
    /// The windows kept, oldest first, and their bytes in all: the directory is read once, when the agent starts.
    /// Read again at each window, a day of 1-second windows (a quarter of a million files) cost more than the
    /// windows themselves, and more with every hour.
    kept: Mutex<Index>,
}

#[derive(Default)]
struct Index {
    windows: VecDeque<Kept>,
    bytes: u64,
}

/// A window's file: its name, size and when it was written.
#[derive(Clone, Debug)]
pub struct Kept {
    pub name: String,
    pub bytes: u64,
    pub written: SystemTime,
}

impl Retention {
    /// Windows in `dir` (created if missing), kept for `keep` and within `max_bytes` in all.
    pub fn new(dir: &Path, keep: Duration, max_bytes: u64) -> Result<Self> {
        fs::create_dir_all(dir).with_context(|| {
            format!(
                "creating {}, where the windows are kept (choose another with --dir)",
                dir.display()
            )
        })?;
        let probe = tempfile::NamedTempFile::new_in(dir).with_context(|| {
            format!(
                "{} is not writable (choose another with --dir)",
                dir.display()
            )
        })?;
        drop(probe);
        let windows: VecDeque<Kept> = read_windows(dir).into();
        let bytes = windows.iter().map(|k| k.bytes).sum();
        Ok(Retention {
            dir: dir.to_path_buf(),
            keep,
            max_bytes,
            kept: Mutex::new(Index { windows, bytes }),
        })
    }

    fn index(&self) -> MutexGuard<'_, Index> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes the window of server `pid` whole (never half a file), then lets the oldest go.
    pub fn keep(&self, kind: &str, pid: u32, started: SystemTime, bytes: &[u8]) -> Result<PathBuf> {
        let path = self
            .dir
            .join(format!("{kind}-{pid}-{}.pb.gz", stamp(started)));
        let mut file = tempfile::NamedTempFile::new_in(&self.dir)
            .with_context(|| format!("writing in {}", self.dir.display()))?;
        file.write_all(bytes)
            .and_then(|()| file.flush())
            .with_context(|| format!("writing {}", path.display()))?;
        let file = file
            .persist(&path)
            .with_context(|| format!("writing {}", path.display()))?;
        let meta = file
            .metadata()
            .with_context(|| format!("reading {}", path.display()))?;
        let window = Kept {
            name: path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            bytes: meta.len(),
            written: meta.modified().unwrap_or_else(|_| SystemTime::now()),
        };
        {
            let mut index = self.index();
            // A window of the same second written again (a server's last, cut short) replaces it: among the last.
            let last = index.windows.len().saturating_sub(64);
            if let Some(at) =
                (last..index.windows.len()).find(|&i| index.windows[i].name == window.name)
            {
                let old = index.windows.remove(at).map_or(0, |k| k.bytes);
                index.bytes = index.bytes.saturating_sub(old);
            }
            index.bytes = index.bytes.saturating_add(window.bytes);
            index.windows.push_back(window);
        }
        self.prune()?;
        Ok(path)
    }

    /// The windows kept, oldest first.
    pub fn list(&self) -> Vec<Kept> {
        self.index().windows.iter().cloned().collect()
    }

    /// The windows kept that overlap `from..=to` (seconds since the epoch), oldest first: only those are copied,
    /// of a day of 1-second windows.
    pub fn overlapping(&self, from: i64, to: i64) -> Vec<Kept> {
        self.index()
            .windows
            .iter()
            .filter(|k| k.span().is_some_and(|(s, e)| s <= to && e >= from))
            .cloned()
            .collect()
    }

    /// A kept window's path by its file name; `None` for any other name.
    pub fn path_of(&self, name: &str) -> Option<PathBuf> {
        is_window(name)
            .then(|| self.dir.join(name))
            .filter(|p| p.is_file())
    }

    /// Removes the windows older than the retention, then the oldest until the rest fit the size.
    pub fn prune(&self) -> Result<()> {
        let now = SystemTime::now();
        let mut index = self.index();
        while let Some(oldest) = index.windows.front() {
            let expired = now.duration_since(oldest.written).unwrap_or_default() > self.keep;
            if !expired && index.bytes <= self.max_bytes {
                break;
            }
            let path = self.dir.join(&oldest.name);
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e).with_context(|| format!("removing {}", path.display())),
            }
            let bytes = oldest.bytes;
            index.windows.pop_front();
            index.bytes = index.bytes.saturating_sub(bytes);
        }
        Ok(())
    }
}

impl Kept {
    /// What the window is of (`cpu`, `offcpu`, `locks`), its server's PID (none in names from before windows were a
    /// server's), and its start: from its name.
    pub fn parts(&self) -> Option<(&str, Option<u32>, i64)> {
        let rest = self.name.strip_suffix(".pb.gz")?;
        let (head, stamp) = rest.rsplit_once('-')?;
        let (kind, pid) = match head.split_once('-') {
            Some((kind, pid)) => (kind, Some(pid.parse().ok()?)),
            None => (head, None),
        };
        let start = chrono::NaiveDateTime::parse_from_str(stamp, "%Y%m%dT%H%M%SZ").ok()?;
        Some((kind, pid, start.and_utc().timestamp()))
    }

    /// Seconds since the epoch of its start (its name) and its end (when its file was written: a window is written
    /// as it ends).
    pub fn span(&self) -> Option<(i64, i64)> {
        let (_, _, start) = self.parts()?;
        let end = self
            .written
            .duration_since(std::time::UNIX_EPOCH)
            .ok()?
            .as_secs() as i64;
        Some((start, end.max(start)))
    }
}

/// The windows in `dir`, oldest first.
fn read_windows(dir: &Path) -> Vec<Kept> {
    let mut kept: Vec<Kept> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            if !is_window(&name) {
                return None;
            }
            let meta = e.metadata().ok()?;
            Some(Kept {
                name,
                bytes: meta.len(),
                written: meta.modified().ok()?,
            })
        })
        .collect();
    kept.sort_by(|a, b| a.written.cmp(&b.written).then(a.name.cmp(&b.name)));
    kept
}

/// A name this module writes: `cpu-1234-20261125T100405Z.pb.gz` (or, before windows were a server's,
/// `cpu-20261125T100405Z.pb.gz`); nothing with a path in it.
fn is_window(name: &str) -> bool {
    let Some(rest) = name.strip_suffix(".pb.gz") else {
        return false;
    };
    let Some((kind, rest)) = rest.split_once('-') else {
        return false;
    };
    let stamp = match rest.split_once('-') {
        Some((pid, stamp)) if !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()) => stamp,
        Some(_) => return false,
        None => rest,
    };
    ["cpu", "offcpu", "locks"].contains(&kind)
        && stamp.len() == 16
        && stamp.bytes().enumerate().all(|(i, b)| match i {
            8 => b == b'T',
            15 => b == b'Z',
            _ => b.is_ascii_digit(),
        })
}

/// `20261125T100405Z`.
pub fn stamp(t: SystemTime) -> String {
    crate::report::rfc3339(t).replace(['-', ':'], "")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(is_window("cpu-20261125T100405Z.pb.gz"));
        assert!(is_window("cpu-1234-20261125T100405Z.pb.gz"));
        assert!(!is_window("cpu-12a4-20261125T100405Z.pb.gz"));
        assert!(!is_window("cpu--20261125T100405Z.pb.gz"));
        assert!(is_window("locks-20261125T100405Z.pb.gz"));
        assert!(!is_window("cpu-20261125T100405Z.pb"));
        assert!(!is_window("heap-20261125T100405Z.pb.gz"));
        assert!(!is_window("cpu-../../etc/passwdZ.pb.gz"));
        let kept = |name: &str| Kept {
            name: name.into(),
            bytes: 1,
            written: SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_000_060),
        };
        assert_eq!(
            kept("offcpu-1234-20261118T110640Z.pb.gz").parts(),
            Some(("offcpu", Some(1234), 1_795_000_000))
        );
        assert_eq!(
            kept("cpu-20261118T110640Z.pb.gz").span(),
            Some((1_795_000_000, 1_795_000_060))
        );
        assert_eq!(
            stamp(SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_000_000)),
            "20261118T110640Z"
        );
    }

    #[test]
    fn the_oldest_go_past_the_size() {
        let dir = tempfile::tempdir().unwrap();
        let r = Retention::new(dir.path(), Duration::from_secs(3600), 250).unwrap();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_000_000);
        for i in 0..4 {
            r.keep("cpu", 7, t0 + Duration::from_secs(60 * i), &[0u8; 100])
                .unwrap();
            // Written in order, at least a tick apart on any file system.
            std::thread::sleep(Duration::from_millis(20));
        }
        let names: Vec<String> = r.list().into_iter().map(|k| k.name).collect();
        assert_eq!(
            names,
            [
                "cpu-7-20261118T110840Z.pb.gz",
                "cpu-7-20261118T110940Z.pb.gz"
            ]
        );
        assert!(r.path_of("cpu-7-20261118T110940Z.pb.gz").is_some());
        assert!(r.path_of("cpu-7-20261118T110640Z.pb.gz").is_none());
        // Each from its start (its name) to when it was written (now): those begun by a time cover it.
        let t0_s = 1_795_000_000;
        let covering = |from, to| -> Vec<String> {
            r.overlapping(from, to)
                .into_iter()
                .map(|k| k.name)
                .collect()
        };
        assert_eq!(
            covering(t0_s + 150, t0_s + 150),
            ["cpu-7-20261118T110840Z.pb.gz"]
        );
        assert_eq!(covering(t0_s + 200, t0_s + 300).len(), 2);
        assert!(covering(t0_s, t0_s + 100).is_empty());
        // A retention of nothing keeps nothing older than now.
        let r = Retention::new(dir.path(), Duration::ZERO, 1 << 30).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        r.prune().unwrap();
        assert!(r.list().is_empty());
    }
}
