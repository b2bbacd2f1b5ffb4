/* The ring buffer every collector sends its events to, and sending to it without waking the reader each time. */
#pragma once

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "lost.h"

/* User space may size it before loading. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4 * 1024 * 1024);
} events SEC(".maps");

/* The reader is woken once this much waits in the ring; it also polls on a timer, so nothing waits long. */
#define RINGBUF_WAKE_BYTES (256 * 1024)

/* How much each CPU sends between its looks at how much waits (a helper call, on a line the reader writes from
 * another CPU): not at every event. */
#define WAKE_CHECK_BYTES (16 * 1024)
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} sent_unchecked SEC(".maps");

/* Sends `size` bytes of `data`, waking the reader at once if `now` (a rare event it must act on without delay), or
 * when a batch waits; counted in lost.ringbuf when the ring buffer is full. Whether it was sent. */
static __always_inline bool submit_event_waking(void *data, __u64 size, bool now)
{
	__u32 zero = 0;
	__u64 *sent = bpf_map_lookup_elem(&sent_unchecked, &zero); /* inlined by recent verifiers */
	bool wake = now;
	if (sent && (*sent += size) >= WAKE_CHECK_BYTES) {
		*sent = 0;
		wake = wake || bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) >= RINGBUF_WAKE_BYTES;
	}
	if (bpf_ringbuf_output(&events, data, size, wake ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP)) {
		count_lost(ringbuf);
		return false;
	}
	return true;
}

static __always_inline bool submit_event(void *data, __u64 size)
{
	return submit_event_waking(data, size, false);
}
