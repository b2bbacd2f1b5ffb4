//! The agent's active-session history: once a second, each connection of each server that runs a statement or sits
//! idle in an open transaction, with what it waits for and behind whom (`sampler.rs`), kept on the node in SQLite
//! (`store.rs`) by age and size, and read back over a range or at a moment (`read.rs`) by `myprobe history`, the
//! agent's page and its HTTP API.

pub mod read;
pub mod sampler;
pub mod store;
pub mod text;
pub mod time;
pub mod writer;

use std::{borrow::Cow, sync::Arc};

use serde::{Deserialize, Serialize};

/// What a connection was doing at a sampled second.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SessionSample {
    /// The connection's id (`CONNECTION_ID()`).
    pub conn: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<Arc<str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<Arc<str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub db: Option<Arc<str>>,
    /// Its statement, literals hidden, and that statement's fingerprint; none while idle in its transaction.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub statement: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
    /// Seconds in its statement (or, idle, since its last one ended), and in its open transaction as far as seen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub statement_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transaction_s: Option<f64>,
    /// On a CPU, waiting for one, its wait's cause in the project's words (`Cause::label`), or
    /// [`IDLE_IN_TRANSACTION`].
    pub state: Cow<'static, str>,
    /// What it waits on: `sbtest.sbtest1 (PRIMARY, X)`, a file, a lock's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object: Option<String>,
    /// The connection it waits behind, and the root of that chain (the one that waits for nothing).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocker: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub root_blocker: Option<u64>,
    /// For a connection others wait behind: the statements of its open transaction the agent saw, oldest first.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub holder_statements: Vec<String>,
}

/// The state of a connection that runs nothing in an open transaction: not load, but what others may wait behind.
pub const IDLE_IN_TRANSACTION: &str = "idle in transaction";

impl SessionSample {
    /// Whether it counts as load (runs a statement), not merely sits in a transaction.
    pub fn is_active(&self) -> bool {
        self.state != IDLE_IN_TRANSACTION
    }
}

/// One second of one server.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Second {
    /// Seconds since the epoch.
    pub ts: i64,
    /// The server, as the agent names it (`mariadbd (PID 12, MariaDB 10.11.19, port 3306)`).
    pub server: String,
    pub sessions: Vec<SessionSample>,
}
