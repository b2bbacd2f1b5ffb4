//! Names of virtual methods that a stripped C++ binary does not export, from its vtables.
//!
//! A class's primary vtable (the Itanium C++ ABI: offset to top 0, a pointer to the class's typeinfo, then
//! one function pointer per virtual method) starts with the slots of its primary base's vtable, in the same
//! order, each holding the base's method or the class's override of it. So a slot of a class whose function
//! has no symbol (Debian's `mariadbd` exports `handler::write_row`, not InnoDB's `ha_innobase::write_row`)
//! takes its method name from the same slot of a class of the same hierarchy whose function has one.
//!
//! Everything is found through the binary's data and dynamic relocations, exported or not:
//! - typeinfo objects are the words relocated to one of libstdc++'s three `__cxxabiv1::__*class_type_info`
//!   vtables (+16); their name is the mangled type at their second word; the primary base is the one of
//!   `__si_class_type_info`, or the first non-virtual base at offset 0 of `__vmi_class_type_info`;
//! - a primary vtable is a word pointing to a typeinfo, after an offset to top of 0; its slots are the words
//!   after it that point into code (or to a function of another file, such as `__cxa_pure_virtual`), up to
//!   the first that does not (null words are null slots), the start of another object, or the end of its
//!   `_ZTV` symbol when exported.
//!
//! The rule: the slots `i` of a class and of its primary base (for `i` below the base's slot count) are one
//! method. A method's name is trusted only from a symbol `K::m` whose class `K` is the slot's class or one
//! of its primary bases (a symbol of another class there is identical code folded together); all such
//! symbols of one method must agree (destructors agree as `~`). A function without a symbol is named
//! `C::m` after the highest class `C` whose vtable holds it, if every class that holds it derives from `C`
//! and every slot it fills is the same method.
//!
//! Limits: only primary vtables (the overrides in secondary vtables, for a second base, are thunks to the
//! functions named here); a class with two candidate primary vtables (construction vtables of virtual
//! inheritance) and no `_ZTV` symbol to choose is left out; the end of a vtable that is not exported is
//! where its function pointers end, so an array of functions right after it would be taken for more of its
//! slots (their names are then trusted only as above); 64-bit x86-64 and AArch64 ELF files.

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::fs::File;
use std::path::Path;

use anyhow::{Context, Result};
use object::elf;
use object::elf::FileHeader64;
use object::read::elf::{ElfFile64, FileHeader, Rela, SectionHeader, Sym, SymbolTable};
use object::{Endian, Endianness, ReadRef};

use super::clean_name;

/// The vtable of each kind of typeinfo object, in libstdc++ (the words of a typeinfo point 16 bytes into it).
const TYPEINFO_VTABLES: [(&[u8], Kind); 3] = [
    (b"_ZTVN10__cxxabiv117__class_type_infoE", Kind::Class),
    (b"_ZTVN10__cxxabiv120__si_class_type_infoE", Kind::Single),
    (b"_ZTVN10__cxxabiv121__vmi_class_type_infoE", Kind::Multiple),
];

/// Bounds against nonsense in a damaged file.
const MAX_SLOTS: usize = 1 << 14;
const MAX_BASES: u64 = 1 << 12;
/// Words above it are not read as pointers: a typeinfo's or vtable's words are read at offsets up to
/// MAX_SLOTS or MAX_BASES words past one, which must not pass 2^64 (only a corrupt file puts one there).
const HIGHEST_POINTER_AT: u64 = u64::MAX - (1 << 20);
const MAX_TYPE_NAME: usize = 4096;

/// Functions without symbols named from vtables: ELF virtual address → `Class::method`.
#[derive(Debug, Default)]
pub struct VtableNames {
    names: HashMap<u64, String>,
}

