//! Data addresses of a traced process (lock words, futexes, condition variables, any pointer into memory) →
//! names a DBA can read: the variable that holds the address, else the mapping it lies in.
//!
//! Names, from the most precise:
//! - `LOCK_open`, `server_threads+0x40`, `dict_sys+0x28`: a data symbol of a mapped ELF file holds the
//!   address, at that offset (hex) from its start. An address past the symbol's size is not in it. C++ and
//!   Rust names are demangled (by blazesym, as function names are) and cleaned with [`clean_name`]:
//!   `(anonymous namespace)::foo`, `ns::bar`, `my_func()::local_static`, `big_array` for `_ZL9big_array`.
//! - `mariadbd+0x1c3f80`, `libc.so.6+0x1d4a20`: in a mapped ELF file but in no data symbol (stripped binary,
//!   padding, a static variable without symbol). The number is the **ELF virtual address** (what `nm`,
//!   `readelf -s`, `addr2line -e` and `gdb FILE` use; for a shared library's code it is usually also the file
//!   offset, for an executable's data segment it is not). A mapped file that is not a readable ELF file (a
//!   data file such as `tc.log`) has no virtual addresses: its number is the file offset.
//! - `[heap]`, `[stack]`, `[vdso]`, `[anon:name]`, …: the kernel's name of the mapping; `[anon]` for an
//!   anonymous mapping without name.
//! - `[unknown]`: in no mapping (0, kernel addresses, garbage, memory unmapped since).
//!
//! How:
//! - `/proc/PID/maps` is read once (and again by [`DataSymbolizer::refresh`], or by a lookup that falls in no
//!   mapping, at most every 200 ms); each mapped file is read on the first address that falls in it: its
//!   `PT_LOAD` segments and its data symbols (`STT_OBJECT`, and sized `STT_NOTYPE` outside code sections;
//!   never `STT_TLS`, whose values are offsets in the thread's TLS block) from `.symtab` and `.dynsym`, and
//!   from the `.symtab` of its separate debug file when one is installed (found as the frame symbolizer finds
//!   it: [`ElfInfo`], `/usr/lib/debug/.build-id/xx/yyyy.debug` or `.gnu_debuglink`, same build-id), which
//!   names static variables too. Symbols are flattened into non-overlapping ranges (the innermost symbol
//!   wins) for binary search.
//! - Address → ELF virtual address: `addr - bias`, the load bias of the object. The bias is found per file
//!   mapping from the segment it maps: a mapping at `start` with file offset `off` that maps segment `S` gives
//!   `bias = (start - off) - (S.p_vaddr - S.p_offset)`. A mapping can hold the file bytes of two segments
//!   (its first page is shared with the previous segment, and the RELRO part of the data segment is remapped
//!   read-only), so every candidate is scored by how many mappings of the same file it explains, and the
//!   best one wins (two loads of one file at different addresses each keep their own bias).
//! - `.bss` past the file: the part of a writable segment beyond `p_filesz` is zero-filled memory; what does
//!   not fit in the last file-backed page is an anonymous mapping (no path in the maps) right after the
//!   file's last data mapping (normally `rw-p`; Debian's `mariadbd` shows its last two file-backed data pages
//!   `r--p`, so the permissions are not required). Such an anonymous mapping (and any anonymous one right
//!   after it: `mprotect` splits them) is taken as the file's: an address in it whose `addr - bias` falls in
//!   the memory range (`p_vaddr .. p_vaddr + p_memsz`) of one of the file's writable segments is named from
//!   the file's symbols (`big_bss_array+0x61a80`, or `file+0x…`); past that range (the kernel merges
//!   adjacent anonymous mappings, e.g. a later `mmap` right after it) it is `[anon]`.
//! - Names are cached per address; a failed read (the process exited, an unreadable file) gives a less
//!   precise name, never a panic.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{Input, Symbolized};
use object::read::ReadCache;
use object::{
    Object, ObjectSection, ObjectSegment, ObjectSymbol, ReadRef, SectionFlags, SectionIndex,
    SegmentFlags, SymbolKind, SymbolSection,
};

use super::clean_name;
use super::elf::{ElfInfo, DEBUG_DIRS};

/// A lookup that falls in no mapping re-reads `/proc/PID/maps` (a library loaded since), at most this often.
const MAPS_REFRESH_INTERVAL: Duration = Duration::from_millis(200);

/// User-space addresses are below this on every Linux architecture (57-bit address spaces included); the
/// ones above (kernel addresses, garbage) never trigger a re-read of the maps.
const USER_SPACE_END: u64 = 1 << 57;

/// One `PT_LOAD` segment.
#[derive(Debug, Clone, Copy)]
struct Segment {
    offset: u64,
    filesz: u64,
    vaddr: u64,
    memsz: u64,
    writable: bool,
}

impl Segment {
    /// `p_vaddr - p_offset`: the same for the segment and for each of its mappings, up to the load bias.
    fn delta(&self) -> u64 {
        self.vaddr.wrapping_sub(self.offset)
    }

    fn holds_vaddr(&self, vaddr: u64) -> bool {
        vaddr >= self.vaddr && vaddr - self.vaddr < self.memsz
    }
}

/// A data symbol of one ELF file.
#[derive(Debug)]
struct DataSym {
    /// ELF virtual address.
    start: u64,
    size: u64,
    /// As in the symbol table (mangled), without `@VERSION`.
    raw: Box<str>,
    /// Read from the separate debug file (else from the file itself): where blazesym finds it to demangle it.
    in_debug_file: bool,
    /// Demangled and cleaned, once needed.
    name: Option<Box<str>>,
}

impl DataSym {
    fn end(&self) -> u64 {
        self.start.saturating_add(self.size)
    }
}

