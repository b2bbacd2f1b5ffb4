// Allocations by user stack: uprobes on the C library's allocation functions (C++ `new` reaches them too)
// sum the requested size and the calls of every N-th call (`sample_every`) within [min_size, max_size] per
// stack (and, with statement_labels, statement: statement.h), in the kernel; each stack goes to user space once.
// With track_outstanding (memleak), each traced allocation is kept by address from its return until free() or
// realloc() lets it go.
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "lost.h"
#include "maps.h"
#include "session.h"
#include "stack_ids.h"
#include "statement.h"
#include "target.h"

char LICENSE[] SEC("license") = "GPL";

const volatile __u64 sample_every = 1;
const volatile __u64 min_size = 0;
const volatile __u64 max_size = ~0ULL;
/* memleak: remember each traced allocation by address until it is freed, instead of summing per stack. */
const volatile bool track_outstanding = false;

/* Calls seen per CPU, for sampling every N-th. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} calls SEC(".maps");

/* What the figures were estimated from, per CPU: the allocations traced (sampled in, within the size bounds),
 * and (memleak) the frees seen, a measure of the allocation rate where allocations are not probed. */
struct alloc_tally {
	__u64 traced;
	__u64 frees;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct alloc_tally);
} tally SEC(".maps");

struct alloc_total {
	__u64 bytes;
	__u64 calls;
};

struct alloc_key {
	__u64 stack_id;
	__u64 statement; /* statement.h's label and connection; 0 without statement_labels */
	__u64 connection;
	__u32 tid;       /* the thread whose statement it is, with a label by start; else 0 */
	__u32 _pad;
};

/* (stack, statement) → what was allocated there. Full: counted in lost.state, the call is not counted. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_STACKS);
	__type(key, struct alloc_key);
	__type(value, struct alloc_total);
} totals SEC(".maps");

#define MAX_OUTSTANDING (1 << 20)

/* The functions by their arguments: the attach cookie of each probe (src/collect/alloc.rs: FUNCTIONS). */
enum alloc_kind : __u32 {
	ALLOC_SIZE = 0,             /* malloc(size), valloc(size), pvalloc(size) */
	ALLOC_CALLOC = 1,           /* calloc(n, size) */
	ALLOC_REALLOC = 2,          /* realloc(ptr, size): the old block is gone (or moved); the new one is an allocation */
	ALLOC_ALIGN_SIZE = 3,       /* aligned_alloc(align, size), memalign(align, size) */
	ALLOC_POSIX_MEMALIGN = 4,   /* posix_memalign(memptr, align, size) */
};

/* An allocation in flight: entry seen, return not yet. */
struct pending_alloc {
	__u64 size;
	__u64 stack_id;
	__u64 memptr; /* posix_memalign: where the address will be written */
	enum alloc_kind kind;
	__u32 _pad;
};

struct outstanding_alloc {
	__u64 size;
	__u64 ts;       /* CLOCK_MONOTONIC of the allocation */
	__u64 stack_id;
};

/* The thread's allocation in flight (stack_id 0: none). */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct pending_alloc);
} pending SEC(".maps");

/* Address → allocation not freed yet. Full: counted in lost.state, the allocation is not tracked. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, MAX_OUTSTANDING);
	__type(key, __u64);
	__type(value, struct outstanding_alloc);
} outstanding SEC(".maps");

/* Counts (profile alloc) or remembers (memleak) the call asking for `size` bytes; 0 when memleak traces it,
 * i.e. wants its return. */
static __always_inline int account(void *ctx, enum alloc_kind kind, __u64 size, __u64 memptr)
{
	__u32 tid;
	if (!current_is_target(&tid) || size < min_size || size > max_size)
		return 1;
	__u32 zero = 0;
	if (sample_every > 1) {
		__u64 *n = bpf_map_lookup_elem(&calls, &zero);
		if (!n || (*n)++ % sample_every)
			return 1;
	}
	struct alloc_tally *counted = bpf_map_lookup_elem(&tally, &zero);
	if (counted)
		counted->traced++;
	__u64 id = stack_id_of_call(ctx, true);
	if (track_outstanding) {
		struct pending_alloc *p = id ? bpf_task_storage_get(&pending, bpf_get_current_task_btf(), 0,
								     BPF_LOCAL_STORAGE_GET_F_CREATE) : 0;
		if (!p) {
			count_lost(state);
			return 1;
		}
		p->size = size;
		p->stack_id = id;
		p->memptr = memptr;
		p->kind = kind;
		return 0;
	}
	struct statement_label statement = current_statement(bpf_get_current_task_btf());
	struct alloc_key k = { .stack_id = id, .statement = statement.label, .connection = statement.connection };
	k.tid = statement_thread(k.statement, tid);
	struct alloc_total zero_total = {};
	struct alloc_total *t = id ? lookup_or_init(&totals, &k, &zero_total) : 0;
	if (!t) {
		count_lost(state);
		return 1;
	}
	__sync_fetch_and_add(&t->bytes, size);
	__sync_fetch_and_add(&t->calls, 1);
	return 1;
}

