//! The texts of statements prepared before tracing, read at their executions from the server's own statement
//! objects: a uprobe on the member function that runs each execution (`Server::statement_execute`,
//! `on_execute` in src/bpf/queries.bpf.c) reads the text the object keeps, a pointer and a 64-bit length at
//! some offset in it. No debug information says where: the offset is found on statements that myprobe prepares
//! and executes itself, with texts it knows (`CALIBRATION_TEXTS`). Until then the probe sends the objects'
//! addresses; the objects of those statements are read from the server's memory, and the one offset that
//! holds each text with its length, the same in both, is the offset. Anything else (no object seen, no such
//! offset, several) fails, and the texts are then looked for elsewhere: never guessed.
//!
//! Once the offset is known, each execution's event carries its statement's text, before the execution's own
//! record (which is sent when it ends), on the same thread and with the same statement id: that record is named
//! by it.

use std::{
    collections::{BTreeSet, VecDeque},
    fs::File,
    os::unix::fs::FileExt,
    time::{Duration, Instant},
};

use rustc_hash::FxHashMap as HashMap;

use crate::collect::queries::Executed;

/// The statements myprobe prepares and executes to find where the text is: two lengths, so that a length
/// that happens to equal one of them elsewhere in the object cannot pass for both.
pub const CALIBRATION_TEXTS: [&str; 2] = [
    "SELECT 1 AS myprobe_calibration",
    "SELECT 1, 2 AS myprobe_calibration_of_statement_texts",
];

/// How much of a statement object is searched for its text (MariaDB's holds it at 0x70, MySQL's further in).
const OBJECT_BYTES: usize = 2048;
/// How long the objects of myprobe's own statements are awaited once they ran: they are in the ring buffer
/// before the server replied, so this is only how late the reader may be.
const CALIBRATION_WAIT: Duration = Duration::from_secs(10);
/// Objects kept while the ids of myprobe's own statements are not known yet (each execution sends one).
const MAX_OBJECTS: usize = 4096;
/// Texts kept per thread for the record of their execution (one per thread at a time).
const MAX_PENDING: usize = 100_000;
/// A length read at the offset beyond this is not a statement's: the offset is wrong for this object.
const MAX_TEXT_LEN: u64 = 1 << 30;

#[derive(Debug)]
enum Calibration {
    /// The probe has not been attached yet.
    NotStarted,
    /// myprobe's own statements are being prepared and run.
    Asked,
    /// They ran: their ids and texts, and the offsets found so far in objects of each id.
    Ran {
        statements: Vec<(u32, &'static str)>,
        since: Instant,
        offsets: Vec<BTreeSet<u32>>,
    },
    Found(u32),
    Failed,
}

/// What the calibration concluded, once.
#[derive(Debug, PartialEq, Eq)]
pub enum Calibrated {
    Offset(u32),
    Failed(String),
}

pub struct ExecutedTexts {
    mem: Option<File>,
    calibration: Calibration,
    /// Executions' objects while the ids of myprobe's own statements are not known yet: (statement id, object).
    objects: VecDeque<(u32, u64)>,
    /// Per thread, the statement id and text of the execution under way (its record comes after).
    pending: HashMap<u32, (u32, String, bool)>,
    /// Texts read that cannot be statements' (a length out of bounds): not used, and said.
    pub implausible: u64,
}

impl ExecutedTexts {
    pub fn new(pid: u32) -> ExecutedTexts {
        ExecutedTexts {
            mem: File::open(format!("/proc/{pid}/mem")).ok(),
            calibration: Calibration::NotStarted,
            objects: VecDeque::new(),
            pending: HashMap::default(),
            implausible: 0,
        }
    }

    /// Where the object keeps its text, once found (0: not yet, or never).
    pub fn offset(&self) -> u32 {
        match self.calibration {
            Calibration::Found(offset) => offset,
            _ => 0,
        }
    }

    pub fn failed(&self) -> bool {
        matches!(self.calibration, Calibration::Failed)
    }

    /// Whether the offset is still being looked for (myprobe's own statements asked for, or run).
    pub fn calibrating(&self) -> bool {
        matches!(
            self.calibration,
            Calibration::Asked | Calibration::Ran { .. }
        )
    }

    /// The probe is attached: true the first time, when myprobe's own statements are to run now.
    pub fn attached(&mut self) -> bool {
        let first = matches!(self.calibration, Calibration::NotStarted);
        if first {
            self.calibration = Calibration::Asked;
        }
        first
    }

