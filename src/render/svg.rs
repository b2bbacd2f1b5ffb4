//! Interactive SVG flame graphs, drawn by inferno (the Rust port of flamegraph.pl).

use std::io::Write;

use anyhow::{Context, Result};

use super::RenderOptions;
use crate::profile::Profile;

/// Draws `profile` as a flame graph. An empty profile gives a small valid SVG saying so.
pub fn write(profile: &Profile, opts: &RenderOptions, w: impl Write) -> Result<()> {
    let lines: Vec<String> = profile
        .stacks()
        .into_iter()
        .map(|(frames, value)| format!("{} {}", frames.join(";"), value))
        .collect();
    let count_name = opts.count_name_for(profile);
    write_lines(lines.iter().map(String::as_str), opts, &count_name, w)
}

/// Draws folded lines (`stack VALUE`, or differential `stack BEFORE AFTER`, which inferno colours
/// red/blue by the change) as a flame graph. Lines whose values are all zero give a small valid
/// SVG saying there is nothing to draw, instead of inferno's error.
pub fn write_lines<'a>(
    lines: impl IntoIterator<Item = &'a str>,
    opts: &RenderOptions,
    count_name: &str,
    mut w: impl Write,
) -> Result<()> {
    let lines: Vec<&str> = lines.into_iter().collect();
    // inferno lays the frames out on the 64-bit sum of the values.
    let total = lines
        .iter()
        .filter_map(|l| {
            l.trim()
                .rsplit(char::is_whitespace)
                .next()?
                .parse::<u64>()
                .ok()
        })
        .try_fold(0u64, u64::checked_add)
        .with_context(|| {
            format!(
                "the values add up to more than {}: too much to draw",
                u64::MAX
            )
        })?;
    if total == 0 {
        return write_empty(&opts.title, &mut w);
    }
    let mut o = inferno::flamegraph::Options::default();
    o.title = opts.title.clone();
    o.subtitle = opts.estimate.as_ref().map(|e| format!("Estimated: {e}"));
    o.count_name = count_name.to_string();
    o.colors = opts.palette.to_inferno();
    // Colours from a hash of the function name: the same input always gives the same SVG.
    o.hash = true;
    inferno::flamegraph::from_lines(&mut o, lines, &mut w).context("drawing the flame graph")?;
    w.flush()?;
    Ok(())
}

/// A valid SVG that says there are no stacks to draw.
fn write_empty(title: &str, w: &mut impl Write) -> Result<()> {
    write!(
        w,
        concat!(
            "<?xml version=\"1.0\" standalone=\"no\"?>\n",
            "<svg version=\"1.1\" width=\"1200\" height=\"90\" viewBox=\"0 0 1200 90\" ",
            "xmlns=\"http://www.w3.org/2000/svg\">\n",
            "<rect x=\"0\" y=\"0\" width=\"100%\" height=\"100%\" fill=\"#eeeeee\"/>\n",
            "<text x=\"600\" y=\"30\" text-anchor=\"middle\" font-family=\"Verdana\" font-size=\"17\">{}</text>\n",
            "<text x=\"600\" y=\"60\" text-anchor=\"middle\" font-family=\"Verdana\" font-size=\"12\">",
            "No stacks to draw: the profile is empty.</text>\n",
            "</svg>\n"
        ),
        xml_escape(title)
    )?;
    w.flush()?;
    Ok(())
}

/// Text for XML or HTML content or attribute values: no character can open a tag or end the value.
pub fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Unit;
    use crate::render::Palette;

    fn render(p: &Profile, opts: &RenderOptions) -> String {
        let mut out = Vec::new();
        write(p, opts, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    /// All `<title>` texts of the SVG, parsed as XML (so also checks it is well-formed).
    fn titles(svg: &str) -> Vec<String> {
        use quick_xml::events::Event;
        let mut reader = quick_xml::Reader::from_str(svg);
        let mut titles = Vec::new();
        let mut in_title = false;
        loop {
            match reader.read_event().expect("well-formed XML") {
                Event::Start(e) if e.name().as_ref() == b"title" => in_title = true,
                Event::End(e) if e.name().as_ref() == b"title" => in_title = false,
                Event::Text(t) if in_title => titles.push(t.unescape().unwrap().into_owned()),
                Event::Eof => break,
                _ => {}
            }
        }
        titles
    }

    #[test]
    fn draws_frames_with_title_and_count_name() {
        let mut p = Profile::new(Unit::Bytes);
        p.add(&["main", "alloc"], 300);
        p.add(&["main", "free"], 100);
        let opts = RenderOptions {
            title: "Memory <test>".into(),
            palette: Palette::Mem,
            ..Default::default()
        };
        let svg = render(&p, &opts);
        assert!(svg.contains("Memory &lt;test&gt;"), "title missing");
        assert!(
            !svg.contains("Estimated"),
            "an exact profile has no subtitle"
        );
        let estimated = RenderOptions {
            estimate: Some("scaled ×10.00 from every 10th call".into()),
            ..opts.clone()
        };
        assert!(render(&p, &estimated).contains("Estimated: scaled ×10.00 from every 10th call"));
        let t = titles(&svg);
        assert!(
            t.contains(&"alloc (300 bytes, 75.00%)".to_string()),
            "{t:?}"
        );
        assert!(t.contains(&"free (100 bytes, 25.00%)".to_string()), "{t:?}");
        assert!(
            t.contains(&"main (400 bytes, 100.00%)".to_string()),
            "{t:?}"
        );
        // Deterministic colours: the same profile gives the same SVG.
        assert_eq!(svg, render(&p, &opts));

        let opts = RenderOptions {
            count_name: Some("allocs".into()),
            ..Default::default()
        };
        assert!(titles(&render(&p, &opts)).contains(&"alloc (300 allocs, 75.00%)".to_string()));
    }

    #[test]
    fn values_that_add_up_past_the_largest_are_not_drawn() {
        let lines = ["main;a 18446744073709551615", "main;b 1"];
        let err = write_lines(lines, &RenderOptions::default(), "samples", Vec::new())
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "the values add up to more than 18446744073709551615: too much to draw"
        );
        let mut p = Profile::new(Unit::Bytes);
        p.add(&["main", "a"], u64::MAX);
        p.add(&["main", "b"], u64::MAX);
        assert!(write(&p, &RenderOptions::default(), Vec::new()).is_err());
    }

    #[test]
    fn empty_profile_gives_valid_svg() {
        let p = Profile::new(Unit::Samples);
        let opts = RenderOptions {
            title: "CPU & more".into(),
            ..Default::default()
        };
        let svg = render(&p, &opts);
        let mut reader = quick_xml::Reader::from_str(&svg);
        let mut root = None;
        loop {
            match reader.read_event().expect("well-formed XML") {
                quick_xml::events::Event::Start(e) if root.is_none() => {
                    root = Some(String::from_utf8(e.name().as_ref().to_vec()).unwrap())
                }
                quick_xml::events::Event::Eof => break,
                _ => {}
            }
        }
        assert_eq!(root.as_deref(), Some("svg"));
        assert!(svg.contains("CPU &amp; more"));
        assert!(svg.contains("No stacks to draw"));
    }
}
