/* The process traced, set by user space before loading: every collector's programs keep to its threads. */
#pragma once

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

const volatile __u32 target_tgid = 0;
/* Several processes traced by one set of programs (the agent's servers): a process is a target when its bit in
 * target_bits is set, rather than when it is target_tgid. An array lookup is inlined by the verifier: a switch of
 * another process is turned away almost as cheaply as by the constant. */
const volatile bool many_targets = false;

/* A bit per PID of the host, set by user space as processes come and go; sized 1 by user space unless
 * many_targets (then PID_MAX_LIMIT / 32). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} target_bits SEC(".maps");
/* Counts the times user space attached the programs (a sampled collector attaches for one period in N): a
 * thread's state from an earlier period is stale, its wait or statement not seen to its end. */
__u32 attach_period = 0; /* defined, as lost.h says why */

/* task_struct.__state of a task that is running or runnable (include/linux/sched.h). */
#define TASK_RUNNING 0
/* The state of a thread's last switch out, after sched_process_exit: whatever is made for it then outlives it. */
#define TASK_DEAD 0x80

static __always_inline bool tgid_is_target(__u32 tgid)
{
	if (!many_targets)
		return tgid == target_tgid;
	__u32 word = tgid / 32;
	__u32 *bits = bpf_map_lookup_elem(&target_bits, &word);
	return bits && (*bits >> (tgid & 31)) & 1;
}

/* Whether the current thread belongs to a traced process; its thread id in *tid. */
static __always_inline bool current_is_target(__u32 *tid)
{
	__u64 id = bpf_get_current_pid_tgid();
	*tid = (__u32)id;
	return tgid_is_target(id >> 32);
}

static __always_inline bool task_is_target(const struct task_struct *task)
{
	return tgid_is_target(task->tgid);
}
