//! Symbolization: raw instruction pointers of the traced process and of the kernel → frame names for flame
//! graphs.
//!
//! - Once per unique address: names are cached (address → name); the misses of one stack go to blazesym in
//!   one call per binary; equal names share one `Rc<str>`.
//! - Return addresses (every IP but the first) are looked up at `ip - 1`, so that a call at the very end of a
//!   function names that function (and not the next one, or nothing).
//! - Mappings come from `/proc/PID/maps`; each mapped ELF file is symbolized through its own blazesym ELF
//!   source, and the source is chosen per file: its own symbols; or the `.symtab` of its separate debug file
//!   when one is installed (Debian's `libc6-dbg`, `*-dbgsym`: `/usr/lib/debug/.build-id/xx/yyyy.debug`, or a
//!   `.gnu_debuglink` target with the same build-id), which names static functions too and costs 1 ms where
//!   DWARF costs 50 ms for glibc (and seconds for a `mariadbd` with debug info); or the DWARF of the debug
//!   file, for debug files without a symbol table. A stripped `mariadbd` never gets `debug_syms`, and what a
//!   debug file lacks is looked up in the binary's own symbols. A stripped binary without a local debug file
//!   gets one from the debuginfod servers of `DEBUGINFOD_URLS`, when set (see [`debuginfod`]).
//! - Addresses without a symbol (stripped binaries, static functions) are named by the start of the function
//!   holding them, from the binary's `.eh_frame`: `mariadbd+0x8a1c00`, the ELF virtual address that
//!   `addr2line -e` takes. blazesym honours symbol sizes; sizeless symbols (which it stretches up to the next
//!   symbol in `.symtab`) are checked against the same table.
//! - Functions without a symbol that a C++ binary's vtables hold are named `Class::method` after the slots of
//!   their base classes' vtables (see [`vtables`]), before the `.eh_frame` name.
//! - Names are cleaned (see [`clean_name`]): demangled, no argument lists, no clone suffixes, no `;`.
//!   Demangling (3 to 7 µs a C++ name) is done once per symbol, not once per address.
//! - Kernel frames come from `/proc/kallsyms` and end in `_[k]`.
//! - A blazesym error never loses a frame: `.eh_frame` name, then the mapping's name, then `[unknown]`.

pub(crate) mod clean;
pub mod data;
mod debuginfod;
pub(crate) mod elf;
#[cfg(test)]
pub(crate) mod test_support;
pub(crate) mod vtables;
pub mod wait_calls;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// The root of a stack of its leaf alone (LEAF_ONLY_ROOT in src/bpf/stack_ids.h): offcpu's thread preempted at a
/// site not unwound before, whose instruction alone was kept.
pub const LEAF_ONLY_ROOT: u64 = 0xffff_ffff_ffff_fff0;
pub const LEAF_ONLY: &str = "[preempted: leaf only]";

use anyhow::{Context, Result};
use blazesym::symbolize::source::{Elf, Kernel, Process, Source};
use blazesym::symbolize::{Input, Symbolized};
use blazesym::MaybeDefault;

use crate::process::maps::{MapKind, Mapping, ProcMaps};
pub use clean::clean_name;

/// The binary of a frame that has no function name (`mariadbd+0x8a1c00`: the name given to the start of a
/// function from `.eh_frame`), if it is one.
pub fn unnamed_in_binary(frame: &str) -> Option<&str> {
    let (binary, hex) = frame.rsplit_once("+0x")?;
    let plain = !binary.is_empty() && !binary.contains([' ', ';', '(', ':']);
    (plain && !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit())).then_some(binary)
}
use elf::{EhTable, ElfInfo};
use vtables::VtableNames;

