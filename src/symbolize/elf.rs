//! What the symbolizer needs to know of one mapped ELF file: its loadable segments (file offset → ELF virtual
//! address), build-id, whether debug information exists for it, and the function table of its `.eh_frame`.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use gimli::UnwindSection;
use object::read::ReadCache;
use object::{Object, ObjectSection, ObjectSegment, ReadRef, SegmentFlags};

/// Directories searched for split debug information (Debian's `-dbg`/`-dbgsym` packages install
/// `/usr/lib/debug/.build-id/xx/yyyy.debug`).
pub const DEBUG_DIRS: &[&str] = &["/usr/lib/debug", "/lib/debug"];

/// The debug directories of process `pid` as seen from here when it runs in another mount namespace (a
/// container): its debug files are in its own file system. Empty otherwise.
pub fn target_debug_dirs(pid: u32) -> Vec<PathBuf> {
    let root = PathBuf::from(format!("/proc/{pid}/root"));
    if std::fs::read_link(&root)
        .map(|r| r != Path::new("/"))
        .unwrap_or(false)
    {
        DEBUG_DIRS
            .iter()
            .map(|d| root.join(d.trim_start_matches('/')))
            .collect()
    } else {
        Vec::new()
    }
}

/// One `PT_LOAD` segment.
#[derive(Debug, Clone, Copy)]
pub struct Segment {
    pub offset: u64,
    pub filesz: u64,
    pub vaddr: u64,
    pub memsz: u64,
    pub exec: bool,
    pub writable: bool,
}

impl Segment {
    /// The loadable segments of `obj` (flags unknown outside ELF: taken as set).
    pub fn all<'d, R: ReadRef<'d>>(obj: &object::File<'d, R>) -> Vec<Segment> {
        obj.segments()
            .map(|s| {
                let (offset, filesz) = s.file_range();
                let flag = |f: u32| match s.flags() {
                    SegmentFlags::Elf { p_flags } => p_flags & f != 0,
                    _ => true,
                };
                Segment {
                    offset,
                    filesz,
                    vaddr: s.address(),
                    memsz: s.size(),
                    exec: flag(object::elf::PF_X),
                    writable: flag(object::elf::PF_W),
                }
            })
            .collect()
    }

    /// `p_vaddr - p_offset`: the same for the segment and for each of its mappings, up to the load bias.
    pub fn delta(&self) -> u64 {
        self.vaddr.wrapping_sub(self.offset)
    }

    pub fn holds_vaddr(&self, vaddr: u64) -> bool {
        vaddr >= self.vaddr && vaddr - self.vaddr < self.memsz
    }

    /// Whether the segment's first `len` bytes from its file offset hold `file_off`. A difference, not
    /// `offset + len`: both come from the file and may add up past 2^64.
    fn holds_offset(&self, file_off: u64, len: u64) -> bool {
        file_off >= self.offset && file_off - self.offset < len
    }

    /// As [`Self::holds_offset`], from the start of the page that holds the segment's start: where a mapping
    /// of the segment starts.
    pub fn holds_page_offset(&self, file_off: u64, len: u64) -> bool {
        file_off >= self.offset & !0xfff
            && (file_off < self.offset || self.holds_offset(file_off, len))
    }

    /// ELF virtual address of the byte at `file_off` in the file, if one of `segments` holds it (and the
    /// address is below 2^64).
    pub fn vaddr_of_offset(segments: &[Segment], file_off: u64) -> Option<u64> {
        let in_file = segments
            .iter()
            .find(|s| s.holds_offset(file_off, s.filesz.max(1)));
        // A mapping starts at the page holding the segment start: accept the bytes just before it, and the
        // zero-filled tail past the file size.
        let seg = in_file.or_else(|| {
            segments
                .iter()
                .find(|s| s.holds_page_offset(file_off, s.memsz.max(s.filesz)))
        })?;
        if file_off >= seg.offset {
            seg.vaddr.checked_add(file_off - seg.offset)
        } else {
            seg.vaddr.checked_sub(seg.offset - file_off)
        }
    }
}

