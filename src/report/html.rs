//! The report as one self-contained HTML file: no network, no CDN. Each flame graph is inferno's SVG, whole,
//! in an `<iframe srcdoc>` of its own, so that its script (search, zoom) runs as in the SVG file alone and
//! the graphs do not share ids or globals. `report.css` and `report.js` are included as they are.

use std::fmt::Write;

use super::{Past, ProfileSection, Report};
use crate::{
    history::{
        read::{chains, Share},
        text::{holder_words, seconds, state_words, waiter_words, who},
        time,
    },
    query::TimeParts,
    render::{
        queries::{clip, human_us},
        svg::xml_escape as escape,
    },
    stacks,
};

const CSS: &str = include_str!("report.css");
const JS: &str = include_str!("report.js");

/// The colour of each part of a statement's time, in `TimeParts::NAMES` order.
const PART_COLOURS: [&str; crate::query::PARTS] = [
    "#e4572e", "#f3a712", "#a8c686", "#8e44ad", "#29335c", "#669bbc", "#1b998b", "#7b9e89",
    "#b0a990", "#c9e4ca", "#dddddd",
];

/// What each part means, for the legend (`TimeParts::NAMES` order).
const PART_LABELS: [&str; crate::query::PARTS] = [
    "CPU (user)",
    "CPU (kernel)",
    "run queue",
    "locks",
    "read",
    "write",
    "fsync",
    "network",
    "other syscalls",
    "SLEEP()",
    "unseen",
];

/// A `srcdoc` is parsed as HTML, where an SVG without a width attribute (inferno's fluid drawing removes it)
/// is 300 px wide: the page makes it as wide as the frame. And inferno's script records its search and zoom
/// in the URL (`history.replaceState`), which a `srcdoc` document may not do: the call throws and the search
/// stops half done; here it does nothing.
const SRCDOC_HEAD: &str = "<!DOCTYPE html><html><head><meta charset=\"utf-8\">\
<style>body{margin:0}body>svg{display:block;width:100%}</style>\
<script>(function(){var r=history.replaceState;\
history.replaceState=function(){try{return r.apply(history,arguments)}catch(e){}}})()</script></head><body>";

/// The flame graph's page for its frame, from its `<svg>` root on, and its height in pixels.
fn framed_svg(svg: &str) -> (String, u64) {
    let svg = svg.find("<svg").map_or(svg, |at| &svg[at..]);
    let height = svg
        .split('>')
        .next()
        .and_then(|root| root.split_once(" height=\""))
        .and_then(|(_, rest)| rest.split('"').next()?.parse().ok())
        .unwrap_or(400);
    (format!("{SRCDOC_HEAD}{svg}</body></html>"), height)
}

pub fn render(r: &Report) -> String {
    let mut h = String::with_capacity(1 << 20);
    let title = format!("myprobe report: {}", r.target);
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{}</title><style>{CSS}</style></head><body>\n",
        escape(&title)
    );
    let _ = write!(
        h,
        "<header><h1>{}</h1><p class=\"meta\">host <b>{}</b> · traced from <b>{}</b> for <b>{:.1} s</b> · \
         myprobe {}</p><nav><a href=\"#findings\">Findings</a> <a href=\"#statements\">Statements</a> \
         <a href=\"#profiles\">Flame graphs</a> <a href=\"#locks\">Locks</a> <a href=\"#threads\">Threads</a>\
         </nav></header>\n<main>\n",
        escape(&title),
        escape(&r.host),
        escape(&r.started),
        r.traced.as_secs_f64(),
        env!("CARGO_PKG_VERSION"),
    );
    findings(&mut h, &r.findings);
    statements(&mut h, r);
    profiles(&mut h, &r.profiles, |p| {
        format!(
            "{} events, total {} {}.",
            p.events,
            p.profile.total(),
            p.profile.unit.count_name()
        )
    });
    locks(&mut h, r);
    threads(&mut h, r);
    let _ = write!(h, "</main>\n<script>{JS}</script>\n</body></html>\n");
    h
}

