//! A process's core file (the kernel's, or gdb's `gcore`; x86_64): each thread's registers, the files that were
//! mapped and their build-ids, and the memory the core holds. The file is mapped, not read: a server's core is
//! gigabytes, and only the stacks and a few words are looked at.

use std::{
    collections::HashMap,
    fmt::Write as _,
    path::{Path, PathBuf},
};

use anyhow::{bail, Context, Result};
use object::{
    elf,
    read::elf::{FileHeader, ProgramHeader},
    Endianness,
};

use crate::process::maps::ProcMaps;
use crate::{symbolize::elf::Segment, unwind::replay::Registers, unwind::CodeMapping};

/// One thread of a core file.
#[derive(Clone, Copy, Debug)]
pub struct CoreThread {
    pub tid: u32,
    pub regs: Registers,
    /// The syscall it was in (`orig_rax`), -1 for none, and its arguments.
    pub syscall: i64,
    pub args: [u64; 6],
    /// Its thread pointer (`fs_base`): glibc's `pthread_self()`.
    pub tls_base: u64,
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

/// The bytes of the core: mapped from its file, or owned (tests).
enum Bytes {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// An x86_64 ELF core file.
pub struct Core {
    pub threads: Vec<CoreThread>,
    pub files: Vec<CoreFile>,
    /// The process's name (NT_PRPSINFO's `pr_fname`).
    pub name: String,
    /// The signal the core was dumped on (the first thread's `pr_cursig`, which the kernel gives the thread that
    /// received it); 0 when none (gcore of a running process).
    pub signal: u16,
    /// The executable's entry point (AT_ENTRY of NT_AUXV): the file mapped there is the executable.
    entry: Option<u64>,
    /// PT_LOAD segments with contents: (vaddr, file offset, file size).
    memory: Vec<(u64, usize, usize)>,
    data: Bytes,
}

/// Offsets in x86_64 `struct elf_prstatus`: pr_cursig, pr_pid, pr_reg; registers in `user_regs_struct`.
const PR_CURSIG: usize = 12;
const PR_PID: usize = 32;
const PR_REG: usize = 112;
const REG_BP: usize = 4;
const REG_R10: usize = 7;
const REG_R9: usize = 8;
const REG_R8: usize = 9;
const REG_DX: usize = 12;
const REG_SI: usize = 13;
const REG_DI: usize = 14;
const REG_ORIG_AX: usize = 15;
const REG_IP: usize = 16;
const REG_SP: usize = 19;
const REG_FS_BASE: usize = 21;
/// Offset of pr_fname in x86_64 `struct elf_prpsinfo`, and its size.
const PR_FNAME: usize = 40;
const FNAME_LEN: usize = 16;
/// NT_AUXV's entry point tag.
const AT_ENTRY: u64 = 9;

/// The process's memory as the core holds it: what it did not keep (a mapping's file-backed code, memory
/// filtered out) reads as not mapped.
impl crate::process::memory::Memory for Core {
    fn read(&self, addr: u64, buf: &mut [u8]) -> usize {
        let mut done = 0;
        while done < buf.len() {
            let at = addr.wrapping_add(done as u64);
            let Some(&(vaddr, _, size)) = self
                .memory
                .iter()
                .find(|&&(v, _, size)| at >= v && at - v < size as u64)
            else {
                break;
            };
            let n = (buf.len() - done).min(size - (at - vaddr) as usize);
            let Some(bytes) = self.read_bytes(at, n) else {
                break;
            };
            buf[done..done + n].copy_from_slice(bytes);
            done += n;
        }
        done
    }
}

impl Core {
    /// Reads the core at `path`; an error in one line for a file that is not a core, or not a whole one.
    pub fn read(path: &Path) -> Result<Core> {
        let file =
            std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
        // SAFETY: the mapping is read only; a core file changed while read gives wrong frames, not UB in Rust
        // terms beyond what every reader of a mapped file accepts.
        let map = unsafe { memmap2::Mmap::map(&file) }
            .with_context(|| format!("reading {}", path.display()))?;
        Self::parse(Bytes::Mapped(map)).map_err(|e| anyhow::anyhow!("{}: {e:#}", path.display()))
    }

    /// A core from its bytes (the fuzz tests' entry).
    pub fn from_bytes(data: Vec<u8>) -> Result<Core> {
        Self::parse(Bytes::Owned(data))
    }

