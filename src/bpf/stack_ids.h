/* Stack ids: a stack is unwound (unwind.h), named by a hash of its frames, and sent to user space once (a
 * stack_event), so that collectors sum amounts per id in the kernel. A per-thread table of recent call sites
 * (an address, the stack and frame pointers) gives the id of a stack seen before without unwinding it again. */
#pragma once

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <asm-generic/errno-base.h>
#include "compat.h"
#include "lost.h"
#include "ringbuf.h"
#include "stack_event.h"

#define MAX_STACKS 32768

/* Ids already sent to user space. Least recently used ones make room: a stack forgotten here is sent again
 * when next seen (user space keeps every definition), where a full table left its amounts undefined. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_STACKS);
	__type(key, __u64);
	__type(value, __u8);
} known_stacks SEC(".maps");

/* A thread allocates from dozens of call sites per statement: a table of 8 recent sites hit 25% of the time
 * under sysbench, one of 128 (32 sets of 4, chosen by a hash of the site) 99.9%. */
#define SITE_SET_BITS 5
#define SITE_SETS (1 << SITE_SET_BITS)
#define SITE_WAYS 4

/* A site is the same place (address, stack and frame pointers) but not always the same stack: two callers
 * at the same depth reach a function with the same registers. So a site also keeps where its first return
 * addresses were on the stack, from sp, and a hash of them, and a hit reads them again. */
#define NO_SLOT 0xffffffffu

struct call_site {
	__u64 at;
	__u64 sp;
	__u64 bp;
	__u64 stack_id;
	__u64 ra_hash;
	__u32 slot_off[RECORDED_SLOTS];  /* NO_SLOT from the first not recorded */
};

struct thread_sites {
	struct call_site slot[SITE_SETS][SITE_WAYS];
	__u32 next;
	__u32 generation;
};

/* Task storage: found from the task without a hash lookup, freed with the thread or the map. Unused by the
 * compat build, which unwinds every stack (frame pointers cost less than a lookup there). */
struct {
	THREAD_STORAGE(struct thread_sites, 1);
} sites SEC(".maps");

/* FNV-1a of the frames; neither half is ever 0 (0 means "no stack", and a record whose first word is 0 is not
 * a stack: queries.h). */
static __always_inline __u64 stack_hash(const struct stack_event *e)
{
	__u32 n = e->user_len + e->kernel_len;
	__u64 h = 0xcbf29ce484222325ULL;
	for (__u32 i = 0; i < MAX_FRAMES; i++) {
		if (i >= n)
			break;
		h = (h ^ e->ips[i]) * 0x100000001b3ULL;
	}
	return h | 0x100000001ULL;
}

/* The current thread's stack, unwound into the scratch event and named; 0 if there is no scratch. */
static __always_inline struct stack_event *stack_event_now(void *ctx)
{
	__u32 zero = 0;
	struct stack_event *e = bpf_map_lookup_elem(&scratch, &zero);
	if (!e)
		return 0;
	capture_stacks(ctx, e);
	e->stack_id = stack_hash(e);
	e->tid = (__u32)bpf_get_current_pid_tgid();
	return e;
}

/* The stack from a site's first slot to its last, read at once when it is this short: one read instead of one
 * per slot (each read costs about as much as the lookups of a hit together). */
#define RA_WINDOW 512

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u8[2 * RA_WINDOW]); /* room for the masks that show the verifier the bounds */
} ra_window SEC(".maps");

/* The hash of the return addresses at the site's slots, as they are now; 0 if one cannot be read. */
static __always_inline __u64 return_addresses_hash(__u64 sp, const __u32 *slot_off)
{
	__u64 h = 0xcbf29ce484222325ULL;
	__u32 first = slot_off[0], last = first;
	for (int i = 1; i < RECORDED_SLOTS; i++) {
		if (slot_off[i] == NO_SLOT)
			break;
		last = slot_off[i];
	}
	__u32 zero = 0;
	__u8 *win = first != NO_SLOT && last >= first && last - first <= RA_WINDOW - 8 ?
			    bpf_map_lookup_elem(&ra_window, &zero) :
			    0;
	if (win) {
		/* Masked after a barrier: the compiler drops a mask it can prove idle, the verifier needs it. */
		__u32 len = last - first + 8;
		barrier_var(len);
		len &= 2 * RA_WINDOW - 1;
		if (bpf_probe_read_user(win, len, (void *)(sp + first)))
			return 0;
		for (int i = 0; i < RECORDED_SLOTS; i++) {
			if (slot_off[i] == NO_SLOT)
				break;
			__u32 at = slot_off[i] - first;
			barrier_var(at);
			at &= RA_WINDOW - 1;
			__u64 ra;
			__builtin_memcpy(&ra, win + at, sizeof(ra));
			h = (h ^ ra) * 0x100000001b3ULL;
		}
		return h | 1;
	}
	for (int i = 0; i < RECORDED_SLOTS; i++) {
		if (slot_off[i] == NO_SLOT)
			break;
		__u64 ra;
		if (bpf_probe_read_user(&ra, sizeof(ra), (void *)(sp + slot_off[i])))
			return 0;
		h = (h ^ ra) * 0x100000001b3ULL;
	}
	return h | 1;
}