/// The page of a past range: its findings, its DB load by state, the top statements, users, hosts and blockers, the
/// moments sessions waited longest behind a connection (as `myprobe history --at` says them), and the flame graphs
/// of the windows kept.
pub fn render_past(p: &Past) -> String {
    let mut h = String::with_capacity(1 << 20);
    let title = format!(
        "myprobe report: {}, {} to {}",
        p.host,
        time::format(p.from),
        time::format(p.to)
    );
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{}</title><style>{CSS}</style></head><body>\n",
        escape(&title)
    );
    let servers = p
        .range
        .as_ref()
        .map(|r| r.servers.join("; "))
        .unwrap_or_default();
    let _ = write!(
        h,
        "<header><h1>{}</h1><p class=\"meta\">from what the agent kept in <b>{}</b> · servers <b>{}</b> · \
         myprobe {}</p><nav><a href=\"#findings\">Findings</a> <a href=\"#load\">DB load</a> \
         <a href=\"#top\">Top</a> <a href=\"#moments\">Blocked sessions</a> <a href=\"#profiles\">Flame graphs</a>\
         </nav></header>\n<main>\n",
        escape(&title),
        escape(&p.dir),
        escape(&servers),
        env!("CARGO_PKG_VERSION"),
    );
    findings(&mut h, &p.findings);
    load(&mut h, p);
    top(&mut h, p);
    moments(&mut h, p);
    let span = p.windows_span.map_or(String::new(), |(a, b)| {
        format!(", together from {} to {}", time::clock(a), time::clock(b))
    });
    profiles(&mut h, &p.profiles, |s| {
        format!(
            "{} windows kept{span}, total {} {}.",
            s.events,
            s.profile.total(),
            s.profile.unit.count_name()
        )
    });
    let _ = write!(h, "</main>\n<script>{JS}</script>\n</body></html>\n");
    h
}

/// The range's DB load by state: the chart and its table.
fn load(h: &mut String, p: &Past) {
    h.push_str("<section id=\"load\"><h2>DB load by state</h2>\n");
    let Some(r) = &p.range else {
        h.push_str(
            "<p class=\"none\">No session history of the range (see the findings).</p></section>\n",
        );
        return;
    };
    let source = if r.per_minute {
        "from the per-minute sums"
    } else {
        "from every second sampled"
    };
    let _ = writeln!(
        h,
        "<p>Average active sessions, {source}; a bar is {} s. A session idle in its transaction is not load.</p>\n{}",
        r.step,
        super::chart::load(r)
    );
    share_table(h, "load-states", "State", &r.states);
    h.push_str("</section>\n");
}

/// A top list as a table: its key, its load and its share of the range's load.
fn share_table(h: &mut String, id: &str, what: &str, shares: &[Share]) {
    if shares.is_empty() {
        let _ = writeln!(h, "<p class=\"none\" id=\"{id}\">None.</p>");
        return;
    }
    let total: f64 = shares
        .iter()
        .map(|s| s.load)
        .sum::<f64>()
        .max(f64::MIN_POSITIVE);
    let _ = writeln!(
        h,
        "<table id=\"{id}\" class=\"sortable\"><thead><tr><th data-type=\"text\">{what}</th>\
         <th>Load (AAS)</th><th>Share</th></tr></thead><tbody>"
    );
    for s in shares {
        let share = 100.0 * s.load / total;
        let _ = writeln!(
            h,
            "<tr><td class=\"fp\">{}</td><td data-v=\"{:.4}\">{:.2}</td><td data-v=\"{share:.3}\">{share:.0}%</td></tr>",
            escape(&s.key),
            s.load,
            s.load
        );
    }
    h.push_str("</tbody></table>\n");
}

fn top(h: &mut String, p: &Past) {
    h.push_str("<section id=\"top\"><h2>Top statements, users, hosts and blockers</h2>\n");
    let Some(r) = &p.range else {
        h.push_str("<p class=\"none\">No session history of the range.</p></section>\n");
        return;
    };
    for (id, title, what, shares) in [
        ("top-statements", "Statements", "Statement", &r.statements),
        ("top-users", "Users", "User", &r.users),
        ("top-hosts", "Hosts", "Host", &r.hosts),
        (
            "top-blockers",
            "Blockers: the load that waited behind each",
            "Connection",
            &r.blockers,
        ),
    ] {
        let _ = writeln!(h, "<h3>{title}</h3>");
        share_table(h, id, what, shares);
    }
    h.push_str("</section>\n");
}

