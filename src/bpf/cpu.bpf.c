// On-CPU sampling: a perf event per CPU fires at the sampling rate; a sample of the target process takes the
// id of its stack (stack_ids.h: unwound and sent once) and counts one more sample for (thread, stack id).
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "maps.h"
#include "stack_ids.h"
#include "target.h"

char LICENSE[] SEC("license") = "GPL";

struct sample_key {
	__u32 tid;
	__u32 _pad;
	__u64 stack_id;
};

/* Full: counted in lost.state, the sample is not counted. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct sample_key);
	__type(value, __u64);
} samples SEC(".maps");

SEC("perf_event")
int on_cpu_sample(struct bpf_perf_event_data *ctx)
{
	__u32 tid;
	if (!current_is_target(&tid))
		return 0;
	/* The sampled instruction is anywhere: a call-site cache would rarely hit. */
	struct sample_key k = { .tid = tid, .stack_id = stack_id_now(ctx) };
	__u64 zero = 0;
	__u64 *n = k.stack_id ? lookup_or_init(&samples, &k, &zero) : 0;
	if (n)
		__sync_fetch_and_add(n, 1);
	else
		count_lost(state);
	return 0;
}
