// Off-CPU time: when a target thread leaves the CPU, the id of its stack is taken (stack_ids.h: from the
// thread's recent call sites, else unwound and sent once); when it comes back the time away is split into
// blocked (switch-out to wakeup) and runnable (wakeup, or preemption, to switch-in: waiting for a CPU) and
// summed per (thread, stack id) in the kernel. Waits shorter than min_block_ns are dropped in the kernel.
// When tracing ends, a task iterator gives the stacks of the threads blocked throughout.
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "compat.h"
#include "lost.h"
#include "maps.h"
#include "stack_event.h"
#include "stack_ids.h"
#include "statement.h"
#include "target.h"
#include "wakeups.h"

char LICENSE[] SEC("license") = "GPL";

const volatile __u64 min_block_ns = 1000;
/* Count who took the CPU from a thread still runnable (`--preemptors`). */
const volatile bool preemptors = false;
/* A thread preempted at a new site keeps its instruction alone (`--preempted-leaf-only`, the agent's choice). */
const volatile bool preempted_leaf_only = false;
/* Whether a woken thread's wait for a CPU is read from the scheduler's own count at its switch in (user space
 * probed that the kernel keeps it); otherwise the wakeup programs, run at every wakeup of the host, mark it. */
const volatile bool runq_from_sched_info = false;

struct preempt_key {
	__u32 preemptor_tgid;
	__u32 preemptor_tid;
	__u32 preempted_tid;
	__u32 valid; /* 1 in the map; 0 in a thread's state: not preempted */
};

struct preempt_count {
	__u64 count;
	__u64 runq_ns;         /* time the preempted thread then waited for a CPU */
	__s32 preemptor_prio;  /* the kernel's prio: below 100 real-time, else 120 + nice */
	__s32 preempted_prio;
	char preemptor_comm[16];
	char preemptor_process[16]; /* its thread group leader's name */
};

/* Full: counted in lost.state. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct preempt_key);
	__type(value, struct preempt_count);
} preemptions SEC(".maps");

struct thread_state {
	__u64 off_ts;   /* when it left the CPU; 0 while on CPU */
	__u64 wake_ts;  /* when it was woken, if it blocked */
	__u64 stack_id; /* where it left the CPU */
	__u64 runq_before; /* the scheduler's count of its waits for a CPU when it left it (runq_from_sched_info) */
	__u64 leaf_ip;  /* preempted at a new site: where, for a stack of that frame alone if the wait lasts */
	__u32 preempted;
	__u32 tid;
	__u32 period;   /* attach_period at its switch out */
	__u32 pad;
	__u64 statement; /* its statement when it left the CPU (statement.h), and its connection */
	__u64 connection;
	struct preempt_key preempted_by; /* preemptors: who took the CPU at the last switch-out */
};

/* Per thread: found from the task without a hash lookup, as many as the process has threads (no table to
 * fill), freed with the thread (the compat build's hash entry at its last switch out). The waits still open
 * when tracing ends are read by a task iterator. */
struct {
	THREAD_STORAGE(struct thread_state, 16384);
} threads SEC(".maps");

struct offcpu_key {
	__u32 tid;
	__u32 tgid;  /* which process, where one set of programs traces several (many_targets) */
	__u64 stack_id;
	__u64 statement; /* statement.h's label; 0 without statement_labels */
	__u64 connection;
};

struct offcpu_time {
	__u64 blocked_ns;
	__u64 runnable_ns;
	__u64 periods; /* times the thread was off CPU */
};

/* Full: counted in lost.state, the wait is not counted. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct offcpu_key);
	__type(value, struct offcpu_time);
} totals SEC(".maps");

/* The DTrace sched provider's "who preempts whom": counted when it happens, its run-queue time added when the
 * preempted thread runs again. */
