//! Finding probe points in a server binary by *demangled* name, so that one build's mangling (or a
//! signature that changed between versions) never breaks a probe: `dispatch_command(` matches
//! `_Z16dispatch_command19enum_server_commandP3THDPcjb` (MariaDB) and
//! `_Z16dispatch_commandP3THDPK8COM_DATA19enum_server_command` (MySQL) alike.

use std::path::Path;

use anyhow::{Context, Result};
use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Function {
    /// The name in the symbol table, as the uprobe attach takes it.
    pub mangled: String,
    /// `dispatch_command(enum_server_command, THD*, char*, unsigned int, bool)`
    pub demangled: String,
}

/// The first function of `binary` whose demangled name starts with `prefix` (e.g. `dispatch_command(`),
/// from `.symtab` or `.dynsym`; `None` if the binary has no such symbol (stripped, or another version).
pub fn find_function(binary: &Path, prefix: &str) -> Result<Option<Function>> {
    let data = std::fs::read(binary).with_context(|| format!("reading {}", binary.display()))?;
    let file = object::File::parse(&*data)
        .with_context(|| format!("{} is not an ELF file", binary.display()))?;
    // The plain identifier appears in the mangled name (as `16dispatch_command`), which avoids demangling
    // tens of thousands of symbols.
    let ident = prefix
        .trim_end_matches('(')
        .rsplit("::")
        .next()
        .unwrap_or(prefix);
    let candidates = file.symbols().chain(file.dynamic_symbols());
    for sym in candidates {
        if sym.kind() != SymbolKind::Text || sym.address() == 0 {
            continue;
        }
        let Ok(name) = sym.name() else { continue };
        if !name.contains(ident) {
            continue;
        }
        let demangled = demangle(name);
        if demangled.starts_with(prefix) {
            return Ok(Some(Function {
                mangled: name.to_string(),
                demangled,
            }));
        }
    }
    Ok(None)
}

/// Where to put a uprobe on a function's entry: `file_offset` (as the uprobe attach takes it) of the
/// function's address plus `skip`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryProbe {
    /// The function's address in the file; functions that are aliases of one another share it.
    pub address: u64,
    pub file_offset: u64,
    pub skip: u64,
}

impl EntryProbe {
    /// The file offset to attach to.
    pub fn offset(&self) -> usize {
        (self.file_offset + self.skip) as usize
    }
}

/// The entry probes of the C functions `names` in `binary` (`None` for a name it does not define).
///
/// A uprobe on an instruction the kernel cannot emulate (e.g. glibc's `free` starts with `test %rdi,%rdi`)
/// executes that instruction out of line with a single-step trap: 14 µs a call on the VMs measured, against
/// 0.4 µs for an emulated `push` or jump. So the probe goes on the first instruction the kernel emulates,
/// past instructions that only set flags (`test`, `cmp`, `endbr64`): the registers, and the stack pointer
/// that a return probe hijacks, are still those of the entry, and every call passes there.
pub fn entry_probes(binary: &Path, names: &[&str]) -> Result<Vec<Option<EntryProbe>>> {
    let data = std::fs::read(binary).with_context(|| format!("reading {}", binary.display()))?;
    let file = object::File::parse(&*data)
        .with_context(|| format!("{} is not an ELF file", binary.display()))?;
    let find = |name: &str| {
        let sym = file
            .dynamic_symbols()
            .chain(file.symbols())
            .find(|s| s.kind() == SymbolKind::Text && s.address() != 0 && s.name() == Ok(name))?;
        let address = sym.address();
        let section = file.section_by_index(sym.section_index()?).ok()?;
        let (section_offset, _) = section.file_range()?;
        // A symbol before its section, or a file offset past 2^64: no place in the file to probe.
        let within = address.checked_sub(section.address())?;
        let file_offset = section_offset.checked_add(within)?;
        let code = section
            .data_range(address, 64)
            .ok()
            .flatten()
            .or_else(|| section.data().ok()?.get(usize::try_from(within).ok()?..))?;
        let skip = emulated_entry(code, address);
        // EntryProbe::offset adds them.
        file_offset.checked_add(skip)?;
        Some(EntryProbe {
            address,
            file_offset,
            skip,
        })
    };
    Ok(names.iter().map(|name| find(name)).collect())
}

/// The offset, from `code`'s start, of the first instruction the kernel's x86 uprobes emulate (push of a
/// register, near jump, conditional jump, call, nop) when only flag-setting instructions come before it;
/// else 0.
#[cfg(target_arch = "x86_64")]
fn emulated_entry(code: &[u8], address: u64) -> u64 {
    use iced_x86::{
        Decoder, DecoderOptions, FlowControl, InstructionInfoFactory, Mnemonic, OpAccess, OpKind,
    };
    let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
    let mut info = InstructionInfoFactory::new();
    for _ in 0..4 {
        if !decoder.can_decode() {
            break;
        }
        let insn = decoder.decode();
        if insn.is_invalid() {
            break;
        }
        let emulated = match insn.mnemonic() {
            Mnemonic::Push => insn.op0_kind() == OpKind::Register && insn.op0_register().is_gpr64(),
            Mnemonic::Nop => true,
            Mnemonic::Jmp | Mnemonic::Call => insn.op0_kind() == OpKind::NearBranch64,
            _ => insn.is_jcc_short_or_near(),
        };
        if emulated {
            return insn.ip() - address;
        }
        let used = info.info(&insn);
        let writes = |access: OpAccess| {
            !matches!(
                access,
                OpAccess::Read | OpAccess::CondRead | OpAccess::NoMemAccess | OpAccess::None
            )
        };
        let flags_only = insn.flow_control() == FlowControl::Next
            && !used.used_registers().iter().any(|r| writes(r.access()))
            && !used.used_memory().iter().any(|m| writes(m.access()));
        if !flags_only {
            break;
        }
    }
    0
}

