//! What the report holds, as the page shows it: its flame graphs, the statements, the lock and thread tables,
//! its findings.

use std::time::Duration;

use anyhow::{Context, Result};

use crate::{
    history::read::{Incident, Range, ServerMoment},
    profile::{locks::LockSummary, Profile},
    query::{digest::DigestRow, follow::Followed},
    render::{self, Palette, RenderOptions},
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

impl ProfileSection {
    /// `profile` drawn by inferno under `title` (nothing drawn for an empty one).
    pub fn drawn(
        id: &'static str,
        title: String,
        profile: Profile,
        palette: Palette,
        events: u64,
        lost: Vec<String>,
    ) -> Result<ProfileSection> {
        let opts = RenderOptions {
            title: title.clone(),
            palette,
            ..RenderOptions::default()
        };
        let mut svg = Vec::new();
        if !profile.is_empty() {
            render::svg(&profile, &opts, &mut svg)
                .with_context(|| format!("drawing the {id} flame graph"))?;
        }
        Ok(ProfileSection {
            id,
            title,
            svg: String::from_utf8_lossy(&svg).into_owned(),
            events,
            lost,
            profile,
        })
    }
}

/// The statements' part of the report.
pub struct Statements {
    pub rows: Vec<DigestRow>,
    pub followed: Followed,
    /// The top statements' own flame graphs (on-CPU, off-CPU), by fingerprint: their samples, each labelled with
    /// the statement its thread ran.
    pub graphs: Vec<(String, Vec<ProfileSection>)>,
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

/// The report of a past range, from what the agent kept in its directory: the session history and the flame-graph
/// windows.
pub struct Past {
    pub host: String,
    /// The agent's directory it was read from.
    pub dir: String,
    /// The range, seconds since the epoch.
    pub from: i64,
    pub to: i64,
    /// The range's load by state and its top lists; none without a history of the range.
    pub range: Option<Range>,
    /// The connections others waited behind longest, each with the moment the most waited.
    pub incidents: Vec<PastIncident>,
    /// The windows kept that overlap the range, merged by kind.
    pub profiles: Vec<ProfileSection>,
    /// How many windows were drawn, and the time they cover together (seconds since the epoch).
    pub windows: usize,
    pub windows_span: Option<(i64, i64)>,
    /// What the agent did not keep of the range, in a line each.
    pub missing: Vec<String>,
    pub findings: Vec<String>,
}

/// A connection others waited behind, and its server's sessions at the moment the most waited.
pub struct PastIncident {
    pub incident: Incident,
    pub moment: Option<ServerMoment>,
}
