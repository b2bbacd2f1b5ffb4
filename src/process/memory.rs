//! Another process's memory, read without stopping it (`/proc/PID/mem`, which root reads as ptrace would, the
//! process running on), and where a binary's variables and functions are in it.

use std::{fs, os::unix::fs::FileExt};

use anyhow::{Context, Result};

/// Memory read by address: a running process's, or a core's.
pub trait Memory {
    /// Reads up to `buf.len()` bytes at `addr`; how many were read (fewer where the mapping ends, 0 where nothing
    /// is mapped).
    fn read(&self, addr: u64, buf: &mut [u8]) -> usize;

    /// The `len` bytes at `addr`, all of them or none.
    fn bytes(&self, addr: u64, len: usize) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; len];
        (self.read(addr, &mut buf) == len).then_some(buf)
    }

    fn u64_at(&self, addr: u64) -> Option<u64> {
        let mut word = [0u8; 8];
        (self.read(addr, &mut word) == 8).then(|| u64::from_le_bytes(word))
    }

    fn u32_at(&self, addr: u64) -> Option<u32> {
        let mut word = [0u8; 4];
        (self.read(addr, &mut word) == 4).then(|| u32::from_le_bytes(word))
    }

    /// Many reads at once (`reads`: the address and length of each), each all or nothing. A running process's are
    /// read a thousand to a syscall; others one by one.
    fn gather(&self, reads: &[(u64, usize)]) -> Gathered {
        let mut got = Gathered::sized(reads);
        for (i, &(addr, len)) in reads.iter().enumerate() {
            let (at, _) = got.spans[i];
            got.ok[i] = self.read(addr, &mut got.buf[at..at + len]) == len;
        }
        got
    }
}

/// What a `Memory::gather` read: each read's bytes where all of them were.
pub struct Gathered {
    buf: Vec<u8>,
    /// Where each read's bytes are in `buf`, and how many.
    spans: Vec<(usize, usize)>,
    ok: Vec<bool>,
}

impl Gathered {
    fn sized(reads: &[(u64, usize)]) -> Gathered {
        let mut at = 0;
        let spans = reads
            .iter()
            .map(|&(_, len)| {
                at += len;
                (at - len, len)
            })
            .collect();
        Gathered {
            buf: vec![0; at],
            spans,
            ok: vec![false; reads.len()],
        }
    }

    /// The bytes of read `i`, if all were read.
    pub fn get(&self, i: usize) -> Option<&[u8]> {
        let (at, len) = *self.spans.get(i)?;
        self.ok[i].then(|| &self.buf[at..at + len])
    }

    /// Read `i`'s little-endian word of 4 or 8 bytes at `offset` in it.
    pub fn word(&self, i: usize, offset: usize, width: usize) -> Option<u64> {
        let b = self.get(i)?.get(offset..offset + width)?;
        Some(match width {
            4 => u64::from(u32::from_le_bytes(b.try_into().ok()?)),
            8 => u64::from_le_bytes(b.try_into().ok()?),
            _ => return None,
        })
    }
}

/// A running process's memory.
pub struct ProcMemory {
    file: fs::File,
    pid: u32,
    /// `process_vm_readv` is refused (a container's seccomp filter): each read goes through the file.
    no_vm_readv: std::cell::Cell<bool>,
}

impl ProcMemory {
    pub fn open(pid: u32) -> Result<ProcMemory> {
        let path = format!("/proc/{pid}/mem");
        let file = fs::File::open(&path)
            .with_context(|| format!("reading the memory of PID {pid} ({path}): run as root"))?;
        Ok(ProcMemory {
            file,
            pid,
            no_vm_readv: std::cell::Cell::new(false),
        })
    }
}

/// The most pieces `process_vm_readv` takes in one call (`IOV_MAX`).
const IOV_MAX: usize = 1024;

impl Memory for ProcMemory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> usize {
        let mut done = 0;
        while done < buf.len() {
            match self
                .file
                .read_at(&mut buf[done..], addr.wrapping_add(done as u64))
            {
                Ok(0) | Err(_) => break,
                Ok(n) => done += n,
            }
        }
        done
    }

    fn gather(&self, reads: &[(u64, usize)]) -> Gathered {
        let mut got = Gathered::sized(reads);
        let mut first = 0;
        while first < reads.len() && !self.no_vm_readv.get() {
            let n = (reads.len() - first).min(IOV_MAX);
            let mut local = Vec::with_capacity(n);
            let mut remote = Vec::with_capacity(n);
            for (&(at, len), &(addr, _)) in got.spans[first..first + n]
                .iter()
                .zip(&reads[first..first + n])
            {
                local.push(libc::iovec {
                    iov_base: got.buf[at..].as_mut_ptr().cast(),
                    iov_len: len,
                });
                remote.push(libc::iovec {
                    iov_base: addr as *mut libc::c_void,
                    iov_len: len,
                });
            }
            // SAFETY: each local piece lies within `got.buf`, which outlives the call; the remote ones are only read.
            let done = unsafe {
                libc::process_vm_readv(
                    self.pid as libc::pid_t,
                    local.as_ptr(),
                    n as libc::c_ulong,
                    remote.as_ptr(),
                    n as libc::c_ulong,
                    0,
                )
            };
            let mut left = match usize::try_from(done) {
                Ok(d) => d,
                Err(_) => match std::io::Error::last_os_error().raw_os_error() {
                    // The first piece is not mapped: the next call starts past it.
                    Some(libc::EFAULT) => 0,
                    Some(libc::ENOSYS | libc::EPERM) => {
                        self.no_vm_readv.set(true);
                        break;
                    }
                    // The process is gone, or another error: nothing is read.
                    _ => return got,
                },
            };
            // Pieces are read in order until one fails: the call goes on past it.
            let mut next = first + n;
            for i in first..first + n {
                let (_, len) = got.spans[i];
                if left >= len {
                    got.ok[i] = true;
                    left -= len;
                } else {
                    next = i + 1;
                    break;
                }
            }
            first = next;
        }
        if self.no_vm_readv.get() {
            for (i, &(addr, len)) in reads.iter().enumerate().skip(first) {
                let (at, _) = got.spans[i];
                got.ok[i] = self.read(addr, &mut got.buf[at..at + len]) == len;
            }
        }
        got
    }
}