/// Counters for diagnostics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SymbolizeStats {
    /// Unique addresses symbolized (user + kernel), i.e. cache misses.
    pub unique_addrs: usize,
    /// Of which user space.
    pub user_addrs: usize,
    /// Of which kernel.
    pub kernel_addrs: usize,
    /// Addresses without a symbol: named from `.eh_frame` (`mariadbd+0x…`), after their mapping (`[anon]`,
    /// `[vdso]`, …) or `[unknown]`.
    pub no_symbol: usize,
    /// Of which named `[unknown]` (or `[unknown]_[k]`).
    pub unknown: usize,
    /// Addresses without a symbol named from the vtables that hold their function (`Class::method`).
    pub from_vtables: usize,
    /// Errors reported by blazesym (the frames concerned fell back to `.eh_frame` names).
    pub errors: usize,
    /// Time spent in [`Symbolizer::new`] and in resolving cache misses.
    pub elapsed: Duration,
}

impl fmt::Display for SymbolizeStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} unique addresses ({} user, {} kernel), {} without symbol ({} unknown), {} named from vtables, \
             {} errors, {:.1} ms",
            self.unique_addrs,
            self.user_addrs,
            self.kernel_addrs,
            self.no_symbol,
            self.unknown,
            self.from_vtables,
            self.errors,
            self.elapsed.as_secs_f64() * 1e3
        )
    }
}

/// What is known of a mapped file, loaded lazily on its first address.
#[derive(Default)]
struct Binary {
    /// `None` until first used; `Some(None)` when the file is not a readable ELF file.
    info: Option<Option<ElfInfo>>,
    /// Where its symbols come from.
    mode: SymMode,
    /// `None` until first needed.
    eh: Option<Rc<EhTable>>,
    /// `None` until first needed.
    vtables: Option<Rc<VtableNames>>,
}

/// Where the symbols of a binary come from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
enum SymMode {
    /// Its own ELF symbols (`.symtab` if not stripped, else `.dynsym`).
    #[default]
    Own,
    /// The `.symtab` of its separate debug file (Debian's `-dbg`/`-dbgsym` packages): every function, static
    /// ones included, at the cost of reading one symbol table (1 ms for glibc, against 50 ms for its DWARF).
    DebugFile(PathBuf),
    /// DWARF (blazesym's `debug_syms`): that of the binary itself (`None`), or that of its separate debug file
    /// when the file has no symbol table.
    Dwarf(Option<PathBuf>),
}

/// Address → frame name for one process and the kernel. Not thread-safe (names are `Rc<str>`).
pub struct Symbolizer {
    pid: u32,
    /// blazesym without demangling: every lookup goes here.
    raw: blazesym::symbolize::Symbolizer,
    /// blazesym with demangling: one lookup per new mangled name.
    demangling: blazesym::symbolize::Symbolizer,
    /// Raw symbol name → cleaned name (`None`: nothing usable).
    clean_names: HashMap<Box<str>, Option<Rc<str>>>,
    maps: ProcMaps,
    /// Per file of `maps` (same index).
    binaries: Vec<Binary>,
    /// `.eh_frame` tables by build-id, shared by files with the same contents.
    eh_by_build_id: HashMap<Vec<u8>, Rc<EhTable>>,
    /// Names from vtables by build-id, likewise.
    vtables_by_build_id: HashMap<Vec<u8>, Rc<VtableNames>>,
    extra_debug_dirs: Vec<PathBuf>,
    user_cache: HashMap<u64, Rc<str>>,
    kernel_cache: HashMap<u64, Rc<str>>,
    /// Whether kernel symbols can be had; `None` until first needed.
    kallsyms_ok: Option<bool>,
    names: HashSet<Rc<str>>,
    stats: SymbolizeStats,
}

impl Symbolizer {
    /// For the process `pid` (must be alive while symbolizing; mappings are read from /proc/PID/maps).
    pub fn new(pid: u32) -> Result<Self> {
        let t0 = Instant::now();
        let maps = ProcMaps::read(pid)
            .with_context(|| format!("reading the mappings of process {pid}"))?;
        let mut s = Self::with_maps(pid, maps);
        s.stats.elapsed += t0.elapsed();
        Ok(s)
    }