/// Header facts of an ELF file.
#[derive(Debug, Clone)]
pub struct ElfInfo {
    segments: Vec<Segment>,
    pub build_id: Option<Vec<u8>>,
    /// DWARF in the file itself.
    pub has_debug_info: bool,
    /// The file has a `.symtab` (not stripped).
    pub has_symtab: bool,
    /// A separate debug file found on this machine (by build-id or `.gnu_debuglink`) or fetched from a
    /// debuginfod server, and whether it has a `.symtab` (`objcopy --only-keep-debug` keeps it: all
    /// functions, static ones included).
    pub debug_file: Option<(PathBuf, bool)>,
}

impl ElfInfo {
    /// Reads the headers of `path` (only the parts needed: program and section headers, notes).
    /// `extra_debug_dirs` are searched after [`DEBUG_DIRS`] (e.g. the target's `/proc/PID/root/usr/lib/debug`).
    pub fn read(path: &Path, symbolic_path: &Path, extra_debug_dirs: &[PathBuf]) -> Result<Self> {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let cache = ReadCache::new(file);
        let obj = object::File::parse(&cache)
            .with_context(|| format!("parsing ELF {}", path.display()))?;
        let segments = Segment::all(&obj);
        let build_id = obj.build_id().ok().flatten().map(<[u8]>::to_vec);
        let has_debug_info = obj
            .section_by_name(".debug_info")
            .is_some_and(|s| s.size() > 0);
        let has_symtab = obj.section_by_name(".symtab").is_some_and(|s| s.size() > 0);
        let debuglink = obj
            .gnu_debuglink()
            .ok()
            .flatten()
            .and_then(|(name, _crc)| std::str::from_utf8(name).ok().map(str::to_owned));
        let mut dirs: Vec<PathBuf> = DEBUG_DIRS.iter().map(PathBuf::from).collect();
        dirs.extend(extra_debug_dirs.iter().cloned());
        let mut debug_file = find_debug_file(
            &dirs,
            build_id.as_deref(),
            debuglink.as_deref(),
            symbolic_path,
            path,
        );
        // A stripped binary without a local debug file: the debuginfod servers', when DEBUGINFOD_URLS is set.
        if let (None, Some(id), false, false) = (&debug_file, &build_id, has_symtab, has_debug_info)
        {
            let name = symbolic_path
                .file_name()
                .unwrap_or(symbolic_path.as_os_str());
            debug_file = super::debuginfod::debug_file(id, &name.to_string_lossy());
        }
        Ok(ElfInfo {
            segments,
            build_id,
            has_debug_info,
            has_symtab,
            debug_file,
        })
    }

    /// Whether `vaddr` lies in an executable segment.
    pub fn is_exec(&self, vaddr: u64) -> bool {
        self.segments.iter().any(|s| s.exec && s.holds_vaddr(vaddr))
    }

    /// ELF virtual address of the byte at `file_off` in the file, if a loadable segment holds it.
    pub fn file_offset_to_vaddr(&self, file_off: u64) -> Option<u64> {
        Segment::vaddr_of_offset(&self.segments, file_off)
    }
}

/// The same search order as blazesym's debug link resolution: build-id directories first, then the debug
/// link name in the debug directories, next to the binary, and under the debug directories mirrored. A file
/// found by name must carry the same build-id (when both have one): a debug file of another build would name
/// the wrong functions. Returns the path and whether the debug file has a `.symtab`.
fn find_debug_file(
    dirs: &[PathBuf],
    build_id: Option<&[u8]>,
    debuglink: Option<&str>,
    symbolic_path: &Path,
    open_path: &Path,
) -> Option<(PathBuf, bool)> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(id) = build_id.filter(|id| id.len() >= 8) {
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        for d in dirs {
            candidates.push(
                d.join(".build-id")
                    .join(&hex[..2])
                    .join(format!("{}.debug", &hex[2..])),
            );
        }
    }
    if let Some(link) = debuglink {
        candidates.extend(dirs.iter().map(|d| d.join(link)));
        if let Some(parent) = symbolic_path.parent() {
            candidates.push(parent.join(link));
            candidates.push(parent.join(".debug").join(link));
            let rel = parent.strip_prefix("/").unwrap_or(parent);
            candidates.extend(dirs.iter().map(|d| d.join(rel).join(link)));
        }
    }
    for p in candidates {
        if !p.is_file() || p == symbolic_path || p == open_path {
            continue;
        }
        let Ok(file) = File::open(&p) else { continue };
        let cache = ReadCache::new(file);
        let Ok(obj) = object::File::parse(&cache) else {
            continue;
        };
        let other_id = obj.build_id().ok().flatten();
        if let (Some(a), Some(b)) = (build_id, other_id) {
            if a != b {
                continue;
            }
        }
        let has_symtab = obj.section_by_name(".symtab").is_some_and(|s| s.size() > 0);
        return Some((p, has_symtab));
    }
    None
}

