//! myprobe: a production-safe eBPF performance analyser for MySQL and MariaDB.
//!
//! The library holds everything; `main.rs` only parses the command line. Tests and fuzzers call the parsers
//! (`wire::protocol`, `profile::folded`), the unwinder (`unwind`) and the symbolizer directly. The map of the
//! modules and their rules is ARCHITECTURE.md.

/// `eprintln!` that never panics: a diagnostic on a closed stderr (`myprobe … 2>&1 | head`) is dropped, never
/// the cause of an abort (a panic in a ring buffer callback would unwind through libbpf's C frames).
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// `eprint!` that never panics (see [`say!`]).
#[macro_export]
macro_rules! say_part {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stderr(), $($arg)*);
    }};
}

pub mod agent;
pub mod client;
pub mod cmd;
pub mod collect;
pub mod history;
pub mod pfs;
pub mod process;
pub mod profile;
pub mod query;
pub mod render;
pub mod report;
pub mod runner;
pub mod server;
pub mod sessions;
pub mod stacks;
pub mod stat;
pub mod symbolize;
pub mod trace;
pub mod unwind;
pub mod wire;
