//! The BPF unwinder (src/bpf/unwind.h) replayed in Rust over a process's [`Tables`], step for step, so that the
//! tables and the walk can be tested without a kernel, and unwind the threads of a core file
//! ([`crate::stacks::core_file::Core`]) as the kernel would have unwound them.

use super::{
    abi::{unwind_limits as limits, unwind_sigframe as sigframe},
    table::Kind,
    BpfMapping, BpfRow, Tables,
};

/// MAX_UNWIND_MAPPINGS of unwind.h: the BPF side holds only the first ones.
const MAX_UNWIND_MAPPINGS: usize = limits::MAX_UNWIND_MAPPINGS.0 as usize;
/// MAPPING_SEARCH_STEPS and ROW_SEARCH_STEPS of unwind.h.
const MAPPING_SEARCH_STEPS: u32 = limits::MAPPING_SEARCH_STEPS.0;
const ROW_SEARCH_STEPS: u32 = limits::ROW_SEARCH_STEPS.0;
/// SIGFRAME_BP, SIGFRAME_SP and SIGFRAME_IP of unwind.h: the interrupted frame's registers in a signal frame.
const SIGFRAME_BP: u64 = sigframe::SIGFRAME_BP.0 as u64;
const SIGFRAME_SP: u64 = sigframe::SIGFRAME_SP.0 as u64;
const SIGFRAME_IP: u64 = sigframe::SIGFRAME_IP.0 as u64;
/// MAX_USER_FRAMES of unwind.h.
pub const MAX_USER_FRAMES: usize = limits::MAX_USER_FRAMES.0 as usize;
/// unwind.h's pages of the page index: an address's page is `address >> PAGE_SHIFT`.
const PAGE_SHIFT: u32 = limits::UNWIND_PAGE_SHIFT.0;

/// The registers an unwind starts from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Registers {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
}

/// `struct user_unwind` of unwind.h.
struct State {
    ip: u64,
    sp: u64,
    bp: u64,
    done: bool,
    mapping: usize,
    ips: Vec<u64>,
}

/// `unwind_from` of unwind.h: the frames (instruction pointer, then return addresses) from `regs`, reading
/// the stack with `read`; at most `max_frames` (MAX_USER_FRAMES in BPF).
pub fn unwind(
    tables: Tables<'_>,
    regs: Registers,
    read: impl Fn(u64) -> Option<u64>,
    max_frames: usize,
) -> Vec<u64> {
    if regs.ip == 0 {
        return Vec::new();
    }
    let mut s = State {
        ip: regs.ip,
        sp: regs.sp,
        bp: regs.bp,
        done: false,
        mapping: MAX_UNWIND_MAPPINGS,
        ips: Vec::new(),
    };
    for index in 0..max_frames {
        if step(tables, index, &mut s, &read, max_frames) {
            break;
        }
    }
    s.ips
}

/// `unwind_step_of` of unwind.h; true to stop.
fn step(
    t: Tables<'_>,
    index: usize,
    s: &mut State,
    read: &impl Fn(u64) -> Option<u64>,
    max_frames: usize,
) -> bool {
    if s.done || s.ips.len() >= max_frames {
        return true;
    }
    s.ips.push(s.ip);

    let pc = if index != 0 {
        s.ip.wrapping_sub(1)
    } else {
        s.ip
    };
    let mut bp = s.bp;
    let mut row = None;
    if let Some(m) = find_unwind_mapping(t.mappings, pc, s.mapping) {
        s.mapping = m;
        let m = &t.mappings[m];
        if m.row_count != 0 {
            row = find_unwind_row(t, m, pc.wrapping_sub(m.bias));
        }
    }

    const END: u8 = Kind::End as u8;
    const SP: u8 = Kind::Sp as u8;
    const FP: u8 = Kind::Fp as u8;
    const PLT: u8 = Kind::Plt as u8;
    const SIGNAL: u8 = Kind::Signal as u8;
    let kind = row.map_or(Kind::Gap as u8, |r| r.kind);
    if kind == SIGNAL {
        if let Some(last) = s.ips.last_mut() {
            *last = s.ip.wrapping_add(1);
        }
        let at = |offset: u64| read(s.sp.wrapping_add(offset));
        let (Some(ip), Some(sp), Some(bp)) = (at(SIGFRAME_IP), at(SIGFRAME_SP), at(SIGFRAME_BP))
        else {
            s.done = true;
            return true;
        };
        if ip == 0 {
            s.done = true;
            return true;
        }
        (s.ip, s.sp, s.bp) = (ip, sp, bp);
        return false;
    }
    let cfa_offset = row.map_or(0, |r| i64::from(r.cfa_offset));
    let cfa = match kind {
        END => {
            s.done = true;
            return true;
        }
        SP => s.sp.wrapping_add_signed(cfa_offset),
        FP => s.bp.wrapping_add_signed(cfa_offset),
        PLT => s.sp.wrapping_add(8 + if s.ip & 15 >= 11 { 8 } else { 0 }),
        // frame pointers: [bp] is the caller's bp, [bp + 8] the return address
        _ => {
            if s.bp == 0 {
                s.done = true;
                return true;
            }
            let Some(v) = read(s.bp) else {
                s.done = true;
                return true;
            };
            bp = v;
            s.bp.wrapping_add(16)
        }
    };
    let ra = match read(cfa.wrapping_sub(8)) {
        Some(ra) if ra != 0 => ra,
        _ => {
            s.done = true;
            return true;
        }
    };
    if let Some(r) = row.filter(|r| matches!(kind, SP | FP | PLT) && r.fp_offset != 0) {
        bp = read(cfa.wrapping_add_signed(r.fp_offset.into())).unwrap_or(0);
    }
    s.ip = ra;
    s.sp = cfa;
    s.bp = bp;
    false
}