    /// For mappings that are not a live process's (a core file's, a crash report's): see [`ProcMaps::fixed`].
    pub fn of_maps(maps: ProcMaps) -> Self {
        Self::with_maps(0, maps)
    }

    /// For the process `pid` whose mappings are `maps`.
    fn with_maps(pid: u32, maps: ProcMaps) -> Self {
        let extra_debug_dirs = elf::target_debug_dirs(pid);
        let mut debug_dirs: Vec<PathBuf> = elf::DEBUG_DIRS.iter().map(PathBuf::from).collect();
        debug_dirs.extend(extra_debug_dirs.iter().cloned());
        Symbolizer {
            pid,
            raw: new_blazesym(false, Some(&debug_dirs)),
            demangling: new_blazesym(true, Some(&debug_dirs)),
            clean_names: HashMap::new(),
            binaries: (0..maps.file_count()).map(|_| Binary::default()).collect(),
            maps,
            eh_by_build_id: HashMap::new(),
            vtables_by_build_id: HashMap::new(),
            extra_debug_dirs,
            user_cache: HashMap::new(),
            kernel_cache: HashMap::new(),
            kallsyms_ok: None,
            names: HashSet::new(),
            stats: SymbolizeStats::default(),
        }
    }

    /// Forgets the names of addresses past `max` of them, for a process that runs for days (`myprobe agent`):
    /// on-CPU samples land on any instruction, so the addresses seen grow with the code ever run.
    pub fn bound_caches(&mut self, max: usize) {
        if self.user_cache.len() + self.kernel_cache.len() > max {
            self.user_cache.clear();
            self.kernel_cache.clear();
        }
    }

    /// Names for a user stack, leaf first, same length as `ips` (one name per address; never drops frames).
    pub fn user_stack(&mut self, ips: &[u64]) -> Vec<Rc<str>> {
        let lookups: Vec<u64> = lookup_addrs(ips);
        let misses = uncached(
            lookups
                .iter()
                .zip(ips)
                .filter(|&(_, &ip)| ip != LEAF_ONLY_ROOT)
                .map(|(&a, _)| a),
            |a| self.user_cache.contains_key(a),
        );
        self.resolve_timed(&misses, Self::resolve_user);
        lookups
            .iter()
            .zip(ips)
            .map(|(a, &ip)| match ip {
                LEAF_ONLY_ROOT => Rc::from(LEAF_ONLY),
                _ => Rc::clone(&self.user_cache[a]),
            })
            .collect()
    }

    /// Names for a kernel stack, leaf first, each suffixed "_[k]" (the FlameGraph convention).
    pub fn kernel_stack(&mut self, ips: &[u64]) -> Vec<Rc<str>> {
        let lookups: Vec<u64> = lookup_addrs(ips);
        let misses = uncached(lookups.iter().copied(), |a| {
            self.kernel_cache.contains_key(a)
        });
        self.resolve_timed(&misses, Self::resolve_kernel);
        lookups
            .iter()
            .map(|a| Rc::clone(&self.kernel_cache[a]))
            .collect()
    }

    /// Counters for diagnostics: unique addresses symbolized, how many had no symbol, time spent.
    #[allow(dead_code)] // API for the commands' diagnostics
    pub fn stats(&self) -> SymbolizeStats {
        self.stats
    }

