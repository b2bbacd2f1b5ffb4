// Lock waits: every futex wait of the target (pthread mutexes, condition variables, rw-locks and InnoDB's own
// latches all end there) is timed from the syscall's entry to its exit and summed in the kernel per (lock
// word, waiter stack): count, total, longest, and a log2 histogram. Every wake of a lock word that has been
// waited on is counted per (lock word, waker stack): the thread releasing the lock.
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "stack_event.h"

char LICENSE[] SEC("license") = "GPL";

const volatile __u32 target_tgid = 0;
const volatile bool kernel_stacks = false;
/* This architecture's futex syscall number, from user space. */
const volatile __s64 futex_nr = 202;

#include "stack_ids.h"

#define FUTEX_CMD_MASK 127
#define FUTEX_WAIT 0
#define FUTEX_WAKE 1
#define FUTEX_REQUEUE 3
#define FUTEX_CMP_REQUEUE 4
#define FUTEX_WAKE_OP 5
#define FUTEX_LOCK_PI 6
#define FUTEX_UNLOCK_PI 7
#define FUTEX_WAIT_BITSET 9
#define FUTEX_WAKE_BITSET 10
#define FUTEX_WAIT_REQUEUE_PI 11
#define FUTEX_LOCK_PI2 13

#define HIST_BUCKETS 24   /* log2 of microseconds: 1 µs .. 8 s and more */
#define MAX_LOCK_STACKS 32768

struct lock_key {
	__u64 addr;
	__u64 stack_id;
};

struct lock_wait {
	__u64 count;
	__u64 total_ns;
	__u64 max_ns;
	__u64 hist[HIST_BUCKETS];
};

/* (lock word, waiter stack) → waits. Full: counted in lost[LOST_STATE]. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_LOCK_STACKS);
	__type(key, struct lock_key);
	__type(value, struct lock_wait);
} waits SEC(".maps");

/* (lock word, waker stack) → wakes. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_LOCK_STACKS);
	__type(key, struct lock_key);
	__type(value, __u64);
} wakes SEC(".maps");

/* Lock words someone waited on: only their wakes are worth a stack. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, __u8);
} waited SEC(".maps");

struct futex_call {
	__u64 addr;
	__u64 ts;
};

/* Thread → the futex wait it is in. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, __u32);
	__type(value, struct futex_call);
} in_wait SEC(".maps");

static __always_inline bool is_wait(__u32 op)
{
	return op == FUTEX_WAIT || op == FUTEX_WAIT_BITSET || op == FUTEX_LOCK_PI || op == FUTEX_LOCK_PI2 ||
	       op == FUTEX_WAIT_REQUEUE_PI;
}

static __always_inline bool is_wake(__u32 op)
{
	return op == FUTEX_WAKE || op == FUTEX_WAKE_BITSET || op == FUTEX_UNLOCK_PI || op == FUTEX_WAKE_OP ||
	       op == FUTEX_REQUEUE || op == FUTEX_CMP_REQUEUE;
}

SEC("tp_btf/sys_enter")
int BPF_PROG(on_sys_enter, struct pt_regs *regs, long id)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	if ((__u32)(pid_tgid >> 32) != target_tgid || id != futex_nr)
		return 0;
	__u64 addr = PT_REGS_PARM1_SYSCALL(regs);
	__u32 op = PT_REGS_PARM2_SYSCALL(regs) & FUTEX_CMD_MASK;
	__u32 tid = (__u32)pid_tgid;
	if (is_wait(op)) {
		struct futex_call c = { .addr = addr, .ts = bpf_ktime_get_ns() };
		bpf_map_update_elem(&in_wait, &tid, &c, BPF_ANY);
	} else if (is_wake(op) && bpf_map_lookup_elem(&waited, &addr)) {
		struct lock_key k = { .addr = addr, .stack_id = stack_id_of_call(ctx, false) };
		__u64 zero = 0;
		__u64 *n = lookup_or_init(&wakes, &k, &zero);
		if (n)
			__sync_fetch_and_add(n, 1);
		else
			count_lost(LOST_STATE);
	}
	return 0;
}

SEC("tp_btf/sys_exit")
int BPF_PROG(on_sys_exit, struct pt_regs *regs, long ret)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	if ((__u32)(pid_tgid >> 32) != target_tgid)
		return 0;
	__u32 tid = (__u32)pid_tgid;
	struct futex_call *c = bpf_map_lookup_elem(&in_wait, &tid);
	if (!c)
		return 0;
	__u64 took = bpf_ktime_get_ns() - c->ts;
	struct lock_key k = { .addr = c->addr };
	bpf_map_delete_elem(&in_wait, &tid);
	if (ret == -11) /* EAGAIN: the word changed before the wait began; nothing was waited for */
		return 0;
	__u8 one = 1;
	bpf_map_update_elem(&waited, &k.addr, &one, BPF_ANY);
	k.stack_id = stack_id_of_call(ctx, false);
	struct lock_wait zero = {};
	struct lock_wait *w = lookup_or_init(&waits, &k, &zero);
	if (!w) {
		count_lost(LOST_STATE);
		return 0;
	}
	__sync_fetch_and_add(&w->count, 1);
	__sync_fetch_and_add(&w->total_ns, took);
	if (took > w->max_ns)
		w->max_ns = took;
	__u64 us = took / 1000;
	__u32 b = 0;
	for (int i = 0; i < HIST_BUCKETS - 1; i++) {
		if (us < 2)
			break;
		us >>= 1;
		b++;
	}
	if (b < HIST_BUCKETS)
		__sync_fetch_and_add(&w->hist[b], 1);
	return 0;
}