/// A field an accessor reads off its argument.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    /// Its displacement from the argument.
    pub offset: u64,
    /// The operand's size in bytes (0 for `lea`, which reads nothing).
    pub width: usize,
    /// Where the field is a pointer the function goes on through (`mov rax, [rdi+0x25f8]; test rax, rax; je …;
    /// mov rax, [rax+8]`): the displacement of each read through it in turn.
    pub through: Vec<u64>,
}

/// What a binary's code says of fields: for each function of `accessors`, given with which of its arguments is
/// the object (0: the first; an accessor such as `thd_get_thread_id`: `mov rax, [rdi+0x3f18]`, or
/// `lea rax, [rdi+0x68]`), its first memory operand off that argument's register (System V's: `rdi`, `rsi`, `rdx`,
/// `rcx`, `r8`, `r9`); `None` for each not defined, or whose first instructions read no such field. The binary is
/// parsed once for all.
pub fn accessor_fields(
    binary: &fs::File,
    accessors: &[(&str, usize)],
) -> Result<Vec<Option<Field>>> {
    accessor_fields_within(binary, accessors, ACCESSOR_INSTRUCTIONS)
}

/// The same, each function's field among its first `instructions`.
fn accessor_fields_within(
    binary: &fs::File,
    accessors: &[(&str, usize)],
    instructions: usize,
) -> Result<Vec<Option<Field>>> {
    use object::{Object, ObjectSection, ObjectSymbol};
    let image = map_file(binary)?;
    let elf = object::File::parse(&*image).context("parsing the binary")?;
    let mut found = vec![None; accessors.len()];
    for symbol in elf.dynamic_symbols().chain(elf.symbols()) {
        let Ok(name) = symbol.name() else { continue };
        let Some(i) = accessors.iter().position(|(n, _)| *n == name) else {
            continue;
        };
        if found[i].is_some() || !symbol.is_definition() || symbol.size() == 0 {
            continue;
        }
        let Some(section) = symbol
            .section_index()
            .and_then(|i| elf.section_by_index(i).ok())
        else {
            continue;
        };
        let code = section
            .data_range(symbol.address(), symbol.size().min(64))
            .ok()
            .flatten()
            .unwrap_or_default();
        found[i] = first_field_within(code, accessors[i].1, instructions);
    }
    Ok(found)
}

/// How many of an accessor's first instructions are looked at for its field. 16, not 8: MariaDB's metadata-lock
/// functions read theirs after a prologue (`MDL_lock::visit_subgraph` its ticket's `m_ctx` at the 13th, the 14th
/// behind `endbr64`), and every connection accessor of MariaDB 10.11 and 11.8 and MySQL 9.7 gives the field it gave
/// with 8 (`the_wider_window_keeps_every_connection_accessor_s_field`).
const ACCESSOR_INSTRUCTIONS: usize = 16;

/// The register System V passes argument `arg` (0: the first) in, of the first six.
#[cfg(target_arch = "x86_64")]
fn argument_register(arg: usize) -> Option<iced_x86::Register> {
    use iced_x86::Register;
    [
        Register::RDI,
        Register::RSI,
        Register::RDX,
        Register::RCX,
        Register::R8,
        Register::R9,
    ]
    .get(arg)
    .copied()
}

/// The first memory operand based on argument `arg`'s register alone among the first `instructions` of `code` (a
/// conditional branch's fall-through followed: a null check), then the reads through the register it loaded, as
/// long as each loads the next pointer.
#[cfg(target_arch = "x86_64")]
fn first_field_within(code: &[u8], arg: usize, instructions: usize) -> Option<Field> {
    use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic, OpKind, Register};
    let base = argument_register(arg)?;
    let mut decoder = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
    let mut field: Option<Field> = None;
    // The register holding the pointer last loaded (a 64-bit `mov` into a register), while it is followed.
    let mut pointer = Register::None;
    let read_of = |insn: &Instruction, base: Register| {
        (0..insn.op_count()).any(|i| insn.op_kind(i) == OpKind::Memory)
            && insn.memory_base() == base
            && insn.memory_index() == Register::None
    };
    let loads_pointer = |insn: &Instruction| {
        (insn.mnemonic() == Mnemonic::Mov
            && insn.op0_kind() == OpKind::Register
            && insn.memory_size().size() == 8)
            .then(|| insn.op0_register())
    };
    for _ in 0..instructions {
        if !decoder.can_decode() {
            break;
        }
        let insn = decoder.decode();
        if insn.is_invalid() {
            break;
        }
        match &mut field {
            None if read_of(&insn, base) => {
                let width = if insn.mnemonic() == Mnemonic::Lea {
                    0
                } else {
                    insn.memory_size().size()
                };
                pointer = loads_pointer(&insn).unwrap_or(Register::None);
                field = Some(Field {
                    offset: insn.memory_displacement64(),
                    width,
                    through: Vec::new(),
                });
            }
            Some(f)
                if pointer != Register::None
                    && insn.mnemonic() == Mnemonic::Mov
                    && insn.op0_kind() == OpKind::Register
                    && read_of(&insn, pointer) =>
            {
                f.through.push(insn.memory_displacement64());
                pointer = loads_pointer(&insn).unwrap_or(Register::None);
            }
            // Anything else that writes the pointer's register ends the chain.
            Some(_) if pointer != Register::None && writes(&insn, pointer) => {
                pointer = Register::None
            }
            _ => {}
        }
        match insn.flow_control() {
            FlowControl::Next | FlowControl::ConditionalBranch => {}
            _ => break,
        }
    }
    field
}

