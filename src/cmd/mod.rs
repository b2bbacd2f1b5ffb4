//! One module per subcommand: options → collector → renderer.

pub mod agent;
pub mod diff;
pub mod flame;
pub mod history;
pub mod pfs;
pub mod profile;
pub mod programs;
pub mod queries;
pub mod report;
pub mod stacks;
pub mod stat;
pub mod trace;

use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::Args;

use crate::{
    client::ConnectArgs,
    collect::{CollectOptions, Stop},
    process::{self, Target},
    query::follow::FollowOptions,
};

/// How the statements' tracing uses SQL, in the commands that trace them beside other collectors.
#[derive(Args, Clone, Debug)]
pub struct SqlArgs {
    /// Show query text with its literals (they can hold passwords); by default literals are replaced by `?`
    #[arg(long)]
    pub raw_sql: bool,
    /// Never connect to the server: no statement texts from its process list
    #[arg(long)]
    pub no_sql: bool,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

impl SqlArgs {
    /// Following statements with this SQL, on the target's kernel terms.
    pub fn follow_options(self, target: &TargetArgs) -> FollowOptions {
        FollowOptions {
            raw_sql: self.raw_sql,
            btf: target.btf.clone(),
            max_kernel_mem_mib: target.max_kernel_mem,
            ..FollowOptions::new((!self.no_sql).then_some(self.connect))
        }
    }
}

/// The file of server `pid` where a command reads several (`--all`): `report.html` becomes `report-PID.html`.
pub fn per_server(output: &Path, pid: u32) -> PathBuf {
    let stem = output.file_stem().unwrap_or_default().to_string_lossy();
    let name = match output.extension() {
        Some(ext) => format!("{stem}-{pid}.{}", ext.to_string_lossy()),
        None => format!("{stem}-{pid}"),
    };
    output.with_file_name(name)
}

/// What every command that loads BPF programs for one process takes: the process, and the kernel's terms.
#[derive(Args, Clone, Debug)]
pub struct TargetArgs {
    /// Server process [default: the one running mariadbd or mysqld]
    #[arg(short = 'p', long = "pid")]
    pub pid: Option<u32>,
    /// Trace a process that is not mariadbd/mysqld (e.g. a test program)
    #[arg(long)]
    pub any_process: bool,
    /// BTF file of the running kernel, for kernels without /sys/kernel/btf/vmlinux
    #[arg(long, value_name = "FILE")]
    pub btf: Option<PathBuf>,
    /// Kernel memory the BPF maps of each collector may take, in MiB (the unwind tables, one copy for the
    /// collectors of a run, within it too); past it, the maps that can be smaller are
    /// (said on stderr)
    #[arg(long, value_name = "MIB", default_value_t = crate::collect::budget::DEFAULT_MIB)]
    pub max_kernel_mem: u64,
}

impl TargetArgs {
    /// Checks that this machine can trace (root, BTF, the kernel's features), then finds the process.
    pub fn resolve(&self) -> Result<Target> {
        crate::collect::features::check_environment(self.btf.as_deref())?;
        process::resolve(self.pid, self.any_process)
    }

    /// As [`TargetArgs::resolve`], for a command that reads a picture of a server (`report`, `stacks`): of several
    /// servers running, the busiest (said), or every one (`all`).
    pub fn servers_to_read(&self, all: bool) -> Result<Vec<Target>> {
        crate::collect::features::check_environment(self.btf.as_deref())?;
        process::servers_to_read(self.pid, self.any_process, all)
    }

    /// `--max-kernel-mem` in bytes.
    pub fn max_kernel_mem_bytes(&self) -> u64 {
        self.max_kernel_mem.saturating_mul(1 << 20)
    }

    /// A collector's options for `target`, traced until Ctrl-C unless the caller sets more.
    pub fn collect_options(&self, target: &Target) -> CollectOptions {
        CollectOptions::new(
            target.pid,
            self.btf.clone(),
            self.max_kernel_mem_bytes(),
            Stop::new(),
        )
    }
}
