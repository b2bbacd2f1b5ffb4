//! A short text summary of a profile for the terminal: the top functions by self and by total value.

use std::collections::{HashMap, HashSet};
use std::fmt::Write;

use crate::profile::Profile;

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
}
