/* The scheduler's wakeups of a thread (an existing one, or a new one), handed to the collector's
 * `mark_woken(struct task_struct *p)`: include after defining it. */
#pragma once

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
