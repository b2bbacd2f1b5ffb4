/* User-stack unwinding from .eh_frame tables (src/unwind/), for binaries without frame pointers (Debian's
 * glibc, libstdc++, liburing). User space compiles each executable mapping's .eh_frame into rows sorted by
 * address and loads them into unwind_rows; unwind_mappings says which rows belong to which mapping. Where a
 * mapping has no rows (JIT code, [vdso], tables that did not fit), the unwinder follows frame pointers.
 * x86_64 only; elsewhere user stacks come from bpf_get_stack (frame pointers). */
#pragma once

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "compat.h"
#include "target.h"

/* The numbers src/unwind/ shares with this header: enums rather than #defines, so that they are in BTF, from which
 * build.rs generates `unwind::abi` (this header compiled alone); Rust writes none of them again. */
enum unwind_limits {
	MAX_USER_FRAMES = 127,
	MAX_UNWIND_MAPPINGS = 256,
	UNWIND_BUFFER_FRAMES = 128, /* a power of 2 above MAX_USER_FRAMES, for masking indexes */
	/* Return addresses whose stack slots an unwind records (unwind_buffer.slots), for the call-site cache of
	 * stack_ids.h to check that a stack seen at the same place is still the same stack. */
	RECORDED_SLOTS = 4,
	/* Binary search steps: enough for the largest range each searches. */
	MAPPING_SEARCH_STEPS = 9, /* over [0, MAX_UNWIND_MAPPINGS] */
	ROW_SEARCH_STEPS = 33,    /* over a range of __u32 row indexes */
	/* unwind_pages indexes pages of 4 KiB: an address's page is address >> UNWIND_PAGE_SHIFT. */
	UNWIND_PAGE_SHIFT = 12,
	/* The compat build: frames of a thread in a syscall unwound by address_rows (unwind_user_stack). */
	COMPAT_ROW_FRAMES = 4,
};
_Static_assert(UNWIND_BUFFER_FRAMES > MAX_USER_FRAMES && !(UNWIND_BUFFER_FRAMES & (UNWIND_BUFFER_FRAMES - 1)),
	       "frame indexes are masked with UNWIND_BUFFER_FRAMES - 1");
_Static_assert((1 << (MAPPING_SEARCH_STEPS - 1)) >= MAX_UNWIND_MAPPINGS, "mapping search too short");
_Static_assert((1ULL << (ROW_SEARCH_STEPS - 1)) >= (1ULL << 32), "row search too short");

enum unwind_kind {
	UNWIND_GAP = 0,          /* no information: frame pointers */
	UNWIND_SP = 1,           /* CFA = sp + cfa_offset */
	UNWIND_FP = 2,           /* CFA = bp + cfa_offset */
	UNWIND_PLT = 3,          /* CFA = sp + 8, + 8 more past the stub's push */
	UNWIND_END = 4,          /* outermost frame */
	UNWIND_UNSUPPORTED = 5,  /* a rule this unwinder cannot follow: frame pointers */
	UNWIND_SIGNAL = 6,       /* a signal handler's return trampoline (__restore_rt): the interrupted frame's
				  * registers are in the signal frame at sp */
};

/* Where the kernel saves the interrupted frame's registers in an x86_64 signal frame: the struct ucontext at sp
 * (past the handler's return), its uc_mcontext after uc_flags, uc_link and uc_stack; rbp, rsp and rip in struct
 * sigcontext. */
enum unwind_sigframe {
	SIGFRAME_BP = 40 + 10 * 8,
	SIGFRAME_SP = 40 + 15 * 8,
	SIGFRAME_IP = 40 + 16 * 8,
};

struct unwind_row {
	__u32 pc;          /* ELF virtual address where the row starts */
	__s32 cfa_offset;
	__s16 fp_offset;   /* caller's frame pointer at CFA + fp_offset; 0: not saved */
	__u8 kind;
	__u8 _pad;
};

struct unwind_mapping {
	__u64 start;       /* process addresses [start, end) */
	__u64 end;
	__u64 bias;        /* ELF virtual address = address - bias */
	__u32 row_start;   /* its rows: unwind_rows[row_start .. row_start + row_count) */
	__u32 row_count;
	/* Page index: for the page_count + 1 pages of 4 KiB from first_page, unwind_pages[page_start + i] is the
	 * row (relative to row_start) in force at the page's first byte; a search looks only between two. */
	__u64 first_page;
	__u32 page_start;
	__u32 page_count;
};

