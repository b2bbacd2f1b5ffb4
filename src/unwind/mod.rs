//! User-stack unwinding tables for the BPF unwinder (src/bpf/unwind.h): every executable file mapping of a
//! process gets its `.eh_frame` compiled into rows ([`table`]), once per file, all rows in one array (an
//! [`Arena`], which several processes may share) and a sorted list of mappings pointing into it ([`Mappings`]);
//! only the rows are kept.

pub mod replay;
pub mod table;

pub mod abi;

use std::{collections::HashMap, path::PathBuf};

use anyhow::{Context, Result};

use table::Table;

use crate::{
    process::maps::{MapKind, ProcMaps},
    symbolize::elf::Segment,
};

/// `struct unwind_row` of src/bpf/unwind.h.
pub type BpfRow = abi::unwind_row;

/// `struct unwind_mapping` of src/bpf/unwind.h.
pub type BpfMapping = abi::unwind_mapping;

/// unwind.h's pages of the page index: an address's page is `address >> PAGE_SHIFT`.
const PAGE_SHIFT: u32 = abi::unwind_limits::UNWIND_PAGE_SHIFT.0;

/// Where a file's rows and page index are in the arrays of an [`Arena`], and its segments (to place its
/// other mappings).
#[derive(Clone, Default)]
struct FileRows {
    row_start: u32,
    row_count: u32,
    first_page: u64,
    page_start: u32,
    page_count: u32,
    segments: Vec<Segment>,
}

/// An executable file mapping of a process: what the tables are built from.
#[derive(Clone, Debug)]
pub struct CodeMapping {
    /// Process addresses [start, end).
    pub start: u64,
    pub end: u64,
    /// File offset of `start`.
    pub offset: u64,
    /// Names the file: mappings with the same `file` share one table.
    pub file: u64,
    /// Where the file is read from.
    pub path: PathBuf,
    /// How the process names it, for warnings.
    pub label: String,
}

/// The rows of every file compiled so far and their page index, as the BPF unwinder's arrays hold them: a
/// file's rows are there once, however many mappings and processes map it, and files whose tables are the same
/// (one library in two containers) share them.
#[derive(Clone, Default)]
pub struct Arena {
    pub rows: Vec<BpfRow>,
    /// Per file, for each 4 KiB page of its code and one more: the row (relative to the file's first) in force
    /// at the page's first byte.
    pub pages: Vec<u32>,
    /// Each table's place, by a hash of its rows and segments.
    by_content: HashMap<u64, FileRows>,
}

impl Arena {
    /// The place of a file's table, appended unless the same table is here already; a table whose addresses do
    /// not fit the rows' 32 bits gets none (frame pointers).
    fn add(&mut self, table: Table) -> FileRows {
        let key = content_key(&table);
        self.add_keyed(key, table)
    }

    fn add_keyed(&mut self, key: u64, table: Table) -> FileRows {
        if let Some(f) = self.by_content.get(&key) {
            return f.clone();
        }
        let rows = self.add_rows(table);
        self.by_content.insert(key, rows.clone());
        rows
    }

    fn add_rows(&mut self, table: Table) -> FileRows {
        let (Some(first), Some(last)) = (table.rows.first(), table.rows.last()) else {
            return FileRows {
                segments: table.segments,
                ..FileRows::default()
            };
        };
        if last.pc > u64::from(u32::MAX) {
            return FileRows {
                segments: table.segments,
                ..FileRows::default()
            };
        }
        let row_start = self.rows.len() as u32;
        self.rows.extend(table.rows.iter().map(|r| BpfRow {
            pc: r.pc as u32,
            cfa_offset: r.cfa_offset,
            fp_offset: r.fp_offset,
            kind: r.kind as u8,
            _pad: 0,
        }));
        let (first_page, last_page) = (first.pc >> PAGE_SHIFT, last.pc >> PAGE_SHIFT);
        let page_start = self.pages.len() as u32;
        let mut row = 0usize;
        for page in first_page..=last_page + 1 {
            let base = page << PAGE_SHIFT;
            while row + 1 < table.rows.len() && table.rows[row + 1].pc <= base {
                row += 1;
            }
            self.pages.push(row as u32);
        }
        FileRows {
            row_start,
            row_count: table.rows.len() as u32,
            first_page,
            page_start,
            page_count: (last_page - first_page + 1) as u32,
            segments: table.segments,
        }
    }
}

