//! `myprobe report --from --to`: the report of a past range, traced by no one now, from what the agent kept in its
//! directory: the session history (history.sqlite: the load by state, the top lists, the connections others waited
//! behind and their moments) and the windows of on-CPU, off-CPU and lock-wait profiles (pprof files, named as the
//! agent's retain.rs writes them: `KIND-PID-YYYYMMDDTHHMMSSZ.pb.gz`), decoded and merged by kind.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
    time::UNIX_EPOCH,
};

use anyhow::{Context, Result};

use super::{Past, PastIncident, ProfileSection};
use crate::{
    history::{
        read::{self, Incident, Range},
        store::{Store, FILE_NAME},
        time,
    },
    profile::Profile,
    render::{pprof, Palette},
};

/// What to read.
pub struct Options {
    /// The agent's directory (`--dir`).
    pub dir: PathBuf,
    /// The range, seconds since the epoch.
    pub from: i64,
    pub to: i64,
    /// Points of the load chart.
    pub points: i64,
    /// How many moments of connections waited behind are shown.
    pub moments: usize,
}

/// The kinds of windows, in the page's order: (the name in files, the title, the palette).
const KINDS: [(&str, &str, Palette); 3] = [
    ("cpu", "On-CPU samples", Palette::Hot),
    ("offcpu", "Off-CPU time (µs)", Palette::Io),
    ("locks", "Lock waits (µs), lock as root", Palette::Io),
];

/// Reads the range's history and windows from `o.dir`. What is missing is said in a line and the rest is still
/// shown; a range of which nothing at all was kept is an error.
pub fn read(o: &Options) -> Result<Past> {
    let mut missing = Vec::new();
    let store = o.dir.join(FILE_NAME);
    let range_words = format!("from {} to {}", time::format(o.from), time::format(o.to));
    let (range, incidents) = match history(&store, o) {
        Ok(Some(found)) => found,
        Ok(None) => {
            missing.push(format!(
                "session history: no session ran a statement {range_words} ({} holds nothing then)",
                store.display()
            ));
            (None, Vec::new())
        }
        Err(e) => {
            missing.push(format!("session history: {e:#}"));
            (None, Vec::new())
        }
    };
    let windows = windows(&o.dir, o.from, o.to)?;
    if windows.drawn == 0 {
        missing.push(format!(
            "flame graphs: no window kept in {} overlaps the range (the agent keeps them for --retain)",
            o.dir.display()
        ));
    }
    if range.is_none() && windows.drawn == 0 {
        anyhow::bail!(
            "nothing kept in {} {range_words}: no session history and no flame-graph window (give the agent's \
             --dir with --dir, and a range when it ran)",
            o.dir.display()
        );
    }
    let mut past = Past {
        host: super::hostname(),
        dir: o.dir.display().to_string(),
        from: o.from,
        to: o.to,
        range,
        incidents,
        profiles: windows.sections,
        windows: windows.drawn,
        windows_span: windows.span,
        missing,
        findings: Vec::new(),
    };
    past.findings = super::findings::past(&past);
    Ok(past)
}

/// The range's load and its connections waited behind, each with its worst moment; `None` when no session ran a
/// statement in it.
fn history(store: &Path, o: &Options) -> Result<Option<(Option<Range>, Vec<PastIncident>)>> {
    anyhow::ensure!(
        store.exists(),
        "no {FILE_NAME} in {} (the agent ran with --no-history, or this is not its --dir)",
        o.dir.display()
    );
    let db = Store::open_read(store)?;
    let range = read::range(&db, o.from, o.to, o.points)?;
    if range.points.is_empty() {
        return Ok(None);
    }
    let incidents = read::incidents(&db, o.from, o.to, o.moments)?
        .into_iter()
        .map(|incident| moment_of(&db, incident))
        .collect::<Result<_>>()?;
    Ok(Some((Some(range), incidents)))
}

