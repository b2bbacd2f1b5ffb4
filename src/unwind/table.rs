//! `.eh_frame` compiled into compact unwind rows: for every address range of every function, how to find the
//! caller's frame (the CFA: stack or frame pointer plus an offset), its return address (always CFA − 8 on
//! x86_64) and the caller's saved frame pointer. The BPF unwinder binary-searches these rows by address.

use std::{fs::File, path::Path};

use anyhow::{Context, Result};
use gimli::{CfaRule, RegisterRule, X86_64};
use object::read::ReadCache;

use super::abi::unwind_kind;
use crate::symbolize::elf::{for_each_fde, Segment};

/// How a row finds the CFA: `enum unwind_kind` of src/bpf/unwind.h, its values taken from the generated type
/// (`unwind_row.kind` holds them as a byte).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// No unwind information here (between functions): the unwinder falls back to frame pointers.
    Gap = unwind_kind::UNWIND_GAP.0 as u8,
    /// CFA = stack pointer + offset.
    Sp = unwind_kind::UNWIND_SP.0 as u8,
    /// CFA = frame pointer + offset.
    Fp = unwind_kind::UNWIND_FP.0 as u8,
    /// A PLT stub: CFA = sp + 8, or sp + 16 past the stub's push (the expression every linker emits).
    Plt = unwind_kind::UNWIND_PLT.0 as u8,
    /// The return address is undefined: the outermost frame of a thread (`_start`, `clone3`).
    End = unwind_kind::UNWIND_END.0 as u8,
    /// A rule the unwinder cannot follow (other DWARF expressions, registers): falls back to frame pointers.
    Unsupported = unwind_kind::UNWIND_UNSUPPORTED.0 as u8,
    /// A signal handler's return trampoline (glibc's `__restore_rt`, an FDE of a CIE with the `S`
    /// augmentation): the interrupted frame's registers are in the signal frame the kernel pushed.
    Signal = unwind_kind::UNWIND_SIGNAL.0 as u8,
}

/// One row: from `pc` (an ELF virtual address) up to the next row's `pc`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    pub pc: u64,
    pub kind: Kind,
    pub cfa_offset: i32,
    /// Where the caller's frame pointer was saved, relative to the CFA; 0 when it was not (unchanged).
    pub fp_offset: i16,
}

/// The rows of one binary, sorted by `pc`, with consecutive identical rules merged; and its loadable
/// segments, to turn process addresses into ELF virtual addresses.
#[derive(Debug, Default)]
pub struct Table {
    pub rows: Vec<Row>,
    pub segments: Vec<Segment>,
}

impl Table {
    /// Compiles the `.eh_frame` of an x86_64 ELF file. A file without one gives an empty table; a malformed
    /// entry is skipped.
    pub fn read(path: &Path) -> Result<Self> {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let cache = ReadCache::new(file);
        let obj = object::File::parse(&cache)
            .with_context(|| format!("parsing ELF {}", path.display()))?;
        let mut ctx = gimli::UnwindContext::new();
        // (start, end, row) per FDE row; FDEs are sorted afterwards and gaps between them marked.
        let mut spans: Vec<(u64, u64, Row)> = Vec::new();
        for_each_fde(&obj, |eh, bases, fde| {
            if fde.cie().is_signal_trampoline() {
                let signal = Row {
                    pc: 0,
                    kind: Kind::Signal,
                    cfa_offset: 0,
                    fp_offset: 0,
                };
                if fde.initial_address() < fde.end_address() {
                    spans.push((fde.initial_address(), fde.end_address(), signal));
                }
                return;
            }
            let Ok(mut rows) = fde.rows(eh, bases, &mut ctx) else {
                return;
            };
            while let Ok(Some(r)) = rows.next_row() {
                if r.start_address() < r.end_address() {
                    spans.push((r.start_address(), r.end_address(), compile(r)));
                }
            }
        })
        .with_context(|| format!("reading .eh_frame of {}", path.display()))?;
        spans.sort_unstable_by_key(|s| s.0);

        let mut rows: Vec<Row> = Vec::with_capacity(spans.len() + spans.len() / 4);
        let mut end = 0;
        for (start, stop, row) in spans {
            if start > end && !rows.is_empty() {
                rows.push(Row {
                    pc: end,
                    kind: Kind::Gap,
                    cfa_offset: 0,
                    fp_offset: 0,
                });
            }
            if start < end {
                continue; // overlapping FDEs: the first one wins
            }
            let same_rule = rows.last().is_some_and(|l| {
                (l.kind, l.cfa_offset, l.fp_offset) == (row.kind, row.cfa_offset, row.fp_offset)
            });
            if !same_rule {
                rows.push(Row { pc: start, ..row });
            }
            end = stop;
        }
        if !rows.is_empty() {
            rows.push(Row {
                pc: end,
                kind: Kind::Gap,
                cfa_offset: 0,
                fp_offset: 0,
            });
        }
        Ok(Table {
            rows,
            segments: Segment::all(&obj),
        })
    }
}

