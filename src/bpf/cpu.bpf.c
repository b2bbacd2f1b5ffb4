// On-CPU sampling: a perf event per CPU fires at the sampling rate; samples of the target process
// send their stacks to user space, which aggregates them (one event per sample, a few hundred a second).
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "stack_event.h"

char LICENSE[] SEC("license") = "GPL";

const volatile __u32 target_tgid = 0;
const volatile bool kernel_stacks = false;

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 2 * 1024 * 1024);
} events SEC(".maps");

SEC("perf_event")
int on_cpu_sample(struct bpf_perf_event_data *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	if ((__u32)(id >> 32) != target_tgid)
		return 0;
	__u32 zero = 0;
	struct stack_event *e = bpf_map_lookup_elem(&scratch, &zero);
	if (!e)
		return 0;
	e->tid = (__u32)id;
	e->kind = 0;
	e->value[0] = 1;
	e->value[1] = 0;
	capture_stacks(ctx, e, kernel_stacks);
	submit_stack_event(&events, e);
	return 0;
}
