//! pprof: a gzip-compressed `perftools.profiles.Profile` protobuf, as read by `go tool pprof`,
//! Pyroscope and Parca. The messages are declared here with prost's derive macros, after
//! github.com/google/pprof/proto/profile.proto (field numbers must match it).

use std::collections::HashMap;
use std::io::Write;

use anyhow::{Context, Result};
use flate2::write::GzEncoder;
use flate2::Compression;
use prost::Message;

use super::RenderOptions;
use crate::profile::{Profile, Unit};

#[derive(Clone, PartialEq, prost::Message)]
pub struct PprofProfile {
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    /// Index 0 must be "".
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    #[prost(int64, tag = "7")]
    pub drop_frames: i64,
    #[prost(int64, tag = "8")]
    pub keep_frames: i64,
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    pub period: i64,
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    /// Leaf first.
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Label {
    #[prost(int64, tag = "1")]
    pub key: i64,
    #[prost(int64, tag = "2")]
    pub str: i64,
    #[prost(int64, tag = "3")]
    pub num: i64,
    #[prost(int64, tag = "4")]
    pub num_unit: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Mapping {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub memory_start: u64,
    #[prost(uint64, tag = "3")]
    pub memory_limit: u64,
    #[prost(uint64, tag = "4")]
    pub file_offset: u64,
    #[prost(int64, tag = "5")]
    pub filename: i64,
    #[prost(int64, tag = "6")]
    pub build_id: i64,
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
    #[prost(bool, tag = "8")]
    pub has_filenames: bool,
    #[prost(bool, tag = "9")]
    pub has_line_numbers: bool,
    #[prost(bool, tag = "10")]
    pub has_inline_frames: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Location {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    #[prost(uint64, tag = "3")]
    pub address: u64,
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
    #[prost(bool, tag = "5")]
    pub is_folded: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Line {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    #[prost(int64, tag = "2")]
    pub line: i64,
    #[prost(int64, tag = "3")]
    pub column: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Function {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    #[prost(int64, tag = "4")]
    pub filename: i64,
    #[prost(int64, tag = "5")]
    pub start_line: i64,
}

/// pprof's (type, unit) for a profile unit; `count_name`, when given, names the type.
fn sample_type(profile_unit: Unit, count_name: Option<&str>) -> (String, &'static str) {
    let (ty, unit) = match profile_unit {
        Unit::Samples => ("samples", "count"),
        Unit::Picoseconds => ("time", "picoseconds"),
        Unit::Nanoseconds => ("time", "nanoseconds"),
        Unit::Microseconds => ("time", "microseconds"),
        Unit::Bytes => ("space", "bytes"),
        Unit::Count => ("calls", "count"),
    };
    // A count name that only repeats the unit's own ("ns", "bytes") does not rename the type.
    let ty = count_name
        .filter(|&n| n != profile_unit.count_name())
        .unwrap_or(ty);
    (ty.to_string(), unit)
}

/// The string table under construction: index 0 is "".
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Self {
        let mut s = Strings {
            table: Vec::new(),
            index: HashMap::new(),
        };
        s.get("");
        s
    }

    fn get(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_string());
        self.index.insert(s.to_string(), i);
        i
    }
}

/// Builds the pprof message for `profile`: one function and one location per distinct frame
/// name, one sample per stack (leaf first), `meta` as `key=value` comments.
pub fn build(profile: &Profile, opts: &RenderOptions) -> PprofProfile {
    let mut strings = Strings::new();
    let (ty, unit) = sample_type(profile.unit, opts.count_name.as_deref());
    let sample_type = ValueType {
        r#type: strings.get(&ty),
        unit: strings.get(unit),
    };

    let mut location_ids: HashMap<&str, u64> = HashMap::new();
    let mut functions = Vec::new();
    let mut locations = Vec::new();
    let mut samples = Vec::new();
    let stacks = profile.labelled_stacks();
    for (frames, labels, value) in &stacks {
        let mut ids = Vec::with_capacity(frames.len());
        for &name in frames.iter().rev() {
            let id = *location_ids.entry(name).or_insert_with(|| {
                let id = functions.len() as u64 + 1;
                let name_idx = strings.get(name);
                functions.push(Function {
                    id,
                    name: name_idx,
                    system_name: name_idx,
                    ..Default::default()
                });
                locations.push(Location {
                    id,
                    mapping_id: 1,
                    line: vec![Line {
                        function_id: id,
                        ..Default::default()
                    }],
                    ..Default::default()
                });
                id
            });
            ids.push(id);
        }
        samples.push(Sample {
            location_id: ids,
            value: vec![(*value).min(i64::MAX as u64) as i64],
            label: labels
                .iter()
                .map(|(k, v)| Label {
                    key: strings.get(k),
                    str: strings.get(v),
                    ..Default::default()
                })
                .collect(),
        });
    }
    // One mapping that says the functions are already symbolized, so pprof does not try to.
    let mapping = Mapping {
        id: 1,
        filename: strings.get("myprobe"),
        has_functions: true,
        ..Default::default()
    };
    let comment = opts
        .meta
        .iter()
        .map(|(k, v)| {
            let v = match v {
                serde_json::Value::String(s) => s.clone(),
                v => v.to_string(),
            };
            strings.get(&format!("{k}={v}"))
        })
        .collect();
    PprofProfile {
        sample_type: vec![sample_type],
        sample: samples,
        mapping: vec![mapping],
        location: locations,
        function: functions,
        comment,
        string_table: strings.table,
        ..Default::default()
    }
}

/// Writes `profile` as gzip-compressed pprof protobuf.
pub fn write(profile: &Profile, opts: &RenderOptions, w: impl Write) -> Result<()> {
    write_message(&build(profile, opts), w)
}

/// Writes a pprof message, gzip-compressed.
pub fn write_message(message: &PprofProfile, w: impl Write) -> Result<()> {
    let mut gz = GzEncoder::new(w, Compression::default());
    gz.write_all(&message.encode_to_vec())?;
    gz.finish()?.flush()?;
    Ok(())
}

/// A gzip-compressed pprof message, as `write_message` writes it (or uncompressed, as some tools keep it).
pub fn decode(bytes: &[u8]) -> Result<PprofProfile> {
    let raw = if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut raw = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(bytes), &mut raw)
            .context("not gzip-compressed whole")?;
        raw
    } else {
        bytes.to_vec()
    };
    PprofProfile::decode(raw.as_slice()).context("not a pprof profile")
}

/// The profile a pprof message holds, stacks root first, in its first sample type: `None` when its unit is not one
/// a profile has.
pub fn profile_of(message: &PprofProfile) -> Option<Profile> {
    profile_of_samples(message, |_| true)
}

/// The same, of the samples whose label `key` has a value that `value` matches (`db_query_summary`: one
/// statement's).
pub fn profile_labelled(
    message: &PprofProfile,
    key: &str,
    value: &regex::Regex,
) -> Option<Profile> {
    let string = |i: i64| {
        usize::try_from(i)
            .ok()
            .and_then(|i| message.string_table.get(i))
            .map_or("", String::as_str)
    };
    profile_of_samples(message, |sample| {
        sample
            .label
            .iter()
            .any(|l| string(l.key) == key && value.is_match(string(l.str)))
    })
}

/// The profile of the samples `keep` keeps.
fn profile_of_samples(message: &PprofProfile, keep: impl Fn(&Sample) -> bool) -> Option<Profile> {
    let string = |i: i64| {
        usize::try_from(i)
            .ok()
            .and_then(|i| message.string_table.get(i))
            .map_or("", String::as_str)
    };
    let kind = message.sample_type.first()?;
    let unit = match (string(kind.r#type), string(kind.unit)) {
        ("samples", "count") => Unit::Samples,
        (_, "picoseconds") => Unit::Picoseconds,
        (_, "nanoseconds") => Unit::Nanoseconds,
        (_, "microseconds") => Unit::Microseconds,
        (_, "bytes") => Unit::Bytes,
        (_, "count") => Unit::Count,
        _ => return None,
    };
    let functions: HashMap<u64, &str> = message
        .function
        .iter()
        .map(|f| (f.id, string(f.name)))
        .collect();
    // A location's frames, innermost first, as pprof lists inlined calls.
    let locations: HashMap<u64, Vec<&str>> = message
        .location
        .iter()
        .map(|l| {
            let names = l
                .line
                .iter()
                .map(|line| functions.get(&line.function_id).copied().unwrap_or("?"))
                .collect();
            (l.id, names)
        })
        .collect();
    let mut profile = Profile::new(unit);
    for sample in message.sample.iter().filter(|s| keep(s)) {
        let Some(&value) = sample.value.first() else {
            continue;
        };
        let mut frames: Vec<&str> = sample
            .location_id
            .iter()
            .flat_map(|id| locations.get(id).into_iter().flatten().copied())
            .collect();
        frames.reverse();
        profile.add(&frames, value.max(0) as u64);
    }
    Some(profile)
}

/// Gives every sample the labels `labels` (what a fleet's profile store files them under: host, server
/// version, window) and the profile its time: when it began, and how long it covers.
pub fn label(
    message: &mut PprofProfile,
    labels: &[(&str, &str)],
    time_nanos: i64,
    duration_nanos: i64,
) {
    let mut index = |s: &str| match message.string_table.iter().position(|t| t == s) {
        Some(i) => i as i64,
        None => {
            message.string_table.push(s.to_string());
            message.string_table.len() as i64 - 1
        }
    };
    let labels: Vec<Label> = labels
        .iter()
        .map(|(k, v)| Label {
            key: index(k),
            str: index(v),
            ..Default::default()
        })
        .collect();
    for sample in &mut message.sample {
        sample.label.extend(labels.iter().cloned());
    }
    message.time_nanos = time_nanos;
    message.duration_nanos = duration_nanos;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn decode(gz: &[u8]) -> PprofProfile {
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(gz)
            .read_to_end(&mut raw)
            .unwrap();
        PprofProfile::decode(raw.as_slice()).unwrap()
    }

    /// The profile back from the decoded message: stacks as root-first names.
    fn stacks_of(m: &PprofProfile) -> Vec<(Vec<String>, i64)> {
        let s = |i: i64| m.string_table[i as usize].clone();
        let func = |id: u64| m.function.iter().find(|f| f.id == id).unwrap();
        let loc = |id: u64| m.location.iter().find(|l| l.id == id).unwrap();
        let mut out: Vec<(Vec<String>, i64)> = m
            .sample
            .iter()
            .map(|smp| {
                let mut names: Vec<String> = smp
                    .location_id
                    .iter()
                    .map(|&l| s(func(loc(l).line[0].function_id).name))
                    .collect();
                names.reverse();
                (names, smp.value[0])
            })
            .collect();
        out.sort();
        out
    }

    #[test]
    fn decode_round_trip() {
        let mut p = Profile::new(Unit::Nanoseconds);
        p.add(&["main", "a", "x"], 10);
        p.add(&["main", "b"], 5);
        p.add(&["main", "a", "main"], 2); // recursion: one location for both "main"
        let mut opts = RenderOptions::default();
        opts.meta.insert("pid".into(), serde_json::json!(42));
        opts.meta
            .insert("comm".into(), serde_json::json!("mariadbd"));
        let mut out = Vec::new();
        write(&p, &opts, &mut out).unwrap();
        assert_eq!(&out[..2], &[0x1f, 0x8b], "gzip magic");
        let m = decode(&out);

        assert_eq!(m.string_table[0], "");
        let s = |i: i64| m.string_table[i as usize].as_str();
        assert_eq!(m.sample_type.len(), 1);
        assert_eq!(
            (s(m.sample_type[0].r#type), s(m.sample_type[0].unit)),
            ("time", "nanoseconds")
        );
        // One function and one location per distinct frame name.
        let mut names: Vec<&str> = m.function.iter().map(|f| s(f.name)).collect();
        names.sort();
        assert_eq!(names, ["a", "b", "main", "x"]);
        assert_eq!(m.location.len(), 4);
        assert!(m
            .location
            .iter()
            .all(|l| l.mapping_id == 1 && l.line.len() == 1));
        assert!(m.mapping[0].has_functions);
        // Leaf first in the sample: the first location of "main;a;x" is x.
        let x = m.sample.iter().find(|smp| smp.value == [10]).unwrap();
        let leaf = m
            .function
            .iter()
            .find(|f| f.id == x.location_id[0])
            .unwrap();
        assert_eq!(s(leaf.name), "x");
        assert_eq!(
            stacks_of(&m),
            vec![
                (vec!["main".to_string(), "a".into(), "main".into()], 2),
                (vec!["main".to_string(), "a".into(), "x".into()], 10),
                (vec!["main".to_string(), "b".into()], 5),
            ]
        );
        let mut comments: Vec<&str> = m.comment.iter().map(|&c| s(c)).collect();
        comments.sort();
        assert_eq!(comments, ["comm=mariadbd", "pid=42"]);
    }

    #[test]
    fn count_name_names_the_sample_type() {
        let mut p = Profile::new(Unit::Count);
        p.add(&["main"], 1);
        let opts = RenderOptions {
            count_name: Some("allocs".into()),
            ..Default::default()
        };
        let m = build(&p, &opts);
        let s = |i: i64| m.string_table[i as usize].as_str();
        assert_eq!(
            (s(m.sample_type[0].r#type), s(m.sample_type[0].unit)),
            ("allocs", "count")
        );
        let mut p = Profile::new(Unit::Bytes);
        p.add(&["main"], 1);
        let opts = RenderOptions {
            count_name: Some("bytes".into()),
            ..Default::default()
        };
        let m = build(&p, &opts);
        let s = |i: i64| m.string_table[i as usize].as_str();
        assert_eq!(
            (s(m.sample_type[0].r#type), s(m.sample_type[0].unit)),
            ("space", "bytes")
        );
    }

    #[test]
    fn labels_go_to_every_sample() {
        let mut p = Profile::new(Unit::Samples);
        p.add(&["main", "a"], 3);
        p.add(&["main", "b"], 1);
        let mut m = build(&p, &RenderOptions::default());
        label(&mut m, &[("host", "db1"), ("window", "main")], 7, 60);
        let mut out = Vec::new();
        write_message(&m, &mut out).unwrap();
        let m = decode(&out);
        let s = |i: i64| m.string_table[i as usize].as_str();
        assert_eq!((m.time_nanos, m.duration_nanos), (7, 60));
        for sample in &m.sample {
            let labels: Vec<(&str, &str)> =
                sample.label.iter().map(|l| (s(l.key), s(l.str))).collect();
            assert_eq!(labels, [("host", "db1"), ("window", "main")]);
        }
        // An existing string is reused.
        assert_eq!(m.string_table.iter().filter(|t| *t == "main").count(), 1);
    }

    #[test]
    fn a_profile_written_is_read_back() {
        let mut p = Profile::new(Unit::Microseconds);
        p.add(&["main", "a", "x"], 10);
        p.add(&["main", "b"], 5);
        p.add(&["main", "a", "main"], 2);
        let mut out = Vec::new();
        write(&p, &RenderOptions::default(), &mut out).unwrap();
        let back = profile_of(&super::decode(&out).unwrap()).unwrap();
        assert_eq!(back.unit, Unit::Microseconds);
        let mut stacks = back.stacks();
        stacks.sort();
        assert_eq!(
            stacks,
            [
                (vec!["main", "a", "main"], 2),
                (vec!["main", "a", "x"], 10),
                (vec!["main", "b"], 5)
            ]
        );
        let mut cpu = Profile::new(Unit::Samples);
        cpu.add(&["main"], 3);
        let m = build(&cpu, &RenderOptions::default());
        assert_eq!(profile_of(&m).unwrap().unit, Unit::Samples);
        assert!(super::decode(b"\x1f\x8bnot gzip").is_err());
    }

    #[test]
    fn empty_profile_encodes() {
        let p = Profile::new(Unit::Samples);
        let mut out = Vec::new();
        write(&p, &RenderOptions::default(), &mut out).unwrap();
        let m = decode(&out);
        assert!(m.sample.is_empty());
        assert_eq!(m.sample_type.len(), 1);
    }
}
