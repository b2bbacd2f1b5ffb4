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

/* The reader is woken only once this much has accumulated; it also polls on a timer, so nothing waits long. */
#define RINGBUF_WAKE_BYTES (256 * 1024)

/* Sends `size` bytes of `data`, waking the reader at once if `now` (a rare event it must act on without delay);
 * counted in lost.ringbuf when the ring buffer is full. */
static __always_inline void submit_event_waking(void *data, __u64 size, bool now)
{
	/* Woken once as the batch fills past the mark, not at every event after it: each wakeup interrupts a CPU
	 * (an IPI, a VM exit in a guest), and the reader, once woken, takes all there is. */
	__u64 before = bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA);
	bool crossing = before < RINGBUF_WAKE_BYTES && before + size >= RINGBUF_WAKE_BYTES;
	if (bpf_ringbuf_output(&events, data, size, now || crossing ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP))
		count_lost(ringbuf);
}

static __always_inline void submit_event(void *data, __u64 size)
{
	submit_event_waking(data, size, false);
}