static __always_inline void forget(__u64 ptr)
{
	__u32 tid, zero = 0;
	if (!track_outstanding || !ptr || !current_is_target(&tid))
		return;
	struct alloc_tally *counted = bpf_map_lookup_elem(&tally, &zero);
	if (counted)
		counted->frees++;
	bpf_map_delete_elem(&outstanding, &ptr);
}

static __always_inline int on_call(struct pt_regs *ctx)
{
	/* One account() whatever the kind: inlined once, verified once. */
	enum alloc_kind kind = bpf_get_attach_cookie(ctx);
	__u64 size = PT_REGS_PARM1(ctx), memptr = 0;
	switch (kind) {
	case ALLOC_CALLOC:
		size = PT_REGS_PARM1(ctx) * PT_REGS_PARM2(ctx);
		break;
	case ALLOC_REALLOC:
		forget(PT_REGS_PARM1(ctx));
		size = PT_REGS_PARM2(ctx);
		break;
	case ALLOC_ALIGN_SIZE:
		size = PT_REGS_PARM2(ctx);
		break;
	case ALLOC_POSIX_MEMALIGN:
		size = PT_REGS_PARM3(ctx);
		memptr = PT_REGS_PARM1(ctx);
		break;
	default:
		break;
	}
	return account(ctx, kind, size, memptr);
}

/* Return of a traced call: the address is the return value, or *memptr for posix_memalign. */
static __always_inline int on_return(struct pt_regs *ctx)
{
	__u32 tid;
	if (!current_is_target(&tid))
		return 0;
	struct pending_alloc *p = bpf_task_storage_get(&pending, bpf_get_current_task_btf(), 0, 0);
	if (!p || !p->stack_id)
		return 0;
	__u64 ret = PT_REGS_RC(ctx), addr = ret;
	if (p->kind == ALLOC_POSIX_MEMALIGN && (ret != 0 || bpf_probe_read_user(&addr, sizeof(addr), (void *)p->memptr)))
		addr = 0;
	if (addr) {
		struct outstanding_alloc a = { .size = p->size, .ts = bpf_ktime_get_ns(), .stack_id = p->stack_id };
		if (bpf_map_update_elem(&outstanding, &addr, &a, BPF_ANY))
			count_lost(state);
	}
	p->stack_id = 0;
	return 0;
}

SEC("uprobe")
int on_alloc(struct pt_regs *ctx)
{
	on_call(ctx);
	return 0;
}

/* The same on kernels with uprobe_multi links (6.6): one link for every function, detached with one wait. */
SEC("uprobe.multi")
int on_alloc_multi(struct pt_regs *ctx)
{
	on_call(ctx);
	return 0;
}

/* Kernels before uprobe sessions (6.13): memleak's return probe on every call. */
SEC("uretprobe")
int on_alloc_return(struct pt_regs *ctx)
{
	return on_return(ctx);
}

/* memleak: one program for the entry and the return, which the kernel only arms when the entry returns 0: a
 * call that is not traced (sampled out, out of the size bounds) costs no return probe. */
SEC("uprobe.session")
int on_alloc_session(struct pt_regs *ctx)
{
	if (session_is_return(ctx))
		return on_return(ctx);
	return on_call(ctx);
}

/* free(ptr), and realloc(ptr, size)'s release of the old block. */
SEC("uprobe")
int BPF_UPROBE(on_free, __u64 ptr)
{
	(void)ctx;
	forget(ptr);
	return 0;
}

SEC("uprobe.multi")
int BPF_UPROBE(on_free_multi, __u64 ptr)
{
	(void)ctx;
	forget(ptr);
	return 0;
}
