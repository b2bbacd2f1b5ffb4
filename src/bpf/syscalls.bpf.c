// Syscalls by user stack, as DTrace's syscall provider aggregated by ustack() and `truss -c`: each syscall of
// the target is timed from its entry to its exit; calls of at least min_ns are summed in the kernel per
// (syscall, stack id): count, total, longest, errors; and the errors per (syscall, errno).
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "compat.h"
#include "lost.h"
#include "maps.h"
#include "stack_ids.h"
#include "target.h"

char LICENSE[] SEC("license") = "GPL";

#define MAX_SYSCALL_NR 512
#define MAX_ERRNO 4095 /* a return value in [-MAX_ERRNO, -1] is an error (include/linux/err.h) */

const volatile __u64 min_ns = 0;
/* Set by user space: the syscalls traced (all of them, or those of --syscall). */
const volatile bool traced_syscall[MAX_SYSCALL_NR] = {};

/* The thread's syscall in progress (ts 0: none traced). */
struct syscall_entry {
	__u64 ts;
	__u32 nr;
	__u32 _pad;
};

/* Per thread (in the compat build, an entry from a syscall's entry to its exit). */
struct {
	THREAD_STORAGE(struct syscall_entry, 16384);
} in_syscall SEC(".maps");

struct syscall_key {
	__u32 nr;
	__u32 _pad;
	__u64 stack_id;
};

struct syscall_calls {
	__u64 count;
	__u64 total_ns;
	__u64 max_ns;
	__u64 errors;
};

/* (syscall, stack id) → calls, per CPU: a server's threads make the same calls from the same stacks on every
 * CPU, and shared sums would cost an atomic add on a contended line per field (10% of the programs' time on 2
 * CPUs). Allocated as entries appear, not up front: a preallocated map would take max_entries × 32 bytes per
 * possible CPU. Full: counted in lost.state, the call is not counted. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 65536);
	__type(key, struct syscall_key);
	__type(value, struct syscall_calls);
} calls SEC(".maps");

struct errno_key {
	__u32 nr;
	__u32 err; /* errno, positive */
};

/* (syscall, errno) → calls that failed so. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct errno_key);
	__type(value, __u64);
} errors SEC(".maps");

SEC("tp_btf/sys_enter")
int BPF_PROG(on_sys_enter, struct pt_regs *regs, long id)
{
	(void)ctx;
	(void)regs;
	__u32 tid;
	if (id < 0 || id >= MAX_SYSCALL_NR || !traced_syscall[id] || !current_is_target(&tid))
		return 0;
	struct syscall_entry none = {};
	struct syscall_entry *e = current_thread_storage(&in_syscall, true, &none);
	if (!e) {
		count_lost(state);
		return 0;
	}
	e->nr = id;
	e->ts = bpf_ktime_get_ns();
	return 0;
}

SEC("tp_btf/sys_exit")
int BPF_PROG(on_sys_exit, struct pt_regs *regs, long ret)
{
	(void)regs;
	__u32 tid;
	if (!current_is_target(&tid))
		return 0;
	struct syscall_entry *e = current_thread_storage(&in_syscall, false, 0);
	if (!e || !e->ts)
		return 0;
	__u64 took = bpf_ktime_get_ns() - e->ts;
	__u32 nr = e->nr;
	e->ts = 0;
	current_thread_storage_release(&in_syscall);
	if (took < min_ns)
		return 0;
	/* The user registers are still those of the call: the stack is the caller's. */
	struct syscall_key k = { .nr = nr, .stack_id = stack_id_of_call(ctx, false) };
	struct syscall_calls zero = {};
	struct syscall_calls *c = k.stack_id ? lookup_or_init(&calls, &k, &zero) : 0;
	if (!c) {
		count_lost(state);
		return 0;
	}
	/* This CPU's copy: the program is not preempted before it returns. */
	c->count++;
	c->total_ns += took;
	if (took > c->max_ns)
		c->max_ns = took;
	if (ret < 0 && ret >= -MAX_ERRNO) {
		c->errors++;
		struct errno_key ek = { .nr = nr, .err = -ret };
		__u64 none = 0;
		__u64 *n = lookup_or_init(&errors, &ek, &none);
		if (n)
			__sync_fetch_and_add(n, 1);
		else
			count_lost(state);
	}
	return 0;
}
