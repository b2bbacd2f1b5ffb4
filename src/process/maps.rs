//! The memory map of a traced process (`/proc/PID/maps`) and the files behind it: the one model of it, which
//! the stack and data symbolizers, the unwind tables and the allocator probes read. What a mapping is named,
//! and which mappings count as a binary's, is left to them.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Result;

/// How long to wait before reading `/proc/PID/maps` again for addresses in no known mapping.
const REFRESH_INTERVAL: Duration = Duration::from_millis(200);

/// One line of `/proc/PID/maps`.
#[derive(Debug, Clone)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// File offset of `start`.
    pub offset: u64,
    /// `x` in the permissions.
    pub exec: bool,
    pub inode: u64,
    pub kind: MapKind,
}

impl Mapping {
    /// The file offset of the byte at `addr`; `None` outside the mapping, or past the largest offset.
    pub fn file_offset(&self, addr: u64) -> Option<u64> {
        if addr < self.start || addr >= self.end {
            return None;
        }
        (addr - self.start).checked_add(self.offset)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MapKind {
    /// A mapped file: index into [`ProcMaps::file`]. Also what the kernel shows as a path without being a
    /// regular file (`/dev/zero (deleted)` for shared anonymous memory, paths with inode 0).
    File(usize),
    /// Anonymous without name.
    Anon,
    /// `[vdso]`.
    Vdso,
    /// Other names given by the kernel: `[heap]`, `[stack]`, `[vvar]`, `[anon:name]`, …
    Named(String),
}

/// A file mapped by the process.
#[derive(Debug, Clone)]
pub struct MappedFile {
    /// Path as in the maps (without ` (deleted)`).
    pub symbolic: PathBuf,
    /// Path through which it is read (see [`open_path`]).
    pub open_path: PathBuf,
    /// Inode, as in the maps.
    pub inode: u64,
    /// File name: the prefix of `file+0x…` names.
    pub basename: String,
}

/// The mappings of one process, sorted by address, and the files they map.
#[derive(Clone)]
pub struct ProcMaps {
    pid: u32,
    maps: Vec<Mapping>,
    /// Every file seen since the first read: indices stay valid across re-reads, so that what a symbolizer
    /// loaded for a file (indexed like this) stays loaded.
    files: Vec<MappedFile>,
    /// (device, inode, path) → index into `files`.
    file_index: HashMap<(String, u64, PathBuf), usize>,
    read_at: Instant,
    /// For fixed maps ([`ProcMaps::fixed`]): where each path is read from.
    core_paths: Option<HashMap<PathBuf, PathBuf>>,
}

impl ProcMaps {
    fn empty(pid: u32) -> Self {
        ProcMaps {
            pid,
            maps: Vec::new(),
            files: Vec::new(),
            file_index: HashMap::new(),
            read_at: Instant::now(),
            core_paths: None,
        }
    }

    /// Reads `/proc/PID/maps` (an error if that fails: no such process, no permission).
    pub fn read(pid: u32) -> Result<Self> {
        let mut maps = ProcMaps::empty(pid);
        maps.reread()?;
        Ok(maps)
    }

    /// Reads the maps again (libraries loaded or unloaded since). On error (the process is gone) the old
    /// mappings are kept.
    pub fn reread(&mut self) -> Result<()> {
        if self.core_paths.is_some() {
            return Ok(());
        }
        let text = std::fs::read_to_string(format!("/proc/{}/maps", self.pid))?;
        self.set_text(&text);
        Ok(())
    }

    /// The mappings of `text` (as `/proc/PID/maps` writes it) replace the current ones.
    fn set_text(&mut self, text: &str) {
        let mut maps: Vec<Mapping> = text.lines().filter_map(|l| self.parse_line(l)).collect();
        maps.sort_by_key(|m| m.start);
        self.maps = maps;
        self.read_at = Instant::now();
    }

    /// The maps of process `pid` as `text` gives them, without reading `/proc`.
    #[cfg(test)]
    pub(crate) fn from_text(pid: u32, text: &str) -> Self {
        let mut maps = ProcMaps::empty(pid);
        maps.set_text(text);
        maps
    }

    /// Maps that are not read from `/proc` (a core file's, the modules of a crash report placed where they
    /// were loaded): `text` as `/proc/PID/maps` would show them, each file opened at the path `open_paths`
    /// gives (else at its own); never re-read.
    pub fn fixed(text: &str, open_paths: HashMap<PathBuf, PathBuf>) -> Self {
        let mut maps = ProcMaps::empty(0);
        maps.core_paths = Some(open_paths);
        maps.set_text(text);
        maps
    }

    /// Whether the maps were read long enough ago to read them again for an address in no known mapping (a
    /// library loaded since), without reading them for every such address.
    pub fn is_stale(&self) -> bool {
        self.core_paths.is_none() && self.read_at.elapsed() >= REFRESH_INTERVAL
    }

    /// Sorted by start address.
    pub fn maps(&self) -> &[Mapping] {
        &self.maps
    }

    /// Index into [`Self::maps`] of the mapping holding `addr`.
    pub fn find(&self, addr: u64) -> Option<usize> {
        let i = self
            .maps
            .partition_point(|m| m.start <= addr)
            .checked_sub(1)?;
        (addr < self.maps[i].end).then_some(i)
    }

    /// The kernel's name of mapping `m`: its path, `[heap]`, `[vdso]`, …, or `[anon]`.
    pub fn label<'a>(&'a self, m: &'a Mapping) -> Cow<'a, str> {
        match &m.kind {
            MapKind::File(i) => self.files[*i].symbolic.to_string_lossy(),
            MapKind::Anon => "[anon]".into(),
            MapKind::Vdso => "[vdso]".into(),
            MapKind::Named(name) => name.as_str().into(),
        }
    }

    /// The files mapped now, each once, in the order of their first mapping's address.
    pub fn files_in_address_order(&self) -> Vec<&MappedFile> {
        let mut seen = vec![false; self.files.len()];
        let mut files = Vec::new();
        for m in &self.maps {
            if let MapKind::File(i) = m.kind {
                if !std::mem::replace(&mut seen[i], true) {
                    files.push(&self.files[i]);
                }
            }
        }
        files
    }

    pub fn file(&self, i: usize) -> &MappedFile {
        &self.files[i]
    }

    /// How many files have been seen: per-file state indexed like [`MapKind::File`] needs this many entries.
    pub fn file_count(&self) -> usize {
        self.files.len()
    }

    fn parse_line(&mut self, line: &str) -> Option<Mapping> {
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
        let exec = field().contains('x');
        let offset = field();
        let dev = field().to_owned();
        let inode: u64 = field().parse().ok()?;
        let path = rest.trim_start();
        let (start, end) = range.split_once('-')?;
        let start = u64::from_str_radix(start, 16).ok()?;
        let end = u64::from_str_radix(end, 16).ok()?;
        let offset = u64::from_str_radix(offset, 16).ok()?;
        // Every user of a mapping takes `end - start` and `addr - start + offset` as sizes and offsets.
        if start > end {
            return None;
        }
        let kind = if path.is_empty() {
            MapKind::Anon
        } else if path == "[vdso]" {
            MapKind::Vdso
        } else if path.starts_with('[') {
            MapKind::Named(path.to_owned())
        } else {
            let symbolic = PathBuf::from(path.strip_suffix(" (deleted)").unwrap_or(path));
            let key = (dev, inode, symbolic.clone());
            let i = match self.file_index.get(&key) {
                Some(&i) => i,
                None => {
                    let open_path = match &self.core_paths {
                        Some(paths) => paths.get(&symbolic).unwrap_or(&symbolic).clone(),
                        None => open_path(self.pid, &symbolic, inode, start, end),
                    };
                    let basename = symbolic
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_else(|| symbolic.to_string_lossy().into_owned());
                    self.files.push(MappedFile {
                        symbolic,
                        open_path,
                        inode,
                        basename,
                    });
                    self.file_index.insert(key, self.files.len() - 1);
                    self.files.len() - 1
                }
            };
            MapKind::File(i)
        };
        Some(Mapping {
            start,
            end,
            offset,
            exec,
            inode,
            kind,
        })
    }
}

/// The file as the process sees it (`/proc/PID/root/...`: other mount namespaces, and debug links next to it
/// resolve), or the mapping itself (`/proc/PID/map_files/...`: deleted or replaced files), or the path as is.
fn open_path(pid: u32, symbolic: &Path, inode: u64, start: u64, end: u64) -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    let rooted = Path::new(&format!("/proc/{pid}/root"))
        .join(symbolic.strip_prefix("/").unwrap_or(symbolic));
    if std::fs::metadata(&rooted)
        .map(|m| m.ino() == inode)
        .unwrap_or(false)
    {
        return rooted;
    }
    let mapped = PathBuf::from(format!("/proc/{pid}/map_files/{start:x}-{end:x}"));
    if mapped.exists() {
        return mapped;
    }
    symbolic.to_path_buf()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pid with no process: paths are opened as the maps name them.
    const NO_PID: u32 = u32::MAX;

    #[test]
    fn a_mapping_that_ends_before_it_starts_is_skipped() {
        let maps = ProcMaps::from_text(
            NO_PID,
            "7f0000002000-7f0000001000 r-xp 00000000 08:01 42 /lib/a.so\n\
             7f0000003000-7f0000004000 r-xp 00001000 08:01 42 /lib/a.so\n",
        );
        let starts: Vec<u64> = maps.maps().iter().map(|m| m.start).collect();
        assert_eq!(starts, [0x7f0000003000]);
        assert_eq!(maps.find(0x7f0000001800), None);
    }

    #[test]
    fn file_offsets_past_the_largest_are_none() {
        let maps = ProcMaps::from_text(
            NO_PID,
            "1000-3000 r-xp fffffffffffff000 08:01 42 /lib/a.so\n",
        );
        let m = &maps.maps()[0];
        assert_eq!(m.file_offset(0x1000), Some(0xffff_ffff_ffff_f000));
        assert_eq!(m.file_offset(0x1fff), Some(u64::MAX));
        assert_eq!(m.file_offset(0x2000), None);
        assert_eq!(m.file_offset(0x3000), None);
        assert_eq!(m.file_offset(0xfff), None);
    }
}