    /// Optional: does now the work that the first lookups would do (about 100 ms for a MariaDB server and
    /// the kernel, mostly the kernel writing /proc/kallsyms): loads the kernel symbols (if `kernel`) and the
    /// symbol and `.eh_frame` tables of every executable file mapping. Calling it right after attaching,
    /// while the trace runs, shortens the time from the end of tracing to the results.
    #[allow(dead_code)] // API for the collectors
    pub fn preload(&mut self, kernel: bool) {
        let t0 = Instant::now();
        if kernel
            && self.kallsyms_usable()
            && self
                .raw
                .symbolize(&Self::kernel_source(), Input::AbsAddr(&[]))
                .is_err()
        {
            self.stats.errors += 1;
            self.kallsyms_ok = Some(false);
        }
        let mut bins: Vec<(usize, u64)> = Vec::new();
        for m in self.maps.maps() {
            if let (Some(bin), true) = (binary_of(m), m.exec) {
                if !bins.iter().any(|b| b.0 == bin) {
                    bins.push((bin, m.offset));
                }
            }
        }
        for (bin, offset) in bins {
            let Some(vaddr) = self
                .binary_info(bin)
                .and_then(|i| i.file_offset_to_vaddr(offset))
            else {
                continue;
            };
            let _ = self.eh_table(bin);
            let _ = self.vtable_names(bin);
            let mode = self.binaries[bin].mode.clone();
            for blaze in [&self.raw, &self.demangling] {
                if self.blaze_elf(blaze, bin, &mode, &[vaddr]).is_err() {
                    self.stats.errors += 1;
                }
            }
        }
        self.stats.elapsed += t0.elapsed();
    }

    fn intern(&mut self, name: &str) -> Rc<str> {
        if let Some(n) = self.names.get(name) {
            return Rc::clone(n);
        }
        let n: Rc<str> = Rc::from(name);
        self.names.insert(Rc::clone(&n));
        n
    }

    /// Re-reads the maps; files seen for the first time get an empty [`Binary`].
    fn read_maps(&mut self) -> Result<()> {
        self.maps.reread()?;
        self.binaries
            .resize_with(self.maps.file_count(), Binary::default);
        Ok(())
    }

    fn binary_info(&mut self, bin: usize) -> Option<&ElfInfo> {
        if self.binaries[bin].info.is_none() {
            let f = self.maps.file(bin);
            let info = ElfInfo::read(&f.open_path, &f.symbolic, &self.extra_debug_dirs).ok();
            let b = &mut self.binaries[bin];
            b.mode = match info
                .as_ref()
                .map(|i| (&i.debug_file, i.has_debug_info, i.has_symtab))
            {
                Some((Some((path, true)), _, _)) => SymMode::DebugFile(path.clone()),
                Some((Some((path, false)), _, _)) => SymMode::Dwarf(Some(path.clone())),
                Some((None, true, false)) => SymMode::Dwarf(None),
                _ => SymMode::Own,
            };
            b.info = Some(info);
        }
        self.binaries[bin].info.as_ref().and_then(Option::as_ref)
    }

    fn eh_table(&mut self, bin: usize) -> Rc<EhTable> {
        if let Some(eh) = &self.binaries[bin].eh {
            return Rc::clone(eh);
        }
        let build_id = self.binary_info(bin).and_then(|i| i.build_id.clone());
        let cached = build_id
            .as_ref()
            .and_then(|id| self.eh_by_build_id.get(id))
            .cloned();
        let eh = cached.unwrap_or_else(|| {
            let eh = Rc::new(EhTable::read(&self.maps.file(bin).open_path).unwrap_or_default());
            if let Some(id) = build_id {
                self.eh_by_build_id.insert(id, Rc::clone(&eh));
            }
            eh
        });
        self.binaries[bin].eh = Some(Rc::clone(&eh));
        eh
    }

    /// The names that the vtables of binary `bin` give its functions without symbols: none for a binary with
    /// a symbol table of its own or a debug file (every function has its symbol there).
    fn vtable_names(&mut self, bin: usize) -> Rc<VtableNames> {
        if let Some(v) = &self.binaries[bin].vtables {
            return Rc::clone(v);
        }
        let (stripped, build_id) = match self.binary_info(bin) {
            Some(i) => (!i.has_symtab && i.debug_file.is_none(), i.build_id.clone()),
            None => (false, None),
        };
        let cached = build_id
            .as_ref()
            .and_then(|id| self.vtables_by_build_id.get(id))
            .cloned();
        let v = cached.unwrap_or_else(|| {
            let v = if stripped {
                VtableNames::read(&self.maps.file(bin).open_path).unwrap_or_default()
            } else {
                VtableNames::default()
            };
            let v = Rc::new(v);
            if let Some(id) = build_id {
                self.vtables_by_build_id.insert(id, Rc::clone(&v));
            }
            v
        });
        self.binaries[bin].vtables = Some(Rc::clone(&v));
        v
    }