static __always_inline void count_preemption(struct thread_state *st, struct task_struct *prev,
					     struct task_struct *next)
{
	st->preempted_by.valid = 0;
	if (!st->preempted)
		return;
	struct preempt_key k = {
		.preemptor_tgid = next->tgid, .preemptor_tid = next->pid, .preempted_tid = prev->pid, .valid = 1
	};
	struct preempt_count *c = bpf_map_lookup_elem(&preemptions, &k);
	if (!c) {
		struct preempt_count init = { .preemptor_prio = next->prio, .preempted_prio = prev->prio };
		bpf_probe_read_kernel_str(init.preemptor_comm, sizeof(init.preemptor_comm), next->comm);
		bpf_probe_read_kernel_str(init.preemptor_process, sizeof(init.preemptor_process),
					  next->group_leader->comm);
		bpf_map_update_elem(&preemptions, &k, &init, BPF_NOEXIST);
		c = bpf_map_lookup_elem(&preemptions, &k);
	}
	if (!c) {
		count_lost(state);
		return;
	}
	__sync_fetch_and_add(&c->count, 1);
	st->preempted_by = k;
}

/* When `st`'s thread, now switched in after `off` ns away, was woken: from the wakeup programs' mark, or from
 * the scheduler's count of its wait for a CPU since; 0 if unknown. */
static __always_inline __u64 woken_at(struct thread_state *st, struct task_struct *t, __u64 now, __u64 off)
{
	if (!runq_from_sched_info)
		return st->wake_ts;
	__u64 waited = runq_total(t) - st->runq_before;
	return waited <= off ? now - waited : 0;
}

SCHED_SWITCH_PROG(on_switch)
{
	/* Every switch of the host comes here: those of other processes are turned away before the clock. */
	bool out = task_is_target(prev) && !(prev_state & TASK_DEAD);
	bool in = task_is_target(next);
	if (COMPAT && task_is_target(prev) && (prev_state & TASK_DEAD))
		task_thread_storage_delete(&threads, prev);
	if (!out && !in)
		return 0;
	__u64 now = bpf_ktime_get_ns();

	if (out) {
		struct thread_state none = {};
		struct thread_state *st = task_thread_storage(&threads, prev, true, &none);
		if (st) {
			st->tid = prev->pid;
			st->off_ts = now;
			st->period = attach_period;
			st->wake_ts = 0;
			st->preempted = preempt || prev_state == TASK_RUNNING;
			if (runq_from_sched_info)
				st->runq_before = prev->sched_info.run_delay;
			/* prev is the current task: its user registers give the call site. A thread preempted at
			 * any instruction is mostly at a new site, whose unwinding (about 10 µs) is paid at every
			 * switch before anyone knows whether the wait lasts min_block_ns: with
			 * preempted_leaf_only its instruction alone is kept, and made a stack at its switch in
			 * only if it does (with kernel stacks, asked for at that price, it is unwound; frame
			 * pointers, the compat build's, cost little). */
			if (preempted_leaf_only && st->preempted && !kernel_stacks && !COMPAT) {
				st->stack_id = call_site_stack_id(ctx, false, true);
				struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(prev);
				st->leaf_ip = !st->stack_id && regs ? PT_REGS_IP(regs) : 0;
			} else {
				st->stack_id = stack_id_of_call(ctx, false);
				st->leaf_ip = 0;
			}
			struct statement_label statement = current_statement(prev);
			st->statement = statement.label;
			st->connection = statement.connection;
			if (preemptors)
				count_preemption(st, prev, next);
		} else {
			count_lost(state);
		}
	}

	if (in) {
		__u32 tid = next->pid;
		struct thread_state *st = task_thread_storage(&threads, next, false, 0);
		if (!st || !st->off_ts)
			return 0;
		__u64 off = now - st->off_ts;
		st->off_ts = 0;
		if (st->period != attach_period)
			return 0; /* switched out before the programs were detached: its wait is not known */
		if (preemptors && st->preempted_by.valid) {
			struct preempt_count *c = bpf_map_lookup_elem(&preemptions, &st->preempted_by);
			if (c)
				__sync_fetch_and_add(&c->runq_ns, off);
			st->preempted_by.valid = 0;
		}
		if (off < min_block_ns)
			return 0;
		if (!st->stack_id && st->leaf_ip)
			st->stack_id = leaf_only_stack_id(st->leaf_ip, tid);
		if (!st->stack_id)
			return 0;
		__u64 woke = st->preempted ? 0 : woken_at(st, next, now, off);
		struct offcpu_key k = {
			.tid = tid,
			.tgid = many_targets ? next->tgid : 0,
			.stack_id = st->stack_id,
			.statement = st->statement,
			.connection = st->connection,
		};
		struct offcpu_time none = {};
		struct offcpu_time *t = lookup_or_init(&totals, &k, &none);
		if (!t) {
			count_lost(state);
			return 0;
		}
		__sync_fetch_and_add(&t->periods, 1);
		if (st->preempted || woke < now - off || woke > now) {
			/* preempted: all of it was waiting for a CPU; a missed wakeup: count it all as blocked */
			if (st->preempted)
				__sync_fetch_and_add(&t->runnable_ns, off);
			else
				__sync_fetch_and_add(&t->blocked_ns, off);
		} else {
			__sync_fetch_and_add(&t->blocked_ns, woke - (now - off));
			__sync_fetch_and_add(&t->runnable_ns, now - woke);
		}
	}
	return 0;
}