/// Each connection others waited behind: its server's sessions at the second the most waited, and the chains.
fn moments(h: &mut String, p: &Past) {
    h.push_str("<section id=\"moments\"><h2>Sessions blocked longest</h2>\n");
    if p.incidents.is_empty() {
        h.push_str(
            "<p class=\"none\">No session waited behind another in the range.</p></section>\n",
        );
        return;
    }
    for (n, i) in p.incidents.iter().enumerate() {
        let x = &i.incident;
        let _ = writeln!(
            h,
            "<section class=\"moment\" id=\"moment-{n}\" data-blocker=\"{}\"><h3>At {}: {} sessions waited behind \
             connection {} ({})</h3>",
            x.root_blocker,
            escape(&time::format(x.worst)),
            x.waiters,
            x.root_blocker,
            escape(&x.server)
        );
        let Some(m) = &i.moment else {
            h.push_str(
                "<p class=\"none\">The sessions of that second are no longer kept.</p></section>\n",
            );
            continue;
        };
        h.push_str(
            "<table class=\"sessions sortable\"><thead><tr><th>Connection</th><th data-type=\"text\">User@host</th>\
             <th data-type=\"text\">Database</th><th>For</th><th data-type=\"text\">State</th>\
             <th data-type=\"text\">Statement</th></tr></thead><tbody>\n",
        );
        for s in &m.sessions {
            let _ = writeln!(
                h,
                "<tr><td data-v=\"{}\">{}</td><td>{}</td><td>{}</td><td data-v=\"{}\">{}</td><td>{}</td>\
                 <td class=\"fp\">{}</td></tr>",
                s.conn,
                s.conn,
                escape(&who(s)),
                escape(s.db.as_deref().unwrap_or("")),
                s.statement_s.unwrap_or(0.0),
                s.statement_s.map_or(String::new(), seconds),
                escape(&state_words(s)),
                escape(s.statement.as_deref().unwrap_or("")),
            );
        }
        h.push_str("</tbody></table>\n<ul class=\"chains\">\n");
        for (root, waiters) in chains(&m.sessions) {
            let holder = m.sessions.iter().find(|s| s.conn == root);
            let _ = write!(
                h,
                "<li class=\"holder\" data-conn=\"{root}\">{}<ul>",
                escape(&holder_words(root, holder))
            );
            for w in waiters {
                let _ = write!(h, "<li>← {}</li>", escape(&waiter_words(w)));
            }
            h.push_str("</ul></li>\n");
        }
        h.push_str("</ul></section>\n");
    }
    h.push_str("</section>\n");
}

fn findings(h: &mut String, findings: &[String]) {
    h.push_str("<section id=\"findings\"><h2>Findings</h2><ol>\n");
    for f in findings {
        let _ = writeln!(h, "<li>{}</li>", escape(f));
    }
    h.push_str("</ol></section>\n");
}

