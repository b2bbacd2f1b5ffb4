// Any function, as DTrace's pid provider: each call of a traced function is timed from entry to return with
// one uprobe session (the return probe is armed only for the calls the entry keeps; before 6.13, an entry and
// a return probe) and summed in the kernel
// per (function, and what the user aggregates by: thread, caller stack, an argument): calls, errors, total,
// longest and a log2 histogram. Static probes (USDT) are counted the same way, without a duration.
// With `inside`, the syscalls, off-CPU time and futex waits of a thread are summed while it is inside a traced
// function: DTrace's thread-local flag, kept in task storage.
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
/* libbpf's own header compares signed and unsigned; not ours to change. */
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wsign-compare"
#include <bpf/usdt.bpf.h>
#pragma clang diagnostic pop
#include "futex.h"
#include "lost.h"
#include "maps.h"
#include "session.h"
#include "stack_ids.h"
#include "target.h"

char LICENSE[] SEC("license") = "GPL";

#define MAX_FUNCS 1024
#define MAX_DEPTH 8      /* nested traced calls timed per thread; deeper ones are counted in too_deep */
#define ARG_STR 64
#define HIST_BUCKETS 40  /* log2 of nanoseconds: hist[i] holds [2^i, 2^(i+1)) ns */

enum trace_arg_kind : __u32 {
	ARG_NONE = 0,
	ARG_INT = 1, /* a signed integer of the register's low 32 bits, widened: C's int */
	ARG_PTR = 2, /* the whole register */
	ARG_STR_KIND = 3, /* a NUL-terminated string the register points to (copyinstr) */
	ARG_LONG = 4, /* the whole register, signed */
};

enum trace_errval : __u32 {
	ERRVAL_NONE = 0,
	ERRVAL_NEGATIVE = 1, /* (int)ret < 0: -1 and -errno conventions */
	ERRVAL_NONZERO = 2,  /* (int)ret != 0: handler and my_* error codes */
	ERRVAL_ZERO = 3,     /* (int)ret == 0: false */
	ERRVAL_NULL = 4,     /* ret == NULL */
};

const volatile __u32 arg_index = 0;                   /* which argument, from 0 */
const volatile enum trace_arg_kind arg_kind = ARG_NONE; /* ARG_NONE: no argument kept */
const volatile enum trace_errval errval = ERRVAL_NONE;
const volatile bool by_thread = false;
const volatile bool by_stack = false;
const volatile bool inside = false;
const volatile __s64 futex_nr = -1;
/* The syscalls through which the kernel runs our own probes (uretprobe, uprobe): not the function's doing. */
const volatile __s64 uretprobe_nr = -1;
const volatile __s64 uprobe_nr = -1;

struct trace_key {
	__u32 func; /* the attach cookie: an index into user space's list of probes */
	__u32 tid;  /* by_thread */
	__u64 stack_id; /* by_stack: the callers of the function */
	__s64 arg;  /* an integer or pointer argument */
	char str[ARG_STR]; /* a string argument */
};

struct trace_stats {
	__u64 calls;
	__u64 errors;
	__u64 total_ns;
	__u64 max_ns;
	__u64 hist[HIST_BUCKETS];
};

/* Full: counted in lost.state. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct trace_key);
	__type(value, struct trace_stats);
} stats SEC(".maps");

/* Calls per probe while the rate is measured, before anything is timed. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_FUNCS);
	__type(key, __u32);
	__type(value, __u64);
} rate_calls SEC(".maps");

struct frame {
	struct trace_key key;
	__u64 ts;
	__u64 sp; /* at the entry: how a return without a session finds its frame */
};

struct thread_trace {
	struct frame frames[MAX_DEPTH];
	__u32 depth;     /* traced calls the thread is in */
	__u32 sys_nr;    /* inside: the syscall it is in */
	__u64 sys_ts;    /* inside: when it entered it (0: none) */
	__u64 futex_addr; /* inside: the word of the futex wait it is in (0: none) */
	__u64 off_ts;    /* inside: when it left the CPU (0: on CPU) */
};