/// The data symbols of one ELF file, ready for lookups.
#[derive(Debug, Default)]
struct SymTable {
    /// Sorted by start, then by preference among aliases (larger first, then the name a user knows best).
    syms: Vec<DataSym>,
    /// Non-overlapping `[start, end)` ranges of the sized symbols → index into `syms` of the innermost symbol
    /// holding the range (the one starting last), sorted.
    ranges: Vec<(u64, u64, u32)>,
    /// Symbols without size (`_DYNAMIC`, `_GLOBAL_OFFSET_TABLE_`): only their own address, and only when no
    /// sized symbol holds it. (address, index into `syms`), sorted.
    exact: Vec<(u64, u32)>,
}

/// A symbol as read, before sorting.
struct RawSym {
    start: u64,
    size: u64,
    raw: Box<str>,
    /// 0 global, 1 weak, 2 local: which alias to prefer.
    binding: u8,
    in_debug_file: bool,
}

impl SymTable {
    fn new(mut raw: Vec<RawSym>) -> Self {
        let underscores = |s: &str| s.bytes().take_while(|&b| b == b'_').count();
        // Aliases (`environ`, `_environ`, `__environ`): the one with fewest leading underscores, global before
        // weak before local.
        let key = |r: &RawSym| (r.start, Reverse(r.size), underscores(&r.raw), r.binding);
        raw.sort_by(|a, b| key(a).cmp(&key(b)).then_with(|| a.raw.cmp(&b.raw)));
        raw.dedup_by(|b, a| a.start == b.start && a.size == b.size && a.raw == b.raw);
        let syms: Vec<DataSym> = raw
            .into_iter()
            .map(|r| DataSym {
                start: r.start,
                size: r.size,
                raw: r.raw,
                in_debug_file: r.in_debug_file,
                name: None,
            })
            .collect();
        let mut exact = Vec::new();
        let mut sized = Vec::new();
        for (i, s) in syms.iter().enumerate() {
            let Ok(i) = u32::try_from(i) else { break };
            if s.size == 0 {
                exact.push((s.start, i));
            } else {
                sized.push(i);
            }
        }
        // Stable: aliases stay in preference order.
        exact.sort_by_key(|e| e.0);
        exact.dedup_by_key(|e| e.0);
        let ranges = flatten(&syms, &sized);
        SymTable {
            syms,
            ranges,
            exact,
        }
    }

    /// Index of the symbol holding `vaddr`.
    fn find(&self, vaddr: u64) -> Option<usize> {
        if let Some(i) = self.ranges.partition_point(|r| r.0 <= vaddr).checked_sub(1) {
            let (_, end, sym) = self.ranges[i];
            if vaddr < end {
                return Some(sym as usize);
            }
        }
        let i = self.exact.partition_point(|e| e.0 < vaddr);
        self.exact
            .get(i)
            .filter(|e| e.0 == vaddr)
            .map(|e| e.1 as usize)
    }
}

/// Non-overlapping ranges covered by the symbols `sized` (indices into `syms`, in `syms` order, all with a
/// size), each with the innermost symbol holding it: the one that starts last (for equal starts, the first in
/// `syms` order). Adjacent ranges of one symbol are merged.
fn flatten(syms: &[DataSym], sized: &[u32]) -> Vec<(u64, u64, u32)> {
    let mut bounds: Vec<u64> = sized
        .iter()
        .flat_map(|&i| [syms[i as usize].start, syms[i as usize].end()])
        .collect();
    bounds.sort_unstable();
    bounds.dedup();
    let mut ranges: Vec<(u64, u64, u32)> = Vec::new();
    // (start, Reverse(index)): the top is the active symbol starting last, the first of equal starts.
    let mut active: BinaryHeap<(u64, Reverse<u32>)> = BinaryHeap::new();
    let mut next = 0;
    for w in bounds.windows(2) {
        let (lo, hi) = (w[0], w[1]);
        while let Some(&i) = sized.get(next) {
            if syms[i as usize].start > lo {
                break;
            }
            active.push((syms[i as usize].start, Reverse(i)));
            next += 1;
        }
        // Symbols that ended are dropped once they reach the top.
        while let Some(&(_, Reverse(i))) = active.peek() {
            if syms[i as usize].end() > lo {
                break;
            }
            active.pop();
        }
        let Some(&(_, Reverse(i))) = active.peek() else {
            continue;
        };
        match ranges.last_mut() {
            Some(last) if last.1 == lo && last.2 == i => last.1 = hi,
            _ => ranges.push((lo, hi, i)),
        }
    }
    ranges
}

/// What is needed of one mapped ELF file.
#[derive(Debug)]
struct ElfData {
    /// The path it was read through.
    path: PathBuf,
    segments: Vec<Segment>,
    symbols: SymTable,
    /// The separate debug file whose `.symtab` was read.
    debug_file: Option<PathBuf>,
}

impl ElfData {
    /// Reads the segments and data symbols of `open_path` and of its debug file.
    fn read(open_path: &Path, symbolic: &Path, extra_debug_dirs: &[PathBuf]) -> Result<Self> {
        let file =
            File::open(open_path).with_context(|| format!("opening {}", open_path.display()))?;
        let cache = ReadCache::new(file);
        let obj = object::File::parse(&cache)
            .with_context(|| format!("parsing {}", open_path.display()))?;
        if obj.format() != object::BinaryFormat::Elf {
            bail!("{} is not an ELF file", open_path.display());
        }
        let segments: Vec<Segment> = obj
            .segments()
            .map(|s| {
                let (offset, filesz) = s.file_range();
                Segment {
                    offset,
                    filesz,
                    vaddr: s.address(),
                    memsz: s.size(),
                    writable: match s.flags() {
                        SegmentFlags::Elf { p_flags } => p_flags & object::elf::PF_W != 0,
                        _ => true,
                    },
                }
            })
            .collect();
        if segments.is_empty() {
            bail!("{} has no loadable segment", open_path.display());
        }
        let mut syms = Vec::new();
        collect_data_symbols(&obj, false, &mut syms);
        let debug_file = ElfInfo::read(open_path, symbolic, extra_debug_dirs)
            .ok()
            .and_then(|info| info.debug_file)
            .and_then(|(path, has_symtab)| has_symtab.then_some(path));
        if let Some(path) = &debug_file {
            if let Ok(file) = File::open(path) {
                let cache = ReadCache::new(file);
                if let Ok(dbg) = object::File::parse(&cache) {
                    collect_data_symbols(&dbg, true, &mut syms);
                }
            }
        }
        Ok(ElfData {
            path: open_path.to_path_buf(),
            segments,
            symbols: SymTable::new(syms),
            debug_file,
        })
    }
}

