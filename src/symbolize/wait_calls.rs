//! The places where a binary calls a function with a constant second argument, found in its code: the server's
//! `thd_wait_begin(thd, type)`, which each wait a thread pool must know of is bracketed by. The function around
//! such a call waits for what the type says, whether the binary names it or not (Debian's `mariadbd` exports
//! `thd_wait_begin`, not InnoDB's `lock_wait`).

use std::{fs, path::Path};

use anyhow::{Context, Result};
use object::{Object, ObjectSection, ObjectSymbol, SectionKind};

use super::elf::EhTable;

/// A direct call of the function looked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConstantCall {
    /// The call instruction's address in the binary, and its offset in the file (where a uprobe goes).
    pub vaddr: u64,
    pub file_offset: u64,
    /// The start of the function around it (its `.eh_frame` entry).
    pub function: u64,
    /// The values the second argument (`esi`) can have at the call, as far as the instructions before it in the
    /// function say: one for `mov esi, 3`, two for a choice (`setne sil; lea esi, [rsi+rsi*2+3]`); empty when
    /// they do not say.
    pub values: Vec<u32>,
}

/// Every direct call of `callee` (a symbol of `path`) in its code, with what its second argument can be.
pub fn calls_with_constant(path: &Path, callee: &str) -> Result<Vec<ConstantCall>> {
    let file = fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: read only; a running executable cannot be written to (ETXTBSY).
    let image = unsafe { memmap2::Mmap::map(&file) }.context("mapping the binary into memory")?;
    let elf = object::File::parse(&*image).context("parsing the binary")?;
    let Some(target) = elf
        .dynamic_symbols()
        .chain(elf.symbols())
        .find(|s| s.is_definition() && s.name() == Ok(callee))
        .map(|s| s.address())
    else {
        return Ok(Vec::new());
    };
    let mut sites = Vec::new();
    for section in elf.sections().filter(|s| s.kind() == SectionKind::Text) {
        let (Ok(code), Some((offset, _))) = (section.data(), section.file_range()) else {
            continue;
        };
        let base = section.address();
        for at in memchr::memchr_iter(0xe8, code) {
            let Some(rel) = code.get(at + 1..at + 5) else {
                break;
            };
            let rel = i32::from_le_bytes(rel.try_into().expect("4 bytes"));
            let next = base + at as u64 + 5;
            if next.wrapping_add_signed(i64::from(rel)) == target {
                sites.push((base + at as u64, offset + at as u64));
            }
        }
    }
    if sites.is_empty() {
        return Ok(Vec::new());
    }
    let functions = EhTable::read(path)?;
    let code_at = |start: u64, end: u64| -> Option<&[u8]> {
        let section = elf
            .sections()
            .find(|s| (s.address()..s.address() + s.size()).contains(&start))?;
        let data = section.data().ok()?;
        let from = usize::try_from(start - section.address()).ok()?;
        let to = usize::try_from(end.min(section.address() + section.size()) - section.address())
            .ok()?;
        data.get(from..to)
    };
    Ok(sites
        .into_iter()
        .filter_map(|(vaddr, file_offset)| {
            let (function, _) = functions.find(vaddr)?;
            // Decoded from the function's start: a call found by its byte alone inside another instruction is
            // not on an instruction's boundary.
            let values = second_argument(code_at(function, vaddr + 5)?, function, vaddr)?;
            Some(ConstantCall {
                vaddr,
                file_offset,
                function,
                values,
            })
        })
        .collect())
}

