//! A short text summary of a profile for the terminal: the top functions by self and by total value.

use std::collections::{HashMap, HashSet};
use std::fmt::Write;

use crate::{profile::Profile, symbolize::unnamed_in_binary};

/// Leaf frames that mark a kind of time (`[blocked]`, `[runnable]`, `[syscall] write`) rather than a function.
fn is_marker(frame: &str) -> bool {
    frame == "[blocked]" || frame == "[runnable]" || frame.starts_with("[syscall] ")
}

/// The allocation functions, and the server's wrappers around them (mysys, InnoDB): in a memory profile
/// every stack ends in one, so the function charged with "self" bytes is the first caller that is not one.
fn is_allocator(frame: &str) -> bool {
    let name = frame.split('(').next().unwrap_or(frame);
    matches!(
        name,
        "malloc"
            | "calloc"
            | "realloc"
            | "aligned_alloc"
            | "posix_memalign"
            | "memalign"
            | "valloc"
            | "pvalloc"
            | "my_malloc"
            | "my_realloc"
            | "my_multi_malloc"
            | "my_multi_malloc_large"
            | "alloc_root"
    ) || name.starts_with("__libc_")
        || name.starts_with("operator new")
        || name.starts_with("ut_allocator<")
}

/// Per function: (self value, total value). Self is the value of the stacks where the function is
/// the leaf (below it, at most a marker frame such as `[blocked]`, which is not a function; in a memory
/// profile, the allocation functions are not counted as leaves either); total (inclusive) counts each stack
/// once per function, even when it recurses.
pub fn function_values(profile: &Profile, memory: bool) -> HashMap<&str, (u64, u64)> {
    let mut values: HashMap<&str, (u64, u64)> = HashMap::new();
    let mut seen = HashSet::new();
    for (frames, value) in profile.stacks() {
        let leaf = frames
            .iter()
            .rev()
            .find(|f| !is_marker(f) && (!memory || !is_allocator(f)));
        if let Some(&leaf) = leaf.or_else(|| frames.iter().rev().find(|f| !is_marker(f))) {
            let v = values.entry(leaf).or_default();
            v.0 = v.0.saturating_add(value);
        }
        seen.clear();
        for &f in frames.iter().filter(|f| !is_marker(f)) {
            if seen.insert(f) {
                let v = values.entry(f).or_default();
                v.1 = v.1.saturating_add(value);
            }
        }
    }
    values
}

/// An aligned table of the top `n` functions by self value and by total (inclusive) value, with
/// percentages of the profile's total and its unit; for printing on stderr at the end of a run. `memory`:
/// self is what the callers of the allocation functions asked for.
pub fn top_functions(profile: &Profile, n: usize, memory: bool, estimated: bool) -> String {
    let unit = profile.unit.count_name();
    let total = profile.total();
    if total == 0 {
        return format!("no {unit} recorded\n");
    }
    let values = function_values(profile, memory);
    let mut out = String::new();
    let (estimated, about) = if estimated {
        (", estimated", "~")
    } else {
        ("", "")
    };
    let _ = writeln!(out, "total: {about}{total} {unit}{estimated}");
    for (i, (heading, pick)) in [
        ("self", (|v: &(u64, u64)| v.0) as fn(&(u64, u64)) -> u64),
        ("total", |v: &(u64, u64)| v.1),
    ]
    .into_iter()
    .enumerate()
    {
        let mut rows: Vec<(&str, u64)> = values
            .iter()
            .map(|(&f, v)| (f, pick(v)))
            .filter(|&(_, v)| v > 0)
            .collect();
        // Largest first, then by name so that ties print in a stable order.
        rows.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        rows.truncate(n);
        if i > 0 {
            out.push('\n');
        }
        let what = if memory && i == 0 {
            " (callers of the allocator)"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "top {} functions{what} by {heading} {unit}{estimated}:",
            rows.len()
        );
        let width = rows
            .iter()
            .map(|r| r.1.to_string().len())
            .chain([heading.len()])
            .max()
            .unwrap_or(0);
        let _ = writeln!(out, "  {heading:>width$}  {:>7}  function", "%");
        for (f, v) in rows {
            let pct = 100.0 * v as f64 / total as f64;
            let _ = writeln!(out, "  {v:>width$}  {:>6.2}%  {f}", pct);
        }
    }
    out
}

/// Frames and leaves below this share of a profile without a function name are not worth a line.
const UNNAMED_NOTICEABLE: f64 = 0.01;

/// How much of a profile has no function name, weighted by its values.
#[derive(Debug, PartialEq)]
pub struct Unnamed {
    /// Of the frames: each frame of a stack counts its stack's value.
    pub frames: f64,
    /// Of the leaves, as the self column of [`top_functions`] chooses them.
    pub leaves: f64,
    /// Of the frames, per binary, largest first.
    pub by_binary: Vec<(String, f64)>,
}

