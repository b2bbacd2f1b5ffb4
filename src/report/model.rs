//! What the report holds, as the page shows it: its flame graphs, the statements, the lock and thread tables,
//! its findings.

use std::time::Duration;

use crate::{
    profile::{locks::LockSummary, Profile},
    query::{digest::DigestRow, follow::Followed},
    stacks::ThreadStack,
};

/// A flame graph of the report.
pub struct ProfileSection {
    /// `cpu`, `offcpu`, `locks`: also the id of its place in the page.
    pub id: &'static str,
    pub title: String,
    pub profile: Profile,
    /// inferno's SVG, whole.
    pub svg: String,
    pub events: u64,
    pub lost: Vec<String>,
}

/// The statements' part of the report.
pub struct Statements {
    pub rows: Vec<DigestRow>,
    pub followed: Followed,
}

/// Everything the page shows.
pub struct Report {
    pub target: String,
    pub host: String,
    /// When tracing began, UTC, RFC 3339.
    pub started: String,
    pub traced: Duration,
    pub profiles: Vec<ProfileSection>,
    pub statements: Option<Statements>,
    pub locks: Vec<LockSummary>,
    pub threads: Vec<ThreadStack>,
    /// What could not be traced or shown, and why (a collector's error, the server's process list).
    pub missing: Vec<String>,
    pub findings: Vec<String>,
    pub top: usize,
}
