//! JSON: `{"unit": "...", "count_name": "...", "total": N, "estimated": false, "meta": {...},
//! "stacks": [{"frames": [root, ..., leaf], "value": N}, ...]}`, stacks by value, largest first. `estimated`:
//! `total` and every value were scaled up from a sample (`meta.estimate` says how).

use std::io::Write;

use anyhow::Result;
use serde::Serialize;

use super::RenderOptions;
use crate::profile::{Profile, Unit};

#[derive(Serialize)]
struct JsonProfile<'a> {
    unit: Unit,
    count_name: String,
    total: u64,
    estimated: bool,
    meta: &'a serde_json::Map<String, serde_json::Value>,
    stacks: Vec<JsonStack<'a>>,
}

#[derive(Serialize)]
struct JsonStack<'a> {
    frames: Vec<&'a str>,
    value: u64,
}

/// Writes `profile` as one JSON document (followed by a newline).
pub fn write(profile: &Profile, opts: &RenderOptions, mut w: impl Write) -> Result<()> {
    let mut stacks: Vec<JsonStack> = profile
        .stacks()
        .into_iter()
        .map(|(frames, value)| JsonStack { frames, value })
        .collect();
    // Largest first; equal values keep the stable stack order.
    stacks.sort_by_key(|s| std::cmp::Reverse(s.value));
    let doc = JsonProfile {
        unit: profile.unit,
        count_name: opts.count_name_for(profile),
        total: profile.total(),
        estimated: opts.estimate.is_some(),
        meta: &opts.meta,
        stacks,
    };
    serde_json::to_writer(&mut w, &doc)?;
    writeln!(w)?;
    w.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_document() {
        let mut p = Profile::new(Unit::Nanoseconds);
        p.add(&["main", "b"], 5);
        p.add(&["main", "a", "x"], 10);
        p.add(&["main", "c"], 5);
        let mut opts = RenderOptions::default();
        opts.meta.insert("pid".into(), json!(1234));
        opts.meta.insert("lost_events".into(), json!(0));
        let mut out = Vec::new();
        write(&p, &opts, &mut out).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            v,
            json!({
                "unit": "nanoseconds",
                "count_name": "ns",
                "total": 20,
                "estimated": false,
                "meta": {"pid": 1234, "lost_events": 0},
                "stacks": [
                    {"frames": ["main", "a", "x"], "value": 10},
                    {"frames": ["main", "b"], "value": 5},
                    {"frames": ["main", "c"], "value": 5},
                ]
            })
        );
    }
}
