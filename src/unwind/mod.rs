//! User-stack unwinding tables for the BPF unwinder (src/bpf/unwind.h): every executable file mapping of the
//! traced process gets its `.eh_frame` compiled into rows ([`table`]), once per file (by device and inode),
//! all rows in one array and a sorted list of mappings pointing into it; only the rows are kept.

pub mod replay;
pub mod table;

use std::{cell::RefCell, collections::HashMap, path::PathBuf};

use anyhow::{Context, Result};

use table::Table;

use crate::{
    process::maps::{MapKind, ProcMaps},
    symbolize::elf::Segment,
};

/// `struct unwind_row` of src/bpf/unwind.h.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct BpfRow {
    pub pc: u32,
    pub cfa_offset: i32,
    pub fp_offset: i16,
    pub kind: u8,
    pub _pad: u8,
}

/// `struct unwind_mapping` of src/bpf/unwind.h.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct BpfMapping {
    pub start: u64,
    pub end: u64,
    pub bias: u64,
    pub row_start: u32,
    pub row_count: u32,
    pub first_page: u64,
    pub page_start: u32,
    pub page_count: u32,
}

/// Where a file's rows and page index are in the process-wide arrays, and its segments (to place its
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

/// The tables of one process, ready to load (cloned for each of several collectors that trace at once).
#[derive(Clone, Default)]
pub struct ProcessTables {
    pub rows: Vec<BpfRow>,
    /// Per file, for each 4 KiB page of its code and one more: the row (relative to the file's first) in force
    /// at the page's first byte.
    pub pages: Vec<u32>,
    /// Sorted by start. The BPF side holds the first `MAX_UNWIND_MAPPINGS` (src/bpf/unwind.h); the others are
    /// unwound with frame pointers.
    pub mappings: Vec<BpfMapping>,
    /// What could not be given a table, for stderr.
    pub warnings: Vec<String>,
    /// Each file's rows, by [`CodeMapping::file`].
    files: HashMap<u64, FileRows>,
    /// The process's memory map, when the tables are of a live process.
    maps: Option<ProcMaps>,
}

impl ProcessTables {
    /// The tables for a collector's `CollectOptions::unwind`: none when stacks are walked by frame pointers
    /// (asked for, or not x86_64); what the tables lack is said on stderr.
    pub fn for_tracing(pid: u32, frame_pointers: bool) -> Result<Option<RefCell<Self>>> {
        if frame_pointers || !cfg!(target_arch = "x86_64") {
            return Ok(None);
        }
        let tables = Self::load(pid).context("reading the unwind tables of the process")?;
        for w in &tables.warnings {
            say!("myprobe: warning: {w}");
        }
        Ok(Some(RefCell::new(tables)))
    }

    /// Reads the executable mappings of `pid` and compiles the tables of their files.
    pub fn load(pid: u32) -> Result<Self> {
        let maps = ProcMaps::read(pid).with_context(|| format!("reading /proc/{pid}/maps"))?;
        let mut t = ProcessTables {
            maps: Some(maps),
            ..ProcessTables::default()
        };
        t.add_process_mappings();
        Ok(t)
    }

    /// Adds the executable mappings that appeared since the last call (a plugin loaded with dlopen); returns
    /// whether anything changed.
    pub fn update(&mut self) -> Result<bool> {
        let Some(maps) = &mut self.maps else {
            return Ok(false);
        };
        maps.reread()?;
        Ok(self.add_process_mappings())
    }

    fn add_process_mappings(&mut self) -> bool {
        let Some(maps) = &self.maps else { return false };
        let code: Vec<CodeMapping> = maps
            .maps()
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
            .collect();
        let mut changed = false;
        for m in code {
            changed |= self.add_mapping(&m);
        }
        changed
    }

    /// Adds one executable mapping, compiling its file's table the first time; returns whether it was new.
    /// Keeps the mappings sorted.
    pub fn add_mapping(&mut self, m: &CodeMapping) -> bool {
        if self
            .mappings
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
            let rows = self.add_rows(table);
            self.files.insert(m.file, rows);
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
        let at = self.mappings.partition_point(|b| b.start < m.start);
        self.mappings.insert(at, mapping);
        true
    }

    /// Appends a file's rows and their page index; a table whose addresses do not fit the rows' 32 bits gets
    /// none (frame pointers).
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
        let (first_page, last_page) = (first.pc >> 12, last.pc >> 12);
        let page_start = self.pages.len() as u32;
        let mut row = 0usize;
        for page in first_page..=last_page + 1 {
            let base = page << 12;
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
