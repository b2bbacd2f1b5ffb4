//! `myprobe stat [-i SECS] [-c COUNT] [--json]`: vmstat-style lines of the machine, the server process and the
//! server's counters.

use std::{
    io::{IsTerminal, Write},
    time::{Duration, Instant},
};

use anyhow::Result;
use clap::Args;

use crate::{
    client::{self, Client, ConnectArgs},
    collect::{install_stop_handler, Stop},
    process, stat,
};

#[derive(Args)]
pub struct StatArgs {
    /// Seconds between lines
    #[arg(
        short = 'i',
        long = "interval",
        value_name = "SECS",
        default_value_t = 1.0
    )]
    pub interval: f64,
    /// Lines to print, then stop [default: until Ctrl-C]
    #[arg(short = 'c', long = "count")]
    pub count: Option<u64>,
    /// One JSON object per line instead of columns
    #[arg(long)]
    pub json: bool,
    /// Server process [default: the one running mariadbd or mysqld, if any]
    #[arg(short = 'p', long = "pid")]
    pub pid: Option<u32>,
    /// Never connect to the server: the machine and process columns only
    #[arg(long)]
    pub no_sql: bool,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

/// Lines between headers when stdout is not a terminal (vmstat's screenful).
const LINES_PER_HEADER: u64 = 20;

pub fn run(a: StatArgs) -> Result<()> {
    if !(a.interval >= 0.1 && a.interval <= 3600.0) {
        anyhow::bail!("-i: between 0.1 and 3600 seconds");
    }
    let pid = match a.pid {
        Some(_) => Some(process::resolve(a.pid, false)?.pid),
        None => match process::resolve(None, false) {
            Ok(t) => Some(t.pid),
            Err(e) => {
                say!("myprobe: the machine's columns only: {e:#}");
                None
            }
        },
    };
    let mut client: Option<Client> = match (pid, a.no_sql) {
        (Some(pid), false) => match client::connect(&a.connect, Some(pid)) {
            Ok(c) => Some(c),
            Err(e) => {
                say!("myprobe: no server columns: {e:#}");
                None
            }
        },
        _ => None,
    };
    install_stop_handler();
    let stop = Stop::new();
    // SAFETY: sysconf with valid names has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
    let lines_per_header = terminal_rows()
        .unwrap_or(LINES_PER_HEADER + 2)
        .saturating_sub(2)
        .max(1);
    let (mut last, _) = stat::read(pid, client.as_mut());
    let interval = Duration::from_secs_f64(a.interval);
    let mut next = Instant::now() + interval;
    let mut printed = 0u64;
    let mut out = std::io::stdout().lock();
    while a.count.is_none_or(|c| printed < c) {
        while Instant::now() < next {
            if stop.is_stopped() {
                return Ok(());
            }
            std::thread::sleep((next - Instant::now()).min(Duration::from_millis(100)));
        }
        next += interval;
        let (now, error) = stat::read(pid, client.as_mut());
        if let Some(e) = error {
            say!("myprobe: the server stopped answering, its columns are left out from now on: {e:#}");
            client = None;
        }
        if let Some(p) = pid.filter(|_| !a.json && last.has_process() && !now.has_process()) {
            say!("myprobe: the server (PID {p}) exited; the machine's columns go on");
        }
        let line = stat::line(&last, &now, ticks, page);
        let text = if a.json {
            serde_json::to_string(&line)?
        } else if printed.is_multiple_of(lines_per_header) {
            format!("{}\n{}", stat::header(&line), stat::columns(&line))
        } else {
            stat::columns(&line)
        };
        match writeln!(out, "{text}").and_then(|()| out.flush()) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
            r => r?,
        }
        printed += 1;
        last = now;
    }
    Ok(())
}

/// The terminal's height, when stdout is one.
fn terminal_rows() -> Option<u64> {
    if !std::io::stdout().is_terminal() {
        return None;
    }
    let mut ws = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ fills the winsize it is given.
    let ok = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut ws) } == 0;
    (ok && ws.ws_row > 2).then_some(u64::from(ws.ws_row))
}
