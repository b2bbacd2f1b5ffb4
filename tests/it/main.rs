//! The integration tests: one binary, so one link and one process (`cargo test --test it MODULE::`). Each
//! module is one command's or one area's tests against real BPF, real servers (`make test` starts them:
//! scripts/run-tests) and the fixtures of tests/fixtures/; `common` holds their shared helpers. The property tests
//! are their own binary (tests/fuzz.rs), which `make fuzz` runs long.

mod common;

mod agent;
mod agent_security;
mod alloc;
mod by_statement;
mod causes;
mod client;
mod clients;
mod diff;
mod errors;
mod faults;
mod history;
mod history_page;
mod hostile;
mod lock_errors;
mod locks;
mod names;
mod pfs;
mod process;
mod profile;
mod programs;
mod queries;
mod report;
mod servers;
mod spills;
mod stacks;
mod stat;
mod syscalls;
mod trace;
mod unwind;
mod unwind_replay;