/// The values `esi` can hold at the call at `call` in `code` (a function from `start`), by the last instructions
/// that wrote it in a straight read of the function (compilers set an argument up just before its call); `None`
/// when `call` is not where an instruction starts.
#[cfg(target_arch = "x86_64")]
fn second_argument(code: &[u8], start: u64, call: u64) -> Option<Vec<u32>> {
    use iced_x86::{Decoder, DecoderOptions, InstructionInfoFactory, Mnemonic, OpKind, Register};
    let mut decoder = Decoder::with_ip(64, code, start, DecoderOptions::NONE);
    let mut info = InstructionInfoFactory::new();
    // What each general register is known to hold, by its full 64-bit name.
    let mut known: Vec<(Register, Vec<u64>)> = Vec::new();
    while decoder.can_decode() {
        let insn = decoder.decode();
        if insn.is_invalid() {
            return None;
        }
        if insn.ip() == call {
            return Some(
                known_values(&known, Register::RSI)
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|v| u32::try_from(v).ok())
                    .collect(),
            );
        }
        if insn.ip() > call {
            return None;
        }
        let dst = (insn.op_count() > 0 && insn.op0_kind() == OpKind::Register)
            .then(|| insn.op0_register());
        let value = dst.and_then(|d| value_written(&insn, d, &known));
        let written: Vec<Register> = info
            .info(&insn)
            .used_registers()
            .iter()
            .filter(|u| {
                matches!(
                    u.access(),
                    iced_x86::OpAccess::Write
                        | iced_x86::OpAccess::CondWrite
                        | iced_x86::OpAccess::ReadWrite
                        | iced_x86::OpAccess::ReadCondWrite
                )
            })
            .map(|u| u.register().full_register())
            .collect();
        known.retain(|(r, _)| !written.contains(r));
        if let (Some(d), Some(mut vals)) = (dst, value) {
            vals.sort_unstable();
            vals.dedup();
            if vals.len() <= 4 {
                known.push((d.full_register(), vals));
            }
        }
        // A call leaves the caller-saved registers unknown (iced lists none as written).
        if insn.mnemonic() == Mnemonic::Call {
            known.retain(|(r, _)| {
                matches!(
                    r,
                    Register::RBX
                        | Register::RBP
                        | Register::R12
                        | Register::R13
                        | Register::R14
                        | Register::R15
                )
            });
        }
    }
    None
}

/// What `insn`, which writes `dst`, leaves in it, where `known` says what the registers it reads hold: a few
/// values, or `None` when not known. A 32-bit result clears the register's upper half.
#[cfg(target_arch = "x86_64")]
fn value_written(
    insn: &iced_x86::Instruction,
    dst: iced_x86::Register,
    known: &[(iced_x86::Register, Vec<u64>)],
) -> Option<Vec<u64>> {
    use iced_x86::{Mnemonic, OpKind, Register};
    let get = |r: Register| known_values(known, r);
    let src_imm = (insn.op_count() > 1
        && matches!(
            insn.op1_kind(),
            OpKind::Immediate8 | OpKind::Immediate32 | OpKind::Immediate8to32
        ))
    .then(|| insn.immediate(1) & 0xffff_ffff);
    let same_regs =
        insn.op_count() == 2 && insn.op1_kind() == OpKind::Register && dst == insn.op1_register();
    match (insn.mnemonic(), Some(dst)) {
        (Mnemonic::Mov, Some(d)) if d.is_gpr32() => match src_imm {
            Some(v) => Some(vec![v]),
            None if insn.op1_kind() == OpKind::Register => get(insn.op1_register()),
            None => None,
        },
        (Mnemonic::Xor | Mnemonic::Sub, Some(d)) if d.is_gpr32() && same_regs => Some(vec![0]),
        (Mnemonic::Sbb, Some(d)) if d.is_gpr32() && same_regs => Some(vec![0, 0xffff_ffff]),
        (Mnemonic::And | Mnemonic::Add | Mnemonic::Or, Some(d)) if d.is_gpr32() => {
            match (get(d), src_imm) {
                (Some(vals), Some(imm)) => Some(
                    vals.into_iter()
                        .map(|v| {
                            (match insn.mnemonic() {
                                Mnemonic::And => v & imm,
                                Mnemonic::Or => v | imm,
                                _ => v.wrapping_add(imm),
                            }) & 0xffff_ffff
                        })
                        .collect(),
                ),
                _ => None,
            }
        }
        // setne sil: the low byte 0 or 1 over what the register held.
        (m, Some(d)) if d.is_gpr8() && format!("{m:?}").starts_with("Set") => get(d).map(|vals| {
            vals.into_iter()
                .flat_map(|v| [v & !0xff, (v & !0xff) | 1])
                .collect()
        }),
        // lea esi, [rsi+rsi*2+3]
        (Mnemonic::Lea, Some(d)) if d.is_gpr32() => {
            let base = insn.memory_base();
            let index = insn.memory_index();
            match get(base) {
                Some(vals) if base == index.full_register() || index == Register::None => Some(
                    vals.into_iter()
                        .map(|v| {
                            let scaled = if index == Register::None {
                                0
                            } else {
                                v.wrapping_mul(u64::from(insn.memory_index_scale()))
                            };
                            v.wrapping_add(scaled)
                                .wrapping_add(insn.memory_displacement64())
                                & 0xffff_ffff
                        })
                        .collect(),
                ),
                _ => None,
            }
        }
        // cmovne esi, eax: either.
        (m, Some(d)) if d.is_gpr32() && format!("{m:?}").starts_with("Cmov") => {
            match (get(d), get(insn.op1_register())) {
                (Some(mut a), Some(b)) => {
                    a.extend(b);
                    Some(a)
                }
                _ => None,
            }
        }
        _ => None,
    }
}

