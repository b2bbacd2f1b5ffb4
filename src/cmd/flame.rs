//! `myprobe flame IN.folded [-o OUT] [--title T] [--countname U] [--colors hot|mem|io]
//! [--grep RE] [--exclude RE]`: a flame graph (or any other output format) from folded stacks.

use std::fs::File;
use std::io::{self, BufReader, BufWriter};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use regex::Regex;

use crate::profile::{folded, Profile, Unit};
use crate::render::{self, Palette, RenderOptions};

#[derive(clap::Args)]
pub struct FlameArgs {
    /// Folded stacks (`frame;frame;frame VALUE`, root first); `-` reads standard input.
    #[arg(value_name = "IN.folded")]
    pub input: String,
    /// Output file; its extension picks the format (.svg, .folded/.txt, .json, .pb.gz).
    /// Without it, the SVG goes to standard output.
    #[arg(short = 'o', long = "output", value_name = "OUT.svg")]
    pub output: Option<PathBuf>,
    /// Title of the flame graph.
    #[arg(long, default_value = "Flame Graph")]
    pub title: String,
    /// What the values count (printed after them, e.g. samples, ns, bytes).
    #[arg(long = "countname", value_name = "U")]
    pub count_name: Option<String>,
    /// Colour palette.
    #[arg(long = "colors", value_enum, default_value_t = Palette::Hot)]
    pub colors: Palette,
    /// Keep only the stacks where some frame, or the whole `a;b;c` stack, matches this regex.
    #[arg(long, value_name = "RE")]
    pub grep: Option<String>,
    /// Drop the stacks where some frame, or the whole `a;b;c` stack, matches this regex.
    #[arg(long, value_name = "RE")]
    pub exclude: Option<String>,
}

pub fn run(a: FlameArgs) -> Result<()> {
    let grep = a
        .grep
        .as_deref()
        .map(|re| compile("--grep", re))
        .transpose()?;
    let exclude = a
        .exclude
        .as_deref()
        .map(|re| compile("--exclude", re))
        .transpose()?;
    let unit = a
        .count_name
        .as_deref()
        .map(unit_for_count_name)
        .unwrap_or(Unit::Samples);
    let mut profile = read_folded(&a.input, unit)?;
    let before = profile.len();
    filter(&mut profile, grep.as_ref(), exclude.as_ref());
    if profile.is_empty() {
        if before > 0 {
            say!("myprobe: warning: no stacks left after --grep/--exclude (of {before})");
        } else {
            say!("myprobe: warning: {} holds no stacks", a.input);
        }
    }
    let opts = RenderOptions {
        title: a.title,
        count_name: a.count_name,
        palette: a.colors,
        ..Default::default()
    };
    match &a.output {
        Some(path) => render::write_profile(&profile, Some(path), &opts),
        None => {
            let stdout = io::stdout();
            render::svg(&profile, &opts, BufWriter::new(stdout.lock())).context("writing to stdout")
        }
    }
}

/// Reads folded stacks from a file, or from standard input for `-`; errors name the input.
pub fn read_folded(input: &str, unit: Unit) -> Result<Profile> {
    if input == "-" {
        return folded::read(io::stdin().lock(), unit).context("standard input");
    }
    let path = Path::new(input);
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    folded::read(BufReader::new(file), unit).with_context(|| path.display().to_string())
}

/// Compiles a regex; the error is one line (regex's own message spans several).
pub(crate) fn compile(flag: &str, re: &str) -> Result<Regex> {
    Regex::new(re).map_err(|e| {
        let msg = e.to_string();
        let why = msg
            .lines()
            .find_map(|l| l.trim().strip_prefix("error: "))
            .map(str::to_string)
            .unwrap_or_else(|| msg.split_whitespace().collect::<Vec<_>>().join(" "));
        anyhow::anyhow!("invalid {flag} regex {re:?}: {why}")
    })
}

