/* The compat build (-DMYPROBE_COMPAT, build.rs): the collectors again, for kernels before 5.17, which lack
 * bpf_loop and callbacks (5.17), task storage and bpf_get_current_task_btf (5.11), bpf_task_pt_regs (5.15),
 * atomic OR (5.12) and sched_switch's prev_state (5.18). It keeps every map, program and type of the normal
 * build under the same names, so that one skeleton opens either object; what differs is behind these. */
#pragma once

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include "maps.h"

#ifdef MYPROBE_COMPAT
#define COMPAT 1
#else
#define COMPAT 0
#endif

/* Per-thread state: task storage, found from the task and freed with it; in the compat build a preallocated
 * hash by thread id of `compat_max` entries, whose entries the collector deletes when it is done with a thread
 * (and counts as lost when full). Every field is given in both builds: the skeleton renders the definition. */
#ifdef MYPROBE_COMPAT
#define THREAD_STORAGE(value_type, compat_max)       \
	__uint(type, BPF_MAP_TYPE_HASH);             \
	__uint(map_flags, 0);                        \
	__uint(max_entries, compat_max);             \
	__type(key, int);                            \
	__type(value, value_type)
#else
#define THREAD_STORAGE(value_type, compat_max)       \
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);     \
	__uint(map_flags, BPF_F_NO_PREALLOC);        \
	__uint(max_entries, 0);                      \
	__type(key, int);                            \
	__type(value, value_type)
#endif

/* The current thread's value in a THREAD_STORAGE map; with `create`, made if missing (the compat build copies
 * `zero`, a zeroed value of the map's type); 0 if it has none or none could be made. */
static __always_inline void *current_thread_storage(void *map, bool create, const void *zero)
{
#ifdef MYPROBE_COMPAT
	int tid = (__u32)bpf_get_current_pid_tgid();
	return create ? lookup_or_init(map, &tid, zero) : bpf_map_lookup_elem(map, &tid);
#else
	(void)zero;
	return bpf_task_storage_get(map, bpf_get_current_task_btf(), 0,
				    create ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);
#endif
}

/* The same for `task`: a pointer the kernel typed (a tracepoint's argument, an iterator's task), or in the compat
 * build current_task()'s. */
static __always_inline void *task_thread_storage(void *map, struct task_struct *task, bool create,
						 const void *zero)
{
#ifdef MYPROBE_COMPAT
	int tid = BPF_CORE_READ(task, pid);
	return create ? lookup_or_init(map, &tid, zero) : bpf_map_lookup_elem(map, &tid);
#else
	(void)zero;
	return bpf_task_storage_get(map, task, 0, create ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);
#endif
}

/* Done with the current thread's value until its next call: the compat build's hash entry is freed (task storage
 * stays, for that call). */
static __always_inline void current_thread_storage_release(void *map)
{
#ifdef MYPROBE_COMPAT
	int tid = (__u32)bpf_get_current_pid_tgid();
	bpf_map_delete_elem(map, &tid);
#else
	(void)map;
#endif
}

/* Frees `task`'s value: task storage is freed with the task anyway, a hash entry only here. */
static __always_inline void task_thread_storage_delete(void *map, struct task_struct *task)
{
#ifdef MYPROBE_COMPAT
	int tid = task->pid;
	bpf_map_delete_elem(map, &tid);
#else
	bpf_task_storage_delete(map, task);
#endif
}

/* The current task: typed by the kernel (its fields read directly), or in the compat build a plain address, whose
 * fields are read with BPF_CORE_READ (which also reads typed pointers). */
static __always_inline struct task_struct *current_task(void)
{
#ifdef MYPROBE_COMPAT
	return (struct task_struct *)bpf_get_current_task();
#else
	return bpf_get_current_task_btf();
#endif
}

/* The user registers `task` entered the kernel with. Before bpf_task_pt_regs (5.15), x86-64's task_pt_regs: at
 * the top of its kernel stack, THREAD_SIZE (16 KiB, without KASAN, as distributions build) above its base; a plain
 * address, read with BPF_CORE_READ. */
static __always_inline struct pt_regs *task_regs(struct task_struct *task)
{
#ifdef MYPROBE_COMPAT
	__u64 stack = (__u64)BPF_CORE_READ(task, stack);
	return stack ? (struct pt_regs *)(stack + 16384) - 1 : 0;
#else
	return (struct pt_regs *)bpf_task_pt_regs(task);
#endif
}

/* task_struct.state, before 5.14 renamed __state (and made unsigned int). */
struct task_struct___pre_5_14 {
	volatile long state;
} __attribute__((preserve_access_index));

static __always_inline unsigned int task_state(struct task_struct *task)
{
	if (bpf_core_field_exists(task->__state))
		return task->__state;
	return ((struct task_struct___pre_5_14 *)task)->state;
}

/* `SCHED_SWITCH_PROG(name) { body }`: the sched_switch program `name`, whose body sees ctx, preempt, prev, next
 * and prev_state. The tracepoint passes prev_state since 5.18; before, it is prev's own state. */
#ifdef MYPROBE_COMPAT
#define SCHED_SWITCH_ARGS bool preempt, struct task_struct *prev, struct task_struct *next
#define SCHED_SWITCH_PREV_STATE task_state(prev)
#else
#define SCHED_SWITCH_ARGS bool preempt, struct task_struct *prev, struct task_struct *next, unsigned int prev_state
#define SCHED_SWITCH_PREV_STATE prev_state
#endif
#define SCHED_SWITCH_PROG(name)                                                                               \
	static __always_inline int name##_body(unsigned long long *ctx, bool preempt, struct task_struct *prev, \
					       struct task_struct *next, unsigned int prev_state);            \
	SEC("tp_btf/sched_switch")                                                                         \
	int BPF_PROG(name, SCHED_SWITCH_ARGS)                                                              \
	{                                                                                                  \
		return name##_body(ctx, preempt, prev, next, SCHED_SWITCH_PREV_STATE);                     \
	}                                                                                                  \
	static __always_inline int name##_body(unsigned long long *ctx, bool preempt, struct task_struct *prev, \
					       struct task_struct *next, unsigned int prev_state)

/* *word |= bits, atomically where the kernel can (BPF's atomic OR, 5.12); before, a lost race loses a bit. */
#define OR_BITS(word, bits)                                 \
	do {                                                \
		if (COMPAT)                                 \
			*(word) |= (bits);                  \
		else                                        \
			__sync_fetch_and_or((word), (bits)); \
	} while (0)
