/* futex(2) operations (include/uapi/linux/futex.h): which ones wait, which ones wake. */
#pragma once

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

#define FUTEX_CMD_MASK 127 /* op & FUTEX_CMD_MASK: without FUTEX_PRIVATE_FLAG and FUTEX_CLOCK_REALTIME */
#define FUTEX_WAIT 0
#define FUTEX_WAKE 1
#define FUTEX_REQUEUE 3
#define FUTEX_CMP_REQUEUE 4
#define FUTEX_WAKE_OP 5
#define FUTEX_LOCK_PI 6
#define FUTEX_UNLOCK_PI 7
#define FUTEX_WAIT_BITSET 9
#define FUTEX_WAKE_BITSET 10
#define FUTEX_WAIT_REQUEUE_PI 11
#define FUTEX_LOCK_PI2 13

/* The thread sleeps until the word changes or it is woken: a lock or condition wait. */
static __always_inline bool futex_op_waits(__u32 op)
{
	op &= FUTEX_CMD_MASK;
	return op == FUTEX_WAIT || op == FUTEX_WAIT_BITSET || op == FUTEX_LOCK_PI || op == FUTEX_LOCK_PI2 ||
	       op == FUTEX_WAIT_REQUEUE_PI;
}

/* The thread wakes waiters: a lock released, a condition signalled. */
static __always_inline bool futex_op_wakes(__u32 op)
{
	op &= FUTEX_CMD_MASK;
	return op == FUTEX_WAKE || op == FUTEX_WAKE_BITSET || op == FUTEX_UNLOCK_PI || op == FUTEX_WAKE_OP ||
	       op == FUTEX_REQUEUE || op == FUTEX_CMP_REQUEUE;
}