    /// Resolves the addresses a cache misses with `resolve`, its time counted.
    fn resolve_timed(&mut self, misses: &[u64], resolve: fn(&mut Self, &[u64])) {
        if !misses.is_empty() {
            let t0 = Instant::now();
            resolve(self, misses);
            self.stats.elapsed += t0.elapsed();
        }
    }

    fn resolve_user(&mut self, misses: &[u64]) {
        self.stats.user_addrs += misses.len();
        self.stats.unique_addrs += misses.len();
        let mut unmapped = Vec::new();
        let mut by_binary: HashMap<usize, Vec<(u64, u64)>> = HashMap::new();
        let mut vdso = Vec::new();
        let mut pending: Vec<u64> = misses.to_vec();
        for round in 0..2 {
            for &addr in &pending {
                let Some(i) = self.maps.find(addr) else {
                    unmapped.push(addr);
                    continue;
                };
                let m = &self.maps.maps()[i];
                if let Some(bin) = binary_of(m) {
                    match m.file_offset(addr) {
                        Some(file_off) => by_binary.entry(bin).or_default().push((addr, file_off)),
                        // An offset past 2^64: no place in the file, as for an offset in no segment.
                        None => {
                            self.stats.no_symbol += 1;
                            let name = format!("[{}]", self.maps.file(bin).basename);
                            let name = self.intern(&name);
                            self.user_cache.insert(addr, name);
                        }
                    }
                } else if m.kind == MapKind::Vdso {
                    vdso.push(addr);
                } else {
                    let name = self.maps.label(m).into_owned();
                    let name = self.intern(&name);
                    self.stats.no_symbol += 1;
                    self.user_cache.insert(addr, name);
                }
            }
            // Addresses in no mapping: maybe a library loaded since; read the maps again (not too often).
            if round == 0
                && !unmapped.is_empty()
                && self.maps.is_stale()
                && self.read_maps().is_ok()
            {
                pending = std::mem::take(&mut unmapped);
                continue;
            }
            break;
        }
        for addr in unmapped {
            self.stats.no_symbol += 1;
            self.stats.unknown += 1;
            let name = self.intern("[unknown]");
            self.user_cache.insert(addr, name);
        }
        let mut bins: Vec<_> = by_binary.into_iter().collect();
        bins.sort_unstable_by_key(|(bin, _)| *bin);
        for (bin, addrs) in bins {
            self.resolve_in_binary(bin, &addrs);
        }
        if !vdso.is_empty() {
            self.resolve_vdso(&vdso);
        }
    }