/// How much of `profile` has no function name (`memory`: a memory profile, whose leaves are the callers of
/// the allocator). `None` for a profile without frames.
pub fn unnamed_share(profile: &Profile, memory: bool) -> Option<Unnamed> {
    let (mut frames, mut unnamed, mut leaves, mut unnamed_leaves) = (0u128, 0u128, 0u128, 0u128);
    let mut by_binary: HashMap<&str, u128> = HashMap::new();
    let stacks = profile.stacks();
    for (stack, value) in &stacks {
        let value = u128::from(*value);
        for f in stack.iter().filter(|f| !is_marker(f)) {
            frames += value;
            if let Some(binary) = unnamed_in_binary(f) {
                unnamed += value;
                *by_binary.entry(binary).or_default() += value;
            }
        }
        let leaf = stack
            .iter()
            .rev()
            .find(|f| !is_marker(f) && (!memory || !is_allocator(f)))
            .or_else(|| stack.iter().rev().find(|f| !is_marker(f)));
        if let Some(leaf) = leaf {
            leaves += value;
            if unnamed_in_binary(leaf).is_some() {
                unnamed_leaves += value;
            }
        }
    }
    if frames == 0 || leaves == 0 {
        return None;
    }
    let share = |part: u128, whole: u128| part as f64 / whole as f64;
    let mut by_binary: Vec<(String, f64)> = by_binary
        .into_iter()
        .map(|(b, v)| (b.to_owned(), share(v, frames)))
        .collect();
    by_binary.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    Some(Unnamed {
        frames: share(unnamed, frames),
        leaves: share(unnamed_leaves, leaves),
        by_binary,
    })
}