/* The id of the stack in `e` (named), sent to user space the first time. */
static __always_inline __u64 define_stack(struct stack_event *e)
{
	/* Most stacks are known: a lookup takes no lock, a failing insert takes the bucket's. */
	if (bpf_map_lookup_elem(&known_stacks, &e->stack_id))
		return e->stack_id;
	__u8 one = 1;
	long err = bpf_map_update_elem(&known_stacks, &e->stack_id, &one, BPF_NOEXIST);
	if (!err)
		submit_event(e, stack_event_size(e));
	else if (err != -EEXIST)
		count_lost(state); /* no room even in the LRU: the amounts of this stack are counted, never defined */
	return e->stack_id;
}

/* Unwinds the current stack and returns its id (never 0), sending it to user space the first time. */
static __always_inline __u64 stack_id_now(void *ctx)
{
	struct stack_event *e = stack_event_now(ctx);
	return e ? define_stack(e) : 0;
}

/* The root of a stack of one frame, its leaf (user space names it): where a preempted thread was, when its
 * site was new. Not an address of user space. */
#define LEAF_ONLY_ROOT 0xfffffffffffffff0ULL

/* The id of the stack [ip, LEAF_ONLY_ROOT] of thread `tid`: from any context, nothing unwound. */
static __always_inline __u64 leaf_only_stack_id(__u64 ip, __u32 tid)
{
	__u32 zero = 0;
	struct stack_event *e = bpf_map_lookup_elem(&scratch, &zero);
	if (!e)
		return 0;
	e->ips[0] = ip;
	e->ips[1] = LEAF_ONLY_ROOT;
	e->user_len = 2;
	e->kernel_len = 0;
	e->tid = tid;
	e->statement = 0;
	e->connection = 0;
	e->stack_id = stack_hash(e);
	return define_stack(e);
}

/* The id of the current stack, from the thread's call sites when it was seen before. The site is the return
 * address on top of the stack (at a function's entry: `at_entry`) or the user instruction pointer (in a
 * syscall), with the stack and frame pointers. A new site is unwound, or with `only_known` left: 0. */
static __always_inline __u64 call_site_stack_id(void *ctx, bool at_entry, bool only_known)
{
#ifdef MYPROBE_COMPAT
	(void)at_entry;
	return only_known ? 0 : stack_id_now(ctx);
#else
	struct task_struct *task = bpf_get_current_task_btf();
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
	struct thread_sites *t = bpf_task_storage_get(&sites, task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!regs || !t || kernel_stacks)
		return only_known ? 0 : stack_id_now(ctx);
	if (unwind_changed(task->tgid, &t->generation)) {
		for (int i = 0; i < SITE_SETS; i++)
			for (int j = 0; j < SITE_WAYS; j++)
				t->slot[i][j].stack_id = 0;
	}
	__u64 sp = PT_REGS_SP(regs), bp = PT_REGS_FP(regs), at = PT_REGS_IP(regs);
	if (at_entry && bpf_probe_read_user(&at, sizeof(at), (void *)sp))
		return only_known ? 0 : stack_id_now(ctx);
	__u64 mix = (at ^ (sp >> 4)) * 0x9e3779b97f4a7c15ULL;
	struct call_site *set = t->slot[mix >> (64 - SITE_SET_BITS)];
	for (int i = 0; i < SITE_WAYS; i++) {
		struct call_site *c = &set[i];
		if (c->stack_id && c->at == at && c->sp == sp && c->bp == bp &&
		    return_addresses_hash(sp, c->slot_off) == c->ra_hash)
			return c->stack_id;
	}
	if (only_known)
		return 0;
	/* The unwind below records its slots; none are left from another when it falls back to frame pointers. */
	__u64 *slots = last_unwind_slots();
	if (slots)
		__builtin_memset(slots, 0, RECORDED_SLOTS * sizeof(__u64));
	__u64 id = stack_id_now(ctx);
	struct call_site *c = &set[t->next++ % SITE_WAYS];
	c->at = at;
	c->sp = sp;
	c->bp = bp;
	bool recorded = slots != 0;
	for (int i = 0; i < RECORDED_SLOTS; i++) {
		recorded = recorded && slots[i] >= sp && slots[i] - sp < NO_SLOT;
		c->slot_off[i] = recorded ? slots[i] - sp : NO_SLOT;
	}
	c->ra_hash = return_addresses_hash(sp, c->slot_off);
	c->stack_id = c->ra_hash ? id : 0;
	return id;
#endif
}

static __always_inline __u64 stack_id_of_call(void *ctx, bool at_entry)
{
	return call_site_stack_id(ctx, at_entry, false);
}
