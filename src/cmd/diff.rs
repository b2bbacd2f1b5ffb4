//! `myprobe diff BEFORE.folded AFTER.folded [-o OUT.svg] [--normalize]`: a red/blue differential
//! flame graph drawn on AFTER, as `difffolded.pl BEFORE AFTER | flamegraph.pl` draws it (inferno's
//! `differential` then `flamegraph`). Red frames grew, blue ones shrank.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};

use crate::cmd::flame::{compile, read_folded};
use crate::profile::{folded, Profile, Unit};
use crate::render::{self, pprof, Format, Palette, RenderOptions};

#[derive(clap::Args)]
pub struct DiffArgs {
    /// Folded stacks of the baseline; `-` reads standard input.
    #[arg(value_name = "BEFORE.folded")]
    pub before: String,
    /// Folded stacks to compare with the baseline; the graph is drawn on these.
    #[arg(value_name = "AFTER.folded")]
    pub after: String,
    /// Output: .svg draws the graph, .folded/.txt writes the differential lines
    /// (`stack BEFORE AFTER`). Without it, the SVG goes to standard output.
    #[arg(short = 'o', long = "output", value_name = "OUT.svg")]
    pub output: Option<PathBuf>,
    /// Scale BEFORE's values so that its total matches AFTER's (compare shapes, not load).
    #[arg(long)]
    pub normalize: bool,
    /// Title of the flame graph.
    #[arg(long, default_value = "Differential Flame Graph")]
    pub title: String,
    /// What the values count (printed after them).
    #[arg(long = "countname", value_name = "U", default_value = "samples")]
    pub count_name: String,
    /// Background palette (frames are coloured red/blue by their change).
    #[arg(long = "colors", value_enum, default_value_t = Palette::Hot)]
    pub colors: Palette,
    /// Compare one statement's samples: those whose statement (the root frame of a profile made with `--by
    /// statement`, or a pprof sample's `db_query_summary` label, as the agent's windows have) this regular
    /// expression matches, without that root
    #[arg(long, value_name = "REGEX")]
    pub statement: Option<String>,
}

pub fn run(a: DiffArgs) -> Result<()> {
    if a.before == "-" && a.after == "-" {
        bail!("BEFORE and AFTER cannot both be standard input");
    }
    let format = a.output.as_deref().map(render::format_for).transpose()?;
    if let (Some(Format::Json | Format::Pprof), Some(path)) = (format, &a.output) {
        bail!("diff writes .svg or .folded/.txt, not {}", path.display());
    }
    let statement = a
        .statement
        .as_deref()
        .map(|re| compile("--statement", re))
        .transpose()?;
    let lines = differential(&a.before, &a.after, a.normalize, statement.as_ref())?;
    let opts = RenderOptions {
        title: a.title,
        palette: a.colors,
        ..Default::default()
    };
    let write = |w: &mut dyn Write| -> Result<()> {
        if format == Some(Format::Folded) {
            for line in &lines {
                writeln!(w, "{line}")?;
            }
            w.flush()?;
            Ok(())
        } else {
            render::svg::write_lines(lines.iter().map(String::as_str), &opts, &a.count_name, w)
        }
    };
    match &a.output {
        Some(path) => {
            let file =
                File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
            write(&mut BufWriter::new(file)).with_context(|| format!("writing {}", path.display()))
        }
        None => write(&mut BufWriter::new(io::stdout().lock())).context("writing to stdout"),
    }
}

/// The largest total of an input: inferno draws a change as the signed 64-bit difference of the two values,
/// after scaling BEFORE in floating point with `--normalize` (2^62 leaves room for its rounding).
const MAX_TOTAL: u64 = 1 << 62;

/// The differential folded lines `stack BEFORE AFTER` of two profiles (folded, or pprof), sorted by stack: with
/// `statement`, of that statement's samples alone. Both inputs are checked (a corrupt line is an error naming its
/// file and line) and handed to inferno's `differential`, which merges them and, with `normalize`, scales BEFORE.
pub fn differential(
    before: &str,
    after: &str,
    normalize: bool,
    statement: Option<&regex::Regex>,
) -> Result<Vec<String>> {
    let canonical = |input: &str| -> Result<Vec<u8>> {
        let profile = read_input(input, statement)?;
        if profile.total() > MAX_TOTAL {
            bail!("{input}: the values add up to more than {MAX_TOTAL}, too much to compare");
        }
        let mut text = Vec::new();
        folded::write(&profile, &mut text)?;
        Ok(text)
    };
    let (b, af) = (canonical(before)?, canonical(after)?);
    let opt = inferno::differential::Options {
        normalize,
        ..Default::default()
    };
    let mut out = Vec::new();
    inferno::differential::from_readers(opt, b.as_slice(), af.as_slice(), &mut out)
        .context("computing the differential")?;
    let text = String::from_utf8(out).context("differential output is not UTF-8")?;
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    lines.sort_by(|x, y| stack_of(x).cmp(stack_of(y)).then(x.cmp(y)));
    Ok(lines)
}

/// A profile to compare, folded or pprof (by its first bytes), of `statement`'s samples alone where given.
fn read_input(input: &str, statement: Option<&regex::Regex>) -> Result<Profile> {
    let bytes = match input {
        "-" => None,
        path => Some(std::fs::read(path).with_context(|| format!("cannot open {path}"))?),
    };
    let pprof = bytes.as_deref().and_then(|b| {
        let pprof = b.starts_with(&[0x1f, 0x8b]);
        pprof.then(|| pprof::decode(b))
    });
    let Some(message) = pprof else {
        let profile = read_folded(input, Unit::Samples)?;
        return Ok(match statement {
            Some(re) => statement_s_own(&profile, re),
            None => profile,
        });
    };
    let message = message.with_context(|| input.to_string())?;
    let profile = match statement {
        Some(re) => pprof::profile_labelled(&message, "db_query_summary", re),
        None => pprof::profile_of(&message),
    };
    profile.with_context(|| format!("{input}: its values are in no unit a profile has"))
}

