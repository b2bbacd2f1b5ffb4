//! The aggregation model shared by every collector: stacks of interned frames → value, with a unit.

pub mod folded;
pub mod locks;
pub mod stacks;
pub mod waits;

use std::collections::HashMap;

/// What a profile's values count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Unit {
    Samples,
    Picoseconds,
    Nanoseconds,
    Microseconds,
    Bytes,
    Count,
}

impl Unit {
    /// The name flame graphs print after a value ("--countname").
    pub fn count_name(self) -> &'static str {
        match self {
            Unit::Samples => "samples",
            Unit::Picoseconds => "ps",
            Unit::Nanoseconds => "ns",
            Unit::Microseconds => "us",
            Unit::Bytes => "bytes",
            Unit::Count => "calls",
        }
    }
}

/// Labels of samples, as pprof carries them (`key`, `value`): the statement a sample was taken in.
pub type Labels = Vec<(&'static str, String)>;

/// A set of stacks, each a list of frame ids (root first), with a value per stack and set of labels.
#[derive(Clone, Debug)]
pub struct Profile {
    pub unit: Unit,
    frames: Vec<String>,
    frame_ids: HashMap<String, u32>,
    /// By (frames, labels' id among `label_sets`: 0 for none).
    stacks: HashMap<(Vec<u32>, u32), u64>,
    label_sets: Vec<Labels>,
    label_set_ids: HashMap<Labels, u32>,
}

impl Profile {
    pub fn new(unit: Unit) -> Self {
        Profile {
            unit,
            frames: Vec::new(),
            frame_ids: HashMap::new(),
            stacks: HashMap::new(),
            label_sets: vec![Vec::new()],
            label_set_ids: HashMap::new(),
        }
    }

    /// The id of a set of labels, interning it on first use.
    pub fn intern_labels(&mut self, labels: Labels) -> u32 {
        if labels.is_empty() {
            return 0;
        }
        if let Some(&id) = self.label_set_ids.get(&labels) {
            return id;
        }
        let id = self.label_sets.len() as u32;
        self.label_sets.push(labels.clone());
        self.label_set_ids.insert(labels, id);
        id
    }

    /// The id of a frame name, interning it on first use.
    pub fn intern(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.frame_ids.get(name) {
            return id;
        }
        let id = self.frames.len() as u32;
        self.frames.push(name.to_string());
        self.frame_ids.insert(name.to_string(), id);
        id
    }

    pub fn frame(&self, id: u32) -> &str {
        &self.frames[id as usize]
    }

    /// Adds `value` to the stack of interned frame ids (root first); a stack's value stops at `u64::MAX`.
    pub fn add_ids(&mut self, stack: Vec<u32>, value: u64) {
        self.add_labelled(stack, 0, value);
    }

    /// [`Profile::add_ids`], for the samples of the labels `labels` (an id of [`Profile::intern_labels`]).
    pub fn add_labelled(&mut self, stack: Vec<u32>, labels: u32, value: u64) {
        if value > 0 {
            let sum = self.stacks.entry((stack, labels)).or_insert(0);
            *sum = sum.saturating_add(value);
        }
    }

    /// Adds `value` to a stack given by frame names (root first).
    pub fn add<S: AsRef<str>>(&mut self, stack: &[S], value: u64) {
        let ids = stack.iter().map(|f| self.intern(f.as_ref())).collect();
        self.add_ids(ids, value);
    }

    /// Stacks as frame names (root first) with their values (those of every set of labels summed), sorted by
    /// stack for stable output.
    pub fn stacks(&self) -> Vec<(Vec<&str>, u64)> {
        let mut merged: HashMap<&[u32], u64> = HashMap::with_capacity(self.stacks.len());
        for ((ids, _), &v) in &self.stacks {
            let sum = merged.entry(ids).or_insert(0);
            *sum = sum.saturating_add(v);
        }
        let mut out: Vec<(Vec<&str>, u64)> = merged
            .into_iter()
            .map(|(ids, v)| (ids.iter().map(|&i| self.frame(i)).collect(), v))
            .collect();
        out.sort();
        out
    }

    /// Stacks as frame names (root first) with their labels and values, sorted for stable output.
    pub fn labelled_stacks(&self) -> Vec<(Vec<&str>, &Labels, u64)> {
        let mut out: Vec<(Vec<&str>, &Labels, u64)> = self
            .stacks
            .iter()
            .map(|((ids, labels), &v)| {
                let frames = ids.iter().map(|&i| self.frame(i)).collect();
                (frames, &self.label_sets[*labels as usize], v)
            })
            .collect();
        out.sort();
        out
    }

    /// The sum of the stacks' values, stopping at `u64::MAX`.
    pub fn total(&self) -> u64 {
        self.stacks.values().fold(0, |a, &v| a.saturating_add(v))
    }

    pub fn len(&self) -> usize {
        self.stacks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.stacks.is_empty()
    }

    /// Keeps only the stacks for which `keep` says yes (given the frame names, root first).
    pub fn retain(&mut self, mut keep: impl FnMut(&[&str]) -> bool) {
        let frames = &self.frames;
        self.stacks.retain(|(ids, _), _| {
            let names: Vec<&str> = ids.iter().map(|&i| frames[i as usize].as_str()).collect();
            keep(&names)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_stop_at_the_largest() {
        let mut p = Profile::new(Unit::Bytes);
        p.add(&["main", "a"], u64::MAX - 1);
        p.add(&["main", "a"], 2);
        p.add(&["main", "b"], 5);
        assert_eq!(
            p.stacks(),
            vec![(vec!["main", "a"], u64::MAX), (vec!["main", "b"], 5)]
        );
        assert_eq!(p.total(), u64::MAX);
    }
}
