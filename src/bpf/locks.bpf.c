// Lock waits: every futex wait of the target (pthread mutexes, condition variables, rw-locks and InnoDB's own
// latches all end there) is timed from the syscall's entry to its exit and summed in the kernel per (lock
// word, waiter stack): count, total, longest, and a log2 histogram. Every wake of a lock word that has been
// waited on is counted per (lock word, waker stack): the thread releasing the lock. With statement_labels, both
// also per statement (statement.h): the waiter's when it began to wait, the waker's when it woke it.
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <asm-generic/errno-base.h>
#include "compat.h"
#include "futex.h"
#include "lost.h"
#include "maps.h"
#include "stack_ids.h"
#include "statement.h"
#include "target.h"

char LICENSE[] SEC("license") = "GPL";

/* This architecture's futex syscall number, from user space. */
const volatile __s64 futex_nr = -1;

#define HIST_BUCKETS 24 /* log2 of microseconds: 1 µs .. 8 s and more */
#define MAX_LOCK_STACKS 32768

struct lock_key {
	__u64 addr;
	__u64 stack_id;
	__u32 tgid;  /* whose word, where one set of programs traces several processes (many_targets); else 0 */
	__u32 tid;   /* the thread whose statement it is, with a label by start; else 0 */
	__u64 statement; /* statement.h's label and connection; 0 without statement_labels, and in `waited` */
	__u64 connection;
};

/* The process of the current thread, in keys: 0 where the programs trace one. */
static __always_inline __u32 key_tgid(void)
{
	return many_targets ? bpf_get_current_pid_tgid() >> 32 : 0;
}

struct lock_wait {
	__u64 count;
	__u64 total_ns;
	__u64 max_ns;
	__u64 futex_ops;          /* bit (op & 15) for each futex operation waited with: what kind of wait */
	__u64 hist[HIST_BUCKETS]; /* hist[i]: waits of [2^i, 2^(i+1)) µs; hist[0] below 2 µs */
};

/* (lock word, waiter stack) → waits. Full: counted in lost.state. */
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

/* Lock words someone waited on (their key with no stack): only their wakes are worth a stack. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct lock_key);
	__type(value, __u8);
} waited SEC(".maps");

/* The first sums of a lock word and stack: from here, not the stack, which the unwinder's frames fill. */
const struct lock_wait no_waits = {};

struct futex_call {
	__u64 addr;
	__u64 ts;
	__u32 op;
	__u32 period; /* attach_period at its entry */
	__u64 statement; /* the statement that waits (statement.h), and its connection */
	__u64 connection;
};

/* Per thread: the futex wait it is in (ts 0: none). Task storage: as many as the process has threads, freed
 * with the thread; in the compat build an entry lasts from a wait's entry to its exit. */
struct {
	THREAD_STORAGE(struct futex_call, 16384);
} in_wait SEC(".maps");

/* A futex call of the target entered. */
static __always_inline void futex_entered(void *ctx, __u32 tid, __u64 addr, __u32 op)
{
	if (futex_op_waits(op)) {
		struct futex_call none = {};
		struct futex_call *c = current_thread_storage(&in_wait, true, &none);
		if (c) {
			c->addr = addr;
			c->op = op;
			c->period = attach_period;
			struct statement_label statement = current_statement(statement_current_task());
			c->statement = statement.label;
			c->connection = statement.connection;
			c->ts = bpf_ktime_get_ns();
		} else {
			count_lost(state);
		}
		return;
	}
	if (!futex_op_wakes(op))
		return;
	struct lock_key k = { .addr = addr, .tgid = key_tgid() };
	if (bpf_map_lookup_elem(&waited, &k)) {
		k.stack_id = stack_id_of_call(ctx, false);
		struct statement_label statement = current_statement(statement_current_task());
		k.statement = statement.label;
		k.connection = statement.connection;
		k.tid = statement_thread(k.statement, tid);
		__u64 zero = 0;
		__u64 *n = lookup_or_init(&wakes, &k, &zero);
		if (n)
			__sync_fetch_and_add(n, 1);
		else
			count_lost(state);
	}
}

/* A syscall of the target returned `ret`: a futex wait it was in ends. */
static __always_inline void futex_exited(void *ctx, __u32 tid, long ret)
{
	struct futex_call *c = current_thread_storage(&in_wait, false, 0);
	if (!c || !c->ts)
		return;
	__u64 took = bpf_ktime_get_ns() - c->ts;
	__u64 op_bit = 1ULL << (c->op & 15);
	struct lock_key k = { .addr = c->addr, .tgid = key_tgid() };
	__u32 period = c->period;
	__u64 statement = c->statement, connection = c->connection;
	c->ts = 0;
	current_thread_storage_release(&in_wait);
	if (ret == -EAGAIN) /* the word changed before the wait began: nothing was waited for */
		return;
	if (period != attach_period)
		return; /* entered before the programs were detached: its wait is not known */
	__u8 one = 1;
	bpf_map_update_elem(&waited, &k, &one, BPF_ANY);
	k.stack_id = stack_id_of_call(ctx, false);
	k.statement = statement;
	k.connection = connection;
	k.tid = statement_thread(statement, tid);
	struct lock_wait *w = lookup_or_init(&waits, &k, &no_waits);
	if (!w) {
		count_lost(state);
		return;
	}
	__sync_fetch_and_add(&w->count, 1);
	__sync_fetch_and_add(&w->total_ns, took);
	if (took > w->max_ns)
		w->max_ns = took;
	if (!(w->futex_ops & op_bit))
		OR_BITS(&w->futex_ops, op_bit);
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
}

/* futex's own tracepoints: the kernel runs them for futex calls only, so no other syscall of the host runs a
 * program here (user space chooses them where the kernel has them). futex_waitv and futex2's calls are not
 * followed: neither the C library nor the server calls them. */
SEC("tracepoint/syscalls/sys_enter_futex")
int on_futex_enter(struct trace_event_raw_sys_enter *ctx)
{
	__u32 tid;
	if (!current_is_target(&tid))
		return 0;
	futex_entered(ctx, tid, ctx->args[0], ctx->args[1]);
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_futex")
int on_futex_exit(struct trace_event_raw_sys_exit *ctx)
{
	__u32 tid;
	if (!current_is_target(&tid))
		return 0;
	futex_exited(ctx, tid, ctx->ret);
	return 0;
}

/* Every syscall of the host: where futex's own tracepoints are missing, or for kernel frames (the syscall
 * tracepoints give a program the user registers, so its kernel stack is empty). */
SEC("tp_btf/sys_enter")
int BPF_PROG(on_sys_enter, struct pt_regs *regs, long id)
{
	__u32 tid;
	if (id != futex_nr || !current_is_target(&tid))
		return 0;
	futex_entered(ctx, tid, PT_REGS_PARM1_SYSCALL(regs), PT_REGS_PARM2_SYSCALL(regs));
	return 0;
}

SEC("tp_btf/sys_exit")
int BPF_PROG(on_sys_exit, struct pt_regs *regs, long ret)
{
	__u32 tid;
#ifdef __TARGET_ARCH_x86
	/* Only a futex call has a wait to end: the others are turned away before their storage lookup. */
	if ((long)regs->orig_ax != futex_nr)
		return 0;
#else
	(void)regs;
#endif
	if (!current_is_target(&tid))
		return 0;
	futex_exited(ctx, tid, ret);
	return 0;
}