/// Appends the data symbols of `obj` (`.symtab` and `.dynsym`) to `out`.
fn collect_data_symbols<'d, R: ReadRef<'d>>(
    obj: &object::File<'d, R>,
    in_debug_file: bool,
    out: &mut Vec<RawSym>,
) {
    let exec_sections: HashSet<SectionIndex> = obj
        .sections()
        .filter(|s| {
            matches!(s.flags(), SectionFlags::Elf { sh_flags }
                if sh_flags & u64::from(object::elf::SHF_EXECINSTR) != 0)
        })
        .map(|s| s.index())
        .collect();
    for sym in obj.symbols().chain(obj.dynamic_symbols()) {
        // Undefined (imports), absolute and common symbols are not addresses of this file's data.
        let SymbolSection::Section(section) = sym.section() else {
            continue;
        };
        let keep = match sym.kind() {
            SymbolKind::Data => true,
            // Sized untyped symbols (assembly) outside code.
            SymbolKind::Unknown => sym.size() > 0 && !exec_sections.contains(&section),
            _ => false,
        };
        if !keep {
            continue;
        }
        let Ok(name) = sym.name() else { continue };
        // `.symtab` spells copy-relocated variables `stdout@GLIBC_2.2.5`.
        let name = name.split('@').next().unwrap_or_default();
        if name.is_empty() {
            continue;
        }
        out.push(RawSym {
            start: sym.address(),
            size: sym.size(),
            raw: name.into(),
            binding: if sym.is_weak() {
                1
            } else if sym.is_global() {
                0
            } else {
                2
            },
            in_debug_file,
        });
    }
}

/// A mapped file.
struct Binary {
    /// Path as in the maps (without ` (deleted)`).
    symbolic: PathBuf,
    /// Path through which it is read.
    open_path: PathBuf,
    /// Inode, as in the maps.
    inode: u64,
    /// File name: the prefix of `file+0x…` names.
    basename: String,
    /// `None` until first needed; `Some(None)` when it is not a readable ELF file.
    elf: Option<Option<ElfData>>,
}

#[derive(Debug, Clone)]
enum MapKind {
    /// A mapped file: index into `binaries`.
    File { bin: usize },
    /// An anonymous mapping right after a mapping of file `bin` (or after another such mapping):
    /// maybe its `.bss`. `file_map` is the index in `maps` of that file mapping, whose bias applies.
    Tail { bin: usize, file_map: usize },
    /// Anonymous without name: `[anon]`.
    Anon,
    /// Named by the kernel (`[heap]`, `[stack]`, `[anon:name]`, …).
    Named(String),
}

/// One line of `/proc/PID/maps`.
#[derive(Debug, Clone)]
struct Mapping {
    start: u64,
    end: u64,
    offset: u64,
    kind: MapKind,
    /// Load bias of a file mapping: `None` until computed; `Some(None)` when unknown (not a readable ELF file).
    bias: Option<Option<u64>>,
}

/// Data address → name (variable, or mapping) for one process. Not thread-safe; cheap per address after the
/// first lookups in a file (symbol tables are read once per file, names cached per address).
pub struct DataSymbolizer {
    pid: u32,
    maps: Vec<Mapping>,
    maps_read: Instant,
    binaries: Vec<Binary>,
    /// (device, inode, path) → index into `binaries`: files stay loaded across re-reads of the maps.
    binary_index: HashMap<(String, u64, PathBuf), usize>,
    /// The target's own debug directories when it runs in another mount namespace (a container).
    extra_debug_dirs: Vec<PathBuf>,
    cache: HashMap<u64, String>,
    /// blazesym without and with demangling: mangled names are demangled through it (checking that both
    /// name the same symbol).
    raw: blazesym::symbolize::Symbolizer,
    demangling: blazesym::symbolize::Symbolizer,
}

impl DataSymbolizer {
    /// For the process `pid`: reads its `/proc/PID/maps` (an error if that fails: no such process, no
    /// permission). Files are read on the first address that falls in them.
    pub fn new(pid: u32) -> Result<Self> {
        let mut extra_debug_dirs = Vec::new();
        let root = PathBuf::from(format!("/proc/{pid}/root"));
        if std::fs::read_link(&root)
            .map(|r| r != Path::new("/"))
            .unwrap_or(false)
        {
            for d in DEBUG_DIRS {
                extra_debug_dirs.push(root.join(d.trim_start_matches('/')));
            }
        }
        let blaze = |demangle: bool| {
            blazesym::symbolize::Symbolizer::builder()
                .enable_demangling(demangle)
                .enable_code_info(false)
                .enable_inlined_fns(false)
                .enable_auto_reload(false)
                .build()
        };
        let mut s = DataSymbolizer {
            pid,
            maps: Vec::new(),
            maps_read: Instant::now(),
            binaries: Vec::new(),
            binary_index: HashMap::new(),
            extra_debug_dirs,
            cache: HashMap::new(),
            raw: blaze(false),
            demangling: blaze(true),
        };
        s.read_maps()
            .with_context(|| format!("reading the mappings of process {pid}"))?;
        Ok(s)
    }

    /// The name of the data address `addr` (see the module documentation): `var`, `var+0x28`,
    /// `file+0x1234` (ELF virtual address), `[heap]`, `[stack]`, `[anon]`, … or `[unknown]`.
    pub fn name(&mut self, addr: u64) -> String {
        if let Some(n) = self.cache.get(&addr) {
            return n.clone();
        }
        let mut map = self.find_mapping(addr);
        if map.is_none()
            && (0x1000..USER_SPACE_END).contains(&addr)
            && self.maps_read.elapsed() >= MAPS_REFRESH_INTERVAL
            && self.read_maps().is_ok()
        {
            map = self.find_mapping(addr);
        }
        let name = match map {
            Some(i) => self.name_in_mapping(i, addr),
            None => "[unknown]".to_owned(),
        };
        self.cache.insert(addr, name.clone());
        name
    }

