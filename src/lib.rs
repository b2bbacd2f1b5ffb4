//! myprobe: a production-safe eBPF performance analyser for MySQL and MariaDB.
//!
//! The library holds everything; `main.rs` only parses the command line. Tests and fuzzers call the parsers
//! (`query::protocol`, `profile::folded`), the unwinder (`unwind`) and the symbolizer directly. The map of the
//! modules and their rules is ARCHITECTURE.md.

pub mod cmd;
pub mod collect;
pub mod process;
pub mod profile;
pub mod query;
pub mod render;
pub mod symbolize;
pub mod unwind;