#ifdef __TARGET_ARCH_x86

/* Sized by user space before loading (at least 1 entry), and written by it in place (mmapped). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct unwind_row);
} unwind_rows SEC(".maps");

/* Sized by user space before loading (at least 1 entry), and written by it in place (mmapped). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, __u32);
} unwind_pages SEC(".maps");

/* A process's code, as the unwinder sees it. */
struct unwind_process {
	struct unwind_mapping mappings[MAX_UNWIND_MAPPINGS]; /* sorted by start */
	__u32 count;
	/* Unwinding on: set by user space once the tables are loaded; else frame pointers (bpf_get_stack). */
	__u32 enabled;
	/* Bumped by user space whenever tables are added: stacks kept from before may now unwind further. */
	__u32 generation;
	__u32 _pad;
};

/* The traced process's: written by user space through the mmapped .bss, count last. */
volatile struct unwind_process unwind_self;

/* With many_targets (target.h), each process's, by tgid, written whole by user space (an update replaces the
 * value at once); sized 1 by user space otherwise. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct unwind_process);
} unwind_processes SEC(".maps");

/* The code of process `tgid`, or 0 if user space gave none. */
static __always_inline struct unwind_process *unwind_process_of(__u32 tgid)
{
	if (!many_targets)
		return (struct unwind_process *)&unwind_self;
	return bpf_map_lookup_elem(&unwind_processes, &tgid);
}

/* Whether the tables of `tgid` changed since a cache stamped with `*generation` was filled; the stamp is renewed. */
static __always_inline bool unwind_changed(__u32 tgid, __u32 *generation)
{
	struct unwind_process *p = unwind_process_of(tgid);
	__u32 now = p ? *(volatile __u32 *)&p->generation : 0;
	if (*generation == now)
		return false;
	*generation = now;
	return true;
}
/* Set by user space: the leaf frame is the start of its unwind row, not the instruction itself. A thread
 * preempted or faulting leaves the CPU at any instruction; summed per stack, each instruction would be a
 * stack of its own, and tens of thousands a minute fill any table. The row start is in the same function. */
const volatile bool leaf_at_row_start = false;

struct user_unwind {
	__u64 ip;
	__u64 sp;
	__u64 bp;
	__u32 n;
	__u32 done;
	__u32 mapping;  /* the mapping of the previous frame */
	__u32 _pad;
	struct unwind_process *proc; /* the code of the task unwound */
	__u64 *ips;     /* a MAX_USER_FRAMES array in a map value */
	__u64 *slots;   /* a RECORDED_SLOTS array in a map value: where the return addresses of frames 1.. were */
	struct task_struct *task;  /* another task's stack (unwind_task_step), else 0 */
	struct stack_page *page;   /* and the page of it read last */
};

/* Per CPU: where unwinding writes, before the frames are copied into the event. The slots of the last unwind
 * stay here for its caller to read: slots[i], 0 if none, is where frame i + 1's return address was read. */
struct unwind_buffer {
	__u64 ips[UNWIND_BUFFER_FRAMES];
	__u64 slots[RECORDED_SLOTS];
};
_Static_assert(!(RECORDED_SLOTS & (RECORDED_SLOTS - 1)), "slot indexes are masked with RECORDED_SLOTS - 1");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct unwind_buffer);
} unwind_buffers SEC(".maps");

/* Another task's stack is read a page at a time: bpf_copy_from_user_task walks the page tables and pins the page
 * for each read, and an unwind reads two or three words a frame from a few pages. Per CPU, the page an unwind read
 * last (forgotten as the next begins). */
struct stack_page {
	__u64 at; /* the page's address; 0: none */
	__u64 words[(1 << UNWIND_PAGE_SHIFT) / 8];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct stack_page);
} stack_pages SEC(".maps");