    /// Re-reads `/proc/PID/maps`, for mappings added since (a plugin loaded with `dlopen`) or removed. Files
    /// already read stay loaded; the per-address cache is emptied. If the process is gone, the old mappings
    /// are kept.
    #[allow(dead_code)] // API for long traces (plugins loaded while tracing)
    pub fn refresh(&mut self) {
        let _ = self.read_maps();
    }

    fn read_maps(&mut self) -> Result<()> {
        let text = std::fs::read_to_string(format!("/proc/{}/maps", self.pid))?;
        let mut maps: Vec<Mapping> = text
            .lines()
            .filter_map(|line| self.parse_maps_line(line))
            .collect();
        maps.sort_by_key(|m| m.start);
        for i in 1..maps.len() {
            if !matches!(maps[i].kind, MapKind::Anon) || maps[i - 1].end != maps[i].start {
                continue;
            }
            maps[i].kind = match maps[i - 1].kind {
                MapKind::File { bin } => MapKind::Tail {
                    bin,
                    file_map: i - 1,
                },
                MapKind::Tail { bin, file_map } => MapKind::Tail { bin, file_map },
                _ => continue,
            };
        }
        self.maps = maps;
        self.maps_read = Instant::now();
        self.cache.clear();
        Ok(())
    }

    fn parse_maps_line(&mut self, line: &str) -> Option<Mapping> {
        // start-end perms offset dev inode [path]; the path may hold spaces.
        let mut rest = line;
        let mut field = || {
            let t = rest.trim_start();
            let end = t.find(' ').unwrap_or(t.len());
            let (f, r) = t.split_at(end);
            rest = r;
            f
        };
        let range = field();
        let _perms = field();
        let offset = field();
        let dev = field().to_owned();
        let inode: u64 = field().parse().ok()?;
        let path = rest.trim_start();
        let (start, end) = range.split_once('-')?;
        let start = u64::from_str_radix(start, 16).ok()?;
        let end = u64::from_str_radix(end, 16).ok()?;
        let offset = u64::from_str_radix(offset, 16).ok()?;
        let kind = if path.is_empty() || path.starts_with("/dev/zero") {
            // `/dev/zero (deleted)`: shared anonymous memory.
            MapKind::Anon
        } else if path.starts_with('[') {
            MapKind::Named(path.to_owned())
        } else {
            let symbolic = PathBuf::from(path.strip_suffix(" (deleted)").unwrap_or(path));
            let key = (dev, inode, symbolic.clone());
            let bin = match self.binary_index.get(&key) {
                Some(&i) => i,
                None => {
                    let open_path = self.open_path(&symbolic, inode, start, end);
                    let basename = symbolic
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_else(|| symbolic.to_string_lossy().into_owned());
                    self.binaries.push(Binary {
                        symbolic,
                        open_path,
                        inode,
                        basename,
                        elf: None,
                    });
                    self.binary_index.insert(key, self.binaries.len() - 1);
                    self.binaries.len() - 1
                }
            };
            MapKind::File { bin }
        };
        Some(Mapping {
            start,
            end,
            offset,
            kind,
            bias: None,
        })
    }

    /// The file as the process sees it (`/proc/PID/root/...`: other mount namespaces, debug links next to it),
    /// or the mapping itself (`/proc/PID/map_files/...`: deleted or replaced files), or the path as is.
    fn open_path(&self, symbolic: &Path, inode: u64, start: u64, end: u64) -> PathBuf {
        use std::os::unix::fs::MetadataExt;
        let rooted = Path::new(&format!("/proc/{}/root", self.pid))
            .join(symbolic.strip_prefix("/").unwrap_or(symbolic));
        if std::fs::metadata(&rooted)
            .map(|m| m.ino() == inode)
            .unwrap_or(false)
        {
            return rooted;
        }
        let mapped = PathBuf::from(format!("/proc/{}/map_files/{start:x}-{end:x}", self.pid));
        if mapped.exists() {
            return mapped;
        }
        symbolic.to_path_buf()
    }

    fn find_mapping(&self, addr: u64) -> Option<usize> {
        let i = self
            .maps
            .partition_point(|m| m.start <= addr)
            .checked_sub(1)?;
        (addr < self.maps[i].end).then_some(i)
    }

    fn elf(&mut self, bin: usize) -> Option<&ElfData> {
        use std::os::unix::fs::MetadataExt;
        if self.binaries[bin].elf.is_none() {
            let b = &self.binaries[bin];
            let mut elf = ElfData::read(&b.open_path, &b.symbolic, &self.extra_debug_dirs);
            // The process exited since the maps were read (its /proc paths are gone): the same file as seen
            // from here, if it is the same file.
            if elf.is_err()
                && b.open_path != b.symbolic
                && std::fs::metadata(&b.symbolic).is_ok_and(|m| m.ino() == b.inode)
            {
                elf = ElfData::read(&b.symbolic, &b.symbolic, &self.extra_debug_dirs);
            }
            self.binaries[bin].elf = Some(elf.ok());
        }
        self.binaries[bin].elf.as_ref().and_then(Option::as_ref)
    }

    fn name_in_mapping(&mut self, map: usize, addr: u64) -> String {
        let m = &self.maps[map];
        match m.kind.clone() {
            MapKind::Anon => "[anon]".to_owned(),
            MapKind::Named(name) => name,
            MapKind::File { bin, .. } => {
                let file_off = addr - m.start + m.offset;
                match self.bias(map) {
                    Some(bias) => self.name_at_vaddr(bin, addr.wrapping_sub(bias)),
                    // Not ELF (or unreadable): the file offset.
                    None => format!("{}+0x{file_off:x}", self.binaries[bin].basename),
                }
            }
            MapKind::Tail { bin, file_map } => {
                let Some(bias) = self.bias(file_map) else {
                    return "[anon]".to_owned();
                };
                let vaddr = addr.wrapping_sub(bias);
                let in_bss = self.elf(bin).is_some_and(|e| {
                    e.segments
                        .iter()
                        .any(|s| s.writable && s.holds_vaddr(vaddr))
                });
                if in_bss {
                    self.name_at_vaddr(bin, vaddr)
                } else {
                    "[anon]".to_owned()
                }
            }
        }
    }

