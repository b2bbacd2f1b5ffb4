//! Finding probe points in a server binary by *demangled* name, so that one build's mangling (or a
//! signature that changed between versions) never breaks a probe: `dispatch_command(` matches
//! `_Z16dispatch_command19enum_server_commandP3THDPcjb` (MariaDB) and
//! `_Z16dispatch_commandP3THDPK8COM_DATA19enum_server_command` (MySQL) alike.

use std::path::Path;

use anyhow::{Context, Result};
use object::{Object, ObjectSection, ObjectSymbol, SectionKind, SymbolKind};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Function {
    /// The name in the symbol table, as the uprobe attach takes it.
    pub mangled: String,
    /// `dispatch_command(enum_server_command, THD*, char*, unsigned int, bool)`
    pub demangled: String,
    /// Where its entry probe goes, by file offset: attached so, the symbol table of a large binary is not read
    /// again (libbpf would, at each attach), and the probe is on an instruction the kernel emulates.
    pub entry: Option<EntryProbe>,
}

/// A function looked for by its demangled name.
pub enum Wanted<'a> {
    /// The name begins so (`dispatch_command(`).
    Prefix(&'a str),
    /// The name is this one, alone or with its arguments.
    Named(&'a str),
}

impl Wanted<'_> {
    /// The plain identifier, which the mangled name holds (as `16dispatch_command`): looking for it avoids
    /// demangling tens of thousands of symbols.
    fn ident(&self) -> &str {
        match *self {
            Wanted::Prefix(prefix) => {
                let name = prefix.split('(').next().unwrap_or(prefix);
                name.rsplit("::").next().unwrap_or(name)
            }
            Wanted::Named(name) => name,
        }
    }

    fn matches(&self, demangled: &str) -> bool {
        match *self {
            Wanted::Prefix(prefix) => demangled.starts_with(prefix),
            Wanted::Named(name) => demangled
                .strip_prefix(name)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('(')),
        }
    }
}

/// For each of `wanted`, the first function of `binary` it matches, in one read of the binary.
pub fn find_functions(binary: &Path, wanted: &[Wanted]) -> Result<Vec<Option<Function>>> {
    let data = std::fs::read(binary).with_context(|| format!("reading {}", binary.display()))?;
    let file = object::File::parse(&*data)
        .with_context(|| format!("{} is not an ELF file", binary.display()))?;
    let mut found: Vec<Option<Function>> = wanted.iter().map(|_| None).collect();
    let idents: Vec<&str> = wanted.iter().map(Wanted::ident).collect();
    for sym in file.symbols().chain(file.dynamic_symbols()) {
        if sym.kind() != SymbolKind::Text || sym.address() == 0 {
            continue;
        }
        let Ok(name) = sym.name() else { continue };
        for ((w, ident), slot) in wanted.iter().zip(&idents).zip(found.iter_mut()) {
            if slot.is_some() || !name.contains(ident) {
                continue;
            }
            let demangled = demangle(name);
            if w.matches(&demangled) {
                *slot = Some(Function {
                    mangled: name.to_string(),
                    demangled,
                    entry: entry_probe_at(&file, sym.address(), sym.size()),
                });
            }
        }
        if found.iter().all(Option::is_some) {
            break;
        }
    }
    Ok(found)
}

/// Where to put a uprobe on a function's entry: `file_offset` (as the uprobe attach takes it) of the
/// function's address plus `skip`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryProbe {
    /// The function's address in the file; functions that are aliases of one another share it.
    pub address: u64,
    pub file_offset: u64,
    pub skip: u64,
    /// The probe is on an instruction the kernel emulates (cheap); else it is single-stepped out of line.
    pub emulated: bool,
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
        entry_probe_at(&file, sym.address(), sym.size())
    };
    Ok(names.iter().map(|name| find(name)).collect())
}