impl VtableNames {
    /// Reads the vtables of `path`. A file that is not a 64-bit ELF file of a known machine has none.
    pub fn read(path: &Path) -> Result<Self> {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        // SAFETY: the map is read only while this function runs; the files read are binaries mapped by the
        // traced process, which are replaced (renamed over) by upgrades, not written in place. A file cut
        // short meanwhile would end this process with SIGBUS, never corrupt it.
        let map = unsafe { memmap2::Mmap::map(&file) }
            .with_context(|| format!("mapping {}", path.display()))?;
        let Ok(elf) = ElfFile64::<Endianness, _>::parse(&*map) else {
            return Ok(Self::default());
        };
        let Some(image) = Image::read(&elf) else {
            return Ok(Self::default());
        };
        Ok(VtableNames {
            names: image.names(),
        })
    }

    /// Every function named, by ELF virtual address, in no order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &str)> {
        self.names.iter().map(|(&a, n)| (a, n.as_str()))
    }

    /// The name of the function that starts at `vaddr`, if its vtables give one.
    pub fn get(&self, vaddr: u64) -> Option<&str> {
        self.names.get(&vaddr).map(String::as_str)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// No base class.
    Class,
    /// One public non-virtual base at offset 0.
    Single,
    /// Anything else: a list of bases with their offsets and flags.
    Multiple,
}

/// What a pointer-sized word of the file holds once loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ptr {
    /// An address in this file.
    Addr(u64),
    /// The first word of a typeinfo object of this kind.
    TypeinfoVptr(Kind),
    /// Something in another file.
    External,
}

/// One slot of a vtable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// A function of this file.
    Fn(u64),
    /// A function of another file (`__cxa_pure_virtual`, a library's method), or none (GCC leaves the
    /// deleting destructor of an abstract class null).
    External,
}

/// What is read of the file.
struct Image<'d> {
    endian: Endianness,
    /// Allocated sections with contents that are not code, by address.
    data: Vec<(u64, &'d [u8])>,
    /// `[start, end)` of the code sections.
    code: Vec<(u64, u64)>,
    /// Words written by the dynamic linker: where → what.
    relocated: HashMap<u64, Ptr>,
    /// A position-dependent executable: its pointers are in the file as they will be in memory.
    absolute: bool,
    /// Function symbols: address → names (mangled).
    functions: HashMap<u64, Vec<&'d str>>,
    /// Where a symbol other than a function starts: no vtable's slot is there.
    object_starts: HashSet<u64>,
    /// Exported vtables (`_ZTV` + mangled type): `[start, end)`.
    vtable_symbols: HashMap<&'d [u8], (u64, u64)>,
    /// The typeinfo vtables' addresses + 16 when this file has them (libstdc++ linked in).
    typeinfo_vptrs: Vec<(u64, Kind)>,
}

/// A class with a primary vtable.
struct Class {
    /// Demangled, as in the names of its methods.
    name: String,
    /// The typeinfo of its primary base.
    base: Option<u64>,
    slots: Vec<Slot>,
}

