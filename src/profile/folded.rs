//! Folded stacks: one stack a line, `frame;frame;frame VALUE`, root first, as FlameGraph's
//! stackcollapse-*.pl scripts write them and flamegraph.pl (and inferno) read them.

use std::io::{self, BufRead, Write};

use anyhow::{bail, Context, Result};

use super::{Profile, Unit};

/// Writes one line per stack (`root;...;leaf VALUE`), in the stable order of [`Profile::stacks`].
pub fn write(profile: &Profile, mut w: impl Write) -> io::Result<()> {
    for (frames, value) in profile.stacks() {
        writeln!(w, "{} {}", frames.join(";"), value)?;
    }
    w.flush()
}

/// Reads folded stacks into a profile of the given unit. Blank lines and `# ` comment lines
/// (which inferno also skips) are ignored; identical stacks are summed. A line without a
/// trailing integer value, or without a stack before it, is an error naming its line number;
/// so is the line whose value brings the total past `u64::MAX` (a flame graph's width is the total).
pub fn read(mut r: impl BufRead, unit: Unit) -> Result<Profile> {
    let mut profile = Profile::new(unit);
    let mut buf = Vec::new();
    let mut lineno = 0usize;
    let mut total = 0u64;
    loop {
        buf.clear();
        lineno += 1;
        let n = r
            .read_until(b'\n', &mut buf)
            .with_context(|| format!("line {lineno}"))?;
        if n == 0 {
            break;
        }
        let text = String::from_utf8_lossy(&buf);
        let line = text.trim();
        if line.is_empty() || line.starts_with("# ") {
            continue;
        }
        let Some((stack, value)) = parse_line(line) else {
            bail!(
                "line {lineno}: expected `frame;frame VALUE`, got {:?}",
                shorten(line)
            );
        };
        let Some(sum) = total.checked_add(value) else {
            bail!("line {lineno}: the values add up to more than {}", u64::MAX);
        };
        total = sum;
        let frames: Vec<&str> = stack.split(';').collect();
        profile.add(&frames, value);
    }
    Ok(profile)
}

/// Splits `stack VALUE` at the last run of whitespace; `None` if there is no stack or the
/// value is not a non-negative integer.
fn parse_line(line: &str) -> Option<(&str, u64)> {
    let at = line.rfind(char::is_whitespace)?;
    let value = line[at..].trim().parse::<u64>().ok()?;
    let stack = line[..at].trim_end();
    if stack.is_empty() {
        return None;
    }
    Some((stack, value))
}

/// A corrupt line quoted in an error message, cut to a readable length.
fn shorten(line: &str) -> String {
    const MAX: usize = 80;
    if line.chars().count() <= MAX {
        line.to_string()
    } else {
        let mut s: String = line.chars().take(MAX).collect();
        s.push('…');
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_str(s: &str) -> Result<Profile> {
        read(s.as_bytes(), Unit::Samples)
    }

    #[test]
    fn round_trip() {
        let mut p = Profile::new(Unit::Samples);
        p.add(&["main", "b"], 5);
        p.add(&["main", "a", "x"], 10);
        p.add(
            &["start_thread", "do_command", "dispatch_command(THD*, ...)"],
            7,
        );
        let mut out = Vec::new();
        write(&p, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            "main;a;x 10\nmain;b 5\nstart_thread;do_command;dispatch_command(THD*, ...) 7\n"
        );
        let q = read_str(&text).unwrap();
        assert_eq!(q.stacks(), p.stacks());
        assert_eq!(q.total(), 22);
        assert_eq!(q.unit, Unit::Samples);
    }

    #[test]
    fn tolerant_of_blank_lines_comments_crlf_and_duplicates() {
        let p = read_str("\n# comment\nmain;a 3\r\n\n  \nmain;a 4\nmain;b\t2\n").unwrap();
        assert_eq!(
            p.stacks(),
            vec![(vec!["main", "a"], 7), (vec!["main", "b"], 2)]
        );
    }

    #[test]
    fn corrupt_line_names_its_number() {
        let input = "main;a 1\n\nmain;b 2\nmain;c 3\nmain;d 4\nmain;e 5\nmain;f x\nmain;g 7\n";
        let err = read_str(input).unwrap_err().to_string();
        assert!(
            err.starts_with("line 7: expected `frame;frame VALUE`"),
            "{err}"
        );
        assert!(err.contains("main;f x"), "{err}");
        for bad in [
            "main;a",
            "42",
            "main;a -3",
            "main;a 1.5",
            "main;a 99999999999999999999999",
        ] {
            let err = read_str(bad).unwrap_err().to_string();
            assert!(err.starts_with("line 1: expected"), "{bad}: {err}");
        }
    }

    #[test]
    fn values_that_add_up_past_the_largest_are_an_error() {
        let max = u64::MAX;
        let p = read_str(&format!("main;a {}\nmain;b 1\n", max - 1)).unwrap();
        assert_eq!(p.total(), max);
        for input in [
            format!("main;a {max}\n\nmain;b 1\n"),
            format!("main;a {max}\n\nmain;a 1\n"),
            format!("main;a {}\n\nmain;b {}\n", max / 2 + 1, max / 2 + 1),
        ] {
            let err = read_str(&input).unwrap_err().to_string();
            assert_eq!(
                err, "line 3: the values add up to more than 18446744073709551615",
                "{input}"
            );
        }
    }

    #[test]
    fn empty_input_is_empty_profile() {
        assert!(read_str("").unwrap().is_empty());
        assert!(read_str("\n\n").unwrap().is_empty());
    }
}