/// What `known` says register `r` (or the full register it is part of) holds.
#[cfg(target_arch = "x86_64")]
fn known_values(
    known: &[(iced_x86::Register, Vec<u64>)],
    r: iced_x86::Register,
) -> Option<Vec<u64>> {
    known
        .iter()
        .find(|(k, _)| *k == r.full_register())
        .map(|(_, v)| v.clone())
}

#[cfg(not(target_arch = "x86_64"))]
fn second_argument(_code: &[u8], _start: u64, _call: u64) -> Option<Vec<u32>> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(code: &[u8]) -> Option<Vec<u32>> {
        // The call is the code's last 5 bytes.
        second_argument(code, 0x1000, 0x1000 + code.len() as u64 - 5)
    }

    #[test]
    fn the_second_argument_s_values_come_from_the_instructions_before_the_call() {
        // mov esi, 2; call
        assert_eq!(values(&[0xbe, 2, 0, 0, 0, 0xe8, 0, 0, 0, 0]), Some(vec![2]));
        // MariaDB's lock_wait: sbb esi, esi; and esi, -3; add esi, 6; call → 6 or 3.
        assert_eq!(
            values(&[0x19, 0xf6, 0x83, 0xe6, 0xfd, 0x83, 0xc6, 0x06, 0xe8, 0, 0, 0, 0]),
            Some(vec![3, 6])
        );
        // MySQL's lock_wait_suspend_thread: xor esi, esi; cmp r8d, 0x20; setne sil; lea esi, [rsi+rsi*2+3]; call.
        assert_eq!(
            values(&[
                0x31, 0xf6, 0x41, 0x83, 0xf8, 0x20, 0x40, 0x0f, 0x95, 0xc6, 0x8d, 0x74, 0x76, 0x03,
                0xe8, 0, 0, 0, 0
            ]),
            Some(vec![3, 6])
        );
        // mov esi, 9; call other; call: the first call clobbers esi.
        assert_eq!(
            values(&[0xbe, 9, 0, 0, 0, 0xe8, 0, 0, 0, 0, 0xe8, 0, 0, 0, 0]),
            Some(vec![])
        );
        // A call inside another instruction: not on a boundary.
        assert_eq!(second_argument(&[0xbe, 0xe8, 0, 0, 0, 0x90], 0, 1), None);
    }

    #[test]
    fn the_servers_calls_of_thd_wait_begin_are_found() {
        let path = Path::new("/usr/sbin/mariadbd");
        if !path.exists() {
            return;
        }
        let calls = calls_with_constant(path, "thd_wait_begin").unwrap();
        assert!(calls.len() >= 5, "{calls:?}");
        // InnoDB's lock_wait: a row lock or a table lock.
        assert!(calls.iter().any(|c| c.values == [3, 6]), "{calls:?}");
        assert!(calls.iter().any(|c| c.values == [5]), "{calls:?}");
        assert!(calls.iter().all(|c| c.function <= c.vaddr));
    }
}