impl<'d> Image<'d> {
    fn read<R: ReadRef<'d>>(elf: &ElfFile64<'d, Endianness, R>) -> Option<Self> {
        let endian = elf.endian();
        let header = elf.elf_header();
        let (relative, abs64) = match header.e_machine(endian) {
            elf::EM_X86_64 => (elf::R_X86_64_RELATIVE, elf::R_X86_64_64),
            elf::EM_AARCH64 => (elf::R_AARCH64_RELATIVE, elf::R_AARCH64_ABS64),
            _ => return None,
        };
        let mut image = Image {
            endian,
            data: Vec::new(),
            code: Vec::new(),
            relocated: HashMap::default(),
            absolute: header.e_type(endian) == elf::ET_EXEC,
            functions: HashMap::default(),
            object_starts: HashSet::default(),
            vtable_symbols: HashMap::default(),
            typeinfo_vptrs: Vec::new(),
        };
        image.read_sections(elf);
        // The symbols first: they say which relocations point to a typeinfo's vtable.
        image.read_symbols(elf);
        image.read_relocations(elf, relative, abs64);
        Some(image)
    }

    /// The allocated sections: the code's bounds, and the contents of the rest, each sorted by address.
    fn read_sections<R: ReadRef<'d>>(&mut self, elf: &ElfFile64<'d, Endianness, R>) {
        let (endian, data) = (self.endian, elf.data());
        for s in elf.elf_section_table().iter() {
            let flags = s.sh_flags(endian);
            let (addr, size) = (s.sh_addr(endian), s.sh_size(endian));
            if flags & u64::from(elf::SHF_ALLOC) == 0 || size == 0 {
                continue;
            }
            if flags & u64::from(elf::SHF_EXECINSTR) != 0 {
                if let Some(end) = addr.checked_add(size) {
                    self.code.push((addr, end));
                }
            } else if s.sh_type(endian) != elf::SHT_NOBITS {
                if let Ok(bytes) = s.data(endian, data) {
                    self.data.push((addr, bytes));
                }
            }
        }
        self.data.sort_unstable_by_key(|d| d.0);
        self.code.sort_unstable();
    }

    /// The symbols of both tables: the functions' names, where other objects start, the exported vtables, and
    /// libstdc++'s typeinfo vtables when linked in.
    fn read_symbols<R: ReadRef<'d>>(&mut self, elf: &ElfFile64<'d, Endianness, R>) {
        let endian = self.endian;
        for table in [elf.elf_symbol_table(), elf.elf_dynamic_symbol_table()] {
            let strings = table.strings();
            for sym in table.iter() {
                let Ok(name) = sym.name(endian, strings) else {
                    continue;
                };
                let (value, size) = (sym.st_value(endian), sym.st_size(endian));
                if sym.is_undefined(endian) || name.is_empty() {
                    continue;
                }
                if let Some(&(_, kind)) = TYPEINFO_VTABLES.iter().find(|(n, _)| *n == name) {
                    if let Some(v) = value.checked_add(16) {
                        self.typeinfo_vptrs.push((v, kind));
                    }
                }
                if sym.st_type() == elf::STT_FUNC {
                    if let Ok(name) = std::str::from_utf8(name) {
                        let names = self.functions.entry(value).or_default();
                        if !names.contains(&name) {
                            names.push(name);
                        }
                    }
                } else {
                    self.object_starts.insert(value);
                    if name.starts_with(b"_ZTV") {
                        if let Some(end) = value.checked_add(size) {
                            self.vtable_symbols.insert(&name[4..], (value, end));
                        }
                    }
                }
            }
        }
    }

    /// The words the dynamic linker writes, from the allocated sections' relocations: relative ones (`relative`,
    /// and every one of RELR), and absolute ones to a symbol (`abs64`); those of other types are left out.
    fn read_relocations<R: ReadRef<'d>>(
        &mut self,
        elf: &ElfFile64<'d, Endianness, R>,
        relative: u32,
        abs64: u32,
    ) {
        let (endian, data, sections) = (self.endian, elf.data(), elf.elf_section_table());
        let mut symbol_tables = HashMap::default();
        for s in sections.iter() {
            if s.sh_flags(endian) & u64::from(elf::SHF_ALLOC) == 0 {
                continue;
            }
            if let Ok(Some(relr)) = s.relr(endian, data) {
                for at in relr {
                    if let Some(v) = self.read_u64(at) {
                        self.relocated.insert(at, self.classify(v));
                    }
                }
                continue;
            }
            let Ok(Some((relas, link))) = s.rela(endian, data) else {
                continue;
            };
            for r in relas {
                let (at, addend) = (r.r_offset(endian), r.r_addend(endian));
                let ptr = match r.r_type(endian, false) {
                    t if t == relative => self.classify(addend as u64),
                    t if t == abs64 => {
                        let table = symbol_tables.entry(link).or_insert_with(|| {
                            sections.symbol_table_by_index(endian, data, link).ok()
                        });
                        match self.symbol_ptr(table.as_ref(), r.r_sym(endian, false), addend) {
                            Some(ptr) => ptr,
                            None => continue,
                        }
                    }
                    _ => continue,
                };
                self.relocated.insert(at, ptr);
            }
        }
    }

    /// What an absolute relocation to the symbol `index` of `table`, plus `addend`, points to; none when the
    /// symbol cannot be read or the sum does not fit in 64 bits.
    fn symbol_ptr<R: ReadRef<'d>>(
        &self,
        table: Option<&SymbolTable<'d, FileHeader64<Endianness>, R>>,
        index: u32,
        addend: i64,
    ) -> Option<Ptr> {
        let sym = table.and_then(|t| t.symbol(object::SymbolIndex(index as usize)).ok())?;
        if sym.is_undefined(self.endian) {
            let name = table
                .and_then(|t| sym.name(self.endian, t.strings()).ok())
                .unwrap_or_default();
            return Some(match TYPEINFO_VTABLES.iter().find(|(n, _)| *n == name) {
                Some(&(_, kind)) if addend == 16 => Ptr::TypeinfoVptr(kind),
                _ => Ptr::External,
            });
        }
        Some(self.classify(sym.st_value(self.endian).checked_add_signed(addend)?))
    }

    fn classify(&self, v: u64) -> Ptr {
        match self.typeinfo_vptrs.iter().find(|t| t.0 == v) {
            Some(&(_, kind)) => Ptr::TypeinfoVptr(kind),
            None => Ptr::Addr(v),
        }
    }

    /// The `len` bytes at `addr`, if one section holds them all.
    fn bytes(&self, addr: u64, len: usize) -> Option<&'d [u8]> {
        let i = self.data.partition_point(|d| d.0 <= addr).checked_sub(1)?;
        let (start, bytes) = self.data[i];
        let off = usize::try_from(addr - start).ok()?;
        bytes.get(off..off.checked_add(len)?)
    }

    fn read_u64(&self, addr: u64) -> Option<u64> {
        let b: [u8; 8] = self.bytes(addr, 8)?.try_into().ok()?;
        Some(self.endian.read_u64_bytes(b))
    }

    fn read_u32(&self, addr: u64) -> Option<u32> {
        let b: [u8; 4] = self.bytes(addr, 4)?.try_into().ok()?;
        Some(self.endian.read_u32_bytes(b))
    }

    /// The pointer in the word at `at`: relocated, or as in the file for a position-dependent executable.
    fn ptr_at(&self, at: u64) -> Option<Ptr> {
        if let Some(p) = self.relocated.get(&at) {
            return Some(*p);
        }
        if self.absolute {
            return self.read_u64(at).map(|v| self.classify(v));
        }
        None
    }

    /// Every word that holds a pointer (a position-dependent executable: every aligned word of its data).
    fn pointers(&self) -> Vec<(u64, Ptr)> {
        let mut out: Vec<(u64, Ptr)> = self.relocated.iter().map(|(&a, &p)| (a, p)).collect();
        if !self.absolute {
            return out;
        }
        for &(start, bytes) in &self.data {
            let Some(mut at) = start.checked_next_multiple_of(8) else {
                continue;
            };
            while let Some(v) = self.read_u64(at) {
                if v != 0 && !self.relocated.contains_key(&at) {
                    out.push((at, self.classify(v)));
                }
                match at.checked_add(8) {
                    Some(next) if next - start < bytes.len() as u64 => at = next,
                    _ => break,
                }
            }
        }
        out.retain(|&(at, _)| at <= HIGHEST_POINTER_AT);
        out
    }

    fn is_code(&self, addr: u64) -> bool {
        let i = self.code.partition_point(|c| c.0 <= addr);
        i > 0 && addr < self.code[i - 1].1
    }

    /// The NUL-terminated string at `addr`, if short and printable.
    fn c_string(&self, addr: u64) -> Option<&'d str> {
        let i = self.data.partition_point(|d| d.0 <= addr).checked_sub(1)?;
        let (start, bytes) = self.data[i];
        let rest = bytes.get(usize::try_from(addr - start).ok()?..)?;
        let len = rest.iter().take(MAX_TYPE_NAME).position(|&b| b == 0)?;
        let s = std::str::from_utf8(&rest[..len]).ok()?;
        s.bytes().all(|b| b.is_ascii_graphic()).then_some(s)
    }

    /// The classes with a primary vtable, by typeinfo address.
    fn classes(&self) -> HashMap<u64, Class> {
        let pointers = self.pointers();
        // Typeinfo objects: address → (kind, mangled type name, primary base, end).
        let mut typeinfos: HashMap<u64, (&'d str, Option<u64>)> = HashMap::default();
        let mut extents: Vec<(u64, u64)> = Vec::new();
        for &(at, p) in &pointers {
            let Ptr::TypeinfoVptr(kind) = p else { continue };
            let Some(name) = (match self.ptr_at(at + 8) {
                Some(Ptr::Addr(s)) => self.c_string(s),
                _ => None,
            }) else {
                continue;
            };
            // GCC marks the types of anonymous namespaces: their typeinfo is compared by address.
            let name = name.strip_prefix('*').unwrap_or(name);
            let (base, end) = match kind {
                Kind::Class => (None, at.checked_add(16)),
                Kind::Single => match self.ptr_at(at + 16) {
                    Some(Ptr::Addr(b)) => (Some(b), at.checked_add(24)),
                    _ => (None, at.checked_add(24)),
                },
                Kind::Multiple => {
                    let count = self.read_u32(at + 20).map_or(0, u64::from).min(MAX_BASES);
                    // Each base: its typeinfo, then offset << 8 | flags (1: virtual).
                    let base = (0..count).find_map(|k| {
                        let entry = at.checked_add(24 + 16 * k)?;
                        let offset_flags = self.read_u64(entry + 8)? as i64;
                        match self.ptr_at(entry) {
                            Some(Ptr::Addr(b))
                                if offset_flags & 1 == 0 && offset_flags >> 8 == 0 =>
                            {
                                Some(b)
                            }
                            _ => None,
                        }
                    });
                    (base, at.checked_add(24 + 16 * count))
                }
            };
            let Some(end) = end else { continue };
            typeinfos.insert(at, (name, base));
            extents.push((at, end));
        }
        extents.sort_unstable();
        let in_typeinfo = |a: u64| {
            let i = extents.partition_point(|e| e.0 <= a);
            i > 0 && a < extents[i - 1].1
        };
        // Primary vtables: a word pointing to a typeinfo after an offset to top of 0.
        let mut candidates: HashMap<u64, Vec<u64>> = HashMap::default();
        let mut headers: HashSet<u64> = HashSet::default();
        for &(at, p) in &pointers {
            let Ptr::Addr(ti) = p else { continue };
            if !typeinfos.contains_key(&ti) || in_typeinfo(at) {
                continue;
            }
            let Some(top_at) = at.checked_sub(8) else {
                continue;
            };
            headers.insert(top_at);
            headers.insert(at);
            if self.relocated.contains_key(&top_at) || self.read_u64(top_at) != Some(0) {
                continue;
            }
            candidates.entry(ti).or_default().push(at + 8);
        }
        let mut classes = HashMap::default();
        for (ti, points) in candidates {
            let (mangled, base) = typeinfos[&ti];
            let exported = self.vtable_symbols.get(mangled.as_bytes()).copied();
            let in_symbol = |a: u64| exported.is_some_and(|(s, e)| a >= s && a < e);
            let chosen: Vec<u64> = if points.len() > 1 && exported.is_some() {
                points.into_iter().filter(|&p| in_symbol(p)).collect()
            } else {
                points
            };
            let [point] = chosen[..] else { continue };
            let mut slots = Vec::new();
            let mut at = point;
            while slots.len() < MAX_SLOTS {
                if (exported.is_some() && !in_symbol(at))
                    || headers.contains(&at)
                    || typeinfos.contains_key(&at)
                    || self.object_starts.contains(&at)
                {
                    break;
                }
                match self.ptr_at(at) {
                    Some(Ptr::Addr(f)) if self.is_code(f) => slots.push(Slot::Fn(f)),
                    Some(Ptr::External) => slots.push(Slot::External),
                    None | Some(Ptr::Addr(0)) if self.read_u64(at) == Some(0) => {
                        slots.push(Slot::External)
                    }
                    _ => break,
                }
                at += 8;
            }
            // Zeros after the last function are more likely padding than null slots.
            while slots.last() == Some(&Slot::External) {
                slots.pop();
            }
            if slots.iter().all(|s| *s == Slot::External) {
                continue;
            }
            let Some(name) = demangle(&format!("_ZTS{mangled}"))
                .and_then(|n| n.strip_prefix("typeinfo name for ").map(str::to_owned))
            else {
                continue;
            };
            classes.insert(ti, Class { name, base, slots });
        }
        classes
    }

    /// Names of the functions without symbols, by the rule of the module's documentation.
    fn names(&self) -> HashMap<u64, String> {
        let classes = self.classes();
        let mut order: Vec<u64> = classes.keys().copied().collect();
        order.sort_unstable();
        let index: HashMap<u64, usize> = order.iter().enumerate().map(|(i, &t)| (t, i)).collect();
        let list: Vec<&Class> = order.iter().map(|t| &classes[t]).collect();
        // A base with more slots than its class is not its primary base as read: not followed.
        let parent: Vec<Option<usize>> = list
            .iter()
            .map(|c| {
                let p = index.get(&c.base?).copied()?;
                (list[p].slots.len() <= c.slots.len()).then_some(p)
            })
            .collect();
        let chain = |mut c: usize| {
            let mut v = vec![c];
            while let Some(p) = parent[c] {
                if v.contains(&p) || v.len() > 1000 {
                    break;
                }
                v.push(p);
                c = p;
            }
            v
        };
        let chains: Vec<Vec<usize>> = (0..list.len()).map(chain).collect();

        // Slot (c, i) is number first[c] + i; slots of one method are one set.
        let mut first = Vec::with_capacity(list.len());
        let mut total = 0;
        for c in &list {
            first.push(total);
            total += c.slots.len();
        }
        let mut sets = UnionFind::new(total);
        for (c, p) in parent.iter().enumerate() {
            if let Some(p) = *p {
                for i in 0..list[p].slots.len() {
                    sets.union(first[c] + i, first[p] + i);
                }
            }
        }

        // Where each function without a symbol is, and which sets matter.
        let mut unnamed: HashMap<u64, Vec<(usize, usize)>> = HashMap::default();
        let mut wanted: HashSet<usize> = HashSet::default();
        for (c, class) in list.iter().enumerate() {
            for (i, slot) in class.slots.iter().enumerate() {
                if let Slot::Fn(f) = *slot {
                    if !self.functions.contains_key(&f) {
                        unnamed.entry(f).or_default().push((c, i));
                        wanted.insert(sets.find(first[c] + i));
                    }
                }
            }
        }
        // Each wanted set's method, from the symbols of its slots' functions.
        let mut split: HashMap<&str, Option<(String, String)>> = HashMap::default();
        let mut method: HashMap<usize, Option<String>> = HashMap::default();
        for (c, class) in list.iter().enumerate() {
            for (i, slot) in class.slots.iter().enumerate() {
                let Slot::Fn(f) = *slot else { continue };
                let set = sets.find(first[c] + i);
                let Some(names) = self.functions.get(&f).filter(|_| wanted.contains(&set)) else {
                    continue;
                };
                for &raw in names {
                    let parts = split
                        .entry(raw)
                        .or_insert_with(|| demangle(raw).and_then(|d| split_method(&d)));
                    let Some((owner, m)) = parts else { continue };
                    if !chains[c].iter().any(|&k| list[k].name == *owner) {
                        continue;
                    }
                    let m = if m.starts_with('~') { "~" } else { m.as_str() };
                    method
                        .entry(set)
                        .and_modify(|known| {
                            if known.as_deref() != Some(m) {
                                *known = None;
                            }
                        })
                        .or_insert_with(|| Some(m.to_owned()));
                }
            }
        }

        let mut names = HashMap::default();
        for (f, places) in unnamed {
            let methods: HashSet<Option<&String>> = places
                .iter()
                .map(|&(c, i)| {
                    method
                        .get(&sets.find(first[c] + i))
                        .and_then(Option::as_ref)
                })
                .collect();
            let [Some(m)] = methods.into_iter().collect::<Vec<_>>()[..] else {
                continue;
            };
            // The highest class that holds it, if all the others derive from it.
            let Some(&(top, _)) = places.iter().min_by_key(|&&(c, _)| chains[c].len()) else {
                continue;
            };
            if !places.iter().all(|&(c, _)| chains[c].contains(&top)) {
                continue;
            }
            let class = &list[top].name;
            let name = if m == "~" {
                format!("{class}::~{}", short_name(class))
            } else {
                format!("{class}::{m}")
            };
            if let Some(name) = clean_name(&name) {
                names.insert(f, name);
            }
        }
        names
    }
}