#[cfg(not(target_arch = "x86_64"))]
fn emulated_entry(_code: &[u8], _address: u64) -> u64 {
    0
}

/// Demangled as the symbolizer's names are: blazesym (its `demangle` feature) makes this very call, with the
/// same crate and default options, so a probe's name and a frame's name of one function are the same text.
/// blazesym has no public demangling function to call instead.
fn demangle(name: &str) -> String {
    cpp_demangle::Symbol::new(name)
        .ok()
        .and_then(|s| s.demangle().ok())
        .unwrap_or_else(|| name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_functions_by_demangled_name() {
        // The test binary itself: a Rust function is not C++, so look for a libc-style C symbol instead.
        let exe = std::env::current_exe().unwrap();
        let f = find_function(&exe, "main")
            .unwrap()
            .expect("the test binary has a main");
        assert_eq!(f.mangled, "main");
        assert!(find_function(&exe, "no_such_function_anywhere(")
            .unwrap()
            .is_none());
        assert!(find_function(Path::new("/nonexistent"), "x").is_err());
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn entry_probes_skip_to_an_emulated_instruction() {
        // Debian glibc 2.41's entries.
        let malloc = [0x41, 0x54, 0x55, 0x53, 0x48, 0x89, 0xfb]; // push %r12
        let free = [0x48, 0x85, 0xff, 0x0f, 0x84, 0xbf, 0, 0, 0, 0x55]; // test %rdi,%rdi; je
        let memalign = [0x80, 0x3d, 0x71, 0x0e, 0x14, 0, 0, 0x74, 0x07]; // cmpb $0,x(%rip); je
        let posix_memalign = [0x80, 0x3d, 0x01, 0x02, 0x14, 0, 0, 0x41, 0x54]; // cmpb; push %r12
        assert_eq!(emulated_entry(&malloc, 0x1000), 0);
        assert_eq!(emulated_entry(&free, 0x1000), 3);
        assert_eq!(emulated_entry(&memalign, 0x1000), 7);
        assert_eq!(emulated_entry(&posix_memalign, 0x1000), 7);
        let cet = [0xf3, 0x0f, 0x1e, 0xfa, 0x55]; // endbr64; push %rbp
        assert_eq!(emulated_entry(&cet, 0x1000), 4);
        // Moves the argument before anything emulated: stay at the entry.
        let moves = [0x48, 0x89, 0xfb, 0x55]; // mov %rdi,%rbx; push %rbp
        assert_eq!(emulated_entry(&moves, 0x1000), 0);
        let sub = [0x48, 0x83, 0xec, 0x18, 0x55]; // sub $0x18,%rsp: moves the stack pointer
        assert_eq!(emulated_entry(&sub, 0x1000), 0);
        assert_eq!(emulated_entry(&[], 0x1000), 0);
    }

    fn c_library() -> &'static Path {
        [
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/lib64/libc.so.6",
            "/usr/lib/libc.so.6",
        ]
        .into_iter()
        .map(Path::new)
        .find(|p| p.exists())
        .expect("a C library")
    }

    #[test]
    fn entry_probes_of_the_c_library() {
        let libc = c_library();
        let probes = entry_probes(libc, &["malloc", "free", "no_such_function_anywhere"]).unwrap();
        let (malloc, free) = (probes[0].unwrap(), probes[1].unwrap());
        assert_ne!(malloc.address, free.address);
        assert!(malloc.file_offset > 0 && malloc.skip < 16 && free.skip < 16);
        assert_eq!(probes[2], None);
    }

    #[test]
    fn symbols_outside_their_section_have_no_entry_probe() {
        let mut data = std::fs::read(c_library()).unwrap();
        let (dynsym, indexes) = {
            let file = object::File::parse(&*data).unwrap();
            let dynsym = file.section_by_name(".dynsym").unwrap();
            let index = |name: &str| {
                let sym = file.dynamic_symbols().find(|s| s.name() == Ok(name));
                sym.unwrap().index().0 as u64
            };
            let offset = dynsym.file_range().unwrap().0;
            (offset, [index("malloc"), index("calloc")])
        };
        // st_value of Elf64_Sym: before .text, and at the end of the address space.
        for (index, value) in indexes.into_iter().zip([1, u64::MAX - 16]) {
            let at = (dynsym + index * 24 + 8) as usize;
            data[at..at + 8].copy_from_slice(&value.to_le_bytes());
        }
        let copy = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(copy.path(), &data).unwrap();
        let probes = entry_probes(copy.path(), &["malloc", "calloc", "free"]).unwrap();
        assert_eq!(probes[..2], [None, None]);
        assert!(probes[2].is_some());
    }

    #[test]
    fn demangles_server_signatures() {
        assert_eq!(
            demangle("_Z16dispatch_command19enum_server_commandP3THDPcjb"),
            "dispatch_command(enum_server_command, THD*, char*, unsigned int, bool)"
        );
        assert!(
            demangle("_Z16dispatch_commandP3THDPK8COM_DATA19enum_server_command")
                .starts_with("dispatch_command(THD*")
        );
    }
}