/// The entry probe of the function of `size` bytes at ELF virtual address `address` of `file`; `None` when no
/// section of the file holds it.
pub fn entry_probe_at(file: &object::File<'_>, address: u64, size: u64) -> Option<EntryProbe> {
    let section = file.sections().find(|s| {
        s.kind() == SectionKind::Text && s.address() <= address && address - s.address() < s.size()
    })?;
    let (section_offset, _) = section.file_range()?;
    let within = address - section.address();
    let file_offset = section_offset.checked_add(within)?;
    let code = section
        .data_range(address, size)
        .ok()
        .flatten()
        .or_else(|| section.data().ok()?.get(usize::try_from(within).ok()?..))?;
    let skip = emulated_entry(code, size);
    // EntryProbe::offset adds them.
    file_offset.checked_add(skip)?;
    Some(EntryProbe {
        address,
        file_offset,
        skip,
        emulated: emulated_at(code, skip),
    })
}

/// The offset, from the function's start, of the first instruction the kernel's x86 uprobes emulate (push of
/// a register, near jump, conditional jump, call, nop) when only flag-setting instructions come before it,
/// that instruction lies within the function's `size` bytes (`code` holds them, maybe more), and no branch in
/// the function lands on it or on an instruction skipped (the probe would fire again on each such jump, one
/// call counted many times); else 0.
#[cfg(target_arch = "x86_64")]
fn emulated_entry(code: &[u8], size: u64) -> u64 {
    let code = &code[..code.len().min(usize::try_from(size).unwrap_or(usize::MAX))];
    match first_emulated(code) {
        Some(skip) if skip > 0 && !branches_into(code, skip) => skip,
        _ => 0,
    }
}

/// The offset of the first instruction of `code` uprobes emulate, if only flag-setting instructions (at most
/// three) come before it.
#[cfg(target_arch = "x86_64")]
fn first_emulated(code: &[u8]) -> Option<u64> {
    use iced_x86::{
        Decoder, DecoderOptions, FlowControl, InstructionInfoFactory, Mnemonic, OpAccess, OpKind,
    };
    let mut decoder = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
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
            return Some(insn.ip());
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
    None
}

/// Whether a direct branch (jump, conditional jump, call, loop) of `code`, decoded from its start, lands in
/// `1..=skip`; also when `code` does not decode to its end, as its branches are then unknown. Offsets are
/// from `code`'s start, so a branch that leaves the function lands far away (or wraps) and never in range.
#[cfg(target_arch = "x86_64")]
fn branches_into(code: &[u8], skip: u64) -> bool {
    use iced_x86::{Decoder, DecoderOptions, OpKind};
    let mut decoder = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
    while decoder.can_decode() {
        let insn = decoder.decode();
        if insn.is_invalid() {
            return true;
        }
        let branches = (0..insn.op_count()).any(|i| {
            matches!(
                insn.op_kind(i),
                OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64
            )
        });
        if branches && (1..=skip).contains(&insn.near_branch_target()) {
            return true;
        }
    }
    false
}

#[cfg(not(target_arch = "x86_64"))]
fn emulated_entry(_code: &[u8], _size: u64) -> u64 {
    0
}

/// Whether the instruction at `at` is one the kernel emulates (the probe's cost: 1.5 µs a call with its
/// return against 11.6 µs single-stepped, measured here).
#[cfg(target_arch = "x86_64")]
fn emulated_at(code: &[u8], at: u64) -> bool {
    code.get(at as usize..)
        .and_then(first_emulated)
        .is_some_and(|skip| skip == 0)
}

#[cfg(not(target_arch = "x86_64"))]
fn emulated_at(_code: &[u8], _at: u64) -> bool {
    false
}

