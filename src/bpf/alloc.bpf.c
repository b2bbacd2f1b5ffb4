// Allocations by user stack: uprobes on the C library's allocation functions (C++ `new` reaches them too)
// sum the requested size and the calls of every N-th call (`sample_every`) within [min_size, max_size] per
// stack, in the kernel; each stack goes to user space once. With track_outstanding (memleak), each traced
// allocation is kept by address from its return until free() or realloc() lets it go.
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "stack_event.h"

char LICENSE[] SEC("license") = "GPL";

const volatile __u32 target_tgid = 0;
const volatile bool kernel_stacks = false;
const volatile __u64 sample_every = 1;
const volatile __u64 min_size = 0;
const volatile __u64 max_size = ~0ULL;
/* memleak: remember each traced allocation by address until it is freed, instead of summing per stack. */
const volatile bool track_outstanding = false;

#include "stack_ids.h"

/* Calls seen per CPU, for sampling every N-th. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} calls SEC(".maps");

struct alloc_total {
	__u64 bytes;
	__u64 calls;
};

/* Stack id → what was allocated on it. Full: counted in lost[LOST_STATE], the call is not counted. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_STACKS);
	__type(key, __u64);
	__type(value, struct alloc_total);
} totals SEC(".maps");

#define MAX_OUTSTANDING (1 << 20)

/* An allocation in flight: entry seen, return not yet. */
struct pending_alloc {
	__u64 size;
	__u64 stack_id;
	__u64 memptr;   /* posix_memalign: where the address will be written */
};

struct outstanding_alloc {
	__u64 size;
	__u64 ts;       /* CLOCK_MONOTONIC of the allocation */
	__u64 stack_id;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct pending_alloc);
} pending SEC(".maps");

/* Address → allocation not freed yet. Full: counted in lost[LOST_STATE], the allocation is not tracked. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, MAX_OUTSTANDING);
	__type(key, __u64);
	__type(value, struct outstanding_alloc);
} outstanding SEC(".maps");

static __always_inline int account(void *ctx, __u64 size, __u64 memptr)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	if ((__u32)(pid_tgid >> 32) != target_tgid || size < min_size || size > max_size)
		return 0;
	__u32 zero = 0;
	if (sample_every > 1) {
		__u64 *n = bpf_map_lookup_elem(&calls, &zero);
		if (!n || (*n)++ % sample_every)
			return 0;
	}
	__u64 id = stack_id_of_call(ctx, (__u32)pid_tgid, true);
	if (track_outstanding) {
		__u32 tid = (__u32)pid_tgid;
		struct pending_alloc p = { .size = size, .stack_id = id, .memptr = memptr };
		bpf_map_update_elem(&pending, &tid, &p, BPF_ANY);
		return 0;
	}
	struct alloc_total zero_total = {};
	struct alloc_total *t = id ? lookup_or_init(&totals, &id, &zero_total) : 0;
	if (!t) {
		count_lost(LOST_STATE);
		return 0;
	}
	__sync_fetch_and_add(&t->bytes, size);
	__sync_fetch_and_add(&t->calls, 1);
	return 0;
}

SEC("uprobe")
int BPF_UPROBE(on_malloc, __u64 size)
{
	return account(ctx, size, 0);
}

SEC("uprobe")
int BPF_UPROBE(on_calloc, __u64 n, __u64 size)
{
	return account(ctx, n * size, 0);
}

/* aligned_alloc(align, size), memalign(align, size) */
SEC("uprobe")
int BPF_UPROBE(on_second_arg_size, __u64 first, __u64 size)
{
	return account(ctx, size, 0);
}

static __always_inline void forget(__u64 ptr)
{
	if (track_outstanding && ptr && (__u32)(bpf_get_current_pid_tgid() >> 32) == target_tgid)
		bpf_map_delete_elem(&outstanding, &ptr);
}

/* realloc(ptr, size): the old block is gone (or moved); the new one is an allocation. */
SEC("uprobe")
int BPF_UPROBE(on_realloc, __u64 ptr, __u64 size)
{
	forget(ptr);
	return account(ctx, size, 0);
}

SEC("uprobe")
int BPF_UPROBE(on_posix_memalign, void **memptr, __u64 align, __u64 size)
{
	return account(ctx, size, (__u64)memptr);
}

SEC("uprobe")
int BPF_UPROBE(on_free, __u64 ptr)
{
	forget(ptr);
	return 0;
}

/* Return of any allocation function: the address is the return value, or *memptr for posix_memalign. */
SEC("uretprobe")
int BPF_URETPROBE(on_alloc_return, __u64 ret)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	if ((__u32)(pid_tgid >> 32) != target_tgid)
		return 0;
	__u32 tid = (__u32)pid_tgid;
	struct pending_alloc *p = bpf_map_lookup_elem(&pending, &tid);
	if (!p)
		return 0;
	__u64 addr = ret;
	if (p->memptr && (ret != 0 || bpf_probe_read_user(&addr, sizeof(addr), (void *)p->memptr)))
		addr = 0;
	if (addr) {
		struct outstanding_alloc a = { .size = p->size, .ts = bpf_ktime_get_ns(), .stack_id = p->stack_id };
		if (bpf_map_update_elem(&outstanding, &addr, &a, BPF_ANY))
			count_lost(LOST_STATE);
	}
	bpf_map_delete_elem(&pending, &tid);
	return 0;
}
