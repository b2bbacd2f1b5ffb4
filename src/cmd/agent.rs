//! `myprobe agent`: an always-on daemon for every server of a host, scraped by Prometheus and pprof clients.

use std::{path::PathBuf, time::Duration};

use anyhow::Result;
use clap::Args;

use crate::{
    agent,
    collect::periods::Duty,
    query::follow::{FollowOptions, SampleEvery},
};

/// `--statements-max-cpu`: what the agent's statements cost before the budget (1,000 a second at 5 µs each,
/// bench/README.md).
const AGENT_STATEMENTS_CPU_PCT: f64 = 0.5;

#[derive(Args)]
pub struct AgentArgs {
    #[command(flatten)]
    pub target: crate::cmd::TargetArgs,
    /// Where the HTTP server listens (/metrics, /healthz, /debug/pprof/)
    #[arg(long, value_name = "ADDRESS:PORT", default_value = "127.0.0.1:9369")]
    pub listen: String,
    /// TLS and basic auth for every endpoint: the web configuration file of Prometheus's exporters
    /// (exporter-toolkit's format: tls_server_config's cert_file and key_file, basic_auth_users' bcrypt hashes;
    /// dist/web-config.example.yml)
    #[arg(long = "web.config.file", value_name = "FILE")]
    pub web_config_file: Option<PathBuf>,
    /// Length of a window: each is kept as pprof files, and ranks the fingerprints exported
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub window: Duration,
    /// On-CPU sampling frequency per CPU, in Hz
    #[arg(short = 'F', long = "frequency", default_value_t = 19)]
    pub frequency: u64,
    /// Ignore off-CPU periods shorter than this many microseconds
    #[arg(long, default_value_t = 1000)]
    pub min_block_us: u64,
    /// Where the windows are kept as pprof files
    #[arg(long, value_name = "DIR", default_value = "/var/lib/myprobe")]
    pub dir: PathBuf,
    /// How long windows are kept
    #[arg(long, value_name = "DURATION", default_value = "24h", value_parser = parse_duration)]
    pub retain: Duration,
    /// The most the windows kept may take, in MiB: past it the oldest go first
    #[arg(long, value_name = "MIB", default_value_t = 1024)]
    pub retain_mib: u64,
    /// Fingerprints with series of their own in /metrics (by time; in the DB load, by load), per server; the rest
    /// add to `other`
    #[arg(long, default_value_t = 100)]
    pub top: usize,
    /// How long the series of a server that exited stay in /metrics, at their last values
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = parse_duration)]
    pub forget_after: Duration,
    /// Trace off-CPU time, lock waits and statements for one second in N (the on-CPU profile always), their
    /// figures scaled up by N: what keeps the agent within a few percent of a CPU under load. 1: all the time
    /// (about N times the cost); waits longer than a second are undercounted when N > 1
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub sample_every: u32,
    /// Sampled (N > 1), statements traced a second at most, on average: above it they are traced one second in
    /// more than N, chosen from their rate after each second traced. `auto`: as many as keep them within
    /// --statements-max-cpu, at what a statement was measured to cost (about 2.2 µs, in the kernel and here).
    /// 0: one second in N whatever the rate
    #[arg(long, value_name = "RATE|auto", default_value = "auto", value_parser = parse_max_statements)]
    pub max_statements: MaxStatements,
    /// With `--max-statements auto`: the share of one CPU, in percent, that tracing statements may take on
    /// average, in the kernel and in the agent together; the servers traced share it (as they share
    /// --max-kernel-mem)
    #[arg(long, value_name = "PERCENT", default_value_t = AGENT_STATEMENTS_CPU_PCT, value_parser = crate::cmd::queries::parse_cpu_percent)]
    pub statements_max_cpu: f64,
    /// Give every server its own off-CPU and lock programs, rather than one set for the servers whose unwind
    /// tables are shared: each set runs at every scheduler switch and futex call of the host (bench/README.md
    /// compares the two)
    #[arg(long)]
    pub programs_per_server: bool,
    /// Keep no session history (each connection's statement and wait, each second, in DIR/history.sqlite), nor
    /// the DB load it gives /metrics
    #[arg(long)]
    pub no_history: bool,
    /// Do not label the profiles' samples by the statement their thread ran (pprof's `db_query_summary`,
    /// `connection`, `db_user`, `db_namespace`): a few reads of the server's memory per sample and wait saved
    #[arg(long)]
    pub no_statement_labels: bool,
    /// How long every second of the session history is kept
    #[arg(long, value_name = "DURATION", default_value = "24h", value_parser = parse_duration)]
    pub history_keep: Duration,
    /// How long the history's per-minute sums are kept (the load by state, statement, user, host and blocker)
    #[arg(long, value_name = "DURATION", default_value = "30d", value_parser = parse_duration)]
    pub history_minutes_keep: Duration,
    /// The most the history may take, in MiB: past it the oldest seconds go first
    #[arg(long, value_name = "MIB", default_value_t = 256)]
    pub history_mib: u64,
    #[command(flatten)]
    pub sql: crate::cmd::SqlArgs,
}