    /// `addrs`: (absolute address, file offset) pairs inside mappings of binary `bin`.
    fn resolve_in_binary(&mut self, bin: usize, addrs: &[(u64, u64)]) {
        let vaddrs: Vec<Option<u64>> = match self.binary_info(bin) {
            Some(info) => addrs
                .iter()
                .map(|&(_, off)| info.file_offset_to_vaddr(off))
                .collect(),
            None => vec![None; addrs.len()],
        };
        let query: Vec<u64> = vaddrs.iter().flatten().copied().collect();
        let mut found: Vec<Option<Found>> = vec![None; query.len()];
        let primary = self.binaries[bin].mode.clone();
        if !query.is_empty()
            && self.binaries[bin]
                .info
                .as_ref()
                .is_some_and(Option::is_some)
        {
            match self.blaze_elf(&self.raw, bin, &primary, &query) {
                Ok(f) => found = f,
                Err(_) => {
                    self.stats.errors += 1;
                    if primary != SymMode::Own {
                        // Debug information that blazesym cannot use: the binary's own symbols from now on.
                        self.binaries[bin].mode = SymMode::Own;
                    }
                }
            }
            // What the debug information lacks, the binary's own symbols may have.
            if primary != SymMode::Own {
                let missing: Vec<usize> =
                    (0..query.len()).filter(|&i| found[i].is_none()).collect();
                if !missing.is_empty() {
                    let q: Vec<u64> = missing.iter().map(|&i| query[i]).collect();
                    match self.blaze_elf(&self.raw, bin, &SymMode::Own, &q) {
                        Ok(f) => missing.iter().zip(f).for_each(|(&i, f)| {
                            found[i] = f.map(|f| Found { own: true, ..f });
                        }),
                        Err(_) => self.stats.errors += 1,
                    }
                }
            }
        }
        self.demangle_new_names(bin, &primary, &query, &found);
        let mut found = found.into_iter();
        for (&(addr, _), vaddr) in addrs.iter().zip(vaddrs) {
            let name = match vaddr {
                Some(vaddr) => {
                    let sym = found.next().flatten();
                    self.name_in_binary(bin, vaddr, sym)
                }
                None => {
                    self.stats.no_symbol += 1;
                    let name = format!("[{}]", self.maps.file(bin).basename);
                    self.intern(&name)
                }
            };
            self.user_cache.insert(addr, name);
        }
    }

    /// Fills `clean_names` for the raw names of `found` not seen before. Demangling is the costly part of
    /// symbolization (3 to 7 µs a C++ name): it is done once per symbol, by asking the demangling blazesym
    /// instance about the first address found in each symbol.
    fn demangle_new_names(
        &mut self,
        bin: usize,
        primary: &SymMode,
        query: &[u64],
        found: &[Option<Found>],
    ) {
        let mut todo: [Vec<(&str, u64, u64)>; 2] = [Vec::new(), Vec::new()];
        let mut seen: HashSet<&str> = HashSet::new();
        for (f, &vaddr) in found.iter().zip(query) {
            let Some(f) = f else { continue };
            if self.clean_names.contains_key(f.raw.as_str()) || !seen.insert(f.raw.as_str()) {
                continue;
            }
            if f.raw.starts_with("_Z") || f.raw.starts_with("_R") {
                todo[usize::from(f.own)].push((f.raw.as_str(), vaddr, f.start));
            } else {
                let name = clean_name(&f.raw).map(|n| self.intern(&n));
                self.clean_names
                    .insert(f.raw.clone().into_boxed_str(), name);
            }
        }
        for (own, list) in todo.into_iter().enumerate() {
            if list.is_empty() {
                continue;
            }
            let mode = if own == 1 {
                SymMode::Own
            } else {
                primary.clone()
            };
            let vaddrs: Vec<u64> = list.iter().map(|t| t.1).collect();
            let demangled: Vec<Option<String>> =
                match self.blaze_elf(&self.demangling, bin, &mode, &vaddrs) {
                    Ok(f) => f
                        .into_iter()
                        .map(|f| f.map(|f| (f.raw, f.start)))
                        .zip(&list)
                        .map(|(d, t)| {
                            // The same symbol as the raw lookup (same instance settings but demangling).
                            d.filter(|d| d.1 == t.2).map(|d| d.0)
                        })
                        .collect(),
                    Err(_) => {
                        self.stats.errors += 1;
                        vec![None; list.len()]
                    }
                };
            for ((raw, _, _), d) in list.into_iter().zip(demangled) {
                let name = clean_name(d.as_deref().unwrap_or(raw)).map(|n| self.intern(&n));
                self.clean_names.insert(raw.into(), name);
            }
        }
    }

