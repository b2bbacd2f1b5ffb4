//! myprobe: a production-safe eBPF performance analyser for MySQL and MariaDB: the command line (the work is
//! done in the library, src/lib.rs).

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use myprobe::cmd;

#[derive(Parser)]
#[command(
    name = "myprobe",
    version,
    about = "Production-safe eBPF performance analyser for MySQL and MariaDB"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Profile a running server: where it burns CPU, where its threads wait.
    #[command(subcommand)]
    Profile(cmd::profile::ProfileCommand),
    /// Every statement the server runs, with where its time went: CPU, run queue, locks, disk, network.
    Queries(cmd::queries::QueriesArgs),
    /// What every thread of a running server is doing right now, read from BPF without stopping it: merged
    /// stacks (pt-pmp's), each thread's state, syscall and the lock it waits on with its holder, deadlocks,
    /// and the statements the threads run.
    Stacks(cmd::stacks::StacksArgs),
    /// The server's own view: performance_schema's waits, stages or statements over an interval, as a
    /// profile (exact totals, or statement → stage → wait stacks with --nest).
    Pfs(cmd::pfs::PfsArgs),
    /// vmstat-style lines: the machine (run queue, context switches, interrupts, CPU, disks), the server process
    /// and the server's counters (SHOW GLOBAL STATUS), one line an interval.
    Stat(cmd::stat::StatArgs),
    /// Any function of the server or its libraries (by demangled name or glob), or a static probe: calls,
    /// errors, time and its histogram, by thread, caller stack or argument; --inside for the syscalls, lock
    /// waits and off-CPU time within it (DTrace's pid provider and its thread-local flag).
    Trace(cmd::trace::TraceArgs),
    /// One trace with every collector at once (on-CPU, off-CPU, lock waits, the statements' digest) and a
    /// thread snapshot at its end, written as one self-contained HTML file: flame graphs, a sortable digest,
    /// the lock table, the threads, and findings in sentences. With --from/--to, traces nothing: the report of a
    /// past range from what the agent kept (its session history and flame-graph windows).
    Report(cmd::report::ReportArgs),
    /// An always-on daemon for every server of the host (or -p's): Prometheus metrics of the statements and
    /// lock waits, pprof profiles over HTTP (on-CPU at 19 Hz, off-CPU, locks), windows kept as pprof files,
    /// each labelled by server; finds servers as they start and lets go of those that exit (given -p,
    /// re-attaches to the server that runs the same executable with the same data directory).
    Agent(cmd::agent::AgentArgs),
    /// What the agent's session history kept: DB load over a range by state, with the top statements, users,
    /// hosts and blockers, or the sessions at a moment with who blocked whom (--at).
    History(cmd::history::HistoryArgs),
    /// Draw a flame graph from folded stacks (FlameGraph's flamegraph.pl, with filters).
    Flame(cmd::flame::FlameArgs),
    /// Differential flame graph of two folded profiles, drawn on AFTER (difffolded.pl + flamegraph.pl).
    Diff(cmd::diff::DiffArgs),
    /// Every BPF program of every collector loaded into this kernel in each configuration the commands use,
    /// nothing attached: what its verifier needed for each, against its limit (an error past half of it).
    Programs(cmd::programs::ProgramsArgs),
    /// The kernel features myprobe probed here, as `name=yes|no` (for scripts/kernels).
    #[command(hide = true)]
    Features,
}

fn main() -> ExitCode {
    let cli = Cli::try_parse().unwrap_or_else(|mut e| {
        cmd::report::explain_conflict(&mut e);
        e.exit()
    });
    let result = match cli.command {
        Command::Profile(c) => cmd::profile::run(c),
        Command::Queries(a) => cmd::queries::run(a),
        Command::Stacks(a) => cmd::stacks::run(a),
        Command::Pfs(a) => cmd::pfs::run(a),
        Command::Stat(a) => cmd::stat::run(a),
        Command::Trace(a) => cmd::trace::run(a),
        Command::Report(a) => cmd::report::run(a),
        Command::Agent(a) => cmd::agent::run(a),
        Command::History(a) => cmd::history::run(a),
        Command::Flame(a) => cmd::flame::run(a),
        Command::Diff(a) => cmd::diff::run(a),
        Command::Programs(a) => cmd::programs::run(a),
        Command::Features => {
            println!(
                "{}",
                myprobe::collect::features::Features::of_kernel(None).summary()
            );
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            myprobe::say!("myprobe: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