fn moment_of(db: &rusqlite::Connection, incident: Incident) -> Result<PastIncident> {
    let moment = read::moment(db, incident.worst)?
        .servers
        .into_iter()
        .find(|s| s.server == incident.server && s.ts == incident.worst);
    Ok(PastIncident { incident, moment })
}

/// A window's file, by its name.
#[derive(Debug, PartialEq)]
struct WindowFile {
    kind: String,
    pid: Option<u32>,
    started: i64,
}

/// `cpu-1234-20261125T100405Z.pb.gz` (or, before windows were a server's, `cpu-20261125T100405Z.pb.gz`).
fn window_file(name: &str) -> Option<WindowFile> {
    let rest = name.strip_suffix(".pb.gz")?;
    let (kind, rest) = rest.split_once('-')?;
    let (pid, stamp) = match rest.split_once('-') {
        Some((pid, stamp)) => (Some(pid.parse().ok()?), stamp),
        None => (None, rest),
    };
    let started = chrono::NaiveDateTime::parse_from_str(stamp, "%Y%m%dT%H%M%SZ")
        .ok()?
        .and_utc()
        .timestamp();
    KINDS.iter().any(|(k, ..)| *k == kind).then(|| WindowFile {
        kind: kind.to_string(),
        pid,
        started,
    })
}

/// The windows' flame graphs, by kind.
struct Windows {
    sections: Vec<ProfileSection>,
    drawn: usize,
    span: Option<(i64, i64)>,
}

/// One kind's windows merged.
struct Merged {
    profile: Profile,
    windows: u64,
    pids: BTreeSet<u32>,
}