/// `--max-statements`: from the budget of CPU, or a rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaxStatements {
    Auto,
    PerSecond(u64),
}

fn parse_max_statements(s: &str) -> Result<MaxStatements, String> {
    match s {
        "auto" => Ok(MaxStatements::Auto),
        _ => s
            .parse()
            .map(MaxStatements::PerSecond)
            .map_err(|_| format!("{s:?}: expected `auto` or a number of statements a second")),
    }
}

/// `90`, `90s`, `15m`, `24h`, `7d`.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let (number, unit) = s
        .find(|c: char| !c.is_ascii_digit())
        .map_or((s, ""), |i| s.split_at(i));
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{s:?} is not a duration such as 60s, 15m, 24h or 7d"))?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n.saturating_mul(60),
        "h" => n.saturating_mul(3600),
        "d" => n.saturating_mul(86400),
        _ => return Err(format!("{s:?}: the unit must be s, m, h or d")),
    };
    Ok(Duration::from_secs(secs))
}

pub fn run(a: AgentArgs) -> Result<()> {
    anyhow::ensure!(
        a.window >= Duration::from_secs(1),
        "--window must be at least 1s"
    );
    anyhow::ensure!(
        (1..=1000).contains(&a.frequency),
        "-F must be between 1 and 1000 Hz"
    );
    anyhow::ensure!(a.top >= 1, "--top must be at least 1");
    anyhow::ensure!(
        (1..=3600).contains(&a.sample_every),
        "--sample-every must be between 1 and 3600"
    );
    agent::run(agent::Options {
        pid: a.target.pid,
        window: a.window,
        frequency: a.frequency,
        min_block_us: a.min_block_us,
        listen: a.listen,
        history: (!a.no_history).then(|| {
            (
                a.dir.join(crate::history::store::FILE_NAME),
                crate::history::store::Retention {
                    samples_s: a.history_keep.as_secs() as i64,
                    minutes_s: a.history_minutes_keep.as_secs() as i64,
                    max_bytes: a.history_mib.saturating_mul(1 << 20),
                },
            )
        }),
        web_config: a.web_config_file,
        dir: a.dir,
        retain: a.retain,
        retain_bytes: a.retain_mib.saturating_mul(1 << 20),
        top: a.top,
        forget_after: a.forget_after,
        duty: (a.sample_every > 1).then_some(Duty {
            length: Duration::from_secs(1),
            every: a.sample_every,
            max_rate: None,
            budget: None,
        }),
        any_process: a.target.any_process,
        programs_per_server: a.programs_per_server,
        statement_labels: !a.no_statement_labels,
        queries: FollowOptions {
            sampling: match (a.sample_every, a.max_statements) {
                (1, _) => SampleEvery::Every(1),
                (every, MaxStatements::PerSecond(0)) => SampleEvery::Every(every),
                (every, MaxStatements::PerSecond(rate)) => SampleEvery::AtLeast {
                    every,
                    max_rate: Some(rate),
                },
                (every, MaxStatements::Auto) => SampleEvery::AtLeast {
                    every,
                    max_rate: None,
                },
            },
            max_cpu_pct: a.statements_max_cpu,
            ..a.sql.follow_options(&a.target)
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_are_sampled_within_the_budget_unless_a_rate_is_given() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            agent: AgentArgs,
        }
        let parse = |args: &[&str]| {
            let a = <Cli as clap::Parser>::try_parse_from([&["agent"], args].concat())
                .expect("parsed")
                .agent;
            (a.max_statements, a.statements_max_cpu)
        };
        assert_eq!(parse(&[]), (MaxStatements::Auto, AGENT_STATEMENTS_CPU_PCT));
        assert_eq!(
            parse(&["--max-statements", "500"]).0,
            MaxStatements::PerSecond(500)
        );
        assert_eq!(parse(&["--statements-max-cpu", "2"]).1, 2.0);
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_duration("24h"), Ok(Duration::from_secs(86400)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(604800)));
        assert!(parse_duration("1w").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("").is_err());
    }
}
