// Off-CPU time: when a target thread leaves the CPU its stack is captured (or kept, when it leaves at the
// same place as last time); when it comes back the time away is split into blocked (switch-out to wakeup)
// and runnable (wakeup, or preemption, to switch-in: waiting for a CPU) and summed on that stack, which is
// sent when the thread next waits elsewhere. Waits shorter than min_block_ns are dropped in the kernel.
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "stack_event.h"

char LICENSE[] SEC("license") = "GPL";

const volatile __u32 target_tgid = 0;
const volatile bool kernel_stacks = false;
const volatile __u64 min_block_ns = 1000;

#define TASK_RUNNING 0

/* A thread that leaves the CPU again at the same instruction with the same stack and frame pointers is in the
 * same call chain: the user stacks of its last few places are kept, keyed by those registers, and reused. */
#define STACK_CACHE_SLOTS 4

struct cached_stack {
	__u64 ip;
	__u64 sp;
	__u64 bp;
	__u32 user_len;
	__u32 _pad;
	__u64 ips[MAX_USER_FRAMES];
};

struct thread_state {
	__u64 off_ts;   /* when it left the CPU; 0 while on CPU */
	__u64 wake_ts;  /* when it was woken, if it blocked */
	__u32 preempted;
	__u32 next_slot;
	__u32 generation;   /* unwind_generation the kept stacks were unwound with */
	__u32 _pad;
	/* User registers of the place ev's stack belongs to. */
	__u64 stack_ip;
	__u64 stack_sp;
	__u64 stack_bp;
	struct cached_stack cache[STACK_CACHE_SLOTS];
	struct stack_event ev;
};

/* Stacks captured, and reused from the thread's previous wait at the same place: for the benchmark figures. */
__u64 stacks_unwound;
__u64 stacks_reused;

/* Bounded by the number of server threads; entries go when the thread exits. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct thread_state);
} threads SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct thread_state);
} zero_state SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 16 * 1024 * 1024);
} events SEC(".maps");

static __always_inline struct thread_state *state_of(__u32 tid, bool create)
{
	struct thread_state *st = bpf_map_lookup_elem(&threads, &tid);
	if (st || !create)
		return st;
	__u32 zero = 0;
	struct thread_state *init = bpf_map_lookup_elem(&zero_state, &zero);
	if (!init)
		return 0;
	st = lookup_or_init(&threads, &tid, init);
	if (!st)
		count_lost(LOST_STATE);
	return st;
}

/* Puts the user stack of the place (ip, sp, bp) into st->ev: from the cache, else unwound and cached. */
static __always_inline void set_stack(void *ctx, struct thread_state *st, __u64 ip, __u64 sp, __u64 bp)
{
	st->stack_ip = ip;
	st->stack_sp = sp;
	st->stack_bp = bp;
	if (kernel_stacks || !ip) {
		capture_stacks(ctx, &st->ev, kernel_stacks);
		__sync_fetch_and_add(&stacks_unwound, 1);
		return;
	}
	for (int i = 0; i < STACK_CACHE_SLOTS; i++) {
		struct cached_stack *c = &st->cache[i];
		if (c->ip == ip && c->sp == sp && c->bp == bp) {
			__u32 n = c->user_len;
			if (n > MAX_USER_FRAMES)
				n = MAX_USER_FRAMES;
			if (n && bpf_probe_read_kernel(st->ev.ips, n * sizeof(__u64), c->ips))
				break;
			st->ev.user_len = n;
			st->ev.kernel_len = 0;
			__sync_fetch_and_add(&stacks_reused, 1);
			return;
		}
	}
	capture_stacks(ctx, &st->ev, false);
	__sync_fetch_and_add(&stacks_unwound, 1);
	struct cached_stack *c = &st->cache[st->next_slot % STACK_CACHE_SLOTS];
	st->next_slot++;
	__u32 n = st->ev.user_len;
	if (n > MAX_USER_FRAMES)
		n = MAX_USER_FRAMES;
	if (n && bpf_probe_read_kernel(c->ips, n * sizeof(__u64), st->ev.ips)) {
		c->ip = 0;
		return;
	}
	c->ip = ip;
	c->sp = sp;
	c->bp = bp;
	c->user_len = n;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(on_switch, bool preempt, struct task_struct *prev, struct task_struct *next, unsigned int prev_state)
{
	__u64 now = bpf_ktime_get_ns();

	if (prev->tgid == target_tgid) {
		struct thread_state *st = state_of(prev->pid, true);
		if (st) {
			st->off_ts = now;
			st->wake_ts = 0;
			st->preempted = preempt || prev_state == TASK_RUNNING;
			st->ev.tid = prev->pid;
			if (st->generation != unwind_generation) {
				/* New tables: forget the kept stacks, which may have stopped short. */
				st->generation = unwind_generation;
				st->stack_ip = 0;
				for (int i = 0; i < STACK_CACHE_SLOTS; i++)
					st->cache[i].ip = 0;
			}
			struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
			__u64 ip = regs ? PT_REGS_IP(regs) : 0;
			__u64 sp = regs ? PT_REGS_SP(regs) : 0;
			__u64 bp = regs ? PT_REGS_FP(regs) : 0;
			if (!kernel_stacks && ip && ip == st->stack_ip && sp == st->stack_sp && bp == st->stack_bp) {
				__sync_fetch_and_add(&stacks_reused, 1);
			} else {
				/* Another call chain: what was summed on the previous one goes to user space first. */
				if (st->ev.value[0] || st->ev.value[1])
					submit_stack_event(&events, &st->ev);
				st->ev.value[0] = 0;
				st->ev.value[1] = 0;
				set_stack(ctx, st, ip, sp, bp);
			}
		}
	}

	if (next->tgid == target_tgid) {
		struct thread_state *st = state_of(next->pid, false);
		if (!st || !st->off_ts)
			return 0;
		__u64 off = now - st->off_ts;
		__u64 woke = st->wake_ts;
		st->off_ts = 0;
		if (off < min_block_ns)
			return 0;
		/* Summed on the thread's current stack; sent when the thread waits in another call chain, or read
		 * from this map at the end: one event per change of place, not one per wait. */
		if (st->preempted || woke < now - off || woke > now) {
			/* preempted: all of it was waiting for a CPU; a missed wakeup: count it all as blocked */
			st->ev.value[st->preempted ? 1 : 0] += off;
		} else {
			st->ev.value[0] += woke - (now - off);
			st->ev.value[1] += now - woke;
		}
	}
	return 0;
}

static __always_inline void mark_woken(struct task_struct *p)
{
	if (p->tgid != target_tgid)
		return;
	struct thread_state *st = state_of(p->pid, false);
	if (st && st->off_ts && !st->wake_ts)
		st->wake_ts = bpf_ktime_get_ns();
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(on_wakeup, struct task_struct *p)
{
	mark_woken(p);
	return 0;
}

SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(on_wakeup_new, struct task_struct *p)
{
	mark_woken(p);
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(on_exit, struct task_struct *p)
{
	if (p->tgid == target_tgid) {
		__u32 tid = p->pid;
		struct thread_state *st = state_of(tid, false);
		if (st && (st->ev.value[0] || st->ev.value[1]))
			submit_stack_event(&events, &st->ev);
		bpf_map_delete_elem(&threads, &tid);
	}
	return 0;
}