/// Demangled as blazesym does (see `process::probes`), without argument lists.
fn demangle(raw: &str) -> Option<String> {
    let d = cpp_demangle::Symbol::new(raw).ok()?.demangle().ok()?;
    if d.starts_with("typeinfo name for ") {
        return Some(d);
    }
    clean_name(&d)
}

/// `A::B<x::y>::f` → (`A::B<x::y>`, `f`): the last component at nesting depth 0 and what qualifies it.
fn split_method(name: &str) -> Option<(String, String)> {
    let (owner, last) = split_last(name);
    Some((owner?.to_owned(), last.to_owned()))
}

fn split_last(name: &str) -> (Option<&str>, &str) {
    let bytes = name.as_bytes();
    let mut depth = 0i32;
    let mut cut = None;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            // An operator's name is not nesting (`operator<`, `operator()`): it is always the last part.
            b'o' if name[i..].starts_with("operator") && depth == 0 => break,
            b'<' | b'(' | b'[' | b'{' => depth += 1,
            b'>' | b')' | b']' | b'}' => depth -= 1,
            b':' if depth == 0 && bytes.get(i + 1) == Some(&b':') => {
                cut = Some(i);
                i += 1;
            }
            _ => {}
        }
        i += 1;
    }
    match cut {
        Some(c) => (Some(&name[..c]), &name[c + 2..]),
        None => (None, name),
    }
}