    /// One call of blazesym instance `blaze` for ELF virtual addresses of one binary, from the symbol source
    /// `mode`.
    fn blaze_elf(
        &self,
        blaze: &blazesym::symbolize::Symbolizer,
        bin: usize,
        mode: &SymMode,
        vaddrs: &[u64],
    ) -> Result<Vec<Option<Found>>> {
        let src = match mode {
            SymMode::Own | SymMode::Dwarf(None) => {
                let mut src = Elf::new(&self.maps.file(bin).open_path);
                src.debug_syms = *mode != SymMode::Own;
                src
            }
            SymMode::DebugFile(path) | SymMode::Dwarf(Some(path)) => {
                let mut src = Elf::new(path);
                src.debug_syms = matches!(mode, SymMode::Dwarf(_));
                src
            }
        };
        let syms = blaze.symbolize(&Source::Elf(src), Input::VirtOffset(vaddrs))?;
        Ok(syms
            .into_iter()
            .map(|s| match s {
                Symbolized::Sym(sym) if !sym.name.is_empty() => Some(Found {
                    raw: sym.name.into_owned(),
                    start: sym.addr,
                    sized: sym.size.is_some(),
                    own: *mode == SymMode::Own,
                }),
                _ => None,
            })
            .collect())
    }

    /// The name of `vaddr` in binary `bin` given blazesym's answer: its symbol, unless the symbol is sizeless
    /// and `.eh_frame` shows another function starting between it and the address (blazesym stretches
    /// sizeless `.symtab` symbols up to the next symbol), or the address lies outside the code; else the start
    /// of the FDE holding it.
    fn name_in_binary(&mut self, bin: usize, vaddr: u64, sym: Option<Found>) -> Rc<str> {
        if let Some(f) = sym {
            let trusted = f.sized || {
                let eh = self.eh_table(bin);
                match eh.last_at_or_before(vaddr) {
                    Some((fde_start, _)) if fde_start > f.start => false,
                    Some((_, fde_end)) if vaddr < fde_end => true,
                    _ => self
                        .binary_info(bin)
                        .is_some_and(|i| i.is_exec(vaddr) && i.is_exec(f.start)),
                }
            };
            if trusted {
                if let Some(Some(name)) = self.clean_names.get(f.raw.as_str()) {
                    return Rc::clone(name);
                }
            }
        }
        let eh = self.eh_table(bin);
        let fde = eh.find(vaddr);
        if let Some((start, _)) = fde {
            if let Some(name) = self.vtable_names(bin).get(start) {
                self.stats.from_vtables += 1;
                return self.intern(name);
            }
        }
        self.stats.no_symbol += 1;
        let start = fde.map_or(vaddr, |(s, _)| s);
        let name = format!("{}+0x{start:x}", self.maps.file(bin).basename);
        self.intern(&name)
    }

    fn resolve_vdso(&mut self, addrs: &[u64]) {
        let mut src = Process::new(self.pid.into());
        src.debug_syms = false;
        src.perf_map = false;
        src.map_files = false;
        src.vdso = true;
        let found: Vec<Option<String>> = match self
            .raw
            .symbolize(&Source::Process(src), Input::AbsAddr(addrs))
        {
            Ok(syms) => clean_names(syms),
            Err(_) => {
                self.stats.errors += 1;
                vec![None; addrs.len()]
            }
        };
        for (&addr, name) in addrs.iter().zip(found) {
            let name = name.unwrap_or_else(|| {
                self.stats.no_symbol += 1;
                "[vdso]".to_owned()
            });
            let name = self.intern(&name);
            self.user_cache.insert(addr, name);
        }
    }

    /// Whether `/proc/kallsyms` shows real addresses (it shows zeros without CAP_SYSLOG or with
    /// `kernel.kptr_restrict=2`, and every address would then get the name of the last symbol).
    fn kallsyms_usable(&mut self) -> bool {
        *self.kallsyms_ok.get_or_insert_with(|| {
            use std::io::BufRead;
            let Ok(f) = std::fs::File::open("/proc/kallsyms") else {
                return false;
            };
            // The first text symbol (per-CPU symbols at 0 may come before it).
            std::io::BufReader::new(f)
                .lines()
                .take(10_000)
                .map_while(|l| l.ok())
                .find_map(|l| {
                    let mut f = l.split_whitespace();
                    let addr = f.next()?;
                    matches!(f.next()?, "T" | "t").then(|| u64::from_str_radix(addr, 16).ok())
                })
                .flatten()
                .is_some_and(|a| a != 0)
        })
    }

