//! Renderers: every [`Profile`] can be written as folded text, an SVG flame graph (inferno),
//! JSON, or a gzip-compressed pprof protobuf; `summary` prints a top-functions table.

pub mod json;
mod options;
pub mod pprof;
pub mod queries;
pub mod summary;
pub mod svg;
pub mod tables;

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::profile::{folded, Profile};

pub use options::{Palette, RenderOptions};

/// Text from the traced server or its clients (user and database names, statements, symbols) made safe for a
/// terminal: tabs and line breaks become spaces, and every other control character (C0, DEL, C1: what starts
/// an escape sequence) is written as an escape, `\x1b` or `\u{9b}`, so that nobody who can connect can drive
/// root's terminal.
pub fn terminal_safe(s: &str) -> std::borrow::Cow<'_, str> {
    use std::fmt::Write as _;
    if !s.chars().any(char::is_control) {
        return s.into();
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' | '\r' | '\t' => out.push(' '),
            c if (c as u32) < 0x80 && c.is_control() => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.into()
}

/// Output formats, chosen from the output file's extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Folded,
    Svg,
    Json,
    Pprof,
}

pub const ACCEPTED_EXTENSIONS: &str = ".folded, .txt, .svg, .json, .pb.gz";

/// The format for an output path: `.folded`/`.txt` → folded, `.svg`, `.json`, `.pb.gz` → pprof.
pub fn format_for(path: &Path) -> Result<Format> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    let format = if name.ends_with(".folded") || name.ends_with(".txt") {
        Format::Folded
    } else if name.ends_with(".svg") {
        Format::Svg
    } else if name.ends_with(".json") {
        Format::Json
    } else if name.ends_with(".pb.gz") {
        Format::Pprof
    } else {
        bail!(
            "cannot tell the output format of {}: use one of the extensions {ACCEPTED_EXTENSIONS}",
            path.display()
        );
    };
    Ok(format)
}

/// Writes `profile` to `out` in the format its extension names; `None` → folded text on stdout.
pub fn write_profile(profile: &Profile, out: Option<&Path>, opts: &RenderOptions) -> Result<()> {
    let Some(path) = out else {
        let stdout = io::stdout();
        folded::write(profile, BufWriter::new(stdout.lock())).context("writing to stdout")?;
        return Ok(());
    };
    let format = format_for(path)?;
    let file = File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    write_format(profile, format, opts, BufWriter::new(file))
        .with_context(|| format!("writing {}", path.display()))
}

/// Writes `profile` in `format` to `w`.
pub fn write_format(
    profile: &Profile,
    format: Format,
    opts: &RenderOptions,
    mut w: impl Write,
) -> Result<()> {
    match format {
        Format::Folded => folded::write(profile, &mut w)?,
        Format::Svg => svg::write(profile, opts, &mut w)?,
        Format::Json => json::write(profile, opts, &mut w)?,
        Format::Pprof => pprof::write(profile, opts, &mut w)?,
    }
    w.flush()?;
    Ok(())
}

/// Draws `profile` as an interactive SVG flame graph (inferno).
pub fn svg(profile: &Profile, opts: &RenderOptions, w: impl Write) -> Result<()> {
    svg::write(profile, opts, w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn formats_from_extensions() {
        let f = |s: &str| format_for(&PathBuf::from(s));
        assert_eq!(f("out.folded").unwrap(), Format::Folded);
        assert_eq!(f("/tmp/x/out.txt").unwrap(), Format::Folded);
        assert_eq!(f("out.SVG").unwrap(), Format::Svg);
        assert_eq!(f("out.json").unwrap(), Format::Json);
        assert_eq!(f("cpu.pb.gz").unwrap(), Format::Pprof);
        for bad in ["out.gz", "out.png", "out", "dir/"] {
            let err = f(bad).unwrap_err().to_string();
            assert!(err.contains(ACCEPTED_EXTENSIONS), "{bad}: {err}");
        }
    }

    #[test]
    fn write_profile_picks_format_from_extension() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let mut p = Profile::new(crate::profile::Unit::Samples);
        p.add(&["main", "a"], 3);
        let opts = RenderOptions::default();

        let folded_path = dir.join("p.folded");
        write_profile(&p, Some(&folded_path), &opts).unwrap();
        assert_eq!(std::fs::read_to_string(&folded_path).unwrap(), "main;a 3\n");

        let json_path = dir.join("p.json");
        write_profile(&p, Some(&json_path), &opts).unwrap();
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&json_path).unwrap()).unwrap();
        assert_eq!(v["total"], 3);

        let svg_path = dir.join("p.svg");
        write_profile(&p, Some(&svg_path), &opts).unwrap();
        assert!(std::fs::read_to_string(&svg_path).unwrap().contains("<svg"));

        let pb_path = dir.join("p.pb.gz");
        write_profile(&p, Some(&pb_path), &opts).unwrap();
        assert_eq!(&std::fs::read(&pb_path).unwrap()[..2], &[0x1f, 0x8b]);

        assert!(write_profile(&p, Some(&dir.join("p.png")), &opts).is_err());
        assert!(!dir.join("p.png").exists());
    }
}