    /// The load bias of file mapping `map` (`None`: not a readable ELF file). Computed for all the mappings of
    /// its file at once: each candidate bias (from each segment whose file bytes the mapping holds) is scored
    /// by the number of mappings of the file it explains.
    fn bias(&mut self, map: usize) -> Option<u64> {
        if let Some(b) = self.maps[map].bias {
            return b;
        }
        let MapKind::File { bin, .. } = self.maps[map].kind else {
            return None;
        };
        let segments = self.elf(bin).map(|e| e.segments.clone());
        let members: Vec<usize> = (0..self.maps.len())
            .filter(|&i| matches!(self.maps[i].kind, MapKind::File { bin: b, .. } if b == bin))
            .collect();
        let Some(segments) = segments else {
            for &i in &members {
                self.maps[i].bias = Some(None);
            }
            return None;
        };
        let candidates: Vec<Vec<u64>> = members
            .iter()
            .map(|&i| {
                let m = &self.maps[i];
                let len = m.end - m.start;
                segments
                    .iter()
                    .filter(|s| {
                        s.filesz > 0
                            && s.offset < m.offset.saturating_add(len)
                            && m.offset < s.offset.saturating_add(s.filesz)
                    })
                    .map(|s| m.start.wrapping_sub(m.offset).wrapping_sub(s.delta()))
                    .collect()
            })
            .collect();
        let score = |b: u64| candidates.iter().filter(|c| c.contains(&b)).count();
        for (&i, cands) in members.iter().zip(&candidates) {
            // The first of the best (`min_by_key` keeps the first of equals).
            let best = cands.iter().copied().min_by_key(|&b| Reverse(score(b)));
            self.maps[i].bias = Some(best);
        }
        self.maps[map].bias.flatten()
    }

    /// The name of ELF virtual address `vaddr` of file `bin`: its symbol (`+0x` offset), else `file+0x…`.
    fn name_at_vaddr(&mut self, bin: usize, vaddr: u64) -> String {
        let found = self.elf(bin).and_then(|e| {
            let i = e.symbols.find(vaddr)?;
            Some((i, e.symbols.syms[i].start))
        });
        let Some((i, start)) = found else {
            return format!("{}+0x{vaddr:x}", self.binaries[bin].basename);
        };
        let name = self.symbol_name(bin, i);
        match vaddr - start {
            0 => name,
            off => format!("{name}+0x{off:x}"),
        }
    }

    /// Demangled and cleaned name of symbol `i` of file `bin` (computed once).
    fn symbol_name(&mut self, bin: usize, i: usize) -> String {
        let Some(Some(elf)) = &self.binaries[bin].elf else {
            return String::new();
        };
        let sym = &elf.symbols.syms[i];
        if let Some(n) = &sym.name {
            return n.to_string();
        }
        let raw = sym.raw.to_string();
        let demangled = if raw.starts_with("_Z") || raw.starts_with("_R") {
            let path = if sym.in_debug_file {
                elf.debug_file.clone()
            } else {
                Some(elf.path.clone())
            };
            path.and_then(|p| self.demangle(&p, sym.start, &raw))
        } else {
            None
        };
        let name = clean_name(demangled.as_deref().unwrap_or(&raw)).unwrap_or_else(|| raw.clone());
        if let Some(Some(elf)) = &mut self.binaries[bin].elf {
            elf.symbols.syms[i].name = Some(name.as_str().into());
        }
        name
    }

    /// The demangled name of the symbol `raw` at `vaddr` of the ELF file `path`, through blazesym: the
    /// demangling instance's answer, if the plain instance finds `raw` itself there (not an alias).
    fn demangle(&self, path: &Path, vaddr: u64, raw: &str) -> Option<String> {
        let mut elf = Elf::new(path);
        elf.debug_syms = false;
        let src = Source::Elf(elf);
        let plain = self
            .raw
            .symbolize_single(&src, Input::VirtOffset(vaddr))
            .ok()?;
        match plain {
            Symbolized::Sym(s) if s.name == raw && s.addr == vaddr => {}
            _ => return None,
        }
        match self
            .demangling
            .symbolize_single(&src, Input::VirtOffset(vaddr))
            .ok()?
        {
            Symbolized::Sym(s) if s.addr == vaddr && !s.name.is_empty() => {
                Some(anonymous_namespaces(&s.name))
            }
            _ => None,
        }
    }
}