/// The windows of `dir` that overlap `from..to`, merged by kind and drawn. A window's time is its profile's own
/// (pprof's `time_nanos` and `duration_nanos`), else its name's start and its file's last write; a file that is not
/// a profile is said and skipped.
fn windows(dir: &Path, from: i64, to: i64) -> Result<Windows> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            anyhow::bail!(
                "{} does not exist: give the agent's directory with --dir",
                dir.display()
            )
        }
        Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
    };
    let mut merged: BTreeMap<String, Merged> = BTreeMap::new();
    let mut span: Option<(i64, i64)> = None;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(file) = window_file(&name).filter(|f| f.started < to) else {
            continue;
        };
        // Written when it ended: an older file ended before the range (its name alone cannot say).
        let written = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(i64::MAX, |d| d.as_secs() as i64);
        if written < from {
            continue;
        }
        let message = match fs::read(entry.path())
            .map_err(anyhow::Error::from)
            .and_then(|bytes| pprof::decode(&bytes))
        {
            Ok(m) => m,
            Err(e) => {
                say!(
                    "myprobe: warning: {} skipped: {e:#}",
                    entry.path().display()
                );
                continue;
            }
        };
        let (start, end) = if message.time_nanos > 0 && message.duration_nanos > 0 {
            let start = message.time_nanos / 1_000_000_000;
            (
                start,
                (message.time_nanos + message.duration_nanos + 999_999_999) / 1_000_000_000,
            )
        } else {
            (file.started, written.max(file.started + 1))
        };
        if start >= to || end <= from {
            continue;
        }
        let Some(profile) = pprof::profile_of(&message) else {
            say!(
                "myprobe: warning: {} skipped: its values are in a unit no flame graph here has",
                entry.path().display()
            );
            continue;
        };
        let m = merged.entry(file.kind).or_insert_with(|| Merged {
            profile: Profile::new(profile.unit),
            windows: 0,
            pids: BTreeSet::new(),
        });
        if m.profile.unit != profile.unit {
            continue;
        }
        for (frames, value) in profile.stacks() {
            m.profile.add(&frames, value);
        }
        m.windows += 1;
        m.pids.extend(file.pid);
        span = Some(span.map_or((start, end), |(a, b)| (a.min(start), b.max(end))));
    }
    let drawn = merged.values().map(|m| m.windows as usize).sum();
    let mut sections = Vec::new();
    for (kind, title, palette) in KINDS {
        let Some(m) = merged.remove(kind) else {
            continue;
        };
        let pids: Vec<String> = m.pids.iter().map(u32::to_string).collect();
        let of = match pids.len() {
            0 => String::new(),
            1 => format!(", PID {}", pids[0]),
            _ => format!(", PIDs {}", pids.join(", ")),
        };
        let title = format!("{title}: {} windows kept{of}", m.windows);
        sections.push(ProfileSection::drawn(
            kind,
            title,
            m.profile,
            palette,
            m.windows,
            Vec::new(),
        )?);
    }
    Ok(Windows {
        sections,
        drawn,
        span,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_known_by_their_names() {
        assert_eq!(
            window_file("offcpu-1234-20261118T110640Z.pb.gz"),
            Some(WindowFile {
                kind: "offcpu".into(),
                pid: Some(1234),
                started: 1_795_000_000
            })
        );
        assert_eq!(
            window_file("cpu-20261118T110640Z.pb.gz").map(|w| (w.pid, w.started)),
            Some((None, 1_795_000_000))
        );
        for not in [
            "heap-1-20261118T110640Z.pb.gz",
            "cpu-x-20261118T110640Z.pb.gz",
            "cpu-1-20261118T110640Z.pb",
            "history.sqlite",
        ] {
            assert_eq!(window_file(not), None, "{not}");
        }
    }

    /// Windows written as the agent writes them: those that overlap the range are merged by kind, the others left.
    #[test]
    fn the_windows_of_the_range_are_merged_by_kind() {
        let dir = tempfile::tempdir().unwrap();
        let t0 = 1_795_000_000;
        let write = |kind: &str, start: i64, frames: &[&str], value: u64| {
            let mut p = Profile::new(if kind == "cpu" {
                crate::profile::Unit::Samples
            } else {
                crate::profile::Unit::Microseconds
            });
            p.add(frames, value);
            let mut m = pprof::build(&p, &crate::render::RenderOptions::default());
            pprof::label(&mut m, &[], start * 1_000_000_000, 2_000_000_000);
            let mut bytes = Vec::new();
            pprof::write_message(&m, &mut bytes).unwrap();
            let stamp = chrono::DateTime::from_timestamp(start, 0)
                .unwrap()
                .format("%Y%m%dT%H%M%SZ");
            fs::write(dir.path().join(format!("{kind}-7-{stamp}.pb.gz")), bytes).unwrap();
        };
        write("cpu", t0, &["main", "do_command"], 3);
        write("cpu", t0 + 2, &["main", "do_command"], 4);
        write("offcpu", t0 + 2, &["main", "[blocked]"], 100);
        // Before and after the range.
        write("cpu", t0 - 10, &["main", "early"], 1);
        write("cpu", t0 + 10, &["main", "late"], 1);
        fs::write(dir.path().join("cpu-7-20261118T110641Z.pb.gz"), b"junk").unwrap();
        let w = windows(dir.path(), t0 + 1, t0 + 5).unwrap();
        assert_eq!(w.drawn, 3);
        assert_eq!(w.span, Some((t0, t0 + 4)));
        let ids: Vec<&str> = w.sections.iter().map(|s| s.id).collect();
        assert_eq!(ids, ["cpu", "offcpu"]);
        assert_eq!(w.sections[0].profile.total(), 7);
        assert!(w.sections[0].svg.contains("do_command"));
        let frames: Vec<&str> = (w.sections[0].profile.stacks().into_iter())
            .flat_map(|(f, _)| f)
            .collect();
        assert!(
            !frames.contains(&"early") && !frames.contains(&"late"),
            "{frames:?}"
        );
        assert!(w.sections[0].title.ends_with("2 windows kept, PID 7"));
        assert!(windows(&dir.path().join("none"), t0, t0 + 5).is_err());
    }
}
