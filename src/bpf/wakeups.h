/* The scheduler's wakeups of a thread, an existing one or a new one: WAKEUP_PROGRAMS(fn) defines the two
 * tracepoint programs, each calling `fn(struct task_struct *p)` with the task woken. Where the kernel counts
 * each task's waits for a CPU (the sched_info feature), runq_total reads a woken thread's wait at its switch
 * in instead, and no program runs at every wakeup of the host. */
#pragma once

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#define WAKEUP_PROGRAMS(fn)                                 \
	SEC("tp_btf/sched_wakeup")                          \
	int BPF_PROG(on_wakeup, struct task_struct *p)      \
	{                                                   \
		(void)ctx;                                  \
		fn(p);                                      \
		return 0;                                   \
	}                                                   \
	SEC("tp_btf/sched_wakeup_new")                      \
	int BPF_PROG(on_wakeup_new, struct task_struct *p)  \
	{                                                   \
		(void)ctx;                                  \
		fn(p);                                      \
		return 0;                                   \
	}

/* How long `t`, being switched in, has waited for a CPU in all, in the scheduler's count (struct sched_info, in
 * its run queue's clock): run_delay adds a wait when it ends, which comes just after the sched_switch
 * tracepoint; the wait still open began at last_queued, and its run queue's clock is now (updated by the
 * switch). Only differences of it are used. */
static __always_inline __u64 runq_total(struct task_struct *t)
{
	__u64 total = t->sched_info.run_delay;
	__u64 queued = t->sched_info.last_queued;
	if (queued) {
		__u64 clock = t->se.cfs_rq->rq->clock;
		if (clock > queued)
			total += clock - queued;
	}
	return total;
}