/* The compat build's rows, by the exact address they were asked for (a syscall's return site, a return address):
 * with no bpf_loop to search the tables, its unwinder looks up the first frames of a thread in a syscall here, and
 * asks user space for the rows it lacks in wanted_rows, which user space empties into address_rows as tracing
 * goes (a row of kind UNWIND_GAP: none). Sized 1 by user space in the normal build, which does not use them. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, struct unwind_row);
} address_rows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, __u64);
	__type(value, __u8);
} wanted_rows SEC(".maps");

#ifndef MYPROBE_COMPAT

/* Binary searches run as bpf_loop callbacks: verified once, not once per iteration and path. */
struct unwind_search {
	struct unwind_process *proc; /* mappings: whose */
	__u64 target;
	__u32 lo;
	__u32 hi;
	__u32 first;   /* rows: index of the first row searched */
};

static long mapping_search_step(__u64 step __attribute__((unused)), struct unwind_search *c)
{
	if (c->lo >= c->hi)
		return 1;
	__u32 mid = (c->lo + c->hi) / 2;
	if (mid >= MAX_UNWIND_MAPPINGS)
		return 1;
	if (c->proc->mappings[mid].start <= c->target)
		c->lo = mid + 1;
	else
		c->hi = mid;
	return 0;
}

static __always_inline int find_unwind_mapping(struct unwind_process *p, __u64 ip, __u32 last)
{
	/* Most frames are in the same binary as the one before. */
	if (last < MAX_UNWIND_MAPPINGS && p->mappings[last].start <= ip && ip < p->mappings[last].end)
		return last;
	__u32 count = *(volatile __u32 *)&p->count;
	if (count > MAX_UNWIND_MAPPINGS)
		count = MAX_UNWIND_MAPPINGS;
	struct unwind_search c = { .proc = p, .target = ip, .lo = 0, .hi = count };
	bpf_loop(MAPPING_SEARCH_STEPS, mapping_search_step, &c, 0);
	if (c.lo == 0 || c.lo > MAX_UNWIND_MAPPINGS)
		return -1;
	__u32 m = c.lo - 1;
	if (m >= MAX_UNWIND_MAPPINGS || ip >= p->mappings[m].end)
		return -1;
	return m;
}

static long row_search_step(__u64 step __attribute__((unused)), struct unwind_search *c)
{
	if (c->lo >= c->hi)
		return 1;
	__u32 mid = (c->lo + c->hi) / 2;
	__u32 key = c->first + mid;
	struct unwind_row *r = bpf_map_lookup_elem(&unwind_rows, &key);
	if (!r) {
		c->lo = 0;
		return 1;
	}
	if (r->pc <= c->target)
		c->lo = mid + 1;
	else
		c->hi = mid;
	return 0;
}

static __always_inline __s64 page_row(__u32 index)
{
	__u32 *row = bpf_map_lookup_elem(&unwind_pages, &index);
	return row ? *row : -1;
}

/* The row of mapping m that holds vaddr, or 0. */
static __always_inline struct unwind_row *find_unwind_row(struct unwind_mapping *m, __u64 vaddr)
{
	__u64 page = (vaddr >> UNWIND_PAGE_SHIFT) - m->first_page;
	if ((vaddr >> UNWIND_PAGE_SHIFT) < m->first_page || page >= m->page_count)
		return 0;
	__s64 lo = page_row(m->page_start + page);
	__s64 hi = page_row(m->page_start + page + 1);
	if (lo < 0 || hi < lo || hi >= m->row_count)
		return 0;
	struct unwind_search c = { .target = vaddr, .lo = lo, .hi = hi + 1, .first = m->row_start };
	bpf_loop(ROW_SEARCH_STEPS, row_search_step, &c, 0);
	if (c.lo <= lo)
		return 0;
	__u32 key = m->row_start + c.lo - 1;
	return bpf_map_lookup_elem(&unwind_rows, &key);
}

/* How to find the caller of the frame at an address: the rule of the row that holds it. */
struct unwind_rule {
	__u64 row_start;   /* the process address where the row starts */
	__s32 cfa_offset;
	__s16 fp_offset;
	__u8 kind;         /* UNWIND_GAP where no row holds the address */
	__u8 _pad;
	__u32 mapping;     /* in: the mapping of the frame before (a hint); out: the address's */
	__u32 _pad2;
};

/* The rule for pc in the code of p, into *r; 1 if a row holds pc. A global function: the verifier checks it once,
 * on its own, where the searches inlined in the unwinder's step were checked again for every path that reached
 * them. */