static __always_inline void mark_woken(struct task_struct *p)
{
	if (!task_is_target(p))
		return;
	struct thread_state *st = task_thread_storage(&threads, p, false, 0);
	if (st && st->off_ts && !st->wake_ts)
		st->wake_ts = bpf_ktime_get_ns();
}

WAKEUP_PROGRAMS(mark_woken)

/* Run once when tracing ends: the waits still open (threads off CPU since before the end). */
SEC("iter/task")
int open_waits(struct bpf_iter__task *ctx)
{
	struct task_struct *task = ctx->task;
	if (!task || !task_is_target(task))
		return 0;
	struct thread_state *st = task_thread_storage(&threads, task, false, 0);
	if (!st || !st->off_ts || st->period != attach_period)
		return 0;
	struct thread_state open = *st;
	/* Woken and still waiting for a CPU: when, from the scheduler's count of that wait so far. */
	if (runq_from_sched_info && !open.preempted && task->sched_info.last_queued) {
		__u64 now = bpf_ktime_get_ns();
		open.wake_ts = woken_at(&open, task, now, now - open.off_ts);
	}
	bpf_seq_write(ctx->meta->seq, &open, sizeof(open));
	return 0;
}

/* Run once when tracing ends: the threads of the process off CPU that never left it while tracing (an idle
 * connection, a thread waiting all along for a lock), with their user stacks read from their own memory; a
 * whole struct stack_event each, its stack id the hash of its frames. */
#ifdef MYPROBE_COMPAT
/* Sleepable iterators came in 5.18: user space does not run it (the task_stacks feature). */
SEC("iter/task")
int blocked_threads(struct bpf_iter__task *ctx __attribute__((unused)))
{
	return 0;
}
#else
SEC("iter.s/task")
int blocked_threads(struct bpf_iter__task *ctx)
{
	struct task_struct *task = ctx->task;
	if (!task || !task_is_target(task) || task->__state == TASK_RUNNING)
		return 0;
	if (bpf_task_storage_get(&threads, task, 0, 0))
		return 0;
	__u32 tid = task->pid;
	__u32 zero = 0;
	struct stack_event *e = bpf_map_lookup_elem(&scratch, &zero);
	if (!e)
		return 0;
	long n = unwind_task_user_stack(task, e->ips);
	e->tid = tid;
	struct statement_label statement = task_statement(task, ctx->meta->seq);
	e->statement = statement.label;
	e->connection = statement.connection;
	__u32 user = n > 0 ? n : 0;
	if (user > MAX_USER_FRAMES)
		user = MAX_USER_FRAMES;
	e->user_len = user;
	e->kernel_len = 0;
	if (kernel_stacks) {
		long k = bpf_get_task_stack(task, &e->ips[user], sizeof(__u64) * MAX_KERNEL_FRAMES, 0);
		e->kernel_len = k > 0 ? k / sizeof(__u64) : 0;
	}
	e->stack_id = stack_hash(e);
	bpf_seq_write(ctx->meta->seq, e, sizeof(*e));
	return 0;
}
#endif
