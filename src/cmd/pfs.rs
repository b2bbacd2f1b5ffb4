//! `myprobe pfs waits|stages|statements`: performance_schema's own view as a profile (folded, SVG, JSON,
//! pprof), over `-d SECS`: exact totals from its summary tables, or with `--nest` the statement → stage → wait
//! stacks of its history rings.

use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use clap::Args;

use crate::{
    client::{self, Client, ConnectArgs},
    collect::{install_stop_handler, Stop},
    pfs::{self, Kind, Rings, Setup, Totals, NEST_KINDS},
    process,
    profile::Profile,
    render::{self, RenderOptions},
};

#[derive(Args)]
pub struct PfsArgs {
    /// What to read
    #[arg(value_enum)]
    pub kind: Kind,
    /// Seconds to measure (Ctrl-C ends early)
    #[arg(
        short = 'd',
        long = "duration",
        value_name = "SECS",
        default_value_t = 10.0
    )]
    pub duration: f64,
    /// Stacks of statement → stage → wait from the history rings (NESTING_EVENT_ID), with the share of
    /// events the rings dropped, instead of the summary tables' exact totals
    #[arg(long)]
    pub nest: bool,
    /// Unit of the values
    #[arg(long, value_name = "ps|ns|us", default_value = "us")]
    pub unit: String,
    /// Write to FILE (.folded/.txt, .svg, .json, .pb.gz) instead of folded stacks on stdout
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// The server process, to find its socket [default: the one running mariadbd or mysqld]
    #[arg(short = 'p', long = "pid")]
    pub pid: Option<u32>,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

/// What a run measured.
struct Measured {
    profile: Profile,
    /// Per kind read, the summary's difference over the run.
    totals: HashMap<Kind, BTreeMap<String, Totals>>,
    /// `--nest`: per kind, the events read from the ring and the events the run had.
    kept: Vec<(Kind, u64, u64)>,
    /// `--nest`: the events read reached their bound before the end.
    full: bool,
    /// `--nest`: events read whose timer ran backwards.
    backwards: u64,
}

/// How often `--nest` reads the history rings: each keeps only the last 1,000 to 10,000 events.
const RING_READ_INTERVAL: Duration = Duration::from_millis(200);

pub fn run(a: PfsArgs) -> Result<()> {
    let (unit, per_unit) = pfs::unit_scale(&a.unit)?;
    // (NaN fails both comparisons.)
    anyhow::ensure!(
        a.duration > 0.0 && a.duration <= 1e9,
        "-d: a number of seconds above 0"
    );
    if let Some(path) = &a.output {
        render::format_for(path)?;
    }
    // The server's PID only finds its socket: a server on another host is reached with --host.
    let pid = match a.pid {
        Some(_) => Some(process::resolve(a.pid, false)?.pid),
        None => process::resolve(None, false).ok().map(|t| t.pid),
    };
    let mut client = client::connect(&a.connect, pid)?;
    pfs::check_enabled(&mut client)?;
    install_stop_handler();
    let stop = Stop::new();
    let kinds: Vec<Kind> = if a.nest {
        NEST_KINDS.to_vec()
    } else {
        vec![a.kind]
    };
    let consumers = if a.nest {
        pfs::nest_consumers()
    } else {
        Vec::new()
    };
    let setup = Setup::read(&mut client, &kinds, &consumers).context(
        "reading performance_schema's setup (myprobe's user needs SELECT and UPDATE on performance_schema.*)",
    )?;
    let measured = setup
        .apply(&mut client)
        .context("switching performance_schema's instruments on (myprobe's user needs UPDATE on performance_schema.*)")
        .and_then(|()| {
            if let Some(d) = setup.describe() {
                say!("myprobe: {d}");
            }
            measure(&mut client, &a, unit, per_unit, &stop)
        });
    let restored = setup.restore(&mut client);
    // A run that failed because the server is gone: its settings went with it (performance_schema starts from
    // its defaults), the run's error is the one to say.
    let measured = measured?;
    report(&a, &measured, per_unit);
    let opts = RenderOptions {
        title: format!("performance_schema {}", kind_name(a.kind, a.nest)),
        ..Default::default()
    };
    render::write_profile(&measured.profile, a.output.as_deref(), &opts)?;
    restored
}