/// Whether `insn` writes `reg` (or its 32-bit half), as its destination.
#[cfg(target_arch = "x86_64")]
fn writes(insn: &iced_x86::Instruction, reg: iced_x86::Register) -> bool {
    use iced_x86::OpKind;
    insn.op_count() > 0
        && insn.op0_kind() == OpKind::Register
        && insn.op0_register().full_register() == reg.full_register()
        && !matches!(
            insn.mnemonic(),
            iced_x86::Mnemonic::Test | iced_x86::Mnemonic::Cmp
        )
}

#[cfg(not(target_arch = "x86_64"))]
fn first_field_within(_code: &[u8], _arg: usize, _instructions: usize) -> Option<Field> {
    None
}

/// Where a function that returns a pointer the calling thread keeps in a thread-local reads it (MariaDB's
/// `_current_thd`, MySQL's `thd_get_current_thd()`, each thread's connection), from the thread pointer (`fs`'s
/// base on x86-64, `pthread_self()`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadLocal {
    /// At this offset from the thread pointer (the local-exec model: `mov rax, fs:[0]; mov rax, [rax-0x68]`).
    At(i64),
    /// At the offset held by the GOT slot at this address of the binary (the initial-exec model, the slot written
    /// by the dynamic linker at load: `mov rax, fs:[0]; add rax, [rip+SLOT]; mov rax, [rax]`).
    Slot(u64),
}

/// Where `function` reads the pointer it returns from a thread-local (`ThreadLocal`); `None` when the binary
/// defines no such function or its first instructions read no thread-local.
pub fn thread_local_pointer(binary: &fs::File, function: &str) -> Result<Option<ThreadLocal>> {
    read_function(binary, function, 128, thread_local_read)
}

/// What `read` finds in the code of `function` (its first `max_len` bytes, and its address); `None` when the binary
/// defines no such function.
fn read_function<T>(
    binary: &fs::File,
    function: &str,
    max_len: u64,
    read: impl FnOnce(&[u8], u64) -> Option<T>,
) -> Result<Option<T>> {
    use object::{Object, ObjectSection, ObjectSymbol};
    let image = map_file(binary)?;
    let elf = object::File::parse(&*image).context("parsing the binary")?;
    let Some(symbol) = elf
        .dynamic_symbols()
        .chain(elf.symbols())
        .find(|s| s.is_definition() && s.size() > 0 && s.name() == Ok(function))
    else {
        return Ok(None);
    };
    let code = symbol
        .section_index()
        .and_then(|i| elf.section_by_index(i).ok())
        .and_then(|section| {
            section
                .data_range(symbol.address(), symbol.size().min(max_len))
                .ok()
                .flatten()
        });
    Ok(code.and_then(|code| read(code, symbol.address())))
}

/// The thread-local read among the first instructions of `code` (at `address`): `fs:[0]` loaded into a register,
/// then read at a displacement from it or added a GOT slot's offset; or `fs:[disp]` read at once.
#[cfg(target_arch = "x86_64")]
fn thread_local_read(code: &[u8], address: u64) -> Option<ThreadLocal> {
    use iced_x86::{Decoder, DecoderOptions, Mnemonic, OpKind, Register};
    let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
    // The register holding the thread pointer, then whether a slot's offset was added to it.
    let (mut pointer, mut slot) = (Register::None, None);
    for insn in decoder.iter().take(ACCESSOR_INSTRUCTIONS) {
        let memory = (0..insn.op_count()).any(|i| insn.op_kind(i) == OpKind::Memory);
        let displacement = insn.memory_displacement64() as i64;
        if memory && insn.memory_segment() == Register::FS && insn.memory_base() == Register::None {
            if insn.mnemonic() != Mnemonic::Mov || insn.op0_kind() != OpKind::Register {
                return None;
            }
            if displacement != 0 {
                return Some(ThreadLocal::At(displacement));
            }
            pointer = insn.op0_register();
            continue;
        }
        if pointer == Register::None || !memory {
            continue;
        }
        match insn.mnemonic() {
            Mnemonic::Add if insn.op0_register() == pointer && insn.is_ip_rel_memory_operand() => {
                slot = Some(insn.ip_rel_memory_address());
            }
            Mnemonic::Mov
                if insn.memory_base() == pointer && insn.memory_index() == Register::None =>
            {
                return match slot {
                    Some(slot) if displacement == 0 => Some(ThreadLocal::Slot(slot)),
                    None => Some(ThreadLocal::At(displacement)),
                    Some(_) => None,
                };
            }
            _ => return None,
        }
    }
    None
}

#[cfg(not(target_arch = "x86_64"))]
fn thread_local_read(_code: &[u8], _address: u64) -> Option<ThreadLocal> {
    None
}

/// Where `function`, a method, stores what its call of `callee` (an imported function, called through the PLT)
/// returned: the displacement from its object (`this`, its first argument, or a register it copied it to) of the
/// first store of `rax` after that call (`mov rbx, rdi; …; call pthread_self@plt; …; mov [rbx+0x3f10], rax`).
/// `None` when the function or the call is not there, or what follows the call is not such a store.
pub fn stored_call_result(binary: &fs::File, function: &str, callee: &str) -> Result<Option<u64>> {
    with_calls_of(
        binary,
        function,
        512,
        callee,
        |code, address, calls_callee| store_after_call(code, address, calls_callee),
    )
}

/// The constant `function` passes as its argument `arg` (0: the first; System V's registers) to its first call of
/// `callee` (a function of the binary, or imported): the last `mov` of an immediate into that register before the
/// call, the register written by nothing else in between (MariaDB's `MDL_context::release_lock`: `mov edx, 0x200;
/// call MDL_lock::remove_ticket`, the member pointer `&MDL_lock::m_granted` passed by value, an offset). `None` when
/// the function or the call is not there, or the argument is not such a constant.
pub fn constant_argument(
    binary: &fs::File,
    function: &str,
    callee: &str,
    arg: usize,
) -> Result<Option<u64>> {
    // MariaDB's MDL_context::acquire_lock makes its call 1.7 KB in.
    with_calls_of(
        binary,
        function,
        64 * 1024,
        callee,
        |code, address, calls_callee| constant_before_call(code, address, arg, calls_callee),
    )
}