/// What tells two tables apart: their rows and segments.
fn content_key(table: &Table) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    table.rows.len().hash(&mut h);
    for r in &table.rows {
        (r.pc, r.kind as u8, r.cfa_offset, r.fp_offset).hash(&mut h);
    }
    for s in &table.segments {
        (s.offset, s.filesz, s.vaddr, s.memsz, s.exec, s.writable).hash(&mut h);
    }
    h.finish()
}

/// One process's executable mappings, each pointing at its file's rows in an [`Arena`].
#[derive(Clone, Default)]
pub struct Mappings {
    /// Sorted by start. The BPF side holds the first `MAX_UNWIND_MAPPINGS` (src/bpf/unwind.h); the others are
    /// unwound with frame pointers.
    pub list: Vec<BpfMapping>,
    /// What could not be given a table, for stderr.
    pub warnings: Vec<String>,
    /// Each file's rows, by [`CodeMapping::file`].
    files: HashMap<u64, FileRows>,
    /// The process's memory map, when the tables are of a live process.
    maps: Option<ProcMaps>,
}

/// A process's executable mappings with their files' tables compiled, not yet placed in an [`Arena`]: the slow
/// part of [`Mappings::load`], which an arena shared by several threads need not wait for.
pub struct Compiled {
    maps: ProcMaps,
    code: Vec<CodeMapping>,
    /// By [`CodeMapping::file`]: the table, and what tells it apart ([`content_key`]).
    tables: HashMap<u64, (u64, Table)>,
    warnings: Vec<String>,
}

impl Compiled {
    /// Reads the executable mappings of `pid` and compiles their files' tables.
    pub fn read(pid: u32) -> Result<Self> {
        let maps = ProcMaps::read(pid).with_context(|| format!("reading /proc/{pid}/maps"))?;
        let code = code_mappings(&maps);
        let mut warnings = Vec::new();
        let mut tables = HashMap::new();
        for m in &code {
            tables.entry(m.file).or_insert_with(|| {
                let table = Table::read(&m.path).unwrap_or_else(|e| {
                    warnings.push(format!("no unwind table for {}: {e:#}", m.label));
                    Table::default()
                });
                (content_key(&table), table)
            });
        }
        Ok(Compiled {
            maps,
            code,
            tables,
            warnings,
        })
    }

    /// The rows and page index entries that placing these tables would add to `arena`.
    pub fn missing_from(&self, arena: &Arena) -> (usize, usize) {
        let new = self
            .tables
            .values()
            .filter(|(key, _)| !arena.by_content.contains_key(key))
            .filter_map(|(_, t)| Some((t.rows.first()?.pc, t.rows.last()?.pc, t.rows.len())));
        new.fold((0, 0), |(rows, pages), (first, last, n)| {
            (
                rows + n,
                pages + ((last >> 12) - (first >> 12) + 2) as usize,
            )
        })
    }

    /// The mappings, their tables placed in `arena`.
    pub fn place(self, arena: &mut Arena) -> Mappings {
        let mut m = Mappings {
            warnings: self.warnings,
            maps: Some(self.maps),
            ..Mappings::default()
        };
        for (file, (key, table)) in self.tables {
            m.files.insert(file, arena.add_keyed(key, table));
        }
        for c in &self.code {
            m.add_mapping(arena, c);
        }
        m
    }
}

/// The executable file mappings of a memory map.
fn code_mappings(maps: &ProcMaps) -> Vec<CodeMapping> {
    maps.maps()
        .iter()
        .filter(|m| m.exec)
        .filter_map(|m| {
            let MapKind::File(i) = m.kind else {
                return None;
            };
            let file = maps.file(i);
            Some(CodeMapping {
                start: m.start,
                end: m.end,
                offset: m.offset,
                file: i as u64,
                path: file.open_path.clone(),
                label: file.symbolic.display().to_string(),
            })
        })
        .collect()
}