/* Per thread: as many as the process has threads, freed with the thread. */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct thread_trace);
} threads SEC(".maps");

/* Calls deeper than MAX_DEPTH in traced functions: counted, not timed. */
__u64 too_deep;

struct inside_key {
	__u32 func;
	__u32 what;   /* a syscall number, or INSIDE_OFFCPU */
	__u64 addr;   /* a futex wait's lock word */
};

#define INSIDE_OFFCPU 0xffffffffu

struct inside_stats {
	__u64 count;
	__u64 total_ns;
	__u64 max_ns;
};

/* inside: (outermost traced function, syscall or off-CPU, lock word) → time. Full: counted in lost.state. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct inside_key);
	__type(value, struct inside_stats);
} inside_stats SEC(".maps");

static __always_inline __u32 log2_bucket(__u64 v)
{
	__u32 b = 0;
	for (int i = 0; i < HIST_BUCKETS - 1; i++) {
		if (v < 2)
			break;
		v >>= 1;
		b++;
	}
	return b;
}

/* Read through the CORE helpers: the verifier refuses a context access at an offset computed from arg_index. */
static __always_inline __u64 register_arg(struct pt_regs *ctx)
{
	switch (arg_index) {
	case 0:
		return PT_REGS_PARM1_CORE(ctx);
	case 1:
		return PT_REGS_PARM2_CORE(ctx);
	case 2:
		return PT_REGS_PARM3_CORE(ctx);
	case 3:
		return PT_REGS_PARM4_CORE(ctx);
	case 4:
		return PT_REGS_PARM5_CORE(ctx);
	default:
		return PT_REGS_PARM6_CORE(ctx);
	}
}

/* The argument into the key, as its kind says. */
static __always_inline void keep_arg(struct trace_key *k, __u64 raw)
{
	switch (arg_kind) {
	case ARG_INT:
		k->arg = (__s32)raw;
		break;
	case ARG_STR_KIND:
		if (bpf_probe_read_user_str(k->str, sizeof(k->str), (void *)raw) < 0)
			k->arg = (__s64)raw; /* unreadable: the pointer is kept, the string is empty */
		break;
	case ARG_PTR:
	case ARG_LONG:
		k->arg = (__s64)raw;
		break;
	default:
		break;
	}
}

/* What a new entry starts from: in .rodata, as it is larger than the BPF stack can spare. */
const struct trace_stats zero_stats = {};

static __always_inline void add_stats(const struct trace_key *k, __u64 took, bool error)
{
	struct trace_stats *s = lookup_or_init(&stats, k, &zero_stats);
	if (!s) {
		count_lost(state);
		return;
	}
	__sync_fetch_and_add(&s->calls, 1);
	if (error)
		__sync_fetch_and_add(&s->errors, 1);
	__sync_fetch_and_add(&s->total_ns, took);
	if (took > s->max_ns)
		s->max_ns = took;
	__u32 b = log2_bucket(took);
	if (b < HIST_BUCKETS)
		__sync_fetch_and_add(&s->hist[b], 1);
}

static __always_inline bool is_error(__u64 ret)
{
	switch (errval) {
	case ERRVAL_NEGATIVE:
		return (__s32)ret < 0;
	case ERRVAL_NONZERO:
		return (__u32)ret != 0;
	case ERRVAL_ZERO:
		return (__u32)ret == 0;
	case ERRVAL_NULL:
		return ret == 0;
	default:
		return false;
	}
}