/// Demangled as the symbolizer's names are: blazesym (its `demangle` feature) makes this very call, with the
/// same crate and default options, so a probe's name and a frame's name of one function are the same text.
/// blazesym has no public demangling function to call instead.
pub(crate) fn demangle(name: &str) -> String {
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
        let found = find_functions(
            &exe,
            &[
                Wanted::Prefix("main"),
                Wanted::Prefix("no_such_function_anywhere("),
            ],
        )
        .unwrap();
        let f = found[0].as_ref().expect("the test binary has a main");
        assert_eq!(f.mangled, "main");
        assert!(found[1].is_none());
        assert!(find_functions(Path::new("/nonexistent"), &[Wanted::Prefix("x")]).is_err());
    }

    #[test]
    fn a_named_function_is_the_c_name_or_the_cpp_name_with_its_arguments() {
        let named = Wanted::Named("vio_ssl_read");
        assert!(named.matches("vio_ssl_read"));
        assert!(named.matches("vio_ssl_read(Vio*, unsigned char*, unsigned long)"));
        assert!(!named.matches("vio_ssl_read_more"));
        assert_eq!(
            Wanted::Prefix("ns::dispatch_command(").ident(),
            "dispatch_command"
        );
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn entry_probes_skip_to_an_emulated_instruction() {
        let whole = |code: &[u8]| emulated_entry(code, code.len() as u64);
        // Debian glibc 2.41's entries (the functions' first bytes).
        let malloc = [0x41, 0x54, 0x55, 0x53, 0x48, 0x89, 0xfb]; // push %r12
        let free = [0x48, 0x85, 0xff, 0x0f, 0x84, 0xbf, 0, 0, 0, 0x55]; // test %rdi,%rdi; je
        let memalign = [0x80, 0x3d, 0x71, 0x0e, 0x14, 0, 0, 0x74, 0x07]; // cmpb $0,x(%rip); je
        let posix_memalign = [0x80, 0x3d, 0x01, 0x02, 0x14, 0, 0, 0x41, 0x54]; // cmpb; push %r12
        assert_eq!(whole(&malloc), 0);
        assert_eq!(whole(&free), 3);
        assert_eq!(whole(&memalign), 7);
        assert_eq!(whole(&posix_memalign), 7);
        let cet = [0xf3, 0x0f, 0x1e, 0xfa, 0x55]; // endbr64; push %rbp
        assert_eq!(whole(&cet), 4);
        // Moves the argument before anything emulated: stay at the entry.
        let moves = [0x48, 0x89, 0xfb, 0x55]; // mov %rdi,%rbx; push %rbp
        assert_eq!(whole(&moves), 0);
        let sub = [0x48, 0x83, 0xec, 0x18, 0x55]; // sub $0x18,%rsp: moves the stack pointer
        assert_eq!(whole(&sub), 0);
        assert_eq!(whole(&[]), 0);
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn entry_probes_stay_at_the_entry_when_a_branch_lands_past_it() {
        // test %rdi,%rdi; push %rbp; jne -3 (back to the push): each turn would count a call.
        let loop_to_push = [0x48, 0x85, 0xff, 0x55, 0x75, 0xfd];
        assert_eq!(emulated_entry(&loop_to_push, 6), 0);
        // endbr64; test %rdi,%rdi; push %rbp; jmp -6 (to the test, then through the push).
        let loop_to_test = [0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x85, 0xff, 0x55, 0xeb, 0xfa];
        assert_eq!(emulated_entry(&loop_to_test, 10), 0);
        // The same jump to the entry itself does not pass the probe without a call.
        let loop_to_entry = [0x48, 0x85, 0xff, 0x55, 0xeb, 0xfa];
        assert_eq!(emulated_entry(&loop_to_entry, 6), 3);
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn entry_probes_stay_within_the_symbol() {
        // endbr64; push %rbp, of a 4-byte symbol (followed by another function's bytes).
        let cet = [0xf3, 0x0f, 0x1e, 0xfa, 0x55];
        assert_eq!(emulated_entry(&cet, 5), 4);
        assert_eq!(emulated_entry(&cet, 4), 0);
        assert_eq!(emulated_entry(&cet, 0), 0);
        // test; je rel32 cut in the middle.
        let free = [0x48, 0x85, 0xff, 0x0f, 0x84, 0xbf, 0, 0, 0, 0x55];
        assert_eq!(emulated_entry(&free, 8), 0);
        assert_eq!(emulated_entry(&free, 9), 3);
    }

    /// Random functions: a few flag-setting instructions, then a body of prologue instructions, nops,
    /// branches and returns, with a symbol size that may cut it anywhere or run past it.
    #[cfg(target_arch = "x86_64")]
    mod placement {
        use iced_x86::{Code, Encoder, Instruction, Register};
        use proptest::prelude::*;

        use super::emulated_entry;

        /// Where a branch goes: an instruction's start (or the function's end), by index.
        #[derive(Clone, Copy, Debug)]
        enum Target {
            Index(usize),
            /// The first instruction after the flag-setting ones: where the probe would be moved.
            Candidate,
            /// Before the function (a loop's head elsewhere, a tail call).
            Outside(u16),
        }

        #[derive(Clone, Copy, Debug)]
        enum Op {
            Endbr64,
            TestRdi,
            CmpRdi(i8),
            Push(Register),
            MovRbpRsp,
            MovRbxRdi,
            SubRsp(i8),
            Nop,
            Nopw,
            Ret,
            Jmp8(Target),
            Jmp32(Target),
            Je8(Target),
            Jne32(Target),
            Call(Target),
        }

        impl Op {
            /// Bytes encoded: fixed per form, so that the layout is known before the targets are.
            fn len(self) -> u64 {
                match self {
                    Op::Push(Register::R12) => 2,
                    Op::Push(_) | Op::Nop | Op::Ret => 1,
                    Op::Nopw | Op::Jmp8(_) | Op::Je8(_) => 2,
                    Op::TestRdi | Op::MovRbpRsp | Op::MovRbxRdi => 3,
                    Op::Endbr64 | Op::CmpRdi(_) | Op::SubRsp(_) => 4,
                    Op::Jmp32(_) | Op::Call(_) => 5,
                    Op::Jne32(_) => 6,
                }
            }

            fn target(self) -> Option<Target> {
                match self {
                    Op::Jmp8(t) | Op::Jmp32(t) | Op::Je8(t) | Op::Jne32(t) | Op::Call(t) => Some(t),
                    _ => None,
                }
            }

            fn emulated(self) -> bool {
                !matches!(
                    self,
                    Op::Endbr64
                        | Op::TestRdi
                        | Op::CmpRdi(_)
                        | Op::MovRbpRsp
                        | Op::MovRbxRdi
                        | Op::SubRsp(_)
                        | Op::Ret
                )
            }

            fn instruction(self, target: u64) -> Instruction {
                use Register::*;
                let i = match self {
                    Op::Endbr64 => Ok(Instruction::with(Code::Endbr64)),
                    Op::TestRdi => Instruction::with2(Code::Test_rm64_r64, RDI, RDI),
                    Op::CmpRdi(v) => Instruction::with2(Code::Cmp_rm64_imm8, RDI, i32::from(v)),
                    Op::Push(r) => Instruction::with1(Code::Push_r64, r),
                    Op::MovRbpRsp => Instruction::with2(Code::Mov_rm64_r64, RBP, RSP),
                    Op::MovRbxRdi => Instruction::with2(Code::Mov_rm64_r64, RBX, RDI),
                    Op::SubRsp(v) => Instruction::with2(Code::Sub_rm64_imm8, RSP, i32::from(v)),
                    Op::Nop => Ok(Instruction::with(Code::Nopd)),
                    Op::Nopw => Ok(Instruction::with(Code::Nopw)),
                    Op::Ret => Ok(Instruction::with(Code::Retnq)),
                    Op::Jmp8(_) => Instruction::with_branch(Code::Jmp_rel8_64, target),
                    Op::Jmp32(_) => Instruction::with_branch(Code::Jmp_rel32_64, target),
                    Op::Je8(_) => Instruction::with_branch(Code::Je_rel8_64, target),
                    Op::Jne32(_) => Instruction::with_branch(Code::Jne_rel32_64, target),
                    Op::Call(_) => Instruction::with_branch(Code::Call_rel32_64, target),
                };
                i.unwrap()
            }
        }

        fn flag_op() -> impl Strategy<Value = Op> {
            prop_oneof![
                Just(Op::Endbr64),
                Just(Op::TestRdi),
                any::<i8>().prop_map(Op::CmpRdi),
            ]
        }

        fn target() -> impl Strategy<Value = Target> {
            prop_oneof![
                3 => (0usize..32).prop_map(Target::Index),
                2 => Just(Target::Candidate),
                1 => (1u16..0x1000).prop_map(Target::Outside),
            ]
        }

        fn op() -> impl Strategy<Value = Op> {
            let push = prop_oneof![
                Just(Register::RBP),
                Just(Register::RBX),
                Just(Register::R12)
            ];
            prop_oneof![
                flag_op(),
                push.prop_map(Op::Push),
                Just(Op::MovRbpRsp),
                Just(Op::MovRbxRdi),
                any::<i8>().prop_map(Op::SubRsp),
                Just(Op::Nop),
                Just(Op::Nopw),
                Just(Op::Ret),
                target().prop_map(Op::Jmp8),
                target().prop_map(Op::Jmp32),
                target().prop_map(Op::Je8),
                target().prop_map(Op::Jne32),
                target().prop_map(Op::Call),
            ]
        }

        /// A function: its instructions' start offsets, their bytes, and where each branch lands.
        struct Function {
            starts: Vec<u64>,
            code: Vec<u8>,
            /// (offset of the branch's instruction, its end, its target offset), offsets wrapping below 0.
            branches: Vec<(u64, u64, u64)>,
        }

        /// Lays out and encodes `ops` at `base`; 20 instructions of at most 6 bytes keep every rel8 branch
        /// in range.
        fn assemble(ops: &[Op], candidate: usize, base: u64) -> Function {
            let mut starts = vec![0u64];
            for op in ops {
                starts.push(starts.last().unwrap() + op.len());
            }
            let mut encoder = Encoder::new(64);
            let mut branches = Vec::new();
            for (i, op) in ops.iter().enumerate() {
                let short = matches!(op, Op::Jmp8(_) | Op::Je8(_));
                let target = op.target().map(|t| match t {
                    Target::Index(n) => starts[n % starts.len()],
                    Target::Candidate => starts[candidate],
                    Target::Outside(back) if short => 0u64.wrapping_sub(u64::from(back % 8 + 1)),
                    Target::Outside(back) => 0u64.wrapping_sub(u64::from(back)),
                });
                if let Some(t) = target {
                    branches.push((starts[i], starts[i + 1], t));
                }
                let insn = op.instruction(base.wrapping_add(target.unwrap_or(0)));
                let len = encoder.encode(&insn, base + starts[i]).unwrap();
                assert_eq!(len as u64, op.len(), "{op:?}");
            }
            Function {
                starts,
                code: encoder.take_buffer(),
                branches,
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(2000))]

            #[test]
            fn the_probe_is_at_the_entry_or_on_an_instruction_no_branch_reaches(
                prefix in prop::collection::vec(flag_op(), 0..4),
                body in prop::collection::vec(op(), 1..17),
                size in prop_oneof![Just(None), (0u64..140).prop_map(Some)],
                base in 0x1000u64..(1 << 47),
            ) {
                let ops: Vec<Op> = prefix.iter().chain(&body).copied().collect();
                let f = assemble(&ops, prefix.len(), base);
                let len = f.code.len() as u64;
                let size = size.unwrap_or(len);
                let skip = emulated_entry(&f.code, size);
                if skip != 0 {
                    // An instruction boundary, the start of an instruction that lies within the symbol.
                    let i = f.starts.iter().position(|&s| s == skip);
                    prop_assert!(i.is_some_and(|i| i < ops.len()), "{skip} is no instruction's start");
                    let end = f.starts[i.unwrap() + 1];
                    prop_assert!(end <= size, "the instruction at {skip} ends past the size {size}");
                    // No branch of the function (its instructions within the size) lands on it or before it.
                    for &(at, branch_end, target) in &f.branches {
                        if branch_end <= size {
                            prop_assert!(
                                !(1..=skip).contains(&target),
                                "the branch at {at} lands on {target}, within the {skip} bytes skipped"
                            );
                        }
                    }
                }
                // And the probe does move when it may: the first body instruction is emulated, lies within
                // the symbol, the symbol ends on an instruction boundary, and no branch lands in the skip.
                let candidate = f.starts[prefix.len()];
                let whole = size >= len || f.starts.contains(&size);
                let reached = f.branches.iter().any(|&(_, branch_end, target)| {
                    branch_end <= size.min(len) && (1..=candidate).contains(&target)
                });
                if body[0].emulated() && f.starts[prefix.len() + 1] <= size && whole && !reached {
                    prop_assert_eq!(skip, candidate);
                }
            }
        }
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