/// What `read` finds in the code of `function` (its first `max_len` bytes, from its address), given whether a
/// call's target is `callee` (its own address, or a PLT entry that jumps through one of its GOT slots).
fn with_calls_of<T>(
    binary: &fs::File,
    function: &str,
    max_len: u64,
    callee: &str,
    read: impl FnOnce(&[u8], u64, &dyn Fn(u64) -> bool) -> Option<T>,
) -> Result<Option<T>> {
    use object::{Object, ObjectSection, ObjectSymbol, ObjectSymbolTable, RelocationTarget};
    let image = map_file(binary)?;
    let elf = object::File::parse(&*image).context("parsing the binary")?;
    // The callee's GOT slots: where its PLT entries jump through.
    let slots: Vec<u64> = match (elf.dynamic_relocations(), elf.dynamic_symbol_table()) {
        (Some(relocations), Some(symbols)) => relocations
            .filter(|(_, r)| match r.target() {
                RelocationTarget::Symbol(i) => {
                    symbols.symbol_by_index(i).ok().and_then(|s| s.name().ok()) == Some(callee)
                }
                _ => false,
            })
            .map(|(slot, _)| slot)
            .collect(),
        _ => Vec::new(),
    };
    let defined = |name: &str| {
        elf.dynamic_symbols()
            .chain(elf.symbols())
            .find(|s| s.is_definition() && s.size() > 0 && s.name() == Ok(name))
    };
    let callee_at = defined(callee).map(|s| s.address());
    let code_at = |address: u64, len: u64| -> Option<Vec<u8>> {
        let section = elf
            .sections()
            .find(|s| (s.address()..s.address() + s.size()).contains(&address))?;
        let len = len.min(section.address() + section.size() - address);
        section
            .data_range(address, len)
            .ok()
            .flatten()
            .map(<[u8]>::to_vec)
    };
    let Some(symbol) = defined(function) else {
        return Ok(None);
    };
    let Some(code) = code_at(symbol.address(), symbol.size().min(max_len)) else {
        return Ok(None);
    };
    // A call's target is the callee's when it is the callee, or its first jump goes through one of the callee's
    // slots.
    let calls_callee = |target: u64| {
        callee_at == Some(target)
            || code_at(target, 32)
                .is_some_and(|stub| plt_slot(&stub, target).is_some_and(|s| slots.contains(&s)))
    };
    Ok(read(&code, symbol.address(), &calls_callee))
}

/// The GOT slot a PLT entry at `address` (its code `stub`) jumps through: its first indirect `jmp [rip+…]`
/// (`endbr64; bnd jmp [rip+…]` in `.plt.sec`).
#[cfg(target_arch = "x86_64")]
fn plt_slot(stub: &[u8], address: u64) -> Option<u64> {
    use iced_x86::{Decoder, DecoderOptions, FlowControl, OpKind};
    let mut decoder = Decoder::with_ip(64, stub, address, DecoderOptions::NONE);
    for _ in 0..3 {
        let insn = decoder.decode();
        if insn.is_invalid() {
            return None;
        }
        if insn.flow_control() == FlowControl::IndirectBranch {
            return (insn.op0_kind() == OpKind::Memory && insn.is_ip_rel_memory_operand())
                .then(|| insn.ip_rel_memory_address());
        }
    }
    None
}

/// In `code` (at `address`), the displacement of the first store of `rax` off `this` (`rdi`, or a register it
/// was copied to) after a call whose target `calls_callee` accepts; `None` if `rax` is written before, or
/// something else comes in between that ends the straight line (a jump, a return, another call).
#[cfg(target_arch = "x86_64")]
fn store_after_call(code: &[u8], address: u64, calls_callee: impl Fn(u64) -> bool) -> Option<u64> {
    use iced_x86::{Decoder, DecoderOptions, FlowControl, Mnemonic, OpKind, Register};
    let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
    let mut this = vec![Register::RDI];
    let mut called = false;
    while decoder.can_decode() {
        let insn = decoder.decode();
        if insn.is_invalid() {
            return None;
        }
        let is_mov = insn.mnemonic() == Mnemonic::Mov;
        // `mov rbx, rdi`: rbx holds `this` too; a register written otherwise no longer does.
        if is_mov
            && insn.op0_kind() == OpKind::Register
            && insn.op1_kind() == OpKind::Register
            && this.contains(&insn.op1_register())
        {
            this.push(insn.op0_register());
        } else if insn.mnemonic() != Mnemonic::Push {
            this.retain(|r| !writes(&insn, *r));
        }
        if !called {
            if insn.flow_control() == FlowControl::Call && insn.op0_kind() == OpKind::NearBranch64 {
                called = calls_callee(insn.near_branch_target());
            }
            continue;
        }
        if is_mov
            && insn.op0_kind() == OpKind::Memory
            && insn.op1_kind() == OpKind::Register
            && insn.op1_register() == Register::RAX
            && insn.memory_index() == Register::None
            && this.contains(&insn.memory_base())
        {
            return Some(insn.memory_displacement64());
        }
        if writes(&insn, Register::RAX) || insn.flow_control() != FlowControl::Next {
            return None;
        }
    }
    None
}