/// The row the tables give for the instruction at `pc`, as the BPF unwinder would find it; `None` where they
/// have none (frame pointers there).
pub fn row_at(t: Tables<'_>, pc: u64) -> Option<BpfRow> {
    let m = &t.mappings[find_unwind_mapping(t.mappings, pc, MAX_UNWIND_MAPPINGS)?];
    if m.row_count == 0 {
        return None;
    }
    find_unwind_row(t, m, pc.wrapping_sub(m.bias)).copied()
}

/// `find_unwind_mapping` and `mapping_search_step` of unwind.h.
fn find_unwind_mapping(mappings: &[BpfMapping], ip: u64, last: usize) -> Option<usize> {
    if last < MAX_UNWIND_MAPPINGS {
        if let Some(m) = mappings.get(last) {
            if m.start <= ip && ip < m.end {
                return Some(last);
            }
        }
    }
    let count = mappings.len().min(MAX_UNWIND_MAPPINGS);
    let (mut lo, mut hi) = (0, count);
    for _ in 0..MAPPING_SEARCH_STEPS {
        if lo >= hi {
            break;
        }
        let mid = (lo + hi) / 2;
        if mappings[mid].start <= ip {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    if lo == 0 {
        return None;
    }
    let m = lo - 1;
    (ip < mappings[m].end).then_some(m)
}

/// `page_row` of unwind.h: unwind_pages[index], -1 past the array.
fn page_row(pages: &[u32], index: u32) -> i64 {
    pages.get(index as usize).map_or(-1, |&r| r.into())
}

/// `find_unwind_row` and `row_search_step` of unwind.h: the row of `m` that holds `vaddr`.
fn find_unwind_row<'t>(t: Tables<'t>, m: &BpfMapping, vaddr: u64) -> Option<&'t BpfRow> {
    let page = (vaddr >> PAGE_SHIFT).wrapping_sub(m.first_page);
    if (vaddr >> PAGE_SHIFT) < m.first_page || page >= m.page_count.into() {
        return None;
    }
    // The index is a __u32 in BPF.
    let lo = page_row(t.pages, (u64::from(m.page_start) + page) as u32);
    let hi = page_row(t.pages, (u64::from(m.page_start) + page + 1) as u32);
    if lo < 0 || hi < lo || hi >= m.row_count.into() {
        return None;
    }
    let (mut c_lo, mut c_hi) = (lo as u32, hi as u32 + 1);
    for _ in 0..ROW_SEARCH_STEPS {
        if c_lo >= c_hi {
            break;
        }
        let mid = ((u64::from(c_lo) + u64::from(c_hi)) / 2) as u32;
        let Some(r) = t.rows.get(m.row_start.wrapping_add(mid) as usize) else {
            c_lo = 0;
            break;
        };
        if u64::from(r.pc) <= vaddr {
            c_lo = mid + 1;
        } else {
            c_hi = mid;
        }
    }
    if i64::from(c_lo) <= lo {
        return None;
    }
    t.rows.get(m.row_start.wrapping_add(c_lo - 1) as usize)
}