/// The `.eh_frame` of an ELF file, as gimli reads it.
pub type EhFrame<'d> = gimli::EhFrame<gimli::EndianSlice<'d, gimli::RunTimeEndian>>;
pub type Fde<'d> = gimli::FrameDescriptionEntry<gimli::EndianSlice<'d, gimli::RunTimeEndian>>;

/// Calls `f` with every FDE of the file's `.eh_frame` (and the section and its bases, to evaluate the FDE's
/// rules). A file without one calls nothing; a malformed FDE is skipped; a malformed entry ends the walk.
pub fn for_each_fde<'d, R: ReadRef<'d>>(
    obj: &object::File<'d, R>,
    mut f: impl FnMut(&EhFrame<'d>, &gimli::BaseAddresses, Fde<'d>),
) -> Result<()> {
    let Some(section) = obj.section_by_name(".eh_frame") else {
        return Ok(());
    };
    let data = section.data()?;
    let mut bases = gimli::BaseAddresses::default().set_eh_frame(section.address());
    if let Some(text) = obj.section_by_name(".text") {
        bases = bases.set_text(text.address());
    }
    if let Some(got) = obj.section_by_name(".got") {
        bases = bases.set_got(got.address());
    }
    if let Some(hdr) = obj.section_by_name(".eh_frame_hdr") {
        bases = bases.set_eh_frame_hdr(hdr.address());
    }
    let endian = if obj.is_little_endian() {
        gimli::RunTimeEndian::Little
    } else {
        gimli::RunTimeEndian::Big
    };
    let mut eh = EhFrame::new(data, endian);
    eh.set_address_size(if obj.is_64() { 8 } else { 4 });

    let mut cies = HashMap::new();
    let mut entries = eh.entries(&bases);
    while let Ok(Some(entry)) = entries.next() {
        let gimli::CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let fde = partial.parse(|section, bases, offset| {
            if let Some(cie) = cies.get(&offset) {
                return Ok(Clone::clone(cie));
            }
            let cie = section.cie_from_offset(bases, offset)?;
            cies.insert(offset, cie.clone());
            Ok(cie)
        });
        if let Ok(fde) = fde {
            f(&eh, &bases, fde);
        }
    }
    Ok(())
}

/// Function ranges from `.eh_frame` (one per FDE), sorted by start address.
#[derive(Debug, Default)]
pub struct EhTable {
    starts: Vec<u64>,
    lens: Vec<u32>,
}

impl EhTable {
    /// Parses every FDE of the file's `.eh_frame`. A file without one gives an empty table; a malformed entry
    /// ends the parse with what was read so far.
    pub fn read(path: &Path) -> Result<Self> {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let cache = ReadCache::new(file);
        let obj = object::File::parse(&cache)
            .with_context(|| format!("parsing ELF {}", path.display()))?;
        let mut fdes: Vec<(u64, u64)> = Vec::new();
        for_each_fde(&obj, |_, _, fde| {
            fdes.push((fde.initial_address(), fde.len()));
        })
        .with_context(|| format!("reading .eh_frame of {}", path.display()))?;
        Ok(Self::from_fdes(fdes))
    }