/// In `code` (at `address`), the immediate last moved into argument `arg`'s register before the first call whose
/// target `calls_callee` accepts; `None` if something else writes the register after it (another call among them),
/// or the straight line to the call is broken (a jump, a return) after it.
#[cfg(target_arch = "x86_64")]
fn constant_before_call(
    code: &[u8],
    address: u64,
    arg: usize,
    calls_callee: impl Fn(u64) -> bool,
) -> Option<u64> {
    use iced_x86::{Decoder, DecoderOptions, FlowControl, Mnemonic, OpKind};
    let register = argument_register(arg)?;
    let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
    let mut value = None;
    while decoder.can_decode() {
        let insn = decoder.decode();
        if insn.is_invalid() {
            return None;
        }
        if insn.flow_control() == FlowControl::Call
            && insn.op0_kind() == OpKind::NearBranch64
            && calls_callee(insn.near_branch_target())
        {
            return value;
        }
        let immediate = insn.mnemonic() == Mnemonic::Mov
            && insn.op0_kind() == OpKind::Register
            && insn.op0_register().full_register() == register
            && matches!(insn.op0_register().size(), 4 | 8)
            && matches!(
                insn.op1_kind(),
                OpKind::Immediate32 | OpKind::Immediate32to64 | OpKind::Immediate64
            );
        if immediate {
            value = Some(insn.immediate(1));
        } else if writes(&insn, register)
            || !matches!(
                insn.flow_control(),
                FlowControl::Next | FlowControl::ConditionalBranch
            )
        {
            value = None;
        }
    }
    None
}

#[cfg(not(target_arch = "x86_64"))]
fn plt_slot(_stub: &[u8], _address: u64) -> Option<u64> {
    None
}

#[cfg(not(target_arch = "x86_64"))]
fn store_after_call(
    _code: &[u8],
    _address: u64,
    _calls_callee: impl Fn(u64) -> bool,
) -> Option<u64> {
    None
}

#[cfg(not(target_arch = "x86_64"))]
fn constant_before_call(
    _code: &[u8],
    _address: u64,
    _arg: usize,
    _calls_callee: impl Fn(u64) -> bool,
) -> Option<u64> {
    None
}

/// What the file holds of each symbol of `names`, as many bytes as its size says (dynamic symbols first, then the
/// symbol table's): a constant table's contents (MariaDB's `MDL_lock::MDL_object_lock::m_granted_incompatible`),
/// or the size of one whose contents the loader fills in. `None` for each not defined, or without bytes in the
/// file (in `.bss`).
pub fn symbol_contents(binary: &fs::File, names: &[&str]) -> Result<Vec<Option<Vec<u8>>>> {
    use object::{Object, ObjectSection, ObjectSymbol};
    let image = map_file(binary)?;
    let elf = object::File::parse(&*image).context("parsing the binary")?;
    let mut found = vec![None; names.len()];
    for symbol in elf.dynamic_symbols().chain(elf.symbols()) {
        let Ok(name) = symbol.name() else { continue };
        let Some(i) = names.iter().position(|n| *n == name) else {
            continue;
        };
        if found[i].is_some() || !symbol.is_definition() {
            continue;
        }
        found[i] = symbol
            .section_index()
            .and_then(|s| elf.section_by_index(s).ok())
            .and_then(|section| {
                section
                    .data_range(symbol.address(), symbol.size())
                    .ok()
                    .flatten()
            })
            .map(<[u8]>::to_vec);
    }
    Ok(found)
}

/// The field a getter `function` returns, where its whole body is `mov rax, [rdi+OFFSET]; ret` (after `endbr64`
/// where built for CET): OFFSET. Its object's field is then the very address it returns, as MariaDB's
/// `MDL_ticket::get_key()`, `return &m_lock->key`, says the key is the lock's first member. `None` when the
/// function is not there or is anything else.
pub fn returned_field(binary: &fs::File, function: &str) -> Result<Option<u64>> {
    read_function(binary, function, 64, |code, _| returned_field_of(code))
}

