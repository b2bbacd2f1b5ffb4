//! The BPF unwinder (src/bpf/unwind.h) replayed in Rust over [`ProcessTables`], step for step, so that the
//! tables and the walk can be tested without a kernel: on the registers and memory of a core file ([`Core`]).

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use anyhow::{bail, Context, Result};
use object::{
    elf,
    read::elf::{ElfFile64, FileHeader, ProgramHeader},
    Endianness,
};

use super::{table::Kind, BpfMapping, BpfRow, CodeMapping, ProcessTables};
use crate::symbolize::elf::Segment;

/// MAX_UNWIND_MAPPINGS of unwind.h: the BPF side holds only the first ones.
const MAX_UNWIND_MAPPINGS: usize = 256;
/// MAPPING_SEARCH_STEPS and ROW_SEARCH_STEPS of unwind.h.
const MAPPING_SEARCH_STEPS: u32 = 9;
const ROW_SEARCH_STEPS: u32 = 33;
/// MAX_USER_FRAMES of unwind.h.
pub const MAX_USER_FRAMES: usize = 127;

/// The registers an unwind starts from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Registers {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
}

/// `struct user_unwind` of unwind.h.
struct State {
    ip: u64,
    sp: u64,
    bp: u64,
    done: bool,
    mapping: usize,
    ips: Vec<u64>,
}

/// `unwind_from` of unwind.h: the frames (instruction pointer, then return addresses) from `regs`, reading
/// the stack with `read`; at most `max_frames` (MAX_USER_FRAMES in BPF).
pub fn unwind(
    tables: &ProcessTables,
    regs: Registers,
    read: impl Fn(u64) -> Option<u64>,
    max_frames: usize,
) -> Vec<u64> {
    if regs.ip == 0 {
        return Vec::new();
    }
    let mut s = State {
        ip: regs.ip,
        sp: regs.sp,
        bp: regs.bp,
        done: false,
        mapping: MAX_UNWIND_MAPPINGS,
        ips: Vec::new(),
    };
    for index in 0..max_frames {
        if step(tables, index, &mut s, &read, max_frames) {
            break;
        }
    }
    s.ips
}

/// `unwind_step_of` of unwind.h; true to stop.
fn step(
    t: &ProcessTables,
    index: usize,
    s: &mut State,
    read: &impl Fn(u64) -> Option<u64>,
    max_frames: usize,
) -> bool {
    if s.done || s.ips.len() >= max_frames {
        return true;
    }
    s.ips.push(s.ip);

    let pc = if index != 0 {
        s.ip.wrapping_sub(1)
    } else {
        s.ip
    };
    let mut bp = s.bp;
    let mut row = None;
    if let Some(m) = find_unwind_mapping(&t.mappings, pc, s.mapping) {
        s.mapping = m;
        let m = &t.mappings[m];
        if m.row_count != 0 {
            row = find_unwind_row(t, m, pc.wrapping_sub(m.bias));
        }
    }

    const END: u8 = Kind::End as u8;
    const SP: u8 = Kind::Sp as u8;
    const FP: u8 = Kind::Fp as u8;
    const PLT: u8 = Kind::Plt as u8;
    let kind = row.map_or(Kind::Gap as u8, |r| r.kind);
    let cfa_offset = row.map_or(0, |r| i64::from(r.cfa_offset));
    let cfa = match kind {
        END => {
            s.done = true;
            return true;
        }
        SP => s.sp.wrapping_add_signed(cfa_offset),
        FP => s.bp.wrapping_add_signed(cfa_offset),
        PLT => s.sp.wrapping_add(8 + if s.ip & 15 >= 11 { 8 } else { 0 }),
        // frame pointers: [bp] is the caller's bp, [bp + 8] the return address
        _ => {
            if s.bp == 0 {
                s.done = true;
                return true;
            }
            let Some(v) = read(s.bp) else {
                s.done = true;
                return true;
            };
            bp = v;
            s.bp.wrapping_add(16)
        }
    };
    let ra = match read(cfa.wrapping_sub(8)) {
        Some(ra) if ra != 0 => ra,
        _ => {
            s.done = true;
            return true;
        }
    };
    if let Some(r) = row.filter(|r| matches!(kind, SP | FP | PLT) && r.fp_offset != 0) {
        bp = read(cfa.wrapping_add_signed(r.fp_offset.into())).unwrap_or(0);
    }
    s.ip = ra;
    s.sp = cfa;
    s.bp = bp;
    false
}

