// What every thread of the process is doing right now, without stopping any: a sleepable task iterator, run
// once, reads each thread's state, the syscall it is in and its arguments (from the registers it entered the
// kernel with), the words of the futex it waits on, and its stacks (user frames unwound from .eh_frame
// tables, as offcpu's blocked threads are). Nothing is attached to the process; no thread is ever stopped.
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "compat.h"
#include "lost.h"
#include "stack_event.h"
#include "target.h"

char LICENSE[] SEC("license") = "GPL";

#define SYSCALL_ARGS 6

/* The futex syscall's number on this machine, set by user space. */
const volatile __s64 futex_syscall = -1;

struct thread_record {
	__u32 tid;
	__u32 state;        /* task_struct.__state: 0 running or runnable, else why it sleeps */
	__u32 exit_state;
	__u32 on_cpu;       /* running on a CPU right now: its user frames are those it last entered the kernel with */
	__s64 syscall;      /* the syscall it is in (orig_ax), -1 if none */
	__u64 args[SYSCALL_ARGS];
	__u64 now_ns;       /* when it was read, and when it last got on a CPU (sched_info.last_arrival) */
	__u64 last_ran_ns;
	__u32 futex_word;   /* in a futex call: the word at args[0], */
	__s32 futex_owner;  /* the int 8 bytes after it (a glibc mutex's __owner), */
	__u32 futex_read;   /* and whether both could be read */
	char comm[16];
	__u64 user_ip;      /* the user registers it entered the kernel with: the compat build leaves its user */
	__u64 user_sp;      /* stack to user space, which unwinds it from these reading /proc/PID/mem */
	__u64 user_bp;
	__u64 tls_base;     /* its thread pointer (x86-64's fs base): glibc's pthread_self() */
	__u64 switches;     /* its context switches so far, voluntary or not */
	__u32 known_wait;   /* not unwound: it waits on a futex from a place `known_waits` holds */
	__u32 pad;
	struct stack_event stack;
};

/* With `only_wanted` (the agent's history, once a second): only the threads whose pointers are keys here are read,
 * and of them only those whose switches differ from the value (they ran since it was last read). The iterator
 * writes the switches of each it reads: user space only adds and removes keys. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, __u64);
	__type(value, __u64);
} wanted SEC(".maps");

bool only_wanted = false;

/* The keys of `wanted` a run found among the process's threads, where it looked them all up: fewer than the keys
 * when some ended. */
__u64 wanted_found = 0;

/* The wanted threads that exited, counted by `thread_exit` while it is attached: then a thread that sleeps and has
 * not got on a CPU since `ran_since` (the scheduler's clock, as sched_info.last_arrival) is as the last run read it,
 * and not even looked up; a thousand idle connections' threads cost their walk alone. 0: every one is. */
__u64 wanted_exited = 0;
__u64 ran_since = 0;

/* When a run began: the reader's own arrival at its first thread. */
__u64 run_began = 0;

/* A thread waiting on a futex, from where: the same thread with the same futex operation at the same stack pointer
 * is in the wait user space named before from its stack, whichever lock word it waits on (InnoDB's page latches are
 * as many as its pages: user space names the word). */
struct wait_place {
	__u64 tls_base;
	__u64 user_sp;
	__u64 futex_op;
};

/* The places of waits whose stacks user space has named (with `only_wanted`): not unwound again. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct wait_place);
	__type(value, __u8);
} known_waits SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct thread_record);
} record_scratch SEC(".maps");

/* The syscall a task stopped in the kernel is in, and its arguments, from its saved user registers. */
static __always_inline void read_syscall(struct thread_record *r, struct pt_regs *regs)
{
	r->syscall = -1;
	r->user_ip = r->user_sp = r->user_bp = 0;
	if (!regs)
		return;
	/* Read with BPF_CORE_READ: the compat build's registers are a plain address (task_regs), and this runs once
	 * per thread. */
#ifdef __TARGET_ARCH_x86
	r->syscall = (long)BPF_CORE_READ(regs, orig_ax);
#elif defined(__TARGET_ARCH_arm64)
	r->syscall = BPF_CORE_READ(regs, syscallno);
#endif
	r->args[0] = PT_REGS_PARM1_CORE_SYSCALL(regs);
	r->args[1] = PT_REGS_PARM2_CORE_SYSCALL(regs);
	r->args[2] = PT_REGS_PARM3_CORE_SYSCALL(regs);
	r->args[3] = PT_REGS_PARM4_CORE_SYSCALL(regs);
	r->args[4] = PT_REGS_PARM5_CORE_SYSCALL(regs);
	r->args[5] = PT_REGS_PARM6_CORE_SYSCALL(regs);
	r->user_ip = PT_REGS_IP_CORE(regs);
	r->user_sp = PT_REGS_SP_CORE(regs);
	r->user_bp = PT_REGS_FP_CORE(regs);
}

static __always_inline __u64 thread_pointer(struct task_struct *task)
{
#ifdef __TARGET_ARCH_x86
	return task->thread.fsbase;
#elif defined(__TARGET_ARCH_arm64)
	return task->thread.uw.tp_value;
#else
	return 0;
#endif
}

