//! Static probes (USDT, SystemTap's `sys/sdt.h` and DTrace's `DTRACE_PROBE`): the `.note.stapsdt` notes of a
//! binary, listed for `myprobe trace --list usdt`. Attaching is libbpf's, which reads the same notes and
//! decodes the arguments from their specs.

use std::path::Path;

use anyhow::{Context, Result};
use object::{Object, ObjectSection};

/// One probe site. A probe inlined in several places has several sites with the same provider and name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsdtProbe {
    pub provider: String,
    pub name: String,
    /// The site's address, as the note gives it (before `.stapsdt.base` prelink adjustment).
    pub address: u64,
    /// The semaphore's address (0: none): a probe guarded by one costs nothing until someone attaches.
    pub semaphore: u64,
    /// The argument specs, e.g. `-4@%edi 8@%rsi`: size (negative: signed) @ where.
    pub args: String,
}

impl UsdtProbe {
    pub fn arg_count(&self) -> usize {
        self.args.split_whitespace().count()
    }
}

const NT_STAPSDT: u32 = 3;

/// The probes of `path`; none when it has no `.note.stapsdt` section.
pub fn probes(path: &Path) -> Result<Vec<UsdtProbe>> {
    let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let file = object::File::parse(&*data)
        .with_context(|| format!("{} is not an ELF file", path.display()))?;
    let Some(section) = file.section_by_name(".note.stapsdt") else {
        return Ok(Vec::new());
    };
    let notes = section
        .data()
        .with_context(|| format!("reading .note.stapsdt of {}", path.display()))?;
    Ok(parse_notes(notes, file.is_little_endian()))
}

/// Parses ELF notes (`namesz`, `descsz`, `type`, name and desc each padded to 4 bytes); the `stapsdt` ones
/// of type 3 are probes. Stops at the first note that does not fit.
pub fn parse_notes(mut notes: &[u8], little_endian: bool) -> Vec<UsdtProbe> {
    let word = |b: &[u8]| -> u32 {
        let b = [b[0], b[1], b[2], b[3]];
        if little_endian {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        }
    };
    let address = |b: &[u8]| -> u64 {
        let b: [u8; 8] = b[..8].try_into().expect("8 bytes");
        if little_endian {
            u64::from_le_bytes(b)
        } else {
            u64::from_be_bytes(b)
        }
    };
    let pad = |n: usize| n.div_ceil(4) * 4;
    let mut found = Vec::new();
    while notes.len() >= 12 {
        let (namesz, descsz, kind) = (
            word(&notes[0..]) as usize,
            word(&notes[4..]) as usize,
            word(&notes[8..]),
        );
        let name_end = 12usize.saturating_add(pad(namesz));
        let desc_end = name_end.saturating_add(pad(descsz));
        if desc_end > notes.len() || namesz > notes.len() || descsz > notes.len() {
            break;
        }
        let name = &notes[12..12 + namesz];
        let desc = &notes[name_end..name_end + descsz];
        if kind == NT_STAPSDT && name == b"stapsdt\0" && desc.len() > 24 {
            let mut strings = desc[24..].split(|&b| b == 0);
            let mut text = || {
                strings
                    .next()
                    .map(|s| String::from_utf8_lossy(s).into_owned())
                    .unwrap_or_default()
            };
            let (provider, probe, args) = (text(), text(), text());
            if !provider.is_empty() && !probe.is_empty() {
                found.push(UsdtProbe {
                    provider,
                    name: probe,
                    address: address(&desc[0..]),
                    semaphore: address(&desc[16..]),
                    args,
                });
            }
        }
        notes = &notes[desc_end..];
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(provider: &str, name: &str, args: &str) -> Vec<u8> {
        let mut desc = Vec::new();
        desc.extend(0x1234u64.to_le_bytes());
        desc.extend(0u64.to_le_bytes());
        desc.extend(0x5678u64.to_le_bytes());
        for s in [provider, name, args] {
            desc.extend(s.as_bytes());
            desc.push(0);
        }
        let mut n = Vec::new();
        n.extend(8u32.to_le_bytes());
        n.extend((desc.len() as u32).to_le_bytes());
        n.extend(3u32.to_le_bytes());
        n.extend(b"stapsdt\0");
        let len = desc.len();
        n.extend(desc);
        n.resize(n.len() + (len.div_ceil(4) * 4 - len), 0);
        n
    }

    #[test]
    fn notes_give_probes_and_stop_at_garbage() {
        let mut notes = note("mysql", "query__start", "8@%rdi -4@%esi");
        notes.extend(note("fixture", "tick", ""));
        let probes = parse_notes(&notes, true);
        assert_eq!(probes.len(), 2);
        assert_eq!(probes[0].provider, "mysql");
        assert_eq!(probes[0].name, "query__start");
        assert_eq!(probes[0].address, 0x1234);
        assert_eq!(probes[0].semaphore, 0x5678);
        assert_eq!(probes[0].arg_count(), 2);
        assert_eq!(probes[1].arg_count(), 0);
        // Cut anywhere: the notes before the cut, never a panic.
        for cut in 0..notes.len() {
            assert!(parse_notes(&notes[..cut], true).len() <= 2);
        }
        let mut huge = notes.clone();
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(parse_notes(&huge, true).is_empty());
    }
}