/// `_GLOBAL__N_1::foo` → `(anonymous namespace)::foo`. blazesym tries Rust's legacy demangling before C++'s,
/// and the C++ name of a variable in a namespace (`_ZN12_GLOBAL__N_13fooE`, unlike a function's, which ends
/// with its parameter types) passes for a Rust one, which keeps GCC's and clang's name of the anonymous
/// namespace.
fn anonymous_namespaces(name: &str) -> String {
    const ANON: &str = "_GLOBAL__N_";
    let mut out = String::with_capacity(name.len() + 16);
    let mut rest = name;
    while let Some(i) = rest.find(ANON) {
        let at_start = i == 0 || rest[..i].ends_with("::");
        let tail = &rest[i + ANON.len()..];
        let len = tail
            .find(|c: char| !c.is_ascii_alphanumeric() && c != '_')
            .unwrap_or(tail.len());
        let at_end = tail[len..].is_empty() || tail[len..].starts_with("::");
        out.push_str(&rest[..i]);
        if at_start && at_end {
            out.push_str("(anonymous namespace)");
        } else {
            out.push_str(&rest[i..i + ANON.len() + len]);
        }
        rest = &tail[len..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::io::{BufRead, BufReader, Write};
    use std::path::{Path, PathBuf};
    use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;

    use super::*;

    const FIXTURE: &str = "tests/fixtures/data_symbols.c";

    /// The fixture, found from the crate root (or from a crate that includes this file from elsewhere).
    fn fixture_source() -> PathBuf {
        let mut dir = Some(Path::new(env!("CARGO_MANIFEST_DIR")));
        while let Some(d) = dir {
            if d.join(FIXTURE).is_file() {
                return d.join(FIXTURE);
            }
            dir = d.parent();
        }
        Path::new("/work/main").join(FIXTURE)
    }

    /// The fixture's builds.
    struct Built {
        /// `cc -O0 -g -pthread`.
        plain: PathBuf,
        /// The same, stripped.
        stripped: PathBuf,
        /// `-rdynamic`, stripped: exported variables only in `.dynsym`.
        dynsym_only: PathBuf,
        /// `nm` of `plain` and of the `-rdynamic` build before stripping: name → ELF virtual address.
        plain_syms: HashMap<String, u64>,
        dynamic_syms: HashMap<String, u64>,
        /// As C++ (`None` without a C++ compiler).
        cxx: Option<PathBuf>,
    }

    fn cc(args: &[&str], out: &Path) -> bool {
        Command::new(args[0])
            .args(&args[1..])
            .args(["-O0", "-g", "-pthread", "-o"])
            .arg(out)
            .arg(fixture_source())
            .arg("-ldl")
            .status()
            .is_ok_and(|s| s.success())
    }

    fn strip(from: &Path, to: &Path) {
        std::fs::copy(from, to).unwrap();
        let status = Command::new("strip")
            .arg(to)
            .status()
            .expect("running strip");
        assert!(status.success(), "strip failed");
    }

    fn nm(path: &Path) -> HashMap<String, u64> {
        let out = Command::new("nm").arg(path).output().expect("running nm");
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let addr = u64::from_str_radix(f.next()?, 16).ok()?;
                let _kind = f.next()?;
                Some((f.next()?.to_owned(), addr))
            })
            .collect()
    }

    fn built() -> &'static Built {
        static BUILT: OnceLock<Built> = OnceLock::new();
        BUILT.get_or_init(|| {
            // One directory per test process; those of test processes that are gone are removed.
            let tmp = std::env::temp_dir();
            for e in std::fs::read_dir(&tmp).into_iter().flatten().flatten() {
                let name = e.file_name();
                let Some(pid) = name
                    .to_str()
                    .and_then(|n| n.strip_prefix("myprobe-datasym-test-"))
                else {
                    continue;
                };
                if !Path::new("/proc").join(pid).exists() {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
            let dir = tmp.join(format!("myprobe-datasym-test-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let plain = dir.join("data_symbols");
            assert!(cc(&["cc"], &plain), "cc failed");
            let stripped = dir.join("data_symbols_stripped");
            strip(&plain, &stripped);
            let dynamic = dir.join("data_symbols_dynamic");
            assert!(cc(&["cc", "-rdynamic"], &dynamic), "cc -rdynamic failed");
            let dynsym_only = dir.join("data_symbols_dyn");
            strip(&dynamic, &dynsym_only);
            let cxx = dir.join("data_symbols_cxx");
            let cxx = cc(&["c++", "-x", "c++"], &cxx).then_some(cxx);
            Built {
                plain_syms: nm(&plain),
                dynamic_syms: nm(&dynamic),
                plain,
                stripped,
                dynsym_only,
                cxx,
            }
        })
    }

    /// A running fixture, killed on drop; `addrs` holds what it printed.
    struct Running {
        child: Child,
        stdin: ChildStdin,
        stdout: BufReader<ChildStdout>,
        addrs: HashMap<String, u64>,
    }

    impl Running {
        fn start(path: &Path) -> Running {
            let mut child = Command::new(path)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("starting fixture");
            let stdin = child.stdin.take().unwrap();
            let stdout = BufReader::new(child.stdout.take().unwrap());
            let mut running = Running {
                child,
                stdin,
                stdout,
                addrs: HashMap::new(),
            };
            running.read_until_ready();
            assert!(
                running.addrs.contains_key("big_lock"),
                "fixture did not report: {:?}",
                running.addrs
            );
            running
        }

        fn read_until_ready(&mut self) {
            let mut line = String::new();
            loop {
                line.clear();
                let n = self.stdout.read_line(&mut line).unwrap();
                assert!(n > 0, "fixture ended early");
                let line = line.trim_end();
                if line == "ready" {
                    return;
                }
                let (name, addr) = line.split_once(' ').unwrap();
                // glibc prints a null pointer as "(nil)".
                let addr = u64::from_str_radix(addr.trim_start_matches("0x"), 16).unwrap_or(0);
                self.addrs.insert(name.to_owned(), addr);
            }
        }

        /// Sends a command line and reads the addresses printed in answer.
        fn command(&mut self, cmd: &str) {
            writeln!(self.stdin, "{cmd}").unwrap();
            self.stdin.flush().unwrap();
            self.read_until_ready();
        }

        fn pid(&self) -> u32 {
            self.child.id()
        }

        fn addr(&self, name: &str) -> u64 {
            self.addrs[name]
        }

        /// The mappings of the fixture: (start, end, perms, offset, path).
        fn maps(&self) -> Vec<(u64, u64, String, u64, String)> {
            maps_of(self.pid())
        }
    }

    impl Drop for Running {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    fn maps_of(pid: u32) -> Vec<(u64, u64, String, u64, String)> {
        std::fs::read_to_string(format!("/proc/{pid}/maps"))
            .unwrap()
            .lines()
            .map(|l| {
                let f: Vec<&str> = l.splitn(6, ' ').collect();
                let (s, e) = f[0].split_once('-').unwrap();
                (
                    u64::from_str_radix(s, 16).unwrap(),
                    u64::from_str_radix(e, 16).unwrap(),
                    f[1].to_owned(),
                    u64::from_str_radix(f[2], 16).unwrap(),
                    f.get(5).map_or("", |p| p.trim()).to_owned(),
                )
            })
            .collect()
    }

    /// The path of the mapping holding `addr` ("" for an anonymous one).
    fn mapping_path(maps: &[(u64, u64, String, u64, String)], addr: u64) -> Option<String> {
        maps.iter()
            .find(|m| addr >= m.0 && addr < m.1)
            .map(|m| m.4.clone())
    }

    /// The load bias of the fixture binary: where its first page (file offset 0) is mapped.
    fn load_bias(maps: &[(u64, u64, String, u64, String)], binary: &Path) -> u64 {
        let path = binary.to_str().unwrap();
        maps.iter()
            .find(|m| m.4 == path && m.3 == 0)
            .expect("binary not mapped")
            .0
    }

    /// Names that do not depend on the fixture's own symbols.
    fn check_common(fx: &Running, s: &mut DataSymbolizer) {
        assert_eq!(s.name(fx.addr("heap")), "[heap]");
        assert_eq!(s.name(fx.addr("heap") + 8), "[heap]");
        assert_eq!(s.name(fx.addr("stack")), "[stack]");
        assert_eq!(s.name(fx.addr("stdout_file")), "_IO_2_1_stdout_");
        assert_eq!(s.name(fx.addr("stdout_file") + 8), "_IO_2_1_stdout_+0x8");
        assert_ne!(fx.addr("re_syntax_options"), 0);
        assert_eq!(s.name(fx.addr("re_syntax_options")), "re_syntax_options");
        for garbage in [
            0,
            1,
            0xfff,
            u64::MAX,
            u64::MAX - 7,
            0xffff_ffff_8100_0000,
            1 << 63,
        ] {
            assert_eq!(s.name(garbage), "[unknown]", "{garbage:#x}");
        }
        // libc's code: no data symbol there.
        let maps = fx.maps();
        let libc_text = maps
            .iter()
            .find(|m| m.2.contains('x') && m.4.ends_with("/libc.so.6"))
            .expect("libc not mapped");
        let name = s.name(libc_text.0 + 0x100);
        assert!(name.starts_with("libc.so.6+0x"), "{name}");
    }

    #[test]
    fn unstripped_names_variables() {
        let b = built();
        let fx = Running::start(&b.plain);
        let mut s = DataSymbolizer::new(fx.pid()).unwrap();
        assert_eq!(s.name(fx.addr("big_lock")), "big_lock");
        assert_eq!(s.name(fx.addr("big_lock") + 16), "big_lock+0x10");
        assert_eq!(s.name(fx.addr("stats")), "stats");
        assert_eq!(s.name(fx.addr("stats_counter")), "stats+0x40");
        assert_eq!(s.name(fx.addr("big_bss_array")), "big_bss_array");
        assert_eq!(s.name(fx.addr("big_bss_elem")), "big_bss_array+0x61a80");
        assert_eq!(
            s.name(fx.addr("big_bss_array") + 100_000 * 8 - 1),
            "big_bss_array+0xc34ff"
        );
        assert!(s.name(fx.addr("hits")).starts_with("hits"));
        // The element lies in the anonymous mapping after the data segment: the case this test is for.
        let maps = fx.maps();
        assert_eq!(
            mapping_path(&maps, fx.addr("big_bss_elem")).as_deref(),
            Some(""),
            "big_bss_array[50000] is not in an anonymous mapping: {maps:x?}"
        );
        // Past the end of `stats` (68 bytes): not in it.
        let after_stats = s.name(fx.addr("stats") + 68);
        assert!(!after_stats.starts_with("stats"), "{after_stats}");
        // Cached: the same answer again.
        assert_eq!(s.name(fx.addr("stats_counter")), "stats+0x40");
        check_common(&fx, &mut s);

        // A static variable of libc named only by its debug file (Debian's libc6-dbg), if installed.
        let libc_path = maps
            .iter()
            .find(|m| m.4.ends_with("/libc.so.6"))
            .map(|m| PathBuf::from(&m.4))
            .unwrap();
        let debug = ElfInfo::read(&libc_path, &libc_path, &[])
            .ok()
            .and_then(|i| i.debug_file);
        if let Some((debug, true)) = debug {
            if let Some(&main_arena) = nm(&debug).get("main_arena") {
                let bias = load_bias(&maps, &libc_path);
                assert_eq!(s.name(bias + main_arena + 8), "main_arena+0x8");
            }
        } else {
            eprintln!(
                "no debug file for {}: main_arena not checked",
                libc_path.display()
            );
        }
    }

    #[test]
    fn stripped_names_file_offsets() {
        let b = built();
        let fx = Running::start(&b.stripped);
        let mut s = DataSymbolizer::new(fx.pid()).unwrap();
        let v = |n: &str| b.plain_syms[n];
        assert_eq!(
            s.name(fx.addr("big_lock")),
            format!("data_symbols_stripped+0x{:x}", v("big_lock"))
        );
        assert_eq!(
            s.name(fx.addr("stats_counter")),
            format!("data_symbols_stripped+0x{:x}", v("stats") + 0x40)
        );
        // In the anonymous tail, still named after the binary with its ELF virtual address.
        assert_eq!(
            s.name(fx.addr("big_bss_elem")),
            format!("data_symbols_stripped+0x{:x}", v("big_bss_array") + 0x61a80)
        );
        // Past the end of the data segment's memory (`_end`), in the last page of the anonymous tail: not the
        // binary's any more.
        let maps = fx.maps();
        let bias = load_bias(&maps, &b.stripped);
        let end = bias + v("_end");
        if !end.is_multiple_of(4096) && mapping_path(&maps, end).as_deref() == Some("") {
            assert_eq!(s.name(end), "[anon]");
            assert_eq!(
                s.name(end - 1),
                format!("data_symbols_stripped+0x{:x}", v("_end") - 1)
            );
        }
        check_common(&fx, &mut s);
    }

    #[test]
    fn dynsym_only_names_exported_variables() {
        let b = built();
        let fx = Running::start(&b.dynsym_only);
        let mut s = DataSymbolizer::new(fx.pid()).unwrap();
        assert_eq!(s.name(fx.addr("big_lock")), "big_lock");
        assert_eq!(s.name(fx.addr("stats_counter")), "stats+0x40");
        // Static: not exported, so only the binary's name and ELF virtual address.
        assert_eq!(
            s.name(fx.addr("big_bss_elem")),
            format!(
                "data_symbols_dyn+0x{:x}",
                b.dynamic_syms["big_bss_array"] + 0x61a80
            )
        );
        check_common(&fx, &mut s);
    }

    #[test]
    fn cxx_names_are_demangled() {
        let b = built();
        let Some(cxx) = &b.cxx else {
            eprintln!("no C++ compiler: skipped");
            return;
        };
        let fx = Running::start(cxx);
        let mut s = DataSymbolizer::new(fx.pid()).unwrap();
        assert_eq!(s.name(fx.addr("big_lock")), "big_lock");
        assert_eq!(s.name(fx.addr("stats_counter")), "stats+0x40");
        // `_ZL13big_bss_array`.
        assert_eq!(s.name(fx.addr("big_bss_elem")), "big_bss_array+0x61a80");
        assert_eq!(
            s.name(fx.addr("anon_ns_counter")),
            "(anonymous namespace)::anon_ns_counter+0x8"
        );
        assert_eq!(s.name(fx.addr("myns_inner")), "myns::inner+0x8");
        assert_eq!(s.name(fx.addr("hits")), "hits_addr()::hits");
        check_common(&fx, &mut s);
    }

    #[test]
    fn refresh_finds_dlopened_library() {
        let b = built();
        let mut fx = Running::start(&b.plain);
        let mut s = DataSymbolizer::new(fx.pid()).unwrap();
        assert_eq!(s.name(fx.addr("big_lock")), "big_lock");
        fx.command("dlopen");
        let signgam = fx.addr("signgam");
        assert_ne!(signgam, 0, "dlopen(libm.so.6) failed");
        s.refresh();
        assert_eq!(s.name(signgam), "signgam");
        assert_eq!(s.name(fx.addr("big_lock")), "big_lock");
    }

    #[test]
    fn exited_process() {
        let b = built();
        let mut fx = Running::start(&b.plain);
        let pid = fx.pid();
        let mut s = DataSymbolizer::new(pid).unwrap();
        assert_eq!(s.name(fx.addr("big_lock")), "big_lock");
        fx.child.kill().unwrap();
        fx.child.wait().unwrap();
        // Known mappings still name what they can; nothing panics.
        s.refresh();
        assert_eq!(s.name(fx.addr("big_lock")), "big_lock");
        assert_eq!(s.name(fx.addr("stats_counter")), "stats+0x40");
        // libc was not read before the exit: read from its path as seen from here.
        assert_eq!(s.name(fx.addr("re_syntax_options")), "re_syntax_options");
        assert_eq!(s.name(0), "[unknown]");
        assert_eq!(s.name(u64::MAX), "[unknown]");
        assert!(DataSymbolizer::new(pid).is_err());
    }

    static RUST_STATIC: [AtomicU64; 4] = [
        AtomicU64::new(1),
        AtomicU64::new(2),
        AtomicU64::new(3),
        AtomicU64::new(4),
    ];

    #[test]
    fn rust_static_of_this_process() {
        RUST_STATIC[1].fetch_add(1, Ordering::Relaxed);
        let addr = &RUST_STATIC[1] as *const AtomicU64 as u64;
        let mut s = DataSymbolizer::new(std::process::id()).unwrap();
        let name = s.name(addr);
        assert!(
            name.ends_with("symbolize::data::tests::RUST_STATIC+0x8"),
            "{name}"
        );
        let local = 0u64;
        let name = s.name(&local as *const u64 as u64);
        // The main thread's stack or a test thread's stack (an anonymous mapping).
        assert!(name == "[stack]" || name == "[anon]", "{name}");
    }

    #[test]
    fn anonymous_namespace_spelling() {
        assert_eq!(
            anonymous_namespaces("_GLOBAL__N_1::foo"),
            "(anonymous namespace)::foo"
        );
        assert_eq!(
            anonymous_namespaces("ns::_GLOBAL__N_1::bar::_GLOBAL__N_2::x"),
            "ns::(anonymous namespace)::bar::(anonymous namespace)::x"
        );
        assert_eq!(
            anonymous_namespaces("my_GLOBAL__N_1::x"),
            "my_GLOBAL__N_1::x"
        );
        assert_eq!(anonymous_namespaces("LOCK_open"), "LOCK_open");
    }

    #[test]
    fn flatten_picks_innermost_symbol() {
        let sym = |start, size, name: &str| RawSym {
            start,
            size,
            raw: name.into(),
            binding: 0,
            in_debug_file: false,
        };
        let t = SymTable::new(vec![
            sym(0x100, 0x100, "outer"),
            sym(0x140, 0x10, "inner"),
            sym(0x140, 0x10, "__inner"),
            sym(0x1f0, 0x20, "overlap"),
            sym(0x300, 0, "sizeless"),
            sym(0x100, 0x100, "outer"),
        ]);
        let name = |v: u64| t.find(v).map(|i| &*t.syms[i].raw);
        assert_eq!(name(0xff), None);
        assert_eq!(name(0x100), Some("outer"));
        assert_eq!(name(0x13f), Some("outer"));
        assert_eq!(name(0x140), Some("inner"));
        assert_eq!(name(0x14f), Some("inner"));
        assert_eq!(name(0x150), Some("outer"));
        assert_eq!(name(0x1ef), Some("outer"));
        assert_eq!(name(0x1f0), Some("overlap"));
        assert_eq!(name(0x20f), Some("overlap"));
        assert_eq!(name(0x210), None);
        assert_eq!(name(0x300), Some("sizeless"));
        assert_eq!(name(0x301), None);
        assert_eq!(t.syms.len(), 5);
    }
}