/* A thread of the process exits: one of `wanted` is counted (the connection it served may have ended, and another be
 * made in its object). Threads exit seldom; no other task is looked at further than its tgid. */
SEC("tp_btf/sched_process_exit")
int BPF_PROG(thread_exit, struct task_struct *task)
{
	(void)ctx;
	if (!task_is_target(task))
		return 0;
	__u64 base = thread_pointer(task);
	if (bpf_map_lookup_elem(&wanted, &base))
		__sync_fetch_and_add(&wanted_exited, 1);
	return 0;
}

/* on_cpu as unsigned, whatever its size: an int until 7.x, then a u8, and libbpf resizes only unsigned fields. */
struct task_struct___on_cpu {
	unsigned int on_cpu;
} __attribute__((preserve_access_index));

/* Sleepable, to read the thread's memory (5.18); before, the compat build's reads none: user space does. */
#ifdef MYPROBE_COMPAT
SEC("iter/task")
#else
SEC("iter.s/task")
#endif
int snapshot(struct bpf_iter__task *ctx)
{
	struct task_struct *task = ctx->task;
	if (!task || !task_is_target(task))
		return 0;
	if (!run_began)
		run_began = BPF_CORE_READ(current_task(), sched_info.last_arrival);
	/* Read directly (the iterator's task is a trusted pointer), not through a helper: this runs for every thread,
	 * and a thread that has not run is left having read two of its cache lines. */
	unsigned int state = task_state(task);
	if (only_wanted && state != 0 && task->sched_info.last_arrival < ran_since)
		return 0;
	__u32 zero = 0;
	struct thread_record *r = bpf_map_lookup_elem(&record_scratch, &zero);
	if (!r)
		return 0;
	r->tls_base = thread_pointer(task);
	r->state = state;
	r->switches = task->nvcsw + task->nivcsw;
	if (only_wanted) {
		__u64 *last = bpf_map_lookup_elem(&wanted, &r->tls_base);
		if (!last)
			return 0;
		wanted_found++;
		/* Not run since its switches were last read: user space keeps what it said of it. */
		if (*last == r->switches && r->state != 0)
			return 0;
		*last = r->switches;
	}
	r->tid = task->pid;
	r->exit_state = task->exit_state;
	r->on_cpu = ((struct task_struct___on_cpu *)task)->on_cpu;
	/* When each got on a CPU last, by the scheduler's clock (not ktime's; and not se.exec_start, whose task
	 * clock leaves out each CPU's own interrupt and steal time): the reader's own arrival is now, give or take
	 * the time it has run since. */
	r->now_ns = BPF_CORE_READ(current_task(), sched_info.last_arrival);
	r->last_ran_ns = task->sched_info.last_arrival;
	__builtin_memcpy(r->comm, task->comm, sizeof(r->comm));
	read_syscall(r, task_regs(task));
	r->futex_read = 0;
	r->futex_word = 0;
	r->futex_owner = 0;
	if (!COMPAT && r->syscall == futex_syscall && r->args[0]) {
		/* The word and the int after it, in one read. */
		__u32 words[3] = {};
		if (!bpf_copy_from_user_task(words, sizeof(words), (void *)r->args[0], task, 0)) {
			r->futex_word = words[0];
			r->futex_owner = (__s32)words[2];
			r->futex_read = 1;
		}
	}
	r->known_wait = 0;
	if (only_wanted && r->state != 0 && r->syscall == futex_syscall) {
		struct wait_place place = { .tls_base = r->tls_base, .user_sp = r->user_sp, .futex_op = r->args[1] };
		r->known_wait = bpf_map_lookup_elem(&known_waits, &place) != NULL;
	}
	/* The history names a running thread, or one blocked in another syscall, without its stack: only a futex
	 * wait's is needed, to say what it waits for, and not for a wait it has named before. */
	bool unwound = !r->known_wait &&
		       !(only_wanted && (r->state == 0 || r->syscall != futex_syscall));
	struct stack_event *e = &r->stack;
	long n = unwound ? unwind_task_user_stack(task, e->ips) : 0;
	if (n < 0) {
		if (!COMPAT) /* the compat build's user stacks are unwound by user space */
			count_lost(user_stack);
		n = 0;
	}
	__u32 user = n > MAX_USER_FRAMES ? MAX_USER_FRAMES : n;
	e->tid = r->tid;
	e->statement = 0;
	e->connection = 0;
	e->stack_id = 0;
	e->user_len = user;
	e->kernel_len = 0;
	if (kernel_stacks) {
		long k = bpf_get_task_stack(task, &e->ips[user], sizeof(__u64) * MAX_KERNEL_FRAMES, 0);
		if (k < 0)
			count_lost(kernel_stack);
		e->kernel_len = k > 0 ? k / sizeof(__u64) : 0;
	}
	bpf_seq_write(ctx->meta->seq, r, sizeof(*r));
	return 0;
}
