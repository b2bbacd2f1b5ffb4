//! The DB load of a range as an inline SVG: a bar per point, stacked by state in the order of the range's table
//! (the largest at the bottom), each part titled with its state and load, a legend, the time axis. Drawn here, so
//! that the page needs nothing from outside.

use std::fmt::Write;

use crate::{history::read::Range, history::time, render::svg::xml_escape as escape};

const WIDTH: f64 = 960.0;
const PLOT_HEIGHT: f64 = 200.0;
const LEFT: f64 = 44.0;
const TOP: f64 = 10.0;

/// A colour per state: the usual ones fixed, so that a row lock is red in every report; the others in turn.
fn colour(state: &str, others: &mut impl Iterator<Item = &'static str>) -> &'static str {
    match state {
        "CPU" => "#2e8b57",
        "run queue" => "#9acd32",
        "row lock" => "#d62728",
        "metadata lock" => "#ff7f0e",
        "table lock" => "#e377c2",
        "client" => "#1f77b4",
        _ => others.next().unwrap_or("#7f7f7f"),
    }
}

const OTHER_COLOURS: [&str; 8] = [
    "#8c564b", "#9467bd", "#17becf", "#bcbd22", "#aec7e8", "#c49c94", "#f7b6d2", "#c5b0d5",
];

/// The chart of `r`'s load by state, `<svg>` whole.
pub fn load(r: &Range) -> String {
    let mut others = OTHER_COLOURS.iter().copied();
    let states: Vec<(&str, &str)> = r
        .states
        .iter()
        .map(|s| (s.key.as_str(), colour(&s.key, &mut others)))
        .collect();
    let columns = ((r.to - r.from + r.step - 1) / r.step).max(1) as f64;
    let peak = r
        .points
        .iter()
        .map(|p| p.load.values().sum::<f64>())
        .fold(0.0, f64::max)
        .max(1.0);
    let legend_rows = states.len().div_ceil(5).max(1) as f64;
    let height = TOP + PLOT_HEIGHT + 24.0 + 18.0 * legend_rows;
    let plot_width = WIDTH - LEFT - 10.0;
    let bar = plot_width / columns;
    let mut s = String::new();
    let _ = write!(
        s,
        "<svg class=\"load-chart\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {WIDTH} {height}\" \
         width=\"{WIDTH}\" height=\"{height}\" role=\"img\" aria-label=\"DB load by state\" \
         font-family=\"system-ui, sans-serif\" font-size=\"11\">"
    );
    // The axes and the peak's level.
    let bottom = TOP + PLOT_HEIGHT;
    let _ = write!(
        s,
        "<line x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{LEFT}\" y2=\"{bottom}\" stroke=\"#888\"/>\
         <line x1=\"{LEFT}\" y1=\"{bottom}\" x2=\"{}\" y2=\"{bottom}\" stroke=\"#888\"/>\
         <text x=\"{}\" y=\"{}\" text-anchor=\"end\">{peak:.1}</text>\
         <text x=\"{}\" y=\"{bottom}\" text-anchor=\"end\">0</text>",
        LEFT + plot_width,
        LEFT - 4.0,
        TOP + 8.0,
        LEFT - 4.0,
    );
    for p in &r.points {
        let x = LEFT + ((p.ts - r.from) / r.step) as f64 * bar;
        let mut y = bottom;
        for (state, fill) in &states {
            let Some(&load) = p.load.get(*state).filter(|l| **l > 0.0) else {
                continue;
            };
            let h = load / peak * PLOT_HEIGHT;
            y -= h;
            let _ = write!(
                s,
                "<rect class=\"load\" data-state=\"{}\" x=\"{x:.2}\" y=\"{y:.2}\" width=\"{:.2}\" height=\"{h:.2}\" \
                 fill=\"{fill}\"><title>{}: {} {load:.2}</title></rect>",
                escape(state),
                (bar - 0.5).max(0.5),
                time::clock(p.ts),
                escape(state),
            );
        }
    }
    let _ = write!(
        s,
        "<text x=\"{LEFT}\" y=\"{}\">{}</text><text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>",
        bottom + 14.0,
        escape(&time::clock(r.from)),
        LEFT + plot_width,
        bottom + 14.0,
        escape(&time::clock(r.to)),
    );
    for (i, (state, fill)) in states.iter().enumerate() {
        let x = LEFT + (i % 5) as f64 * 180.0;
        let y = bottom + 34.0 + (i / 5) as f64 * 18.0;
        let _ = write!(
            s,
            "<g class=\"legend\"><rect x=\"{x}\" y=\"{}\" width=\"11\" height=\"11\" fill=\"{fill}\"/>\
             <text x=\"{}\" y=\"{y}\">{}</text></g>",
            y - 10.0,
            x + 15.0,
            escape(state)
        );
    }
    s.push_str("</svg>");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::read::{Point, Share};

    #[test]
    fn each_state_is_a_part_of_its_bar() {
        let share = |k: &str, load| Share {
            key: k.into(),
            load,
        };
        let r = Range {
            from: 100,
            to: 110,
            step: 5,
            per_minute: false,
            servers: vec!["one".into()],
            points: vec![
                Point {
                    ts: 100,
                    load: [("CPU".to_string(), 1.0)].into(),
                },
                Point {
                    ts: 105,
                    load: [("CPU".to_string(), 1.0), ("row lock".to_string(), 2.0)].into(),
                },
            ],
            states: vec![share("row lock", 1.0), share("CPU", 1.0)],
            statements: Vec::new(),
            users: Vec::new(),
            hosts: Vec::new(),
            blockers: Vec::new(),
        };
        let svg = load(&r);
        assert_eq!(svg.matches("<rect class=\"load\"").count(), 3);
        assert_eq!(svg.matches("data-state=\"row lock\"").count(), 1);
        assert!(svg.contains("fill=\"#d62728\"><title>"));
        assert!(svg.contains("<text x=\"59\" y=\"244\">row lock</text>"));
        assert!(svg.contains(">3.0</text>"), "the peak: {svg}");
    }
}