/* Entry: a frame on the thread's stack of traced calls; 0 arms a session's return probe. */
static __always_inline int on_entry(struct pt_regs *ctx, bool session)
{
	__u32 tid;
	if (!current_is_target(&tid))
		return 1;
	struct thread_trace *t =
		bpf_task_storage_get(&threads, bpf_get_current_task_btf(), 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	__u64 *cookie = session ? session_cookie(ctx) : 0;
	if (!t || (session && !cookie)) {
		count_lost(state);
		return 1;
	}
	__u32 slot = t->depth;
	if (slot >= MAX_DEPTH) {
		__sync_fetch_and_add(&too_deep, 1);
		return 1;
	}
	struct frame *f = &t->frames[slot];
	__builtin_memset(&f->key, 0, sizeof(f->key));
	f->key.func = bpf_get_attach_cookie(ctx);
	if (by_thread)
		f->key.tid = tid;
	if (by_stack)
		f->key.stack_id = stack_id_of_call(ctx, true);
	if (arg_kind != ARG_NONE)
		keep_arg(&f->key, register_arg(ctx));
	t->depth = slot + 1;
	/* The slot, for the return: a call left by longjmp or an exception gets no return, and the next return
	 * below it puts the depth right again. */
	if (session && cookie)
		*cookie = slot;
	f->sp = PT_REGS_SP(ctx);
	f->ts = bpf_ktime_get_ns();
	return 0;
}

static __always_inline int on_return(struct pt_regs *ctx)
{
	__u64 now = bpf_ktime_get_ns();
	struct thread_trace *t = bpf_task_storage_get(&threads, bpf_get_current_task_btf(), 0, 0);
	__u64 *cookie = session_cookie(ctx);
	if (!t || !cookie)
		return 0;
	__u32 slot = *cookie;
	if (slot >= MAX_DEPTH)
		return 0;
	struct frame *f = &t->frames[slot];
	t->depth = slot;
	add_stats(&f->key, now - f->ts, is_error(PT_REGS_RC(ctx)));
	return 0;
}

SEC("uprobe.session")
int on_call(struct pt_regs *ctx)
{
	if (session_is_return(ctx))
		return on_return(ctx);
	return on_entry(ctx, true);
}

/* Kernels without uprobe sessions (before 6.13): an entry probe, and a return probe at every call. */
SEC("uprobe")
int on_call_entry(struct pt_regs *ctx)
{
	on_entry(ctx, false);
	return 0;
}

/* A return finds its frame by the stack pointer, which is the entry's past the return address: frames below it
 * were left by longjmp or an exception and are dropped; none at it, the entry kept nothing (too deep, no state). */
SEC("uretprobe")
int on_call_return(struct pt_regs *ctx)
{
	__u64 now = bpf_ktime_get_ns();
	struct thread_trace *t = bpf_task_storage_get(&threads, bpf_get_current_task_btf(), 0, 0);
	if (!t)
		return 0;
	__u64 entry_sp = PT_REGS_SP(ctx) - 8;
	for (int i = 0; i < MAX_DEPTH; i++) {
		__u32 depth = t->depth;
		if (depth == 0 || depth > MAX_DEPTH)
			return 0;
		struct frame *f = &t->frames[(depth - 1) & (MAX_DEPTH - 1)];
		if (f->sp > entry_sp)
			return 0;
		t->depth = depth - 1;
		if (f->sp == entry_sp) {
			add_stats(&f->key, now - f->ts, is_error(PT_REGS_RC(ctx)));
			return 0;
		}
	}
	return 0;
}

static __always_inline int count_call(struct pt_regs *ctx)
{
	__u32 i = bpf_get_attach_cookie(ctx);
	__u64 *n = bpf_map_lookup_elem(&rate_calls, &i);
	if (n)
		__sync_fetch_and_add(n, 1);
	return 0;
}

/* The call rate, measured before the timing probes are placed: a counter per probe and nothing else. */
SEC("uprobe.multi")
int on_call_count(struct pt_regs *ctx)
{
	return count_call(ctx);
}

/* The same without uprobe_multi links (before 6.6). */
SEC("uprobe")
int on_call_count_one(struct pt_regs *ctx)
{
	return count_call(ctx);
}

/* A static probe: counted, with its argument; it has no duration. */
SEC("usdt")
int on_usdt(struct pt_regs *ctx)
{
	__u32 tid;
	if (!current_is_target(&tid))
		return 0;
	struct trace_key k = { .func = bpf_usdt_cookie(ctx) };
	if (by_thread)
		k.tid = tid;
	if (by_stack)
		k.stack_id = stack_id_of_call(ctx, false);
	long raw = 0;
	if (arg_kind != ARG_NONE && bpf_usdt_arg(ctx, arg_index, &raw) == 0)
		keep_arg(&k, raw);
	add_stats(&k, 0, false);
	return 0;
}

SEC("usdt")
int on_usdt_count(struct pt_regs *ctx)
{
	__u32 i = bpf_usdt_cookie(ctx);
	__u64 *n = bpf_map_lookup_elem(&rate_calls, &i);
	if (n)
		__sync_fetch_and_add(n, 1);
	return 0;
}

static __always_inline void add_inside(__u32 func, __u32 what, __u64 addr, __u64 took)
{
	struct inside_key k = { .func = func, .what = what, .addr = addr };
	struct inside_stats zero = {};
	struct inside_stats *s = lookup_or_init(&inside_stats, &k, &zero);
	if (!s) {
		count_lost(state);
		return;
	}
	__sync_fetch_and_add(&s->count, 1);
	__sync_fetch_and_add(&s->total_ns, took);
	if (took > s->max_ns)
		s->max_ns = took;
}

/* The thread's state when it is inside a traced function, else 0. */
static __always_inline struct thread_trace *inside_of(struct task_struct *task)
{
	struct thread_trace *t = bpf_task_storage_get(&threads, task, 0, 0);
	return t && t->depth ? t : 0;
}

SEC("tp_btf/sys_enter")
int BPF_PROG(on_sys_enter, struct pt_regs *regs, long id)
{
	(void)ctx;
	__u32 tid;
	if (!current_is_target(&tid))
		return 0;
	if (id == uretprobe_nr || id == uprobe_nr)
		return 0;
	struct thread_trace *t = inside_of(bpf_get_current_task_btf());
	if (!t)
		return 0;
	t->sys_nr = id;
	t->futex_addr = id == futex_nr && futex_op_waits(PT_REGS_PARM2_SYSCALL(regs)) ?
				PT_REGS_PARM1_SYSCALL(regs) : 0;
	t->sys_ts = bpf_ktime_get_ns();
	return 0;
}

SEC("tp_btf/sys_exit")
int BPF_PROG(on_sys_exit, struct pt_regs *regs, long ret)
{
	(void)ctx;
	(void)regs;
	(void)ret;
	__u32 tid;
	if (!current_is_target(&tid))
		return 0;
	struct thread_trace *t = bpf_task_storage_get(&threads, bpf_get_current_task_btf(), 0, 0);
	/* Entered inside, even if the function returned meanwhile (it cannot, from a syscall). */
	if (!t || !t->sys_ts)
		return 0;
	__u64 took = bpf_ktime_get_ns() - t->sys_ts;
	t->sys_ts = 0;
	__u32 func = t->frames[0].key.func;
	add_inside(func, t->sys_nr, 0, took);
	if (t->futex_addr)
		add_inside(func, futex_nr, t->futex_addr, took);
	return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(on_switch, bool preempt, struct task_struct *prev, struct task_struct *next, unsigned int prev_state)
{
	(void)ctx;
	(void)preempt;
	__u64 now = 0;
	if (task_is_target(prev) && !(prev_state & TASK_DEAD)) {
		struct thread_trace *t = inside_of(prev);
		if (t)
			t->off_ts = now = bpf_ktime_get_ns();
	}
	if (task_is_target(next)) {
		struct thread_trace *t = bpf_task_storage_get(&threads, next, 0, 0);
		if (t && t->off_ts) {
			if (!now)
				now = bpf_ktime_get_ns();
			add_inside(t->frames[0].key.func, INSIDE_OFFCPU, 0, now - t->off_ts);
			t->off_ts = 0;
		}
	}
	return 0;
}
