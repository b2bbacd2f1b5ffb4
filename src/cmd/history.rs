//! `myprobe history`: what the agent's session history kept, over a range or at a moment, read from its store
//! (the file, even while the agent writes it) or from a running agent over HTTP.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use crate::history::{read, store::Store, text, time};

#[derive(Args)]
pub struct HistoryArgs {
    /// The start of the range: 03:10 (the last such time of day), -2h (before now: s, m, h, d), an ISO date
    /// (2026-12-06T03:10:00Z; local time without an offset) or now
    #[arg(
        long,
        value_name = "TIME",
        default_value = "-1h",
        allow_hyphen_values = true
    )]
    pub from: String,
    /// The end of the range, as --from
    #[arg(
        long,
        value_name = "TIME",
        default_value = "now",
        allow_hyphen_values = true
    )]
    pub to: String,
    /// The sessions at that second instead, with who blocked whom
    #[arg(long, value_name = "TIME", conflicts_with_all = ["from", "to"], allow_hyphen_values = true)]
    pub at: Option<String>,
    /// The agent's history file
    #[arg(
        long,
        value_name = "FILE",
        default_value = "/var/lib/myprobe/history.sqlite",
        conflicts_with = "agent"
    )]
    pub store: PathBuf,
    /// Read a running agent's history over HTTP instead: its address (http://127.0.0.1:9369)
    #[arg(long, value_name = "URL")]
    pub agent: Option<String>,
    /// Points of the range's chart
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(i64).range(1..=2000))]
    pub points: i64,
    /// Write JSON to FILE (`-` for stdout) instead of the tables
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
}

pub fn run(a: HistoryArgs) -> Result<()> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    if let Some(at) = &a.at {
        let at = time::parse(at, now).context("--at")?;
        let m: read::Moment = match &a.agent {
            Some(url) => fetch(url, &format!("/api/history/at?t={at}"))?,
            None => read::moment(&Store::open_read(&a.store)?, at)?,
        };
        return write(&a, &m, || text::moment(&m));
    }
    let from = time::parse(&a.from, now).context("--from")?;
    let to = time::parse(&a.to, now).context("--to")?;
    anyhow::ensure!(
        from < to,
        "--from ({}) is not before --to ({})",
        time::format(from),
        time::format(to)
    );
    let r: read::Range = match &a.agent {
        Some(url) => fetch(
            url,
            &format!("/api/history?from={from}&to={to}&points={}", a.points),
        )?,
        None => read::range(&Store::open_read(&a.store)?, from, to, a.points)?,
    };
    write(&a, &r, || text::range(&r))
}

fn write<T: serde::Serialize>(a: &HistoryArgs, value: &T, text: impl Fn() -> String) -> Result<()> {
    match &a.output {
        None => print!("{}", text()),
        Some(p) if p.as_os_str() == "-" => println!("{}", serde_json::to_string_pretty(value)?),
        Some(p) => std::fs::write(p, serde_json::to_vec_pretty(value)?)
            .with_context(|| format!("writing {}", p.display()))?,
    }
    Ok(())
}

/// GETs `path` of the agent at `url`, as JSON.
fn fetch<T: serde::de::DeserializeOwned>(url: &str, path: &str) -> Result<T> {
    let url = format!("{}{path}", url.trim_end_matches('/'));
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(std::time::Duration::from_secs(30)))
        .http_status_as_error(false)
        .build()
        .into();
    let mut response = agent
        .get(&url)
        .call()
        .with_context(|| format!("asking the agent at {url} (is it running? see --agent)"))?;
    let status = response.status();
    let body = response
        .body_mut()
        .read_to_string()
        .with_context(|| format!("reading the answer of {url}"))?;
    anyhow::ensure!(
        status.is_success(),
        "the agent at {url} answered {status}: {}",
        body.trim()
    );
    serde_json::from_str(&body)
        .with_context(|| format!("the answer of {url} is not the history's JSON"))
}
