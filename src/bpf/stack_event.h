/* The event every stack-capturing collector sends to user space, and what they share around it. */
#pragma once

#include "maps.h"

#define MAX_USER_FRAMES 127
#define MAX_KERNEL_FRAMES 48
#define MAX_FRAMES (MAX_USER_FRAMES + MAX_KERNEL_FRAMES)

/* Reasons an event or a part of it was lost; user space reports each count. Keep in sync with collect/mod.rs. */
enum lost_reason {
	LOST_RINGBUF = 0,     /* ring buffer full: the whole event */
	LOST_USER_STACK = 1,  /* user stack could not be read: event kept with no user frames */
	LOST_KERNEL_STACK = 2,
	LOST_STATE = 3,       /* per-thread state map full: the event could not be timed */
	LOST_REASONS = 4,
};

struct stack_event {
	__u32 tid;
	__u32 kind;          /* collector-specific */
	__u64 value[2];      /* collector-specific: samples, or nanoseconds split in two */
	__u16 user_len;      /* ips[0 .. user_len): user frames, leaf first */
	__u16 kernel_len;    /* ips[user_len .. user_len + kernel_len): kernel frames, leaf first */
	__u32 _pad;
	__u64 ips[MAX_FRAMES];
};

#define STACK_EVENT_HEADER_BYTES ((unsigned long)&((struct stack_event *)0)->ips)

/* An event is larger than the BPF stack, so it is assembled here. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct stack_event);
} scratch SEC(".maps");

/* In .bss, so user space reads them without a map lookup. Only failure paths touch them. */
__u64 lost[LOST_REASONS];

static __always_inline void count_lost(enum lost_reason why)
{
	if (why < LOST_REASONS)
		__sync_fetch_and_add(&lost[why], 1);
}

#include "unwind.h"

/* Fills the user (and optionally kernel) frames of `e` for the current task: unwound from .eh_frame tables
 * where user space loaded them, else by frame pointers. */
static __always_inline void capture_stacks(void *ctx, struct stack_event *e, bool kernel)
{
	long frames = unwind_user_stack(e->ips);
	long n = frames * (long)sizeof(__u64);
	if (frames < 0)
		n = bpf_get_stack(ctx, e->ips, sizeof(__u64) * MAX_USER_FRAMES, BPF_F_USER_STACK);
	if (n < 0) {
		count_lost(LOST_USER_STACK);
		n = 0;
	}
	__u32 user = n / sizeof(__u64);
	if (user > MAX_USER_FRAMES)
		user = MAX_USER_FRAMES;
	e->user_len = user;
	e->kernel_len = 0;
	if (!kernel)
		return;
	n = bpf_get_stack(ctx, &e->ips[user], sizeof(__u64) * MAX_KERNEL_FRAMES, 0);
	if (n < 0) {
		count_lost(LOST_KERNEL_STACK);
		return;
	}
	e->kernel_len = n / sizeof(__u64);
}

/* Wake the reader only once a batch has accumulated; it also polls on a timer, so nothing waits long. */
#define RINGBUF_WAKE_BYTES (256 * 1024)

/* Sends the used part of `e`; counts it as lost when the ring buffer is full. */
static __always_inline void submit_stack_event(void *ringbuf, struct stack_event *e)
{
	__u64 frames = e->user_len + e->kernel_len;
	if (frames > MAX_FRAMES)
		frames = MAX_FRAMES;
	__u64 size = STACK_EVENT_HEADER_BYTES + frames * sizeof(__u64);
	__u64 flags = bpf_ringbuf_query(ringbuf, BPF_RB_AVAIL_DATA) >= RINGBUF_WAKE_BYTES ? BPF_RB_FORCE_WAKEUP
											  : BPF_RB_NO_WAKEUP;
	if (bpf_ringbuf_output(ringbuf, e, size, flags))
		count_lost(LOST_RINGBUF);
}
