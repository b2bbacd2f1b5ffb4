//! User-stack unwinding tables for the BPF unwinder (src/bpf/unwind.h): every executable file mapping of the
//! traced process gets its `.eh_frame` compiled into rows ([`table`]), once per file (by device and inode),
//! all rows in one array and a sorted list of mappings pointing into it; only the rows are kept.

pub mod table;

use std::{collections::HashMap, path::PathBuf};

use anyhow::{Context, Result};

use table::Table;

use crate::symbolize::elf::Segment;

/// Mappings the BPF side holds (`MAX_UNWIND_MAPPINGS` in src/bpf/unwind.h).
pub const MAX_MAPPINGS: usize = 256;

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
#[derive(Default)]
struct FileRows {
    row_start: u32,
    row_count: u32,
    first_page: u64,
    page_start: u32,
    page_count: u32,
    segments: Vec<Segment>,
}

/// The tables of one process, ready to load.
#[derive(Default)]
pub struct ProcessTables {
    pub rows: Vec<BpfRow>,
    /// Per file, for each 4 KiB page of its code and one more: the row (relative to the file's first) in force
    /// at the page's first byte.
    pub pages: Vec<u32>,
    /// Sorted by start; at most [`MAX_MAPPINGS`].
    pub mappings: Vec<BpfMapping>,
    /// What could not be given a table, for stderr.
    pub warnings: Vec<String>,
    /// Each file's rows, by device and inode.
    files: HashMap<(String, u64), FileRows>,
}

impl ProcessTables {
    /// Reads the executable mappings of `pid` and compiles the tables of their files.
    pub fn load(pid: u32) -> Result<Self> {
        let mut t = ProcessTables::default();
        t.update(pid)?;
        Ok(t)
    }

    /// Adds the executable mappings that appeared since the last call (a plugin loaded with dlopen); returns
    /// whether anything changed.
    pub fn update(&mut self, pid: u32) -> Result<bool> {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).with_context(|| format!("reading /proc/{pid}/maps"))?;
        let mut changed = false;
        for line in maps.lines() {
            let mut f = line.split_whitespace();
            let (Some(range), Some(perms), Some(offset), Some(dev), Some(inode)) = (f.next(), f.next(), f.next(), f.next(), f.next()) else {
                continue;
            };
            let path = f.collect::<Vec<_>>().join(" ");
            if !perms.contains('x') || !path.starts_with('/') {
                continue;
            }
            let (Some((start, end)), Ok(offset), Ok(inode)) =
                (range.split_once('-'), u64::from_str_radix(offset, 16), inode.parse::<u64>())
            else {
                continue;
            };
            let (Ok(start), Ok(end)) = (u64::from_str_radix(start, 16), u64::from_str_radix(end, 16)) else { continue };
            if self.mappings.iter().any(|m| m.start == start && m.end == end) {
                continue;
            }
            if self.mappings.len() >= MAX_MAPPINGS {
                self.warnings.push(format!("more than {MAX_MAPPINGS} executable mappings: {path} is unwound with frame pointers"));
                break;
            }
            let key = (dev.to_string(), inode);
            if !self.files.contains_key(&key) {
                // The mapping itself: right even for deleted or replaced files and other mount namespaces.
                let file = PathBuf::from(format!("/proc/{pid}/map_files/{start:x}-{end:x}"));
                let table = Table::read(&file).unwrap_or_else(|e| {
                    self.warnings.push(format!("no unwind table for {path}: {e:#}"));
                    Table::default()
                });
                let rows = self.add_rows(table);
                self.files.insert(key.clone(), rows);
            }
            let f = &self.files[&key];
            let Some(vaddr) = Segment::vaddr_of_offset(&f.segments, offset) else { continue };
            self.mappings.push(BpfMapping {
                start,
                end,
                bias: start.wrapping_sub(vaddr),
                row_start: f.row_start,
                row_count: f.row_count,
                first_page: f.first_page,
                page_start: f.page_start,
                page_count: f.page_count,
            });
            changed = true;
        }
        self.mappings.sort_unstable_by_key(|m| m.start);
        Ok(changed)
    }

    /// Appends a file's rows and their page index; a table whose addresses do not fit the rows' 32 bits gets
    /// none (frame pointers).
    fn add_rows(&mut self, table: Table) -> FileRows {
        let (Some(first), Some(last)) = (table.rows.first(), table.rows.last()) else {
            return FileRows { segments: table.segments, ..FileRows::default() };
        };
        if last.pc > u64::from(u32::MAX) {
            return FileRows { segments: table.segments, ..FileRows::default() };
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
