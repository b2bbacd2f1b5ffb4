/* A stack as every stack-capturing collector sends it to user space: once per stack, named by its id
 * (stack_ids.h), so that amounts are summed per id in the kernel. */
#pragma once

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "lost.h"
#include "ringbuf.h"
#include "unwind.h"

/* Set by user space: also take kernel frames. */
const volatile bool kernel_stacks = false;

#define MAX_KERNEL_FRAMES 48
#define MAX_FRAMES (MAX_USER_FRAMES + MAX_KERNEL_FRAMES)

struct stack_event {
	__u64 stack_id;
	__u32 tid;        /* the thread it was taken from (the task iterator's stacks are per thread) */
	__u16 user_len;   /* ips[0 .. user_len): user frames, leaf first */
	__u16 kernel_len; /* ips[user_len .. user_len + kernel_len): kernel frames, leaf first */
	__u64 statement;  /* a sample's statement (statement.h's label), where the collector labels them; else 0 */
	__u64 connection; /* and its connection's id */
	__u64 ips[MAX_FRAMES];
};

#define STACK_EVENT_HEADER_BYTES __builtin_offsetof(struct stack_event, ips)

/* An event is larger than the BPF stack, so it is assembled here. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct stack_event);
} scratch SEC(".maps");

/* Fills the user (and with kernel_stacks, kernel) frames of `e` for the current task: unwound from .eh_frame
 * tables where user space loaded them, else by frame pointers. */
static __always_inline void capture_stacks(void *ctx, struct stack_event *e)
{
	long frames = unwind_user_stack(e->ips);
	long n = frames * (long)sizeof(__u64);
	if (frames < 0)
		n = bpf_get_stack(ctx, e->ips, sizeof(__u64) * MAX_USER_FRAMES, BPF_F_USER_STACK);
	if (n < 0) {
		count_lost(user_stack);
		n = 0;
	}
	__u32 user = n / sizeof(__u64);
	if (user > MAX_USER_FRAMES)
		user = MAX_USER_FRAMES;
	e->user_len = user;
	e->kernel_len = 0;
	e->statement = 0;
	e->connection = 0;
	if (!kernel_stacks)
		return;
	n = bpf_get_stack(ctx, &e->ips[user], sizeof(__u64) * MAX_KERNEL_FRAMES, 0);
	if (n < 0) {
		count_lost(kernel_stack);
		return;
	}
	e->kernel_len = n / sizeof(__u64);
}

/* The used part of `e`, in bytes. */
static __always_inline __u64 stack_event_size(const struct stack_event *e)
{
	__u64 frames = e->user_len + e->kernel_len;
	if (frames > MAX_FRAMES)
		frames = MAX_FRAMES;
	return STACK_EVENT_HEADER_BYTES + frames * sizeof(__u64);
}