fn statements(h: &mut String, r: &Report) {
    h.push_str("<section id=\"statements\"><h2>Statements</h2>\n");
    let Some(s) = &r.statements else {
        h.push_str(
            "<p class=\"none\">Statements were not traced (see the findings).</p></section>\n",
        );
        return;
    };
    let grand = s
        .rows
        .iter()
        .map(|r| r.total_us)
        .fold(0, u64::saturating_add);
    let _ = write!(
        h,
        "<p>{} statements traced, {} distinct fingerprints; each row's bar splits its time into parts that add \
         up to its total. Click a column to sort.</p>\n<p class=\"legend\">",
        s.followed.seen,
        s.rows.len()
    );
    for (label, colour) in PART_LABELS.iter().zip(PART_COLOURS) {
        let _ = write!(
            h,
            "<span><i style=\"background:{colour}\"></i>{label}</span> "
        );
    }
    h.push_str("</p>\n<table id=\"digest\" class=\"sortable\"><thead><tr>\
        <th data-type=\"text\">Fingerprint</th><th>Count</th><th>Errors</th><th>Total</th><th>Share</th>\
        <th>Avg</th><th>p50</th><th>p95</th><th>p99</th><th>Max</th><th class=\"nosort\">Time by part</th>\
        </tr></thead><tbody>\n");
    for row in s.rows.iter().take(r.top) {
        let share = if grand > 0 {
            row.total_us as f64 * 100.0 / grand as f64
        } else {
            0.0
        };
        let graphs = s
            .graphs
            .iter()
            .position(|(fp, _)| *fp == row.fingerprint)
            .map_or(String::new(), |n| {
                format!(" <a class=\"graphs\" href=\"#graphs-{n}\">flame graphs</a>")
            });
        let _ = write!(
            h,
            "<tr><td class=\"fp\" title=\"{}\">{}{graphs}</td><td data-v=\"{}\">{}</td><td data-v=\"{}\">{}</td>",
            escape(&row.fingerprint),
            escape(&clip(&row.fingerprint, 120)),
            row.count,
            row.count,
            row.errors,
            row.errors,
        );
        let _ = write!(
            h,
            "<td data-v=\"{}\">{}</td>",
            row.total_us,
            human_us(row.total_us)
        );
        let _ = write!(h, "<td data-v=\"{share:.3}\">{share:.1}%</td>");
        for us in [row.avg_us, row.p50_us, row.p95_us, row.p99_us, row.max_us] {
            let _ = write!(h, "<td data-v=\"{us}\">{}</td>", human_us(us));
        }
        h.push_str("<td><div class=\"bar\">");
        for ((name, pct), (colour, (label, us))) in
            TimeParts::NAMES.iter().zip(row.shares.values()).zip(
                PART_COLOURS
                    .iter()
                    .zip(PART_LABELS.iter().zip(row.time.values())),
            )
        {
            if pct > 0.0 {
                let _ = write!(
                    h,
                    "<span class=\"part-{name}\" style=\"width:{pct}%;background:{colour}\" \
                     title=\"{label}: {pct:.1}% ({})\"></span>",
                    human_us(us)
                );
            }
        }
        h.push_str("</div></td></tr>\n");
    }
    h.push_str("</tbody></table>\n");
    if s.rows.len() > r.top {
        let _ = writeln!(
            h,
            "<p class=\"none\">{} more fingerprints not shown (--top).</p>",
            s.rows.len() - r.top
        );
    }
    let lost = s.followed.lost.report(s.followed.seen);
    notes(h, &lost);
    statement_graphs(h, &s.graphs);
    h.push_str("</section>\n");
}

/// Each of the top statements' own flame graphs, opened from its row.
fn statement_graphs(h: &mut String, graphs: &[(String, Vec<ProfileSection>)]) {
    if graphs.is_empty() {
        return;
    }
    h.push_str(
        "<section id=\"statement-graphs\"><h3>Flame graphs by statement</h3>\n<p>Each statement's own samples: those \
         its connection's thread took while running it.</p>\n",
    );
    for (n, (fingerprint, sections)) in graphs.iter().enumerate() {
        let _ = writeln!(
            h,
            "<details id=\"graphs-{n}\" class=\"statement-graphs\"><summary>{}</summary>",
            escape(&clip(fingerprint, 160))
        );
        for p in sections {
            let _ = writeln!(
                h,
                "<section class=\"profile\" data-profile=\"{}\"><h4>{}</h4><p>{} events, total {} {}.</p>",
                p.id,
                escape(&p.title),
                p.events,
                p.profile.total(),
                p.profile.unit.count_name()
            );
            flame(h, p);
            h.push_str("</section>\n");
        }
        h.push_str("</details>\n");
    }
    h.push_str("</section>\n");
}

/// A flame graph in its frame, or that nothing was traced.
fn flame(h: &mut String, p: &ProfileSection) {
    if p.svg.is_empty() {
        h.push_str("<p class=\"none\">Nothing was traced.</p>");
        return;
    }
    let (svg, height) = framed_svg(&p.svg);
    let _ = writeln!(
        h,
        "<iframe class=\"flame\" title=\"{}\" style=\"height:{}px\" srcdoc=\"{}\"></iframe>",
        escape(&p.title),
        height + 4,
        escape(&svg)
    );
}

/// The flame graphs, each with the line `about` says of it.
fn profiles(
    h: &mut String,
    sections: &[ProfileSection],
    about: impl Fn(&ProfileSection) -> String,
) {
    h.push_str(
        "<section id=\"profiles\"><h2>Flame graphs</h2>\n<form id=\"flame-search-form\"><label>Search every \
         flame graph (a regular expression): <input id=\"flame-search\" type=\"search\" placeholder=\"e.g. \
         ^ha_innobase::\"></label> <button type=\"submit\">Search</button> <button type=\"button\" \
         id=\"flame-reset\">Reset</button> <span id=\"search-status\"></span></form>\n\
         <p>Click a frame to zoom, Ctrl-F or the search box to highlight functions.</p>\n",
    );
    for p in sections {
        let _ = writeln!(
            h,
            "<section class=\"profile\" id=\"profile-{}\" data-profile=\"{}\"><h3>{}</h3><p>{}</p>",
            p.id,
            p.id,
            escape(&p.title),
            escape(&about(p)),
        );
        flame(h, p);
        notes(h, &p.lost);
        h.push_str("</section>\n");
    }
    h.push_str("</section>\n");
}