/// The stacks of a `--by statement` profile whose root (the statement) `re` matches, that root left out.
fn statement_s_own(profile: &Profile, re: &regex::Regex) -> Profile {
    let mut own = Profile::new(profile.unit);
    for (frames, value) in profile.stacks() {
        if let Some((_, rest)) = frames.split_first().filter(|(root, _)| re.is_match(root)) {
            own.add(rest, value);
        }
    }
    own
}

/// The stack part of a differential line (before its two value columns).
fn stack_of(line: &str) -> &str {
    let mut s = line;
    for _ in 0..2 {
        s = s.rsplit_once(' ').map_or(s, |(head, _)| head);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stack_part() {
        assert_eq!(stack_of("main;a;x 10 15"), "main;a;x");
        assert_eq!(stack_of("main;f(a, b) 1 2"), "main;f(a, b)");
    }

    #[test]
    fn values_too_large_to_subtract_are_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let (b, a) = (dir.join("b.folded"), dir.join("a.folded"));
        std::fs::write(&b, "main;a 9223372036854775808\n").unwrap();
        std::fs::write(&a, "main;a 1\n").unwrap();
        let args = |before: &std::path::Path, after: &std::path::Path| DiffArgs {
            before: before.to_str().unwrap().into(),
            after: after.to_str().unwrap().into(),
            output: Some(dir.join("out.svg")),
            normalize: false,
            title: "t".into(),
            count_name: "samples".into(),
            colors: Palette::Hot,
            statement: None,
        };
        for (before, after) in [(&b, &a), (&a, &b)] {
            let err = format!("{:#}", run(args(before, after)).unwrap_err());
            assert!(
                err.ends_with(
                    ": the values add up to more than 4611686018427387904, too much to compare"
                ),
                "{err}"
            );
        }
        std::fs::write(&b, "main;a 4611686018427387904\n").unwrap();
        run(args(&b, &a)).unwrap();
    }

    #[test]
    fn one_statement_s_samples_are_compared_from_folded_roots_or_pprof_labels() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let (b, a) = (dir.join("b.folded"), dir.join("a.folded"));
        std::fs::write(&b, "select ?;main;a 10\ncommit;main;sync 7\n").unwrap();
        // The same statement's samples, another statement's not compared.
        std::fs::write(
            &a,
            "select ?;main;a 4\nselect ?;main;b 6\ncommit;main;sync 70\n",
        )
        .unwrap();
        let select = regex::Regex::new("^select").unwrap();
        let (bs, as_) = (b.to_str().unwrap(), a.to_str().unwrap());
        assert_eq!(
            differential(bs, as_, false, Some(&select)).unwrap(),
            ["main;a 10 4", "main;b 0 6"]
        );
        // The agent's windows: pprof samples labelled with their statement.
        let pprof_of = |stacks: &[(&[&str], &str, u64)], path: &std::path::Path| {
            let mut p = Profile::new(Unit::Samples);
            for (frames, statement, value) in stacks {
                let ids = frames.iter().map(|f| p.intern(f)).collect();
                let labels = p.intern_labels(vec![("db_query_summary", statement.to_string())]);
                p.add_labelled(ids, labels, *value);
            }
            pprof::write(
                &p,
                &RenderOptions::default(),
                std::fs::File::create(path).unwrap(),
            )
            .unwrap();
        };
        let (bp, ap) = (dir.join("b.pb.gz"), dir.join("a.pb.gz"));
        pprof_of(
            &[
                (&["main", "a"], "select ?", 10),
                (&["main", "sync"], "commit", 7),
            ],
            &bp,
        );
        pprof_of(
            &[
                (&["main", "a"], "select ?", 4),
                (&["main", "sync"], "commit", 70),
            ],
            &ap,
        );
        assert_eq!(
            differential(
                bp.to_str().unwrap(),
                ap.to_str().unwrap(),
                false,
                Some(&select)
            )
            .unwrap(),
            ["main;a 10 4"]
        );
    }

    #[test]
    fn merges_and_normalizes() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let (b, a) = (dir.join("b.folded"), dir.join("a.folded"));
        std::fs::write(&b, "main;a;x 10\nmain;b 5\n").unwrap();
        std::fs::write(&a, "main;a;x 15\nmain;b 2\nmain;c 4\n").unwrap();
        let (bs, as_) = (b.to_str().unwrap(), a.to_str().unwrap());
        assert_eq!(
            differential(bs, as_, false, None).unwrap(),
            ["main;a;x 10 15", "main;b 5 2", "main;c 0 4"]
        );
        // BEFORE total 15 scaled to AFTER total 21: 10 → 14, 5 → 7.
        assert_eq!(
            differential(bs, as_, true, None).unwrap(),
            ["main;a;x 14 15", "main;b 7 2", "main;c 0 4"]
        );
        std::fs::write(&b, "main;a;x 10\nmain;b five\n").unwrap();
        let err = format!("{:#}", differential(bs, as_, false, None).unwrap_err());
        assert!(
            err.ends_with("b.folded: line 2: expected `frame;frame VALUE`, got \"main;b five\""),
            "{err}"
        );
    }
}