/// The line that says how much of `profile` has no function name and how to get names, when that is
/// noticeable (1% of the frames or of the leaves); `debuginfod`: whether `DEBUGINFOD_URLS` is set.
pub fn unnamed_line(profile: &Profile, memory: bool, debuginfod: bool) -> Option<String> {
    let Unnamed {
        frames,
        leaves,
        by_binary,
    } = unnamed_share(profile, memory)?;
    if frames < UNNAMED_NOTICEABLE && leaves < UNNAMED_NOTICEABLE {
        return None;
    }
    let shown: Vec<String> = by_binary
        .iter()
        .take(3)
        .map(|(b, s)| format!("{b} {:.1}%", 100.0 * s))
        .collect();
    let more = if by_binary.len() > 3 { ", …" } else { "" };
    // What to install, by Debian's names where they are known: for the binaries that matter.
    let matter = by_binary
        .iter()
        .take(3)
        .filter(|(_, s)| *s >= UNNAMED_NOTICEABLE)
        .count()
        .max(1);
    let install: Vec<String> = by_binary
        .iter()
        .take(matter)
        .map(|(b, _)| match crate::server::debug_package(b) {
            Some(package) => package.to_owned(),
            None => format!("the debug symbols of {b} (its -dbgsym package)"),
        })
        .collect();
    let how = if debuginfod {
        format!("install {}", install.join(", "))
    } else {
        format!("install {}, or set DEBUGINFOD_URLS", install.join(", "))
    };
    Some(format!(
        "{:.1}% of frames ({:.1}% of leaves) have no function name, in {}{more}: {how}",
        100.0 * frames,
        100.0 * leaves,
        shown.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Unit;

    fn sample() -> Profile {
        let mut p = Profile::new(Unit::Samples);
        p.add(&["main", "a", "x"], 10);
        p.add(&["main", "b"], 5);
        p.add(&["main", "a", "a", "a"], 3); // recursion: a counted once per stack in total
        p.add(&["main"], 2);
        p
    }

    #[test]
    fn values_that_add_up_past_the_largest_stop_there() {
        let mut p = Profile::new(Unit::Bytes);
        p.add(&["main", "a"], u64::MAX);
        p.add(&["main", "b", "a"], u64::MAX);
        let v = function_values(&p, false);
        assert_eq!(v["main"], (0, u64::MAX));
        assert_eq!(v["a"], (u64::MAX, u64::MAX));
        assert!(
            top_functions(&p, 5, false, false).starts_with(&format!("total: {} bytes", u64::MAX))
        );
    }

    #[test]
    fn self_and_total_values() {
        let p = sample();
        let v = function_values(&p, false);
        assert_eq!(v["main"], (2, 20));
        assert_eq!(v["a"], (3, 13));
        assert_eq!(v["x"], (10, 10));
        assert_eq!(v["b"], (5, 5));
        assert_eq!(v.len(), 4);
    }

    #[test]
    fn wait_markers_are_not_functions() {
        let mut p = Profile::new(Unit::Microseconds);
        p.add(&["main", "poll", "[blocked]"], 7);
        p.add(&["main", "poll", "[runnable]"], 2);
        p.add(&["main", "[runnable]"], 1);
        let v = function_values(&p, false);
        assert_eq!(v["poll"], (9, 9));
        assert_eq!(v["main"], (1, 10));
        assert_eq!(v.len(), 2);
    }

    #[test]
    fn memory_self_is_the_caller_of_the_allocator() {
        let mut p = Profile::new(Unit::Bytes);
        p.add(&["main", "filesort", "my_malloc", "malloc"], 100);
        p.add(
            &[
                "main",
                "Item::operator new(unsigned long)",
                "alloc_root",
                "malloc",
            ],
            30,
        );
        p.add(
            &["main", "parse", "operator new(unsigned long)", "malloc"],
            20,
        );
        p.add(&["malloc"], 5);
        let v = function_values(&p, true);
        assert_eq!(v["filesort"], (100, 100));
        // A class's own operator new (MariaDB's Sql_alloc, from a MEM_ROOT) is the code that asked.
        assert_eq!(v["Item::operator new(unsigned long)"], (30, 30));
        assert_eq!(v["main"], (0, 150));
        assert_eq!(v["parse"], (20, 20));
        assert_eq!(
            v["malloc"],
            (5, 155),
            "a stack of the allocator alone keeps it as leaf"
        );
        assert!(top_functions(&p, 3, true, false)
            .contains("top 3 functions (callers of the allocator) by self bytes:"));
    }

    #[test]
    fn table() {
        let p = sample();
        let t = top_functions(&p, 3, false, false);
        let expected = "\
total: 20 samples
top 3 functions by self samples:
  self        %  function
    10   50.00%  x
     5   25.00%  b
     3   15.00%  a

top 3 functions by total samples:
  total        %  function
     20  100.00%  main
     13   65.00%  a
     10   50.00%  x
";
        assert_eq!(t, expected);
        let t = top_functions(&p, 3, false, true);
        assert!(
            t.starts_with(
                "total: ~20 samples, estimated\ntop 3 functions by self samples, estimated:\n"
            ),
            "{t}"
        );
        assert!(
            t.contains("top 3 functions by total samples, estimated:\n"),
            "{t}"
        );
    }

    #[test]
    fn empty() {
        assert_eq!(
            top_functions(&Profile::new(Unit::Bytes), 5, true, false),
            "no bytes recorded\n"
        );
    }

    #[test]
    fn unnamed_frames_and_leaves_are_weighted_by_value() {
        let mut p = Profile::new(Unit::Microseconds);
        p.add(&["main", "mariadbd+0x8a1c00", "[blocked]"], 30);
        p.add(&["main", "do_command", "mariadbd+0xdead0"], 10);
        p.add(&["main", "do_command", "libfoo.so.1+0x10"], 10);
        p.add(&["main", "operator+", "a::b(0x1)"], 50);
        let Unnamed {
            frames,
            leaves,
            by_binary,
        } = unnamed_share(&p, false).unwrap();
        // Markers left out: 2 × 30 + 3 × 10 + 3 × 10 + 3 × 50 in all, 30 + 10 + 10 without a name.
        assert!((frames - 50.0 / 270.0).abs() < 1e-9, "{frames}");
        assert!((leaves - 50.0 / 100.0).abs() < 1e-9, "{leaves}");
        assert_eq!(by_binary[0].0, "mariadbd");
        assert!((by_binary[0].1 - 40.0 / 270.0).abs() < 1e-9);
        assert_eq!(by_binary[1].0, "libfoo.so.1");
        assert_eq!(
            unnamed_line(&p, false, false).unwrap(),
            "18.5% of frames (50.0% of leaves) have no function name, in mariadbd 14.8%, libfoo.so.1 3.7%: \
             install mariadb-server-core-dbgsym, the debug symbols of libfoo.so.1 (its -dbgsym package), or \
             set DEBUGINFOD_URLS"
        );
        assert!(!unnamed_line(&p, false, true)
            .unwrap()
            .contains("DEBUGINFOD_URLS"));
    }

    #[test]
    fn a_small_unnamed_share_says_nothing() {
        let mut p = Profile::new(Unit::Samples);
        p.add(&["main", "a", "b"], 1000);
        assert_eq!(unnamed_share(&p, false).unwrap().frames, 0.0);
        p.add(&["main", "a", "mariadbd+0x10"], 5);
        assert_eq!(unnamed_line(&p, false, false), None);
        p.add(&["main", "a", "mariadbd+0x10"], 10);
        assert!(unnamed_line(&p, false, false).is_some());
        assert_eq!(unnamed_share(&Profile::new(Unit::Samples), false), None);
        // A binary below 1% is named, but not in the advice (frames: 2 × 100 + 3 × 1, 101 unnamed).
        let mut p = Profile::new(Unit::Samples);
        p.add(&["main", "mariadbd+0x10"], 100);
        p.add(&["main", "a", "libbar.so+0x10"], 1);
        assert_eq!(
            unnamed_line(&p, false, false).unwrap(),
            "49.8% of frames (100.0% of leaves) have no function name, in mariadbd 49.3%, libbar.so 0.5%: \
             install mariadb-server-core-dbgsym, or set DEBUGINFOD_URLS"
        );
        // Not names of the symbolizer's fallback.
        for f in ["a+0x", "+0x10", "x+0xzz", "f(int+0x1)", "thread 1 (a+0x1)"] {
            assert_eq!(unnamed_in_binary(f), None, "{f}");
        }
    }
}
