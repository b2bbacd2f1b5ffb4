//! Query records: the statements the query collector saw, joined with what user space knows of their
//! connections (id, user, database, prepared statements), with literals hidden unless asked for. The files stand
//! in layers, each importing only those below it: the record model (record.rs) → the tracker and the text finder
//! (tracker.rs, finder.rs) → the stages and the readers of the server (texts.rs, holders.rs, deadlocks.rs,
//! released.rs, started.rs, …) → the pipeline that runs them (follow.rs).

pub mod deadlocks;
pub mod digest;
pub mod executed;
pub mod files;
pub mod finder;
pub mod follow;
pub mod holders;
pub mod reader;
pub mod recent;
pub mod record;
pub mod released;
pub mod started;
pub mod text_reader;
pub mod texts;
pub mod tracker;

pub use record::{
    dispatch_fd, format_ts, largest_remainder, CauseWait, Holder, QueryRecord, Ran, StatementKey,
    Text, TimeParts, Timestamp, PARTS,
};
pub use tracker::{
    Notice, Tracker, LAST_PREPARED, MAX_CONNS, MAX_PREPARED_PER_CONN, UNKNOWN_PREPARED,
};
