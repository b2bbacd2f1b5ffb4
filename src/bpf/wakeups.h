/* The scheduler's wakeups of a thread, an existing one or a new one: WAKEUP_PROGRAMS(fn) defines the two
 * tracepoint programs, each calling `fn(struct task_struct *p)` with the task woken. */
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