impl Mappings {
    /// Reads the executable mappings of `pid`, compiling into `arena` the tables of files it lacks.
    pub fn load(pid: u32, arena: &mut Arena) -> Result<Self> {
        Ok(Compiled::read(pid)?.place(arena))
    }

    /// Adds the executable mappings that appeared since the last call (a plugin loaded with dlopen); returns
    /// whether anything changed.
    pub fn update(&mut self, arena: &mut Arena) -> Result<bool> {
        let Some(maps) = &mut self.maps else {
            return Ok(false);
        };
        maps.reread()?;
        Ok(self.add_process_mappings(arena))
    }

    fn add_process_mappings(&mut self, arena: &mut Arena) -> bool {
        let Some(maps) = &self.maps else { return false };
        let code = code_mappings(maps);
        let mut changed = false;
        for m in code {
            changed |= self.add_mapping(arena, &m);
        }
        changed
    }

    /// Adds one executable mapping, compiling its file's table the first time; returns whether it was new.
    /// Keeps the mappings sorted.
    pub fn add_mapping(&mut self, arena: &mut Arena, m: &CodeMapping) -> bool {
        if self
            .list
            .iter()
            .any(|b| b.start == m.start && b.end == m.end)
        {
            return false;
        }
        if !self.files.contains_key(&m.file) {
            let table = Table::read(&m.path).unwrap_or_else(|e| {
                self.warnings
                    .push(format!("no unwind table for {}: {e:#}", m.label));
                Table::default()
            });
            self.files.insert(m.file, arena.add(table));
        }
        let f = &self.files[&m.file];
        let Some(vaddr) = Segment::vaddr_of_offset(&f.segments, m.offset) else {
            return false;
        };
        let mapping = BpfMapping {
            start: m.start,
            end: m.end,
            bias: m.start.wrapping_sub(vaddr),
            row_start: f.row_start,
            row_count: f.row_count,
            first_page: f.first_page,
            page_start: f.page_start,
            page_count: f.page_count,
        };
        let at = self.list.partition_point(|b| b.start < m.start);
        self.list.insert(at, mapping);
        true
    }
}

/// The tables of one process, with rows of its own: for a core file, a crash's threads, or a test.
#[derive(Clone, Default)]
pub struct ProcessTables {
    pub arena: Arena,
    pub process: Mappings,
}

impl ProcessTables {
    /// Reads the executable mappings of `pid` and compiles the tables of their files.
    pub fn load(pid: u32) -> Result<Self> {
        let mut arena = Arena::default();
        let process = Mappings::load(pid, &mut arena)?;
        Ok(ProcessTables { arena, process })
    }

    /// Adds one executable mapping, compiling its file's table the first time; returns whether it was new.
    pub fn add_mapping(&mut self, m: &CodeMapping) -> bool {
        self.process.add_mapping(&mut self.arena, m)
    }

    /// What the unwinder reads.
    pub fn tables(&self) -> Tables<'_> {
        Tables {
            rows: &self.arena.rows,
            pages: &self.arena.pages,
            mappings: &self.process.list,
        }
    }
}

/// What the BPF unwinder reads of a process: the rows and page index of its files, and its mappings.
#[derive(Clone, Copy)]
pub struct Tables<'a> {
    pub rows: &'a [BpfRow],
    pub pages: &'a [u32],
    pub mappings: &'a [BpfMapping],
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_whose_code_is_in_an_arena_adds_nothing_to_it() {
        let pid = std::process::id();
        let compiled = Compiled::read(pid).unwrap();
        let mut arena = Arena::default();
        let (rows, pages) = compiled.missing_from(&arena);
        let first = compiled.place(&mut arena);
        assert!(rows > 0 && rows == arena.rows.len() && pages == arena.pages.len());
        // The same process again, as a second server of the same code would be: its rows are those placed.
        let again = Compiled::read(pid).unwrap();
        assert_eq!(again.missing_from(&arena), (0, 0));
        let second = again.place(&mut arena);
        assert_eq!(arena.rows.len(), rows);
        let places = |m: &Mappings| -> Vec<(u64, u32, u32)> {
            m.list
                .iter()
                .map(|b| (b.start, b.row_start, b.page_start))
                .collect()
        };
        assert_eq!(places(&first), places(&second));
    }
}