/// `find_unwind_mapping` and `mapping_search_step` of unwind.h.
fn find_unwind_mapping(mappings: &[BpfMapping], ip: u64, last: usize) -> Option<usize> {
    if last < MAX_UNWIND_MAPPINGS {
        if let Some(m) = mappings.get(last) {
            if m.start <= ip && ip < m.end {
                return Some(last);
            }
        }
    }
    let count = mappings.len().min(MAX_UNWIND_MAPPINGS);
    let (mut lo, mut hi) = (0, count);
    for _ in 0..MAPPING_SEARCH_STEPS {
        if lo >= hi {
            break;
        }
        let mid = (lo + hi) / 2;
        if mappings[mid].start <= ip {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    if lo == 0 {
        return None;
    }
    let m = lo - 1;
    (ip < mappings[m].end).then_some(m)
}

/// `page_row` of unwind.h: unwind_pages[index], -1 past the array.
fn page_row(pages: &[u32], index: u32) -> i64 {
    pages.get(index as usize).map_or(-1, |&r| r.into())
}

/// `find_unwind_row` and `row_search_step` of unwind.h: the row of `m` that holds `vaddr`.
fn find_unwind_row<'t>(t: &'t ProcessTables, m: &BpfMapping, vaddr: u64) -> Option<&'t BpfRow> {
    let page = (vaddr >> 12).wrapping_sub(m.first_page);
    if (vaddr >> 12) < m.first_page || page >= m.page_count.into() {
        return None;
    }
    // The index is a __u32 in BPF.
    let lo = page_row(&t.pages, (u64::from(m.page_start) + page) as u32);
    let hi = page_row(&t.pages, (u64::from(m.page_start) + page + 1) as u32);
    if lo < 0 || hi < lo || hi >= m.row_count.into() {
        return None;
    }
    let (mut c_lo, mut c_hi) = (lo as u32, hi as u32 + 1);
    for _ in 0..ROW_SEARCH_STEPS {
        if c_lo >= c_hi {
            break;
        }
        let mid = ((u64::from(c_lo) + u64::from(c_hi)) / 2) as u32;
        let Some(r) = t.rows.get(m.row_start.wrapping_add(mid) as usize) else {
            c_lo = 0;
            break;
        };
        if u64::from(r.pc) <= vaddr {
            c_lo = mid + 1;
        } else {
            c_hi = mid;
        }
    }
    if i64::from(c_lo) <= lo {
        return None;
    }
    t.rows.get(m.row_start.wrapping_add(c_lo - 1) as usize)
}

/// One thread of a core file.
#[derive(Clone, Copy, Debug)]
pub struct CoreThread {
    pub tid: u32,
    pub regs: Registers,
}

/// A file mapping of a core file (NT_FILE).
#[derive(Clone, Debug)]
pub struct CoreFile {
    pub start: u64,
    pub end: u64,
    /// File offset in bytes.
    pub offset: u64,
    pub path: PathBuf,
}

/// An x86_64 ELF core file (from the kernel or gdb's gcore): its threads' registers, file mappings and
/// the memory it holds.
pub struct Core {
    pub threads: Vec<CoreThread>,
    pub files: Vec<CoreFile>,
    /// PT_LOAD segments with contents: (vaddr, file offset, file size).
    memory: Vec<(u64, usize, usize)>,
    data: Vec<u8>,
}

/// Offset of pr_pid and pr_reg in x86_64 `struct elf_prstatus`; rbp, rip and rsp in `user_regs_struct`.
const PR_PID: usize = 32;
const PR_REG: usize = 112;
const REG_BP: usize = 4;
const REG_IP: usize = 16;
const REG_SP: usize = 19;