fn compile<R: gimli::ReaderOffset>(r: &gimli::UnwindTableRow<R>) -> Row {
    let unsupported = Row {
        pc: 0,
        kind: Kind::Unsupported,
        cfa_offset: 0,
        fp_offset: 0,
    };
    match r.register(X86_64::RA) {
        RegisterRule::Undefined => {
            return Row {
                kind: Kind::End,
                ..unsupported
            }
        }
        RegisterRule::Offset(-8) => {}
        _ => return unsupported,
    }
    let fp_offset = match r.register(X86_64::RBP) {
        RegisterRule::Offset(o) => match i16::try_from(o) {
            Ok(o) => o,
            Err(_) => return unsupported,
        },
        RegisterRule::Undefined | RegisterRule::SameValue => 0,
        _ => return unsupported,
    };
    match r.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => {
            let Ok(cfa_offset) = i32::try_from(*offset) else {
                return unsupported;
            };
            let kind = match *register {
                X86_64::RSP => Kind::Sp,
                X86_64::RBP => Kind::Fp,
                _ => return unsupported,
            };
            Row {
                pc: 0,
                kind,
                cfa_offset,
                fp_offset,
            }
        }
        // The expression linkers emit for PLT entries (rsp + 8 + ((rip & 15) >= 11 ? 8 : 0)); the only
        // expression in the binaries that matter here, told apart by its length.
        CfaRule::Expression(e) if e.length.into_u64() == 11 => Row {
            pc: 0,
            kind: Kind::Plt,
            cfa_offset: 8,
            fp_offset,
        },
        CfaRule::Expression(_) => unsupported,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use object::{Object, ObjectSection, ObjectSymbol};

    use super::*;
    use crate::symbolize::test_support::{build_dir, compile, fixture_source};

    /// Function name → (address, size).
    type Functions = HashMap<String, (u64, u64)>;

    /// tests/fixtures/unwind/table_rows.c built as a shared library: its table, and its functions' (address,
    /// size) and .plt section's range.
    fn fixture() -> (Table, Functions, (u64, u64)) {
        // Built once: the tests run in parallel.
        static SO: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
        let so = SO.get_or_init(|| {
            let so = build_dir("myprobe-table-").join("table_rows.so");
            let flags = ["cc", "-O2", "-fomit-frame-pointer", "-shared", "-fPIC"];
            let src = fixture_source("unwind/table_rows.c");
            assert!(compile(&flags, &src, &so, &[]), "compiling {src:?}");
            so
        });
        let data = std::fs::read(so).unwrap();
        let obj = object::File::parse(&*data).unwrap();
        let funcs = obj
            .symbols()
            .filter(|s| s.kind() == object::SymbolKind::Text && s.size() > 0)
            .map(|s| (s.name().unwrap().to_owned(), (s.address(), s.size())))
            .collect();
        let plt = obj.section_by_name(".plt").unwrap();
        (
            Table::read(so).unwrap(),
            funcs,
            (plt.address(), plt.address() + plt.size()),
        )
    }

    /// The row in force at `pc`.
    fn row_at(rows: &[Row], pc: u64) -> Row {
        rows[rows.partition_point(|r| r.pc <= pc) - 1]
    }

    fn rule(r: &Row) -> (Kind, i32, i16) {
        (r.kind, r.cfa_offset, r.fp_offset)
    }

    #[test]
    fn rows_are_sorted_merged_and_end_in_a_gap() {
        let (t, funcs, _) = fixture();
        assert!(t.rows.windows(2).all(|w| w[0].pc < w[1].pc), "{:?}", t.rows);
        assert!(
            t.rows.windows(2).all(|w| rule(&w[0]) != rule(&w[1])),
            "identical rules not merged: {:?}",
            t.rows
        );
        assert_eq!(t.rows.last().unwrap().kind, Kind::Gap);
        // Past each function: a gap, unless another function starts right there.
        let mut checked = 0;
        for (name, (start, size)) in &funcs {
            let end = start + size;
            if !funcs.values().any(|f| f.0 == end) && t.rows.iter().any(|r| r.pc == *start) {
                assert_eq!(row_at(&t.rows, end).kind, Kind::Gap, "after {name}");
                checked += 1;
            }
        }
        assert!(checked > 0, "no function followed by padding: {funcs:?}");
        assert!(t
            .segments
            .iter()
            .any(|s| s.exec && s.holds_vaddr(funcs["leaf"].0)));
    }

    #[test]
    fn frame_pointer_function_rows() {
        let (t, funcs, _) = fixture();
        let (f, size) = funcs["fp_func"];
        // push %rbp (1 byte), mov %rsp,%rbp (3 bytes)
        assert_eq!(rule(&row_at(&t.rows, f)), (Kind::Sp, 8, 0));
        assert_eq!(rule(&row_at(&t.rows, f + 1)), (Kind::Sp, 16, -16));
        assert_eq!(rule(&row_at(&t.rows, f + 4)), (Kind::Fp, 16, -16));
        // Its ret, after the frame pointer is popped.
        let ret = row_at(&t.rows, f + size - 1);
        assert_eq!((ret.kind, ret.cfa_offset), (Kind::Sp, 8));
    }

    #[test]
    fn leaf_without_frame_pointer_has_only_sp_rows() {
        let (t, funcs, _) = fixture();
        let (f, size) = funcs["leaf"];
        assert_eq!(rule(&row_at(&t.rows, f)), (Kind::Sp, 8, 0));
        for r in t.rows.iter().filter(|r| r.pc >= f && r.pc < f + size) {
            assert_eq!((r.kind, r.fp_offset), (Kind::Sp, 0), "{r:?}");
        }
    }

    #[test]
    fn undefined_return_address_is_the_end() {
        let (t, funcs, _) = fixture();
        let (f, size) = funcs["outermost"];
        assert_eq!(row_at(&t.rows, f + size - 1).kind, Kind::End);
    }

    #[test]
    fn plt_entries_have_the_plt_rule() {
        let (t, _, (start, end)) = fixture();
        let plt: Vec<&Row> = t
            .rows
            .iter()
            .filter(|r| r.pc >= start && r.pc < end)
            .collect();
        assert!(
            plt.iter().any(|r| r.kind == Kind::Plt && r.cfa_offset == 8),
            "no PLT rule in .plt [{start:#x}, {end:#x}): {plt:?}"
        );
    }

    #[test]
    #[ignore = "prints the size of the tables of this machine's server and libraries"]
    fn sizes() {
        for p in [
            "/usr/sbin/mariadbd",
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/lib/x86_64-linux-gnu/libstdc++.so.6",
        ] {
            let t = std::time::Instant::now();
            let table = Table::read(Path::new(p)).unwrap();
            let kinds = table.rows.iter().fold(HashMap::new(), |mut m, r| {
                *m.entry(r.kind).or_insert(0) += 1;
                m
            });
            eprintln!(
                "{p}: {} rows in {:?}: {kinds:?}",
                table.rows.len(),
                t.elapsed()
            );
        }
    }
}
