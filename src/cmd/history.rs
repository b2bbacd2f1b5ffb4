//! `myprobe history`: what the agent's session history kept, over a range or at a moment, read from its store
//! (the file, even while the agent writes it) or from a running agent over HTTP.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use crate::{
    agent::web_config::certificates,
    client::read_password_file,
    history::{read, store::Store, text, time},
};

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
    /// The agent's certificate, or its CA's, in PEM: trusted for its TLS (--web.config.file's tls_server_config)
    #[arg(long, value_name = "FILE", requires = "agent")]
    pub agent_ca: Option<PathBuf>,
    /// The user of the agent's basic auth; the password comes from MYPROBE_AGENT_PASSWORD or --agent-password-file
    #[arg(long, value_name = "USER", requires = "agent")]
    pub agent_user: Option<String>,
    /// A file that holds the password of --agent-user alone
    #[arg(long, value_name = "FILE", requires = "agent_user")]
    pub agent_password_file: Option<PathBuf>,
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
            Some(url) => fetch(&a, url, &format!("/api/history/at?t={at}"))?,
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
            &a,
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

/// GETs `path` of the agent at `url`, as JSON, with the credentials and the CA `a` gives.
fn fetch<T: serde::de::DeserializeOwned>(a: &HistoryArgs, url: &str, path: &str) -> Result<T> {
    let url = format!("{}{path}", url.trim_end_matches('/'));
    let mut config = ureq::Agent::config_builder()
        .timeout_global(Some(std::time::Duration::from_secs(30)))
        .http_status_as_error(false);
    if let Some(ca) = &a.agent_ca {
        let pem =
            std::fs::read(ca).with_context(|| format!("reading --agent-ca {}", ca.display()))?;
        // Read as the agent reads its own (--web.config.file's), then given to ureq.
        let certs: Vec<ureq::tls::Certificate<'static>> =
            certificates(&pem, &format!("--agent-ca {}", ca.display()))?
                .iter()
                .map(|c| ureq::tls::Certificate::from_der(c.as_ref()).to_owned())
                .collect();
        config = config.tls_config(
            ureq::tls::TlsConfig::builder()
                .root_certs(ureq::tls::RootCerts::new_with_certs(&certs))
                .build(),
        );
    }
    let agent: ureq::Agent = config.build().into();
    let mut request = agent.get(&url);
    if let Some(user) = &a.agent_user {
        let password = password(a)?;
        use base64::Engine;
        let credentials =
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        request = request.header("Authorization", format!("Basic {credentials}"));
    }
    let mut response = request.call().map_err(|e| {
        let hint = if e.to_string().contains("CaUsedAsEndEntity") {
            "its certificate is a CA's, which rustls takes only as the issuer of another: make the agent's with \
             -addext basicConstraints=critical,CA:FALSE"
        } else {
            "is it running? over https, is its certificate, or its CA's, given to --agent-ca?"
        };
        anyhow::anyhow!("asking the agent at {url} ({hint}): {e}")
    })?;
    let status = response.status();
    let body = response
        .body_mut()
        .read_to_string()
        .with_context(|| format!("reading the answer of {url}"))?;
    anyhow::ensure!(
        status != 401,
        "the agent at {url} {}",
        match &a.agent_user {
            None =>
                "asks for a user and password: give --agent-user, and the password in \
                     MYPROBE_AGENT_PASSWORD or --agent-password-file",
            Some(_) => "refused the user and password given",
        }
    );
    anyhow::ensure!(
        status.is_success(),
        "the agent at {url} answered {status}: {}",
        body.trim()
    );
    serde_json::from_str(&body)
        .with_context(|| format!("the answer of {url} is not the history's JSON"))
}

/// --agent-user's password: what --agent-password-file holds, or MYPROBE_AGENT_PASSWORD (never an argument,
/// which `ps` shows).
fn password(a: &HistoryArgs) -> Result<String> {
    if let Some(file) = &a.agent_password_file {
        return read_password_file(file, "--agent-password-file");
    }
    std::env::var("MYPROBE_AGENT_PASSWORD").map_err(|_| {
        anyhow::anyhow!(
            "--agent-user needs its password: in MYPROBE_AGENT_PASSWORD, or the first line of --agent-password-file"
        )
    })
}