__noinline int unwind_rule_of(struct unwind_process *p, __u64 pc, struct unwind_rule *r)
{
	if (!r)
		return 0;
	r->kind = UNWIND_GAP;
	r->cfa_offset = 0;
	r->fp_offset = 0;
	r->row_start = pc;
	if (!p)
		return 0;
	int m = find_unwind_mapping(p, pc, r->mapping);
	if (m < 0 || m >= MAX_UNWIND_MAPPINGS)
		return 0;
	r->mapping = m;
	__u64 bias = p->mappings[m].bias;
	struct unwind_row *row = p->mappings[m].row_count ? find_unwind_row(&p->mappings[m], pc - bias) : 0;
	if (!row)
		return 0;
	r->row_start = row->pc + bias;
	r->cfa_offset = row->cfa_offset;
	r->fp_offset = row->fp_offset;
	r->kind = row->kind;
	return 1;
}

/* Reads the user memory of the current task, or (other_task, a constant) of s->task: bpf_copy_from_user_task is
 * for sleepable programs only, so the two are separate callbacks. */
static __always_inline long read_user(__u64 *dst, __u64 ptr, struct user_unwind *s, bool other_task)
{
	if (!other_task)
		return bpf_probe_read_user(dst, sizeof(*dst), (void *)ptr);
	struct stack_page *page = s->page;
	if (!page)
		return bpf_copy_from_user_task(dst, sizeof(*dst), (void *)ptr, s->task, 0);
	/* The words a stack holds are aligned, each within a page: read from the page, read whole first (a page
	 * that cannot be read whole holds no word that can). */
	__u64 at = ptr & ~((1ULL << UNWIND_PAGE_SHIFT) - 1);
	if (ptr & 7)
		return -1;
	if (page->at != at) {
		page->at = 0;
		if (bpf_copy_from_user_task(page->words, sizeof(page->words), (void *)at, s->task, 0))
			return -1;
		page->at = at;
	}
	*dst = page->words[((ptr - at) / 8) & ((1 << UNWIND_PAGE_SHIFT) / 8 - 1)];
	return 0;
}

/* index's slot, masked where the verifier sees it: after `index < RECORDED_SLOTS` the compiler drops a mask it
 * proves void, and may reload index from the stack, where verifiers before 6.3 or so lose its bounds. */
static __always_inline __u64 slot_of(__u64 index)
{
	barrier_var(index);
	return index & (RECORDED_SLOTS - 1);
}

static __always_inline long unwind_step_of(__u64 index, struct user_unwind *s, bool other_task)
{
	/* index, not a count kept in s: the verifier checks a callback until its state stops changing, and a count
	 * that it tracks exactly changes at every frame. */
	if (s->done || index >= MAX_USER_FRAMES)
		return 1;
	s->ips[index & (UNWIND_BUFFER_FRAMES - 1)] = s->ip;
	s->n = index + 1;

	/* A return address points after its call, which may be the last instruction of the function. */
	__u64 pc = index ? s->ip - 1 : s->ip;
	__u64 cfa = 0, ra = 0, bp = s->bp;
	struct unwind_rule rule = { .mapping = s->mapping };
	bool found = unwind_rule_of(s->proc, pc, &rule);
	s->mapping = rule.mapping;
	if (!index && found && leaf_at_row_start)
		s->ips[0] = rule.row_start;

	__u8 kind = rule.kind;
	switch (kind) {
	case UNWIND_END:
		s->done = 1;
		return 1;
	case UNWIND_SP:
		cfa = s->sp + rule.cfa_offset;
		break;
	case UNWIND_FP:
		cfa = s->bp + rule.cfa_offset;
		break;
	case UNWIND_PLT:
		cfa = s->sp + 8 + (((s->ip & 15) >= 11) ? 8 : 0);
		break;
	case UNWIND_SIGNAL:
		/* Named by the trampoline's own address: its FDE starts a byte before it, where the return address
		 * minus 1 falls, and no symbol does. */
		s->ips[index & (UNWIND_BUFFER_FRAMES - 1)] = s->ip + 1;
		if (read_user(&ra, s->sp + SIGFRAME_IP, s, other_task) || ra == 0 ||
		    read_user(&cfa, s->sp + SIGFRAME_SP, s, other_task) ||
		    read_user(&bp, s->sp + SIGFRAME_BP, s, other_task)) {
			s->done = 1;
			return 1;
		}
		if (index < RECORDED_SLOTS)
			s->slots[slot_of(index)] = s->sp + SIGFRAME_IP;
		s->ip = ra;
		s->sp = cfa;
		s->bp = bp;
		return 0;
	default:
		/* frame pointers: [bp] is the caller's bp, [bp + 8] the return address */
		if (!s->bp) {
			s->done = 1;
			return 1;
		}
		cfa = s->bp + 16;
		if (read_user(&bp, s->bp, s, other_task)) {
			s->done = 1;
			return 1;
		}
		break;
	}
	if (read_user(&ra, cfa - 8, s, other_task) || ra == 0) {
		s->done = 1;
		return 1;
	}
	if (index < RECORDED_SLOTS)
		s->slots[slot_of(index)] = cfa - 8;
	if ((kind == UNWIND_SP || kind == UNWIND_FP || kind == UNWIND_PLT) && rule.fp_offset) {
		if (read_user(&bp, cfa + rule.fp_offset, s, other_task))
			bp = 0;
	}
	s->ip = ra;
	s->sp = cfa;
	s->bp = bp;
	return 0;
}