    fn parse(data: Bytes) -> Result<Core> {
        // The file header and program headers only: a truncated core loses its section headers first (gcore
        // writes them last), and they are not needed.
        let header = elf::FileHeader64::<Endianness>::parse(&*data)
            .map_err(|_| anyhow::anyhow!("not an ELF file (not a core file)"))?;
        let e = header
            .endian()
            .map_err(|_| anyhow::anyhow!("not an ELF file (not a core file)"))?;
        if header.e_type(e) != elf::ET_CORE {
            bail!("an ELF file but not a core file (a program or a library?)");
        }
        if header.e_machine(e) != elf::EM_X86_64 {
            bail!(
                "a core of another architecture (ELF machine {}): only x86_64 cores are read",
                header.e_machine(e)
            );
        }
        let phdrs = header
            .program_headers(e, &*data)
            .map_err(|_| anyhow::anyhow!("the core is truncated: its program headers are cut"))?;
        // A core cut short (RLIMIT_CORE, a full disk, a copy interrupted): say so rather than show the
        // threads whose stacks are missing as if they were empty.
        let described = phdrs
            .iter()
            .map(|ph| ph.p_offset(e).saturating_add(ph.p_filesz(e)))
            .max()
            .unwrap_or(0);
        if described > data.len() as u64 {
            bail!(
                "the core is truncated: it holds {} bytes of the {described} its headers describe \
                 (cut short by `ulimit -c`, a full disk or an interrupted copy?)",
                data.len()
            );
        }
        let (mut threads, mut files, mut memory) = (Vec::new(), Vec::new(), Vec::new());
        let (mut name, mut entry) = (String::new(), None);
        let mut signal = None;
        for ph in phdrs {
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
                            elf::NT_PRSTATUS => {
                                let (t, sig) = prstatus(n.desc())?;
                                signal.get_or_insert(sig);
                                threads.push(t);
                            }
                            elf::NT_PRPSINFO => name = prpsinfo_name(n.desc()),
                            elf::NT_AUXV => entry = auxv_entry(n.desc()),
                            elf::NT_FILE => files = nt_file(n.desc())?,
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        if threads.is_empty() {
            bail!("a core file without threads (no NT_PRSTATUS note)");
        }
        Ok(Core {
            threads,
            files,
            name,
            signal: signal.unwrap_or(0),
            entry,
            memory,
            data,
        })
    }

    /// `len` bytes at `addr`, if the core holds them all in one segment.
    pub fn read_bytes(&self, addr: u64, len: usize) -> Option<&[u8]> {
        let &(vaddr, off, size) = self
            .memory
            .iter()
            .find(|&&(v, _, size)| addr >= v && addr - v < size as u64)?;
        let at = (addr - vaddr) as usize;
        if size - at < len {
            return None;
        }
        // The segment's file offset comes from the core file: it may point anywhere, even past 2^64.
        let start = off.checked_add(at)?;
        self.data.get(start..start.checked_add(len)?)
    }

    /// Where the core maps `path` from its first byte.
    pub fn mapped_start(&self, path: &Path) -> Option<u64> {
        self.files
            .iter()
            .filter(|f| f.offset == 0 && f.path == path)
            .map(|f| f.start)
            .min()
    }

    /// The 8 bytes at `addr`, if the core holds them.
    pub fn read_u64(&self, addr: u64) -> Option<u64> {
        let b = self.read_bytes(addr, 8)?;
        Some(u64::from_le_bytes(b.try_into().ok()?))
    }

    /// The 4 bytes at `addr`, if the core holds them.
    pub fn read_u32(&self, addr: u64) -> Option<u32> {
        let b = self.read_bytes(addr, 4)?;
        Some(u32::from_le_bytes(b.try_into().ok()?))
    }

    /// The executable: the file mapped at the entry point, else the first file mapped at offset 0.
    pub fn exe(&self) -> Option<&Path> {
        let at_entry = self
            .entry
            .and_then(|a| self.files.iter().find(|f| (f.start..f.end).contains(&a)));
        at_entry
            .or_else(|| self.files.iter().find(|f| f.offset == 0))
            .map(|f| f.path.as_path())
    }

    /// The build-id of `path` as it was when the core was dumped: from the ELF headers in the first page of its
    /// mapping at offset 0, which the core holds when the kernel's `coredump_filter` keeps ELF headers (its
    /// default) or gcore wrote it; `None` when the core lacks it.
    pub fn build_id(&self, path: &Path) -> Option<Vec<u8>> {
        let first = self
            .files
            .iter()
            .find(|f| f.offset == 0 && f.path == path)?;
        let len = first.end.saturating_sub(first.start).min(4096) as usize;
        let page = self.read_bytes(first.start, len)?;
        let header = elf::FileHeader64::<Endianness>::parse(page).ok()?;
        let e = header.endian().ok()?;
        for ph in header.program_headers(e, page).ok()? {
            if ph.p_type(e) != elf::PT_NOTE {
                continue;
            }
            let Ok(Some(mut notes)) = ph.notes(e, page) else {
                continue;
            };
            while let Ok(Some(n)) = notes.next() {
                if n.name() == elf::ELF_NOTE_GNU && n.n_type(e) == elf::NT_GNU_BUILD_ID {
                    return Some(n.desc().to_vec());
                }
            }
        }
        None
    }

    /// The file mappings as `/proc/PID/maps` would show them, for the symbolizers, each file read from
    /// `open(path)` (the file on this machine, or the one the user named); the memory the core holds outside
    /// files as anonymous mappings (where a file's `.bss` is).
    pub fn proc_maps(&self, open: &impl Fn(&Path) -> PathBuf) -> ProcMaps {
        use std::os::unix::fs::MetadataExt;
        let mut text = String::new();
        let mut opens = HashMap::new();
        let code = self.code_mappings(open);
        for f in &self.files {
            // A name is one line of the maps.
            if f.path.as_os_str().as_encoded_bytes().contains(&b'\n') {
                continue;
            }
            let open_path = open(&f.path);
            let exec = code.iter().any(|c| c.start == f.start);
            // Symbolizers take inode 0 for "no real file".
            let inode = std::fs::metadata(&open_path).map_or(1, |m| m.ino().max(1));
            let _ = writeln!(
                text,
                "{:x}-{:x} r{}p {:x} 00:00 {inode} {}",
                f.start,
                f.end,
                if exec { "-x" } else { "w-" },
                f.offset,
                f.path.display()
            );
            opens.insert(f.path.clone(), open_path);
        }
        for &(vaddr, _, size) in &self.memory {
            let end = vaddr.saturating_add(size as u64);
            if !self.files.iter().any(|f| f.start < end && vaddr < f.end) {
                let _ = writeln!(text, "{vaddr:x}-{end:x} rw-p 0 00:00 0");
            }
        }
        ProcMaps::fixed(&text, opens)
    }

    /// The file mappings that hold code (their file offset is in an executable segment of the file, read from
    /// `open(path)`); one `file` id per path.
    pub fn code_mappings(&self, open: &impl Fn(&Path) -> PathBuf) -> Vec<CodeMapping> {
        let mut segments: HashMap<&Path, (u64, Vec<Segment>)> = HashMap::new();
        let mut code = Vec::new();
        for f in &self.files {
            let next = segments.len() as u64;
            let (id, segs) = segments.entry(&f.path).or_insert_with(|| {
                let segs = std::fs::read(open(&f.path))
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
                    path: open(&f.path),
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

/// NT_PRSTATUS: the thread id, its registers, and the signal that dumped the core.
fn prstatus(desc: &[u8]) -> Result<(CoreThread, u16)> {
    let tid = desc
        .get(PR_PID..PR_PID + 4)
        .context("NT_PRSTATUS too short")?;
    let cursig = desc
        .get(PR_CURSIG..PR_CURSIG + 2)
        .context("NT_PRSTATUS too short")?;
    let reg = |i: usize| u64_at(desc, PR_REG + 8 * i);
    let thread = CoreThread {
        tid: u32::from_le_bytes(tid.try_into().unwrap()),
        regs: Registers {
            ip: reg(REG_IP)?,
            sp: reg(REG_SP)?,
            bp: reg(REG_BP)?,
        },
        syscall: reg(REG_ORIG_AX)? as i64,
        args: [
            reg(REG_DI)?,
            reg(REG_SI)?,
            reg(REG_DX)?,
            reg(REG_R10)?,
            reg(REG_R8)?,
            reg(REG_R9)?,
        ],
        tls_base: reg(REG_FS_BASE)?,
    };
    Ok((thread, u16::from_le_bytes(cursig.try_into().unwrap())))
}

/// NT_PRPSINFO: the process's name.
fn prpsinfo_name(desc: &[u8]) -> String {
    let name = desc.get(PR_FNAME..PR_FNAME + FNAME_LEN).unwrap_or_default();
    let name = name.split(|&c| c == 0).next().unwrap_or_default();
    String::from_utf8_lossy(name).into_owned()
}

/// NT_AUXV: (tag, value) pairs; the entry point's.
fn auxv_entry(desc: &[u8]) -> Option<u64> {
    desc.chunks_exact(16).find_map(|p| {
        let tag = u64::from_le_bytes(p[..8].try_into().ok()?);
        (tag == AT_ENTRY).then(|| u64::from_le_bytes(p[8..].try_into().unwrap()))
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
            name: String::new(),
            signal: 0,
            entry: None,
            memory: vec![(0x1000, 8, 32), (0x2000, usize::MAX - 4, 32)],
            data: Bytes::Owned(data),
        };
        assert_eq!(core.read_u64(0x1000), Some(42));
        assert_eq!(core.read_u64(0x1019), None);
        assert_eq!(core.read_u64(0x2000), None);
        assert_eq!(core.read_u64(0x2010), None);
    }

    #[test]
    fn what_is_not_a_core_says_what_it_is() {
        let err = |bytes: Vec<u8>| Core::parse(Bytes::Owned(bytes)).err().unwrap().to_string();
        assert_eq!(err(b"hello".to_vec()), "not an ELF file (not a core file)");
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert_eq!(
            err(exe),
            "an ELF file but not a core file (a program or a library?)"
        );
    }
}
