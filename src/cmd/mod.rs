//! One module per subcommand: options → collector → renderer.

pub mod agent;
pub mod diff;
pub mod flame;
pub mod pfs;
pub mod profile;
pub mod queries;
pub mod report;
pub mod stacks;
pub mod stat;
pub mod trace;