static long unwind_step(__u64 index, struct user_unwind *s)
{
	return unwind_step_of(index, s, false);
}

/* Unwinds from regs into ips with `step`; returns the number of frames, or -1. */
static __always_inline long unwind_from(struct pt_regs *regs, struct task_struct *task, struct unwind_process *p,
					void *step, __u64 *ips)
{
	__u32 zero = 0;
	struct unwind_buffer *buf = bpf_map_lookup_elem(&unwind_buffers, &zero);
	if (!buf)
		return -1;
	struct user_unwind s = {
		.ip = PT_REGS_IP(regs),
		.sp = PT_REGS_SP(regs),
		.bp = PT_REGS_FP(regs),
		.mapping = MAX_UNWIND_MAPPINGS,
		.ips = buf->ips,
		.slots = buf->slots,
		.task = task,
		.proc = p,
	};
	__builtin_memset(buf->slots, 0, sizeof(buf->slots));
	if (!s.ip)
		return -1;
	if (task) {
		s.page = bpf_map_lookup_elem(&stack_pages, &zero);
		if (s.page)
			s.page->at = 0;
	}
	bpf_loop(MAX_USER_FRAMES, step, &s, 0);
	__u32 n = s.n;
	if (n > MAX_USER_FRAMES)
		n = MAX_USER_FRAMES;
	if (n && bpf_probe_read_kernel(ips, n * sizeof(__u64), buf->ips))
		return -1;
	return n;
}

/* Unwinds the current task's user stack from the registers it entered the kernel with, into ips;
 * returns the number of frames, or -1 if unwinding is off or impossible (the caller uses frame pointers). */
static __always_inline long unwind_user_stack(__u64 *ips)
{
	struct unwind_process *p = unwind_process_of(bpf_get_current_pid_tgid() >> 32);
	if (!p || !*(volatile __u32 *)&p->enabled)
		return -1;
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
	return regs ? unwind_from(regs, 0, p, unwind_step, ips) : -1;
}

/* The stack slots of the current CPU's last unwind (unwind_buffer.slots), or 0. */
static __always_inline __u64 *last_unwind_slots(void)
{
	__u32 zero = 0;
	struct unwind_buffer *buf = bpf_map_lookup_elem(&unwind_buffers, &zero);
	return buf ? buf->slots : 0;
}

static long unwind_task_step(__u64 index, struct user_unwind *s)
{
	return unwind_step_of(index, s, true);
}

/* Unwinds the user stack of another task, stopped in the kernel (from the registers it entered it with):
 * from the tables where loaded, else by frame pointers. Sleepable programs only. */
static __always_inline long unwind_task_user_stack(struct task_struct *task, __u64 *ips)
{
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
	struct unwind_process *p = unwind_process_of(task->tgid);
	if (p && !*(volatile __u32 *)&p->enabled)
		p = 0;
	return regs ? unwind_from(regs, task, p, unwind_task_step, ips) : -1;
}

#else /* MYPROBE_COMPAT: no bpf_loop to search the tables */

/* COMPAT_ROW_FRAMES: frames of a thread in a syscall unwound by address_rows before frame pointers take over: the
 * C library's functions between a syscall and the code that called them have no frame pointers (Debian's glibc),
 * and a wait there (a futex, a poll) would keep only its leaf, the frame pointer being another register there. */