fn locks(h: &mut String, r: &Report) {
    h.push_str("<section id=\"locks\"><h2>Lock waits</h2>\n");
    if r.locks.is_empty() {
        h.push_str("<p class=\"none\">No lock wait was traced.</p></section>\n");
        return;
    }
    h.push_str(
        "<p>Futex waits by lock word: the variable that holds it, its kind, and where it was waited for; the \
         stacks that waited longest and those that woke the waiters (the holders releasing it).</p>\n\
         <table id=\"lock-table\" class=\"sortable\"><thead><tr><th data-type=\"text\">Lock</th>\
         <th data-type=\"text\">Kind</th><th data-type=\"text\">Site</th><th>Waits</th><th>Total</th><th>Max</th>\
         <th class=\"nosort\">Waited in</th><th class=\"nosort\">Woken by</th></tr></thead><tbody>\n",
    );
    let meanings = super::findings::SiteMeanings::of(r);
    for l in r.locks.iter().take(r.top) {
        let site = l
            .site
            .as_deref()
            .map(|s| match meanings.meaning(s) {
                Some(m) => format!("{s} ({m})"),
                None => s.to_string(),
            })
            .unwrap_or_default();
        let stack =
            |list: &[(u64, String)]| list.first().map(|(_, s)| escape(s)).unwrap_or_default();
        let _ = writeln!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td data-v=\"{}\">{}</td><td data-v=\"{}\">{}</td>\
             <td data-v=\"{}\">{}</td><td class=\"stack\">{}</td><td class=\"stack\">{}</td></tr>",
            escape(&l.name),
            l.kind.map(|k| k.label()).unwrap_or("-"),
            escape(&site),
            l.waits,
            l.waits,
            l.total_ns,
            human_us(l.total_ns / 1000),
            l.max_ns,
            human_us(l.max_ns / 1000),
            stack(&l.waiters),
            stack(&l.wakers),
        );
    }
    h.push_str("</tbody></table></section>\n");
}

fn threads(h: &mut String, r: &Report) {
    h.push_str("<section id=\"threads\"><h2>Threads when tracing ended</h2>\n");
    if r.threads.is_empty() {
        h.push_str(
            "<p class=\"none\">The threads were not read (see the findings).</p></section>\n",
        );
        return;
    }
    let _ = writeln!(
        h,
        "<p>{} threads, read without stopping any; identical stacks merged (pt-pmp's view), most threads \
         first.</p>",
        r.threads.len()
    );
    let _ = writeln!(
        h,
        "<pre class=\"threads\">{}</pre>",
        escape(&stacks::render_groups(&r.threads))
    );
    h.push_str("</section>\n");
}

fn notes(h: &mut String, lines: &[String]) {
    for l in lines {
        let _ = writeln!(h, "<p class=\"warning\">lost: {}</p>", escape(l));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_cannot_open_a_tag_or_leave_an_attribute() {
        let hostile = "</script><img src=x onerror=alert(1)>\"'&";
        let e = escape(hostile);
        assert!(!e.contains('<') && !e.contains('>') && !e.contains('"') && !e.contains('\''));
        assert_eq!(
            e,
            "&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;&quot;&apos;&amp;"
        );
    }

    #[test]
    fn the_svg_gets_its_page() {
        let svg = "<?xml version=\"1.0\"?><svg version=\"1.1\" width=\"1200\" height=\"134\" onload=\"init(evt)\"><g/></svg>";
        let (page, height) = framed_svg(svg);
        assert_eq!(height, 134);
        assert!(page.starts_with(SRCDOC_HEAD));
        assert!(page.ends_with("<svg version=\"1.1\" width=\"1200\" height=\"134\" onload=\"init(evt)\"><g/></svg></body></html>"));
        let (_, unknown) = framed_svg("<svg><g height=\"9\"/></svg>");
        assert_eq!(unknown, 400);
    }
}