/// A class's own name, as its destructor spells it: `ns::Foo<int>` → `Foo`.
fn short_name(class: &str) -> &str {
    let last = split_last(class).1;
    match last.find('<') {
        Some(i) if last.ends_with('>') => &last[..i],
        _ => last,
    }
}

struct UnionFind {
    parent: Vec<usize>,
}

impl UnionFind {
    fn new(n: usize) -> Self {
        UnionFind {
            parent: (0..n).collect(),
        }
    }

    fn find(&mut self, mut x: usize) -> usize {
        while self.parent[x] != x {
            self.parent[x] = self.parent[self.parent[x]];
            x = self.parent[x];
        }
        x
    }

    fn union(&mut self, a: usize, b: usize) {
        let (a, b) = (self.find(a), self.find(b));
        if a != b {
            self.parent[a.max(b)] = a.min(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_split_at_the_last_top_level_qualifier() {
        assert_eq!(split_last("a::B<x::y>::f"), (Some("a::B<x::y>"), "f"));
        assert_eq!(split_last("f"), (None, "f"));
        assert_eq!(
            split_last("(anonymous namespace)::D::run"),
            (Some("(anonymous namespace)::D"), "run")
        );
        assert_eq!(split_last("A::operator<"), (Some("A"), "operator<"));
        assert_eq!(split_last("A::operator()"), (Some("A"), "operator()"));
        assert_eq!(short_name("ns::Foo<int>"), "Foo");
        assert_eq!(short_name("(anonymous namespace)::Derived"), "Derived");
    }
}