/// Whether some frame, or the whole `a;b;c` stack, matches `re`.
fn stack_matches(re: &Regex, frames: &[&str]) -> bool {
    frames.iter().any(|f| re.is_match(f)) || re.is_match(&frames.join(";"))
}

/// Keeps the stacks that match `grep` (if any) and do not match `exclude` (if any).
fn filter(profile: &mut Profile, grep: Option<&Regex>, exclude: Option<&Regex>) {
    if grep.is_none() && exclude.is_none() {
        return;
    }
    profile.retain(|frames| {
        grep.is_none_or(|re| stack_matches(re, frames))
            && !exclude.is_some_and(|re| stack_matches(re, frames))
    });
}

/// The unit whose count name is `name` (so that `--countname bytes` gives a bytes pprof), else samples.
fn unit_for_count_name(name: &str) -> Unit {
    [
        Unit::Samples,
        Unit::Picoseconds,
        Unit::Nanoseconds,
        Unit::Microseconds,
        Unit::Bytes,
        Unit::Count,
    ]
    .into_iter()
    .find(|u| u.count_name() == name)
    .unwrap_or(Unit::Samples)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile() -> Profile {
        folded::read(
            "start_thread;do_command;dispatch_command;mysql_execute_command 10\n\
             start_thread;do_command;dispatch_command;ha_innobase::write_row 7\n\
             main;mysqld_main;handle_connections_sockets;poll 5\n\
             start_thread;buf_flush_page_cleaner;os_event_wait 3\n"
                .as_bytes(),
            Unit::Samples,
        )
        .unwrap()
    }

    fn leaves(p: &Profile) -> Vec<String> {
        p.stacks()
            .into_iter()
            .map(|(f, v)| format!("{} {v}", f.last().unwrap()))
            .collect()
    }

    #[test]
    fn grep_keeps_matching_stacks() {
        let mut p = profile();
        filter(
            &mut p,
            Some(&compile("--grep", "start_thread").unwrap()),
            None,
        );
        assert_eq!(
            leaves(&p),
            [
                "os_event_wait 3",
                "ha_innobase::write_row 7",
                "mysql_execute_command 10"
            ]
        );
        assert_eq!(p.total(), 20);
    }

    #[test]
    fn grep_matches_the_joined_stack_too() {
        let mut p = profile();
        filter(
            &mut p,
            Some(&compile("--grep", "do_command;dispatch_command;ha_").unwrap()),
            None,
        );
        assert_eq!(leaves(&p), ["ha_innobase::write_row 7"]);
        // Anchors apply to single frames as well.
        let mut p = profile();
        filter(&mut p, Some(&compile("--grep", "^poll$").unwrap()), None);
        assert_eq!(leaves(&p), ["poll 5"]);
    }

    #[test]
    fn exclude_drops_matching_stacks() {
        let mut p = profile();
        filter(
            &mut p,
            None,
            Some(&compile("--exclude", "os_event_wait|poll").unwrap()),
        );
        assert_eq!(
            leaves(&p),
            ["ha_innobase::write_row 7", "mysql_execute_command 10"]
        );
        let mut p = profile();
        filter(
            &mut p,
            Some(&compile("--grep", "start_thread").unwrap()),
            Some(&compile("--exclude", "innobase").unwrap()),
        );
        assert_eq!(leaves(&p), ["os_event_wait 3", "mysql_execute_command 10"]);
    }

    #[test]
    fn bad_regex_is_one_line() {
        let err = compile("--grep", "dispatch(").unwrap_err().to_string();
        assert_eq!(err, "invalid --grep regex \"dispatch(\": unclosed group");
    }

    #[test]
    fn count_names_map_to_units() {
        assert_eq!(unit_for_count_name("bytes"), Unit::Bytes);
        assert_eq!(unit_for_count_name("ns"), Unit::Nanoseconds);
        assert_eq!(unit_for_count_name("widgets"), Unit::Samples);
    }
}