/// OFFSET where `code` is exactly `[endbr64;] mov rax, [rdi+OFFSET]; ret`.
#[cfg(target_arch = "x86_64")]
fn returned_field_of(code: &[u8]) -> Option<u64> {
    use iced_x86::{Decoder, DecoderOptions, Mnemonic, OpKind, Register};
    let mut decoder = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
    let mut insns = Vec::new();
    while decoder.can_decode() && insns.len() < 4 {
        let insn = decoder.decode();
        if insn.is_invalid() {
            return None;
        }
        if insn.mnemonic() != Mnemonic::Endbr64 || !insns.is_empty() {
            insns.push(insn);
        }
    }
    match insns[..] {
        [load, ret]
            if load.mnemonic() == Mnemonic::Mov
                && load.op0_kind() == OpKind::Register
                && load.op0_register() == Register::RAX
                && load.op1_kind() == OpKind::Memory
                && load.memory_base() == Register::RDI
                && load.memory_index() == Register::None
                && ret.mnemonic() == Mnemonic::Ret
                && ret.op_count() == 0 =>
        {
            Some(load.memory_displacement64())
        }
        _ => None,
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn returned_field_of(_code: &[u8]) -> Option<u64> {
    None
}

/// The runtime addresses, in a process that maps `binary` from `mapped` (the start of its mapping of the file's
/// first page), of the symbols `names` (dynamic symbols first, then the symbol table's); `None` for each not
/// defined.
pub fn symbol_addresses(
    binary: &fs::File,
    mapped: u64,
    names: &[&str],
) -> Result<Vec<Option<u64>>> {
    use object::{Object, ObjectSymbol};
    let image = map_file(binary)?;
    let elf = object::File::parse(&*image).context("parsing the binary")?;
    let bias = bias(&elf, mapped)?;
    let mut found = vec![None; names.len()];
    for symbol in elf.dynamic_symbols().chain(elf.symbols()) {
        if !symbol.is_definition() {
            continue;
        }
        let Ok(name) = symbol.name() else { continue };
        if let Some(i) = names.iter().position(|n| *n == name) {
            if found[i].is_none() {
                found[i] = symbol.address().checked_add(bias);
            }
        }
    }
    Ok(found)
}

/// What a process that maps `elf`'s first page at `mapped` adds to its addresses: the load bias, which every
/// segment shares (where the segment loaded from the file's start is mapped, less its address in the file).
/// Through it a variable is found even past its segment's file part (in .bss).
fn bias(elf: &object::File, mapped: u64) -> Result<u64> {
    use object::{Object, ObjectSegment};
    let first_vaddr = elf
        .segments()
        .filter(|seg| seg.file_range().0 == 0)
        .map(|seg| seg.address())
        .min()
        .context("the binary has no segment loaded from its start")?;
    const PAGE: u64 = 4096;
    mapped
        .checked_sub(first_vaddr & !(PAGE - 1))
        .context("the binary is mapped below its own addresses")
}

/// What process `pid` adds to the addresses of `binary`, which it maps (its load bias).
pub fn load_bias(pid: u32, binary: &fs::File) -> Option<u64> {
    let mapped = mapped_start(pid, binary)?;
    let image = map_file(binary).ok()?;
    let elf = object::File::parse(&*image).ok()?;
    bias(&elf, mapped).ok()
}

/// `binary` mapped into memory, read in place: its symbols' names are read one by one, and a read of each (`ReadCache`)
/// took half a second on MySQL's. A running executable cannot be written to (ETXTBSY), so the mapping holds.
fn map_file(binary: &fs::File) -> Result<memmap2::Mmap> {
    // SAFETY: read only; the file is the server's executable, which the kernel keeps from being written while it
    // runs (a core's is read once, by this process alone).
    unsafe { memmap2::Mmap::map(binary) }.context("mapping the binary into memory")
}

/// Where process `pid` maps the first page of `binary` (the file, known by its inode).
pub fn mapped_start(pid: u32, binary: &fs::File) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let inode = binary.metadata().ok()?.ino();
    let maps = super::maps::ProcMaps::read(pid).ok()?;
    maps.maps()
        .iter()
        .filter(|m| m.inode == inode && m.offset == 0)
        .map(|m| m.start)
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn first_field_of(code: &[u8], arg: usize) -> Option<Field> {
        first_field_within(code, arg, ACCESSOR_INSTRUCTIONS)
    }

    fn first_field_of_rdi(code: &[u8]) -> Option<Field> {
        first_field_of(code, 0)
    }

    #[test]
    fn a_call_s_result_stored_in_the_object_gives_its_field() {
        // MariaDB's THD::store_globals: push rbx; mov rbx, rdi; call 0x100 (syscall@plt); mov [rbx+0x3f28], eax;
        // call 0x200 (pthread_self@plt); mov rdx, [rbx+0x1f20]; lea rdi, [rbx+0x1f20]; mov [rbx+0x3f10], rax
        let code = [
            0x53, 0x48, 0x89, 0xfb, 0xe8, 0xf7, 0x00, 0x00, 0x00, 0x89, 0x83, 0x28, 0x3f, 0x00,
            0x00, 0xe8, 0xec, 0x01, 0x00, 0x00, 0x48, 0x8b, 0x93, 0x20, 0x1f, 0x00, 0x00, 0x48,
            0x8d, 0xbb, 0x20, 0x1f, 0x00, 0x00, 0x48, 0x89, 0x83, 0x10, 0x3f, 0x00, 0x00, 0xc3,
        ];
        assert_eq!(store_after_call(&code, 0, |t| t == 0x200), Some(0x3f10));
        // After syscall's call the first store is of eax, 32 bits, not rax: then a call ends the line.
        assert_eq!(store_after_call(&code, 0, |t| t == 0x100), None);
        assert_eq!(store_after_call(&code, 0, |_| false), None);
        // The same stored off rdi once rdi holds something else: not the object's.
        let mut other = code;
        other[36] = 0x87; // mov [rdi+0x3f10], rax
        assert_eq!(store_after_call(&other, 0, |t| t == 0x200), None);
        // endbr64; bnd jmp [rip+0x1000]: the slot at 0x50 + 11 + 0x1000
        let stub = [
            0xf3, 0x0f, 0x1e, 0xfa, 0xf2, 0xff, 0x25, 0x00, 0x10, 0x00, 0x00,
        ];
        assert_eq!(plt_slot(&stub, 0x50), Some(0x50 + 11 + 0x1000));
        assert_eq!(plt_slot(&[0xc3], 0x50), None);
    }

    #[test]
    fn an_accessor_whose_object_is_a_later_argument_gives_its_field() {
        // MySQL's db_is_default_db(const char *, size_t, const THD *): test rdx, rdx; je; mov rax, [rdx+0x558];
        // test rax, rax; je; cmp [rdx+0x560], rsi; je
        let db = [
            0x48, 0x85, 0xd2, 0x74, 0x15, 0x48, 0x8b, 0x82, 0x58, 0x05, 0x00, 0x00, 0x48, 0x85,
            0xc0, 0x74, 0x09, 0x48, 0x39, 0xb2, 0x60, 0x05, 0x00, 0x00, 0x74, 0x0a,
        ];
        assert_eq!(first_field_of(&db, 2), field(0x558, 8, &[]));
        assert_eq!(first_field_of(&db, 0), None);
        assert_eq!(first_field_of(&db, 6), None);
    }

    fn field(offset: u64, width: usize, through: &[u64]) -> Option<Field> {
        Some(Field {
            offset,
            width,
            through: through.to_vec(),
        })
    }

    #[test]
    fn accessors_give_their_field() {
        // endbr64; mov rax, [rdi+0x3f18]; ret
        let id = [
            0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x8b, 0x87, 0x18, 0x3f, 0x00, 0x00, 0xc3,
        ];
        assert_eq!(first_field_of_rdi(&id), field(0x3f18, 8, &[]));
        // mov eax, [rdi+0x25d0]; ret
        let id32 = [0x8b, 0x87, 0xd0, 0x25, 0x00, 0x00, 0xc3];
        assert_eq!(first_field_of_rdi(&id32), field(0x25d0, 4, &[]));
        // lea rax, [rdi+0x68]; ret
        let lea = [0x48, 0x8d, 0x47, 0x68, 0xc3];
        assert_eq!(first_field_of_rdi(&lea), field(0x68, 0, &[]));
        // mov rax, [rsi+0x10]; ret: not the first argument's
        let rsi = [0x48, 0x8b, 0x46, 0x10, 0xc3];
        assert_eq!(first_field_of_rdi(&rsi), None);
        // ret first: nothing read
        assert_eq!(first_field_of_rdi(&[0xc3, 0x48, 0x8d, 0x47, 0x68]), None);
        assert_eq!(first_field_of_rdi(&[]), None);
    }

    #[test]
    fn a_pointer_is_followed_through_its_null_check() {
        // MariaDB's thd_user_name: mov rax, [rdi+0x25f8]; test rax, rax; je +4; mov rax, [rax+8]; ret
        let user = [
            0x48, 0x8b, 0x87, 0xf8, 0x25, 0x00, 0x00, 0x48, 0x85, 0xc0, 0x74, 0x04, 0x48, 0x8b,
            0x40, 0x08, 0xc3,
        ];
        assert_eq!(first_field_of_rdi(&user), field(0x25f8, 8, &[8]));
        // MySQL's thd_get_security_context: test rsi, rsi; je +0x17; mov rax, [rdi+0x1800]; mov [rsi], rax;
        // xor eax, eax; ret: a branch before, and the pointer stored, not followed
        let sctx = [
            0x48, 0x85, 0xf6, 0x74, 0x17, 0x48, 0x8b, 0x87, 0x00, 0x18, 0x00, 0x00, 0x48, 0x89,
            0x06, 0x31, 0xc0, 0xc3,
        ];
        assert_eq!(first_field_of_rdi(&sctx), field(0x1800, 8, &[]));
        // mov rax, [rdi+0x10]; mov rax, rdx; mov rcx, [rax+8]; ret: rax no longer holds the pointer
        let overwritten = [
            0x48, 0x8b, 0x47, 0x10, 0x48, 0x89, 0xd0, 0x48, 0x8b, 0x48, 0x08, 0xc3,
        ];
        assert_eq!(first_field_of_rdi(&overwritten), field(0x10, 8, &[]));
    }

    #[test]
    fn a_constant_passed_to_a_call_gives_its_value() {
        // MariaDB 10.11's MDL_context::release_lock: push rbp; mov rcx, rdx; mov rbp, rsp; push rbx; mov rbx, rdx;
        // sub rsp, 8; mov rsi, [rdi+0x110]; mov rdi, [rdx+0x40]; mov edx, 0x200; call 0x95e1f0 (at 0x95ec80)
        let release = [
            0x55, 0x48, 0x89, 0xd1, 0x48, 0x89, 0xe5, 0x53, 0x48, 0x89, 0xd3, 0x48, 0x83, 0xec,
            0x08, 0x48, 0x8b, 0xb7, 0x10, 0x01, 0x00, 0x00, 0x48, 0x8b, 0x7a, 0x40, 0xba, 0x00,
            0x02, 0x00, 0x00, 0xe8, 0x4c, 0xf5, 0xff, 0xff,
        ];
        let remove_ticket = |t| t == 0x95e1f0;
        assert_eq!(
            constant_before_call(&release, 0x95ec80, 2, remove_ticket),
            Some(0x200)
        );
        // Another register's, another call's: none.
        assert_eq!(
            constant_before_call(&release, 0x95ec80, 1, remove_ticket),
            None
        );
        assert_eq!(constant_before_call(&release, 0x95ec80, 2, |_| false), None);
        // 11.8's, behind endbr64.
        let cet: Vec<u8> = [0xf3, 0x0f, 0x1e, 0xfa]
            .iter()
            .chain(&release)
            .copied()
            .collect();
        assert_eq!(
            constant_before_call(&cet, 0x95ec7c, 2, remove_ticket),
            Some(0x200)
        );
        // mov edx, 0x250; mov rdx, rdi; call: written again in between.
        let overwritten = [
            0xba, 0x50, 0x02, 0x00, 0x00, 0x48, 0x89, 0xfa, 0xe8, 0x00, 0x00, 0x00, 0x00,
        ];
        assert_eq!(constant_before_call(&overwritten, 0, 2, |_| true), None);
        // mov edx, 0x250; call elsewhere; call: the first call may have changed it.
        let called = [
            0xba, 0x50, 0x02, 0x00, 0x00, 0xe8, 0x10, 0x00, 0x00, 0x00, 0xe8, 0x00, 0x00, 0x00,
            0x00,
        ];
        assert_eq!(constant_before_call(&called, 0, 2, |t| t == 15), None);
        // mov rdx, 0x250 (sign-extended); call: 64 bits.
        let wide = [
            0x48, 0xc7, 0xc2, 0x50, 0x02, 0x00, 0x00, 0xe8, 0x00, 0x00, 0x00, 0x00,
        ];
        assert_eq!(constant_before_call(&wide, 0, 2, |_| true), Some(0x250));
    }

    #[test]
    fn a_getter_s_returned_field_is_its_whole_body() {
        // MariaDB 10.11's MDL_ticket::get_key(): mov rax, [rdi+0x40]; ret
        let get_key = [0x48, 0x8b, 0x47, 0x40, 0xc3];
        assert_eq!(returned_field_of(&get_key), Some(0x40));
        // 11.8's: endbr64 first
        let cet = [0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x8b, 0x47, 0x40, 0xc3];
        assert_eq!(returned_field_of(&cet), Some(0x40));
        // mov rax, [rdi+0x40]; add rax, 8; ret: not the field itself
        let moved = [0x48, 0x8b, 0x47, 0x40, 0x48, 0x83, 0xc0, 0x08, 0xc3];
        assert_eq!(returned_field_of(&moved), None);
        // mov rax, [rsi+0x40]; ret: not the object's
        assert_eq!(returned_field_of(&[0x48, 0x8b, 0x46, 0x40, 0xc3]), None);
        // lea rax, [rdi+0x40]; ret: no read
        assert_eq!(returned_field_of(&[0x48, 0x8d, 0x47, 0x40, 0xc3]), None);
        assert_eq!(returned_field_of(&[]), None);
    }

    /// The servers' binaries on this machine, where there: the host's MariaDB and scripts/testdb's roots.
    fn server_binaries() -> Vec<(std::path::PathBuf, &'static dyn crate::server::Server)> {
        use crate::server::{MariaDb, MySql};
        let roots = std::env::var("MYPROBE_TESTDB_ROOTS")
            .unwrap_or_else(|_| "/var/cache/myprobe/roots".to_string());
        [
            (
                "/usr/sbin/mariadbd".to_string(),
                &MariaDb as &dyn crate::server::Server,
            ),
            (format!("{roots}/mariadb-11.8/usr/sbin/mariadbd"), &MariaDb),
            (format!("{roots}/mysql-9.7/usr/sbin/mysqld"), &MySql),
        ]
        .into_iter()
        .map(|(path, server)| (std::path::PathBuf::from(path), server))
        .filter(|(path, _)| path.exists())
        .collect()
    }

    #[test]
    fn the_wider_window_keeps_every_connection_accessor_s_field() {
        use crate::server::TextAccessor;
        for (path, server) in server_binaries() {
            let spec = server.sessions();
            let mut accessors = vec![
                (spec.id, 0),
                (spec.query, 0),
                (spec.command, 0),
                (spec.started, 0),
                (spec.transaction.0, 0),
            ];
            accessors.extend(spec.db);
            for text in [&spec.user, &spec.host] {
                match *text {
                    TextAccessor::CString(f) => accessors.push((f, 0)),
                    TextAccessor::Through(p, t) => accessors.extend([(p, 0), (t, 0)]),
                }
            }
            // MySQL's user and host share their security context's accessor.
            accessors.sort_unstable();
            accessors.dedup();
            let file = fs::File::open(&path).unwrap();
            let narrow = accessor_fields_within(&file, &accessors, 8).unwrap();
            let wide = accessor_fields(&file, &accessors).unwrap();
            assert!(narrow.iter().all(Option::is_some), "{path:?}: {narrow:?}");
            assert_eq!(narrow, wide, "{path:?}: {accessors:?}");
        }
    }

    #[test]
    fn each_server_s_thread_local_connection_is_decoded_from_its_exported_code() {
        use object::{Object, ObjectSegment};
        for (path, server) in server_binaries() {
            let file = fs::File::open(&path).unwrap();
            let found = thread_local_pointer(&file, server.sessions().current)
                .unwrap()
                .unwrap_or_else(|| panic!("{path:?}: no thread-local read"));
            eprintln!("{path:?}: {found:x?}");
            let image = map_file(&file).unwrap();
            let elf = object::File::parse(&*image).unwrap();
            match found {
                // In the executable's own block, which ends at the thread pointer (x86-64's TLS variant II).
                ThreadLocal::At(offset) => {
                    use object::read::elf::ProgramHeader;
                    let tls = object::read::elf::ElfFile64::<object::Endianness>::parse(&*image)
                        .unwrap()
                        .elf_program_headers()
                        .iter()
                        .find(|h| h.p_type(object::Endianness::Little) == object::elf::PT_TLS)
                        .map(|h| h.p_memsz(object::Endianness::Little))
                        .unwrap_or_else(|| panic!("{path:?}: no TLS segment"));
                    assert!(
                        offset < 0 && offset.unsigned_abs() <= tls + 64,
                        "{path:?}: {offset:#x}, {tls:#x}"
                    );
                }
                // A slot the dynamic linker fills with a thread-local's offset.
                ThreadLocal::Slot(slot) => {
                    let relocation = elf
                        .dynamic_relocations()
                        .unwrap()
                        .find(|(at, _)| *at == slot)
                        .unwrap_or_else(|| panic!("{path:?}: nothing relocates {slot:#x}"))
                        .1;
                    assert_eq!(
                        relocation.flags(),
                        object::RelocationFlags::Elf {
                            r_type: object::elf::R_X86_64_TPOFF64
                        },
                        "{path:?}: {slot:#x}"
                    );
                    assert!(elf
                        .segments()
                        .any(|s| (s.address()..s.address() + s.size()).contains(&slot)));
                }
            }
        }
    }

    #[test]
    fn this_process_memory_reads_back() {
        let value: u64 = 0x1122_3344_5566_7788;
        let mem = ProcMemory::open(std::process::id()).unwrap();
        let addr = &value as *const u64 as u64;
        assert_eq!(mem.u64_at(addr), Some(value));
        assert_eq!(mem.u32_at(addr), Some(0x5566_7788));
        assert_eq!(mem.u64_at(0), None);
        assert_eq!(mem.bytes(8, 4), None);
    }

    #[test]
    fn a_gather_reads_each_piece_past_those_not_mapped() {
        let words: Vec<u64> = (0..2500u64).map(|i| i * 3 + 1).collect();
        let mem = ProcMemory::open(std::process::id()).unwrap();
        // Every seventh piece unmapped (page 0), over three calls' worth of pieces.
        let reads: Vec<(u64, usize)> = words
            .iter()
            .enumerate()
            .map(|(i, w)| match i % 7 {
                3 => (8, 8),
                _ => (w as *const u64 as u64, 8),
            })
            .collect();
        for got in [mem.gather(&reads), Memory::gather(&Unbatched(&mem), &reads)] {
            for (i, w) in words.iter().enumerate() {
                let want = (i % 7 != 3).then_some(*w);
                assert_eq!(got.word(i, 0, 8), want, "piece {i}");
            }
        }
    }

    /// The one-by-one gather every other memory has.
    struct Unbatched<'a>(&'a ProcMemory);

    impl Memory for Unbatched<'_> {
        fn read(&self, addr: u64, buf: &mut [u8]) -> usize {
            self.0.read(addr, buf)
        }
    }
}
