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

use anyhow::{bail, Context, Result};
use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{Input, Symbolized};
use object::read::ReadCache;
use object::{
    Object, ObjectSection, ObjectSymbol, ReadRef, SectionFlags, SectionIndex, SymbolKind,
    SymbolSection,
};

use super::elf::{target_debug_dirs, ElfInfo, Segment};
use super::{clean_name, new_blazesym};
use crate::process::maps::{MapKind, Mapping, ProcMaps};

/// User-space addresses are below this on every Linux architecture (57-bit address spaces included); the
/// ones above (kernel addresses, garbage) never trigger a re-read of the maps.
const USER_SPACE_END: u64 = 1 << 57;

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
        let segments = Segment::all(&obj);
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

/// What is known of one mapping of `DataSymbolizer::maps` (same index); rebuilt on each read of the maps.
#[derive(Debug, Clone, Copy, Default)]
struct MapState {
    /// For an anonymous mapping right after a file mapping (or after another such mapping): that file
    /// mapping, whose bias applies. Maybe the file's `.bss`.
    tail_of: Option<usize>,
    /// Load bias of a file mapping: `None` until computed; `Some(None)` when unknown (not a readable ELF file).
    bias: Option<Option<u64>>,
}

/// Data address → name (variable, or mapping) for one process. Not thread-safe; cheap per address after the
/// first lookups in a file (symbol tables are read once per file, names cached per address).
pub struct DataSymbolizer {
    maps: ProcMaps,
    /// Per mapping of `maps` (same index).
    map_state: Vec<MapState>,
    /// Per file of `maps` (same index, so files stay loaded across re-reads of the maps): `None` until first
    /// needed; `Some(None)` when it is not a readable ELF file.
    elf: Vec<Option<Option<ElfData>>>,
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
        let maps = ProcMaps::read(pid)
            .with_context(|| format!("reading the mappings of process {pid}"))?;
        Ok(Self::with_maps(pid, maps))
    }

    /// For mappings that are not a live process's (a core file's, a crash report's): see [`ProcMaps::fixed`].
    pub fn of_maps(maps: ProcMaps) -> Self {
        Self::with_maps(0, maps)
    }

    /// For the process `pid` whose mappings are `maps`.
    fn with_maps(pid: u32, maps: ProcMaps) -> Self {
        let mut s = DataSymbolizer {
            maps,
            map_state: Vec::new(),
            elf: Vec::new(),
            extra_debug_dirs: target_debug_dirs(pid),
            cache: HashMap::new(),
            raw: new_blazesym(false, None),
            demangling: new_blazesym(true, None),
        };
        s.index_maps();
        s
    }

    /// The name of the data address `addr` (see the module documentation): `var`, `var+0x28`,
    /// `file+0x1234` (ELF virtual address), `[heap]`, `[stack]`, `[anon]`, … or `[unknown]`.
    pub fn name(&mut self, addr: u64) -> String {
        if let Some(n) = self.cache.get(&addr) {
            return n.clone();
        }
        let mut map = self.maps.find(addr);
        if map.is_none()
            && (0x1000..USER_SPACE_END).contains(&addr)
            && self.maps.is_stale()
            && self.read_maps().is_ok()
        {
            map = self.maps.find(addr);
        }
        let name = match map {
            Some(i) => self.name_in_mapping(i, addr),
            None => "[unknown]".to_owned(),
        };
        self.cache.insert(addr, name.clone());
        name
    }

    /// Forgets the names of addresses past `max` of them (lock words on the heap are many over days).
    pub fn bound_cache(&mut self, max: usize) {
        if self.cache.len() > max {
            self.cache.clear();
        }
    }

    /// Whether `name`, from [`DataSymbolizer::name`], names no variable: a mapping (`[heap]`, `[anon]`) or a file
    /// and offset (`mariadbd+0x21a69cc`), not `var+0x28`.
    pub fn names_no_variable(&self, name: &str) -> bool {
        name.starts_with('[')
            || name.split_once("+0x").is_some_and(|(file, _)| {
                (0..self.maps.file_count()).any(|i| self.maps.file(i).basename == file)
            })
    }

    /// Re-reads `/proc/PID/maps`, for mappings added since (a plugin loaded with `dlopen`) or removed. Files
    /// already read stay loaded; the per-address cache is emptied. If the process is gone, the old mappings
    /// are kept.
    #[allow(dead_code)] // API for long traces (plugins loaded while tracing)
    pub fn refresh(&mut self) {
        let _ = self.read_maps();
    }

    fn read_maps(&mut self) -> Result<()> {
        self.maps.reread()?;
        self.index_maps();
        Ok(())
    }

    /// Fits the per-file and per-mapping state to freshly read maps (finding the anonymous tails of files) and
    /// empties the per-address cache.
    fn index_maps(&mut self) {
        self.elf.resize_with(self.maps.file_count(), || None);
        let maps = self.maps.maps();
        let mut state = vec![MapState::default(); maps.len()];
        for i in 1..maps.len() {
            if maps[i - 1].end != maps[i].start || !self.is_anon(&maps[i]) {
                continue;
            }
            state[i].tail_of = match self.file_of(&maps[i - 1]) {
                Some(_) => Some(i - 1),
                None => state[i - 1].tail_of,
            };
        }
        self.map_state = state;
        self.cache.clear();
    }

    /// The file whose symbols name the addresses of `m`, if it maps one. `/dev/zero (deleted)` is shared
    /// anonymous memory.
    fn file_of(&self, m: &Mapping) -> Option<usize> {
        match m.kind {
            MapKind::File(bin) if !self.maps.file(bin).symbolic.starts_with("/dev/zero") => {
                Some(bin)
            }
            _ => None,
        }
    }

    fn is_anon(&self, m: &Mapping) -> bool {
        match m.kind {
            MapKind::Anon => true,
            MapKind::File(_) => self.file_of(m).is_none(),
            MapKind::Vdso | MapKind::Named(_) => false,
        }
    }

    fn elf(&mut self, bin: usize) -> Option<&ElfData> {
        use std::os::unix::fs::MetadataExt;
        if self.elf[bin].is_none() {
            let f = self.maps.file(bin);
            let mut elf = ElfData::read(&f.open_path, &f.symbolic, &self.extra_debug_dirs);
            // The process exited since the maps were read (its /proc paths are gone): the same file as seen
            // from here, if it is the same file.
            if elf.is_err()
                && f.open_path != f.symbolic
                && std::fs::metadata(&f.symbolic).is_ok_and(|m| m.ino() == f.inode)
            {
                elf = ElfData::read(&f.symbolic, &f.symbolic, &self.extra_debug_dirs);
            }
            self.elf[bin] = Some(elf.ok());
        }
        self.elf[bin].as_ref().and_then(Option::as_ref)
    }

    fn name_in_mapping(&mut self, map: usize, addr: u64) -> String {
        let m = &self.maps.maps()[map];
        if let Some(bin) = self.file_of(m) {
            let file_off = m.file_offset(addr);
            return match (self.bias(map), file_off) {
                (Some(bias), _) => self.name_at_vaddr(bin, addr.wrapping_sub(bias)),
                // Not ELF (or unreadable): the file offset.
                (None, Some(off)) => format!("{}+0x{off:x}", self.maps.file(bin).basename),
                (None, None) => self.maps.label(&self.maps.maps()[map]).into_owned(),
            };
        }
        if !self.is_anon(m) {
            return self.maps.label(m).into_owned();
        }
        self.map_state[map]
            .tail_of
            .and_then(|file_map| self.bss_name(file_map, addr))
            .unwrap_or_else(|| "[anon]".to_owned())
    }

    /// The name of `addr`, in an anonymous mapping after file mapping `file_map`, if it lies in the memory of
    /// one of the file's writable segments (its `.bss`).
    fn bss_name(&mut self, file_map: usize, addr: u64) -> Option<String> {
        let bin = self.file_of(&self.maps.maps()[file_map])?;
        let vaddr = addr.wrapping_sub(self.bias(file_map)?);
        let in_bss = self
            .elf(bin)?
            .segments
            .iter()
            .any(|s| s.writable && s.holds_vaddr(vaddr));
        in_bss.then(|| self.name_at_vaddr(bin, vaddr))
    }

    /// The load bias of file mapping `map` (`None`: not a readable ELF file). Computed for all the mappings of
    /// its file at once: each candidate bias (from each segment whose file bytes the mapping holds) is scored
    /// by the number of mappings of the file it explains.
    fn bias(&mut self, map: usize) -> Option<u64> {
        if let Some(b) = self.map_state[map].bias {
            return b;
        }
        let bin = self.file_of(&self.maps.maps()[map])?;
        let segments = self.elf(bin).map(|e| e.segments.clone());
        let maps = self.maps.maps();
        let members: Vec<usize> = (0..maps.len())
            .filter(|&i| self.file_of(&maps[i]) == Some(bin))
            .collect();
        let Some(segments) = segments else {
            for &i in &members {
                self.map_state[i].bias = Some(None);
            }
            return None;
        };
        let candidates: Vec<Vec<u64>> = members
            .iter()
            .map(|&i| {
                let m = &maps[i];
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
            self.map_state[i].bias = Some(best);
        }
        self.map_state[map].bias.flatten()
    }

    /// The name of ELF virtual address `vaddr` of file `bin`: its symbol (`+0x` offset), else `file+0x…`.
    fn name_at_vaddr(&mut self, bin: usize, vaddr: u64) -> String {
        let found = self.elf(bin).and_then(|e| {
            let i = e.symbols.find(vaddr)?;
            Some((i, e.symbols.syms[i].start))
        });
        let Some((i, start)) = found else {
            return format!("{}+0x{vaddr:x}", self.maps.file(bin).basename);
        };
        let name = self.symbol_name(bin, i);
        match vaddr - start {
            0 => name,
            off => format!("{name}+0x{off:x}"),
        }
    }

    /// Demangled and cleaned name of symbol `i` of file `bin` (computed once).
    fn symbol_name(&mut self, bin: usize, i: usize) -> String {
        let Some(Some(elf)) = &self.elf[bin] else {
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
        if let Some(Some(elf)) = &mut self.elf[bin] {
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
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;

    use super::*;
    use crate::symbolize::test_support::{
        build_dir, compile, fixture_source, nm, strip, MapLine, Running,
    };

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

    /// Builds the fixture with `cmd` (compiler and flags) and the flags all builds share.
    fn cc(cmd: &[&str], out: &Path) -> bool {
        let cmd = [cmd, &["-O0", "-g", "-pthread"]].concat();
        compile(&cmd, &fixture_source("data_symbols.c"), out, &["-ldl"])
    }

    fn built() -> &'static Built {
        static BUILT: OnceLock<Built> = OnceLock::new();
        BUILT.get_or_init(|| {
            let dir = build_dir("myprobe-datasym-test-");
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

    /// Starts a build of the fixture, and a symbolizer for it.
    fn start(path: &Path) -> (Running, DataSymbolizer) {
        let fx = Running::start(path, "big_lock");
        let s = DataSymbolizer::new(fx.pid()).unwrap();
        (fx, s)
    }

    /// The path of the mapping holding `addr` ("" for an anonymous one).
    fn mapping_path(maps: &[MapLine], addr: u64) -> Option<String> {
        maps.iter()
            .find(|m| addr >= m.start && addr < m.end)
            .map(|m| m.path.clone())
    }

    /// The load bias of the fixture binary: where its first page (file offset 0) is mapped.
    fn load_bias(maps: &[MapLine], binary: &Path) -> u64 {
        let path = binary.to_str().unwrap();
        maps.iter()
            .find(|m| m.path == path && m.offset == 0)
            .expect("binary not mapped")
            .start
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
            .find(|m| m.perms.contains('x') && m.path.ends_with("/libc.so.6"))
            .expect("libc not mapped");
        let name = s.name(libc_text.start + 0x100);
        assert!(name.starts_with("libc.so.6+0x"), "{name}");
    }

    #[test]
    fn unstripped_names_variables() {
        let b = built();
        let (fx, mut s) = start(&b.plain);
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
            .find(|m| m.path.ends_with("/libc.so.6"))
            .map(|m| PathBuf::from(&m.path))
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
        let (fx, mut s) = start(&b.stripped);
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
        let (fx, mut s) = start(&b.dynsym_only);
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
        let (fx, mut s) = start(cxx);
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
        let (mut fx, mut s) = start(&b.plain);
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
        let (mut fx, mut s) = start(&b.plain);
        let pid = fx.pid();
        assert_eq!(s.name(fx.addr("big_lock")), "big_lock");
        fx.kill();
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

    // A static of this process on purpose: the variable the test names from its address.
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

    #[test]
    fn a_mapping_whose_file_offsets_pass_2_64_is_named_by_its_path() {
        let maps = ProcMaps::from_text(
            u32::MAX,
            "1000-3000 rw-p fffffffffffff000 08:01 42 /nonexistent/tc.log\n",
        );
        let mut s = DataSymbolizer::with_maps(u32::MAX, maps);
        assert_eq!(s.name(0x1fff), "tc.log+0xffffffffffffffff");
        assert_eq!(s.name(0x2000), "/nonexistent/tc.log");
    }
}