    /// The table of FDEs given as (initial address, length). Empty ones are left out, and so are those that
    /// end past 2^64: no code is there, and a wrapped end would hold every address, or none.
    fn from_fdes(fdes: impl IntoIterator<Item = (u64, u64)>) -> Self {
        let mut ranges: Vec<(u64, u32)> = fdes
            .into_iter()
            .filter(|&(_, len)| len > 0)
            .map(|(start, len)| (start, u32::try_from(len).unwrap_or(u32::MAX)))
            .filter(|&(start, len)| start.checked_add(u64::from(len)).is_some())
            .collect();
        ranges.sort_unstable();
        ranges.dedup_by_key(|r| r.0);
        EhTable {
            starts: ranges.iter().map(|r| r.0).collect(),
            lens: ranges.iter().map(|r| r.1).collect(),
        }
    }

    /// The `[start, end)` of the function (FDE) that holds `vaddr`.
    pub fn find(&self, vaddr: u64) -> Option<(u64, u64)> {
        self.last_at_or_before(vaddr)
            .filter(|&(_, end)| vaddr < end)
    }

    /// The `[start, end)` of the last function (FDE) starting at or before `vaddr`, whether it holds `vaddr`
    /// or not.
    pub fn last_at_or_before(&self, vaddr: u64) -> Option<(u64, u64)> {
        let i = self
            .starts
            .partition_point(|&s| s <= vaddr)
            .checked_sub(1)?;
        Some((self.starts[i], self.starts[i] + u64::from(self.lens[i])))
    }
}

#[cfg(test)]
impl EhTable {
    pub fn starts_for_tests(&self) -> &[u64] {
        &self.starts
    }

    pub fn len(&self) -> usize {
        self.starts.len()
    }

    pub fn ranges_for_tests(&self) -> Vec<(u64, u64)> {
        self.starts
            .iter()
            .zip(&self.lens)
            .map(|(&s, &l)| (s, s + u64::from(l)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(offset: u64, filesz: u64, vaddr: u64, memsz: u64) -> Segment {
        Segment {
            offset,
            filesz,
            vaddr,
            memsz,
            exec: true,
            writable: false,
        }
    }

    #[test]
    fn a_segment_whose_file_range_ends_past_2_64_still_maps_its_bytes() {
        let s = [segment(u64::MAX - 0xfff, 0x2000, 0x1000, 0x2000)];
        assert_eq!(Segment::vaddr_of_offset(&s, u64::MAX - 0x10), Some(0x1fef));
        assert_eq!(Segment::vaddr_of_offset(&s, u64::MAX - 0xfff), Some(0x1000));
        assert_eq!(Segment::vaddr_of_offset(&s, 0x10), None);
    }

    #[test]
    fn virtual_addresses_past_2_64_or_below_0_are_none() {
        let high = [segment(0, 0x2000, u64::MAX - 0xff, 0x2000)];
        assert_eq!(Segment::vaddr_of_offset(&high, 0xff), Some(u64::MAX));
        assert_eq!(Segment::vaddr_of_offset(&high, 0x1000), None);
        // The page before a segment that starts at a low address.
        let low = [segment(0x1800, 0x100, 0x100, 0x100)];
        assert_eq!(Segment::vaddr_of_offset(&low, 0x1700), Some(0));
        assert_eq!(Segment::vaddr_of_offset(&low, 0x1000), None);
        // The zero-filled tail, up to the memory size.
        let bss = [segment(0, 0x10, 0x1000, u64::MAX)];
        assert_eq!(Segment::vaddr_of_offset(&bss, 0x20), Some(0x1020));
        assert_eq!(Segment::vaddr_of_offset(&bss, u64::MAX), None);
    }

    #[test]
    fn an_fde_that_ends_past_2_64_is_left_out() {
        let t = EhTable::from_fdes([
            (0x1000, 0x100),
            (u64::MAX - 0xf, 0x100),
            (0x2000, 0),
            (0x3000, 1 << 40),
        ]);
        assert_eq!(
            t.ranges_for_tests(),
            [(0x1000, 0x1100), (0x3000, 0x3000 + u64::from(u32::MAX))]
        );
        assert_eq!(t.find(u64::MAX - 1), None);
        assert_eq!(t.find(0x10ff), Some((0x1000, 0x1100)));
        assert_eq!(
            t.last_at_or_before(u64::MAX),
            Some((0x3000, 0x3000 + u64::from(u32::MAX)))
        );
    }
}