impl Core {
    pub fn read(path: &Path) -> Result<Core> {
        let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let file = ElfFile64::<Endianness>::parse(&*data)
            .with_context(|| format!("parsing ELF {}", path.display()))?;
        let e = file.endian();
        if file.elf_header().e_type(e) != elf::ET_CORE {
            bail!("{} is not a core file", path.display());
        }
        let (mut threads, mut files, mut memory) = (Vec::new(), Vec::new(), Vec::new());
        for ph in file.elf_program_headers() {
            match ph.p_type(e) {
                elf::PT_LOAD if ph.p_filesz(e) > 0 => memory.push((
                    ph.p_vaddr(e),
                    ph.p_offset(e) as usize,
                    ph.p_filesz(e) as usize,
                )),
                elf::PT_NOTE => {
                    let mut notes = ph.notes(e, &*data)?.context("a PT_NOTE without notes")?;
                    while let Some(n) = notes.next()? {
                        if n.name() != b"CORE" {
                            continue;
                        }
                        match n.n_type(e) {
                            elf::NT_PRSTATUS => threads.push(prstatus(n.desc())?),
                            elf::NT_FILE => files = nt_file(n.desc())?,
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(Core {
            threads,
            files,
            memory,
            data,
        })
    }

    /// The 8 bytes at `addr`, if the core holds them.
    pub fn read_u64(&self, addr: u64) -> Option<u64> {
        let &(vaddr, off, size) = self
            .memory
            .iter()
            .find(|&&(v, _, size)| addr >= v && addr - v < size as u64)?;
        let at = (addr - vaddr) as usize;
        if size - at < 8 {
            return None;
        }
        // The segment's file offset comes from the core file: it may point anywhere, even past 2^64.
        let start = off.checked_add(at)?;
        let b = self.data.get(start..start.checked_add(8)?)?;
        Some(u64::from_le_bytes(b.try_into().unwrap()))
    }

    /// The file mappings that hold code: their file offset is in an executable segment of the file (read
    /// from this machine's file system); one `file` id per path.
    pub fn code_mappings(&self) -> Vec<CodeMapping> {
        let mut segments: HashMap<&Path, (u64, Vec<Segment>)> = HashMap::new();
        let mut code = Vec::new();
        for f in &self.files {
            let next = segments.len() as u64;
            let (id, segs) = segments.entry(&f.path).or_insert_with(|| {
                let segs = std::fs::read(&f.path)
                    .ok()
                    .and_then(|d| object::File::parse(&*d).ok().map(|o| Segment::all(&o)))
                    .unwrap_or_default();
                (next, segs)
            });
            let exec = segs
                .iter()
                .any(|s| s.exec && s.holds_page_offset(f.offset, s.filesz));
            if exec {
                code.push(CodeMapping {
                    start: f.start,
                    end: f.end,
                    offset: f.offset,
                    file: *id,
                    path: f.path.clone(),
                    label: f.path.display().to_string(),
                });
            }
        }
        code
    }
}

fn u64_at(b: &[u8], at: usize) -> Result<u64> {
    let b = b.get(at..at + 8).context("note too short")?;
    Ok(u64::from_le_bytes(b.try_into().unwrap()))
}

/// NT_PRSTATUS: the thread id and its registers.
fn prstatus(desc: &[u8]) -> Result<CoreThread> {
    let tid = desc
        .get(PR_PID..PR_PID + 4)
        .context("NT_PRSTATUS too short")?;
    let reg = |i: usize| u64_at(desc, PR_REG + 8 * i);
    Ok(CoreThread {
        tid: u32::from_le_bytes(tid.try_into().unwrap()),
        regs: Registers {
            ip: reg(REG_IP)?,
            sp: reg(REG_SP)?,
            bp: reg(REG_BP)?,
        },
    })
}

/// NT_FILE: count, page size, count × (start, end, offset in pages), then the names.
fn nt_file(desc: &[u8]) -> Result<Vec<CoreFile>> {
    let (count, page) = (u64_at(desc, 0)?, u64_at(desc, 8)?);
    // The count comes from the file: its entries must fit in the note (16 + count × 24 may pass 2^64).
    let count = usize::try_from(count)
        .ok()
        .filter(|&n| n <= (desc.len() - 16) / 24)
        .context("NT_FILE too short")?;
    let names_at = 16 + count * 24;
    let mut names = desc[names_at..].split(|&c| c == 0);
    (0..count)
        .map(|i| {
            let at = 16 + i * 24;
            let name = names.next().context("NT_FILE: a name missing")?;
            let pages = u64_at(desc, at + 16)?;
            Ok(CoreFile {
                start: u64_at(desc, at)?,
                end: u64_at(desc, at + 8)?,
                offset: pages
                    .checked_mul(page)
                    .context("NT_FILE: a file offset past 2^64")?,
                path: PathBuf::from(String::from_utf8_lossy(name).into_owned()),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An NT_FILE note: count, page size, (start, end, offset in pages) per file, then NUL-terminated names.
    fn nt_file_note(count: u64, page: u64, files: &[(u64, u64, u64, &str)]) -> Vec<u8> {
        let mut desc: Vec<u8> = [count, page].iter().flat_map(|v| v.to_le_bytes()).collect();
        for &(start, end, pages, _) in files {
            desc.extend([start, end, pages].iter().flat_map(|v| v.to_le_bytes()));
        }
        for &(.., name) in files {
            desc.extend(name.as_bytes());
            desc.push(0);
        }
        desc
    }

    #[test]
    fn nt_file_with_a_count_past_its_size_is_an_error() {
        let files = [(0x1000, 0x2000, 1, "/lib/a.so")];
        let ok = nt_file(&nt_file_note(1, 4096, &files)).unwrap();
        assert_eq!((ok[0].start, ok[0].offset), (0x1000, 4096));
        assert_eq!(ok[0].path, Path::new("/lib/a.so"));
        // 2^61 entries of 24 bytes wrap 16 + count × 24 to 16.
        for count in [2, 1 << 61, u64::MAX / 24 + 1, u64::MAX] {
            let err = nt_file(&nt_file_note(count, 4096, &files)).unwrap_err();
            assert_eq!(err.to_string(), "NT_FILE too short", "count {count}");
        }
    }

    #[test]
    fn nt_file_with_an_offset_past_2_64_is_an_error() {
        let files = [(0x1000, 0x2000, 1 << 53, "/lib/a.so")];
        let err = nt_file(&nt_file_note(1, 4096, &files)).unwrap_err();
        assert_eq!(err.to_string(), "NT_FILE: a file offset past 2^64");
    }

    #[test]
    fn memory_whose_file_offset_passes_the_end_is_not_read() {
        let mut data = vec![0u8; 64];
        data[8..16].copy_from_slice(&42u64.to_le_bytes());
        let core = Core {
            threads: Vec::new(),
            files: Vec::new(),
            memory: vec![(0x1000, 8, 32), (0x2000, usize::MAX - 4, 32)],
            data,
        };
        assert_eq!(core.read_u64(0x1000), Some(42));
        assert_eq!(core.read_u64(0x1019), None);
        assert_eq!(core.read_u64(0x2000), None);
        assert_eq!(core.read_u64(0x2010), None);
    }
}
