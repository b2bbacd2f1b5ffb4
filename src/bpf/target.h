/* The process traced, set by user space before loading: every collector's programs keep to its threads. */
#pragma once

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

const volatile __u32 target_tgid = 0;
/* Counts the times user space attached the programs (a sampled collector attaches for one period in N): a
 * thread's state from an earlier period is stale, its wait or statement not seen to its end. */
__u32 attach_period = 0; /* defined, as lost.h says why */

/* task_struct.__state of a task that is running or runnable (include/linux/sched.h). */
#define TASK_RUNNING 0
/* The state of a thread's last switch out, after sched_process_exit: whatever is made for it then outlives it. */
#define TASK_DEAD 0x80

/* Whether the current thread belongs to the traced process; its thread id in *tid. */
static __always_inline bool current_is_target(__u32 *tid)
{
	__u64 id = bpf_get_current_pid_tgid();
	*tid = (__u32)id;
	return (__u32)(id >> 32) == target_tgid;
}

static __always_inline bool task_is_target(const struct task_struct *task)
{
	return (__u32)task->tgid == target_tgid;
}