    fn kernel_source() -> Source<'static> {
        Source::Kernel(Kernel {
            vmlinux: MaybeDefault::None,
            debug_syms: false,
            ..Kernel::default()
        })
    }

    fn resolve_kernel(&mut self, misses: &[u64]) {
        self.stats.kernel_addrs += misses.len();
        self.stats.unique_addrs += misses.len();
        let result = if self.kallsyms_usable() {
            self.raw
                .symbolize(&Self::kernel_source(), Input::AbsAddr(misses))
                .map_err(|_| ())
        } else {
            Err(())
        };
        let found: Vec<Option<String>> = match result {
            Ok(syms) => clean_names(syms),
            Err(()) => {
                if self.kallsyms_ok == Some(true) {
                    // Not again for every stack.
                    self.stats.errors += 1;
                    self.kallsyms_ok = Some(false);
                }
                vec![None; misses.len()]
            }
        };
        for (&addr, name) in misses.iter().zip(found) {
            let name = match name {
                Some(n) => format!("{n}_[k]"),
                None => {
                    self.stats.no_symbol += 1;
                    self.stats.unknown += 1;
                    "[unknown]_[k]".to_owned()
                }
            };
            let name = self.intern(&name);
            self.kernel_cache.insert(addr, name);
        }
    }
}

/// A symbol found by blazesym.
#[derive(Debug, Clone)]
struct Found {
    /// Name as in the symbol table (mangled).
    raw: String,
    /// Start (ELF virtual address).
    start: u64,
    /// Whether its size is known.
    sized: bool,
    /// Found in the binary's own symbols (else in its debug information).
    own: bool,
}

/// A blazesym instance for names only (no source lines, no inlined functions); `debug_dirs`: where debug
/// links are looked up (`None`: blazesym's default).
fn new_blazesym(demangle: bool, debug_dirs: Option<&[PathBuf]>) -> blazesym::symbolize::Symbolizer {
    blazesym::symbolize::Symbolizer::builder()
        .enable_demangling(demangle)
        .enable_code_info(false)
        .enable_inlined_fns(false)
        .enable_auto_reload(false)
        .set_debug_dirs(debug_dirs)
        .build()
}

/// The binary (index into `Symbolizer::binaries`) whose symbols name the addresses of `m`: that of a file
/// mapping, unless its inode is 0 (no real file).
fn binary_of(m: &Mapping) -> Option<usize> {
    match m.kind {
        MapKind::File(bin) if m.inode != 0 => Some(bin),
        _ => None,
    }
}

/// Each symbol's clean name; none for an address blazesym could not name.
fn clean_names(syms: Vec<Symbolized<'_>>) -> Vec<Option<String>> {
    syms.into_iter()
        .map(|s| match s {
            Symbolized::Sym(sym) => clean_name(&sym.name),
            Symbolized::Unknown(_) => None,
        })
        .collect()
}

/// The addresses of `lookups` not in a cache yet (`cached`), each once, in order.
fn uncached(lookups: impl Iterator<Item = u64>, cached: impl Fn(&u64) -> bool) -> Vec<u64> {
    let mut misses: Vec<u64> = lookups.filter(|a| !cached(a)).collect();
    misses.sort_unstable();
    misses.dedup();
    misses
}

/// The addresses to look up for a stack, leaf first: the first as is, the others (return addresses) minus one.
fn lookup_addrs(ips: &[u64]) -> Vec<u64> {
    ips.iter()
        .enumerate()
        .map(|(i, &ip)| if i == 0 { ip } else { ip.saturating_sub(1) })
        .collect()
}

#[cfg(test)]
mod tests;
