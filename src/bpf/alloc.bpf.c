// Allocations by user stack: uprobes on the C library's allocation functions (C++ `new` reaches them too)
// send the requested size and the stack of every N-th call (`sample_every`), within [min_size, max_size].
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

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 16 * 1024 * 1024);
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct stack_event);
} scratch SEC(".maps");

/* Calls seen per CPU, for sampling every N-th. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} calls SEC(".maps");

static __always_inline int account(void *ctx, __u64 size)
{
	__u64 id = bpf_get_current_pid_tgid();
	if ((__u32)(id >> 32) != target_tgid || size < min_size || size > max_size)
		return 0;
	__u32 zero = 0;
	if (sample_every > 1) {
		__u64 *n = bpf_map_lookup_elem(&calls, &zero);
		if (!n || (*n)++ % sample_every)
			return 0;
	}
	struct stack_event *e = bpf_map_lookup_elem(&scratch, &zero);
	if (!e)
		return 0;
	e->tid = (__u32)id;
	e->kind = 0;
	e->value[0] = size;
	e->value[1] = 1;
	capture_stacks(ctx, e, kernel_stacks);
	submit_stack_event(&events, e);
	return 0;
}

SEC("uprobe")
int BPF_UPROBE(on_malloc, __u64 size)
{
	return account(ctx, size);
}

SEC("uprobe")
int BPF_UPROBE(on_calloc, __u64 n, __u64 size)
{
	return account(ctx, n * size);
}

/* realloc(ptr, size), aligned_alloc(align, size), memalign(align, size) */
SEC("uprobe")
int BPF_UPROBE(on_second_arg_size, __u64 first, __u64 size)
{
	return account(ctx, size);
}

SEC("uprobe")
int BPF_UPROBE(on_posix_memalign, void **memptr, __u64 align, __u64 size)
{
	return account(ctx, size);
}
