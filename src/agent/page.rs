//! The agent's page at `/`: DB load (average active sessions) over a range, stacked by state, with zoom; the top
//! statements, users, hosts and blockers of the range; a moment's sessions and who blocked whom, with the windows
//! kept for it. One HTML file with nothing fetched from elsewhere: page.css and page.js are included as they are,
//! and the script draws everything from `/api/history`, `/api/history/at` and `/api/windows`. Every text those
//! give (statements, users, hosts, objects) is set as text, never as markup.

use crate::{render::svg::xml_escape as escape, server::causes::Cause};

const CSS: &str = include_str!("page.css");
const JS: &str = include_str!("page.js");

/// The page of the agent on `host`, whose CPUs (`cpus`) the chart draws a line at.
pub fn html(host: &str, cpus: usize) -> String {
    // The states in a fixed order, each with its colour's place in the script's palette: the same colour on every
    // load of the page, whatever the range holds.
    let mut states: Vec<&str> = Cause::ALL.iter().map(|c| c.label()).collect();
    states.push(crate::history::IDLE_IN_TRANSACTION);
    let states = escape(&serde_json::to_string(&states).unwrap_or_default());
    let host = escape(host);
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
<title>myprobe agent on {host}</title><style>{CSS}</style></head>\n\
<body data-cpus=\"{cpus}\" data-states=\"{states}\">\n\
<header><h1>myprobe agent on {host}</h1><nav><a href=\"/debug/pprof/\">profiles and windows kept (pprof)</a> \
<a href=\"/metrics\">metrics</a> <a href=\"/healthz\">health</a></nav></header>\n<main>\n\
<section id=\"controls\"><span class=\"presets\">{presets}</span> \
<button id=\"zoom-out\" type=\"button\">zoom out</button> <span id=\"range-text\"></span></section>\n\
<p id=\"status\" role=\"status\"></p>\n\
<div id=\"overview\">\n<section id=\"load\"><h2>DB load: average active sessions, by state</h2>\
<p id=\"servers\"></p><div id=\"chart\"></div><ul id=\"legend\"></ul>\
<p class=\"hint\">Drag across the chart to zoom in; click a moment to see its sessions.</p></section>\n\
<aside id=\"tops\">\
<h3>Top statements</h3><table id=\"top-statements\" class=\"top\"></table>\
<h3>Top users</h3><table id=\"top-users\" class=\"top\"></table>\
<h3>Top hosts</h3><table id=\"top-hosts\" class=\"top\"></table>\
<h3>Top blockers <small>(the load waiting behind each)</small></h3><table id=\"top-blockers\" class=\"top\"></table>\
</aside>\n</div>\n\
<section id=\"moment\" hidden><h2 id=\"moment-title\"></h2><div id=\"moment-servers\"></div>\
<h3>Flame graphs kept for that moment</h3><ul id=\"windows\"></ul></section>\n\
</main>\n<script>{JS}</script>\n</body></html>\n",
        presets = PRESETS
            .iter()
            .map(|(label, s)| format!("<button type=\"button\" data-seconds=\"{s}\">{label}</button>"))
            .collect::<Vec<_>>()
            .join(" ")
    )
}

/// The ranges offered, up to now.
const PRESETS: [(&str, u32); 6] = [
    ("15 min", 900),
    ("1 h", 3600),
    ("6 h", 6 * 3600),
    ("24 h", 86_400),
    ("7 d", 7 * 86_400),
    ("30 d", 30 * 86_400),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_fetches_nothing_from_elsewhere_and_writes_no_markup_from_text() {
        let page = html("db1 <&>", 4);
        for outside in ["src=", "href=\"http", "@import", "url(", "//cdn", "fonts."] {
            assert!(!page.contains(outside), "the page loads {outside}…");
        }
        assert!(page.contains("<title>myprobe agent on db1 &lt;&amp;&gt;</title>"));
        assert!(page.contains("data-cpus=\"4\""));
        assert!(page.contains("&quot;row lock&quot;"));
        // A colour of its own for each state.
        let palette = JS
            .split_once("const PALETTE = [")
            .and_then(|(_, rest)| rest.split_once("];"))
            .map(|(colours, _)| colours.matches("'#").count());
        assert_eq!(palette, Some(Cause::ALL.len() + 1));
        // What the server sends is set as text: the script never parses markup.
        for markup in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
        ] {
            assert!(!JS.contains(markup), "page.js uses {markup}");
        }
    }
}