/* The row of the instruction at pc, from address_rows; asked of user space when it is not there yet. */
static __always_inline struct unwind_row *address_row(__u64 pc)
{
	struct unwind_row *row = bpf_map_lookup_elem(&address_rows, &pc);
	if (!row) {
		__u8 one = 1;
		bpf_map_update_elem(&wanted_rows, &pc, &one, BPF_NOEXIST);
	}
	return row;
}

/* The current thread's user stack into ips: in a syscall, its first frames by address_rows; then by frame
 * pointers, and by address_rows again where those fail. */
static __always_inline long unwind_user_stack(__u64 *ips)
{
	if (!unwind_self.enabled)
		return -1;
	struct pt_regs *regs = task_regs(current_task());
	if (!regs)
		return -1;
	/* Out of a syscall (a sample, a preemption), the leaf is any instruction: no row is asked for it. */
	int row_frames = (long)BPF_CORE_READ(regs, orig_ax) >= 0 ? COMPAT_ROW_FRAMES : 0;
	__u32 zero = 0;
	struct unwind_buffer *buf = bpf_map_lookup_elem(&unwind_buffers, &zero);
	if (!buf)
		return -1;
	__u64 ip = PT_REGS_IP_CORE(regs), sp = PT_REGS_SP_CORE(regs), bp = PT_REGS_FP_CORE(regs);
	__u32 n = 0;
	for (int i = 0; i < MAX_USER_FRAMES && ip; i++) {
		buf->ips[i & (UNWIND_BUFFER_FRAMES - 1)] = ip;
		n = i + 1;
		/* A return address points after its call, which may be the last instruction of the function. */
		__u64 pc = i ? ip - 1 : ip;
		struct unwind_row *row = i < row_frames ? address_row(pc) : 0;
		__u8 kind = row ? row->kind : UNWIND_GAP;
		if (kind == UNWIND_END)
			break;
		if (kind != UNWIND_SP && kind != UNWIND_FP && kind != UNWIND_PLT) {
			/* frame pointers: [bp] is the caller's bp, [bp + 8] the return address, read at once */
			__u64 frame[2];
			if (bp && !bpf_probe_read_user(frame, sizeof(frame), (void *)bp) && frame[1]) {
				ip = frame[1];
				sp = bp + 16;
				bp = frame[0];
				continue;
			}
			/* None here (a library built without them, as libstdc++'s thread start): its row, if known. */
			row = i < row_frames || !i ? 0 : address_row(pc);
			kind = row ? row->kind : UNWIND_GAP;
			if (kind != UNWIND_SP && kind != UNWIND_FP && kind != UNWIND_PLT)
				break;
		}
		if (!row)
			break;
		__u64 cfa = kind == UNWIND_SP ? sp + row->cfa_offset :
			    kind == UNWIND_FP ? bp + row->cfa_offset :
						sp + 8 + (((ip & 15) >= 11) ? 8 : 0);
		__u64 ra = 0, next_bp = bp;
		if (bpf_probe_read_user(&ra, sizeof(ra), (void *)(cfa - 8)) || !ra)
			break;
		if (row->fp_offset && bpf_probe_read_user(&next_bp, sizeof(next_bp), (void *)(cfa + row->fp_offset)))
			next_bp = 0;
		ip = ra;
		sp = cfa;
		bp = next_bp;
	}
	if (n > MAX_USER_FRAMES)
		n = MAX_USER_FRAMES;
	if (n && bpf_probe_read_kernel(ips, n * sizeof(__u64), buf->ips))
		return -1;
	return n;
}

static __always_inline long unwind_task_user_stack(struct task_struct *task __attribute__((unused)),
						   __u64 *ips __attribute__((unused)))
{
	return -1;
}

static __always_inline __u64 *last_unwind_slots(void)
{
	return 0;
}

#endif /* MYPROBE_COMPAT */

#else

static __always_inline long unwind_user_stack(__u64 *ips)
{
	return -1;
}

static __always_inline long unwind_task_user_stack(struct task_struct *task, __u64 *ips)
{
	return -1;
}

static __always_inline __u64 *last_unwind_slots(void)
{
	return 0;
}

const volatile bool leaf_at_row_start = false;

static __always_inline bool unwind_changed(__u32 tgid, __u32 *generation)
{
	return false;
}

#endif
