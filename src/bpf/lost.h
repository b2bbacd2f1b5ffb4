/* What went missing, counted in .bss (user space reads it without a map lookup) and reported: nothing is
 * lost silently. Only failure paths touch it. */
#pragma once

#include "vmlinux.h"

struct lost_counts {
	__u64 ringbuf;      /* the ring buffer was full: the event (a stack's definition, a statement) */
	__u64 user_stack;   /* the user stack was unreadable: the stack is kept without user frames */
	__u64 kernel_stack; /* the kernel stack was unreadable */
	__u64 state;        /* a per-thread or summing map was full: the event is not counted */
};

/* Defined, not tentative: clang places tentative ones in .bss in their order of first use, which differs between
 * the builds (build.rs). */
struct lost_counts lost = {};

#define count_lost(what) __sync_fetch_and_add(&lost.what, 1)