fn kind_name(kind: Kind, nest: bool) -> &'static str {
    match (nest, kind) {
        (true, _) => "statements, stages and waits",
        (false, Kind::Waits) => "waits",
        (false, Kind::Stages) => "stages",
        (false, Kind::Statements) => "statements",
    }
}

/// Snapshots, waits `-d` (or Ctrl-C), snapshots again.
fn measure(
    client: &mut Client,
    a: &PfsArgs,
    unit: crate::profile::Unit,
    per_unit: u64,
    stop: &Stop,
) -> Result<Measured> {
    // With --nest, every kind's summary: how many events each ring should have kept.
    let summaries = if a.nest {
        NEST_KINDS.to_vec()
    } else {
        vec![a.kind]
    };
    let mut rings = if a.nest {
        Some(Rings::start(client)?)
    } else {
        None
    };
    let mut before = HashMap::new();
    for &k in &summaries {
        before.insert(k, pfs::read_summary(client, k)?);
    }
    say!(
        "myprobe: reading performance_schema {} for {} s (Ctrl-C ends early)",
        kind_name(a.kind, a.nest),
        a.duration
    );
    let gone = |e: anyhow::Error| e.context("the server stopped answering during the run");
    let started = Instant::now();
    let duration = Duration::from_secs_f64(a.duration);
    while started.elapsed() < duration && !stop.is_stopped() {
        let left = duration.saturating_sub(started.elapsed());
        std::thread::sleep(RING_READ_INTERVAL.min(left));
        if let Some(r) = &mut rings {
            r.read(client).map_err(gone)?;
        }
    }
    let mut totals = HashMap::new();
    for &k in &summaries {
        let after = pfs::read_summary(client, k).map_err(gone)?;
        totals.insert(k, pfs::difference(&before[&k], &after));
    }
    if let Some(r) = &rings {
        let kept = r
            .counts()
            .into_iter()
            .map(|(k, n)| {
                let had = totals[&k]
                    .values()
                    .map(|t| t.count)
                    .fold(0, u64::saturating_add);
                (k, n, had)
            })
            .collect();
        return Ok(Measured {
            profile: r.profile(unit, per_unit),
            totals,
            kept,
            full: r.is_full(),
            backwards: r.backwards,
        });
    }
    Ok(Measured {
        profile: pfs::summary_profile(&totals[&a.kind], unit, per_unit),
        totals,
        kept: Vec::new(),
        full: false,
        backwards: 0,
    })
}

/// The tables and the warnings on stderr.
fn report(a: &PfsArgs, m: &Measured, per_unit: u64) {
    if !a.nest {
        if let Some(t) = m.totals.get(&a.kind) {
            say!("{}", pfs::top_table(t, 15).trim_end());
        }
    }
    for &(kind, kept, had) in &m.kept {
        if had > kept {
            say!(
                "myprobe: the {} history ring gave {kept} of the run's {had} events ({:.1}% dropped): the \
                 stacks are a sample of the run; the summaries (without --nest) have exact totals",
                kind_name(kind, false),
                100.0 * (had - kept) as f64 / had as f64
            );
        }
    }
    if m.full {
        say!("myprobe: the rings were read until the events kept reached their bound; the rest of the run is not in the stacks");
    }
    if m.backwards > 0 {
        say!(
            "myprobe: {} events read had a timer that ran backwards between their start and end (a cycle \
             counter that differs between CPUs, or a wall clock set back): they are in the stacks with no time of \
             their own",
            m.backwards
        );
    }
    let unexplained = if a.nest {
        pfs::unexplained_stage(&m.profile)
    } else {
        None
    };
    if let Some((stage, own, waited)) = unexplained {
        say!(
            "myprobe: {}",
            pfs::unexplained_line(
                &stage,
                own.saturating_mul(per_unit),
                waited.saturating_mul(per_unit)
            )
        );
    }
}