    /// myprobe's own statements ran, with these ids (or could not: why).
    pub fn own_statements_ran(
        &mut self,
        ran: Result<Vec<(u32, &'static str)>, String>,
    ) -> Option<Calibrated> {
        let statements = match ran {
            Ok(s) => s,
            Err(why) => return Some(self.fail(format!("its own statements failed: {why}"))),
        };
        let offsets = vec![BTreeSet::new(); statements.len()];
        self.calibration = Calibration::Ran {
            statements,
            since: Instant::now(),
            offsets,
        };
        let objects: Vec<_> = self.objects.drain(..).collect();
        objects
            .into_iter()
            .find_map(|(id, object)| self.object(id, object))
            .or_else(|| self.overdue())
    }

    /// An execution seen by the probe: an object while calibrating (the calibration's conclusion, if this was
    /// the last object it needed), a text once calibrated.
    pub fn event(&mut self, e: Executed) -> Option<Calibrated> {
        match &self.calibration {
            // Sent before the probe knew the offset.
            Calibration::Found(_) if e.text.is_empty() && e.full_len == 0 => None,
            Calibration::Found(_) => {
                if e.text.is_empty() || e.full_len > MAX_TEXT_LEN {
                    self.implausible += 1;
                    return None;
                }
                if self.pending.len() >= MAX_PENDING {
                    self.pending.clear();
                }
                let truncated = e.full_len > e.text.len() as u64;
                let text = String::from_utf8_lossy(&e.text).into_owned();
                self.pending
                    .insert(e.tid, (e.statement_id, text, truncated));
                None
            }
            Calibration::NotStarted | Calibration::Asked => {
                if self.objects.len() >= MAX_OBJECTS {
                    self.objects.pop_front();
                }
                self.objects.push_back((e.statement_id, e.object));
                None
            }
            Calibration::Ran { .. } => self
                .object(e.statement_id, e.object)
                .or_else(|| self.overdue()),
            _ => None,
        }
    }

    /// The text of the execution of statement `id` under way on thread `tid`, whose record this is: (text, cut).
    pub fn take(&mut self, tid: u32, id: u32) -> Option<(String, bool)> {
        match self.pending.remove(&tid) {
            Some((pending_id, text, truncated)) if pending_id == id => Some((text, truncated)),
            _ => None,
        }
    }

    /// The calibration, if its objects have been awaited too long.
    pub fn overdue(&mut self) -> Option<Calibrated> {
        match &self.calibration {
            Calibration::Ran { since, .. } if since.elapsed() >= CALIBRATION_WAIT => {
                Some(self.fail(format!(
                    "no execution of its own statements was seen there within {} s",
                    CALIBRATION_WAIT.as_secs()
                )))
            }
            _ => None,
        }
    }

    /// Gives up, for `why`.
    pub fn fail(&mut self, why: String) -> Calibrated {
        self.calibration = Calibration::Failed;
        self.objects.clear();
        Calibrated::Failed(why)
    }

    /// An object of statement `id` while calibrating: the offsets where it holds one of myprobe's own texts.
    fn object(&mut self, id: u32, object: u64) -> Option<Calibrated> {
        let Calibration::Ran {
            statements,
            offsets,
            ..
        } = &mut self.calibration
        else {
            return None;
        };
        let mem = self.mem.as_ref()?;
        for ((own_id, text), found) in statements.iter().zip(offsets.iter_mut()) {
            if *own_id == id {
                found.extend(text_offsets(mem, object, text));
            }
        }
        if offsets.iter().any(BTreeSet::is_empty) {
            return None;
        }
        let mut common = offsets[0].clone();
        for o in &offsets[1..] {
            common.retain(|x| o.contains(x));
        }
        let common: Vec<u32> = common.into_iter().collect();
        Some(match common[..] {
            [offset] => {
                self.calibration = Calibration::Found(offset);
                Calibrated::Offset(offset)
            }
            [] => {
                self.fail("its own statements' objects hold their texts at different places".into())
            }
            _ => self.fail(format!(
                "its own statements' objects hold their texts at several places ({common:x?})"
            )),
        })
    }
}

/// The offsets in the object at `object` (8-byte aligned, past its first word) of a pointer to `text` followed by
/// its length.
fn text_offsets(mem: &File, object: u64, text: &str) -> Vec<u32> {
    let mut bytes = vec![0u8; OBJECT_BYTES];
    let Ok(n) = mem.read_at(&mut bytes, object) else {
        return Vec::new();
    };
    let word = |at: usize| -> Option<u64> {
        Some(u64::from_ne_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
    };
    let mut found = Vec::new();
    let mut buf = vec![0u8; text.len()];
    for at in (8..n.saturating_sub(15)).step_by(8) {
        let (Some(pointer), Some(len)) = (word(at), word(at + 8)) else {
            continue;
        };
        if len != text.len() as u64 || pointer == 0 {
            continue;
        }
        if mem.read_at(&mut buf, pointer).is_ok_and(|n| n == buf.len()) && buf == text.as_bytes() {
            found.push(at as u32);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This process's memory stands for the server's: an object holding a text at 0x70, a decoy length at 0x20.
    struct Object {
        words: Vec<u64>,
        _texts: Vec<Vec<u8>>,
    }

    fn object(text: &str, at: usize) -> Object {
        let texts = vec![text.as_bytes().to_vec()];
        let mut words = vec![0u64; OBJECT_BYTES / 8];
        words[at / 8] = texts[0].as_ptr() as u64;
        words[at / 8 + 1] = text.len() as u64;
        words[0x28 / 8] = text.len() as u64; // a length without its pointer
        Object {
            words,
            _texts: texts,
        }
    }

    fn executed(id: u32, o: &Object) -> Executed {
        Executed {
            tid: 1,
            statement_id: id,
            object: o.words.as_ptr() as u64,
            full_len: 0,
            text: Vec::new(),
        }
    }

    fn texts() -> ExecutedTexts {
        ExecutedTexts::new(std::process::id())
    }

    #[test]
    fn the_offset_is_where_both_own_statements_keep_their_texts() {
        let a = object(CALIBRATION_TEXTS[0], 0x70);
        let b = object(CALIBRATION_TEXTS[1], 0x70);
        let mut t = texts();
        assert!(!t.calibrating());
        assert!(t.attached());
        assert!(!t.attached());
        assert!(t.calibrating());
        // One object arrives before the ids are known, the other after; another connection's statement 5 too.
        assert_eq!(t.event(executed(4, &a)), None);
        let other = object("SELECT c FROM sbtest1 WHERE id=?", 0x70);
        assert_eq!(t.event(executed(5, &other)), None);
        let ran = vec![(4, CALIBRATION_TEXTS[0]), (5, CALIBRATION_TEXTS[1])];
        assert_eq!(t.own_statements_ran(Ok(ran)), None);
        assert!(
            t.calibrating(),
            "the objects of its own statements are awaited"
        );
        assert_eq!(t.event(executed(5, &b)), Some(Calibrated::Offset(0x70)));
        assert_eq!(t.offset(), 0x70);
        assert!(!t.calibrating());
    }

    #[test]
    fn texts_at_different_places_fail() {
        let a = object(CALIBRATION_TEXTS[0], 0x70);
        let b = object(CALIBRATION_TEXTS[1], 0x90);
        let mut t = texts();
        t.attached();
        let ran = vec![(1, CALIBRATION_TEXTS[0]), (2, CALIBRATION_TEXTS[1])];
        t.own_statements_ran(Ok(ran));
        assert_eq!(t.event(executed(1, &a)), None);
        assert!(matches!(
            t.event(executed(2, &b)),
            Some(Calibrated::Failed(_))
        ));
        assert!(t.failed() && t.offset() == 0);
    }

    #[test]
    fn a_text_names_the_next_execution_of_its_statement_on_its_thread() {
        let mut t = texts();
        t.calibration = Calibration::Found(0x70);
        let text = |id: u32, s: &str, full_len: u64| Executed {
            tid: 7,
            statement_id: id,
            object: 0,
            full_len,
            text: s.as_bytes().to_vec(),
        };
        t.event(text(3, "UPDATE t SET v=? WHERE id=?", 27));
        assert_eq!(t.take(7, 4), None, "another statement");
        assert_eq!(t.take(7, 3), None, "taken by the record before");
        t.event(text(3, "UPDATE t SET", 27));
        assert_eq!(t.take(7, 3), Some(("UPDATE t SET".to_string(), true)));
        t.event(text(3, "", 1 << 40));
        assert_eq!((t.take(7, 3), t.implausible), (None, 1));
    }
}
