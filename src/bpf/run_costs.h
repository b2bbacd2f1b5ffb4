/* What each run of the statement tracer's busiest programs turned out to be, and what it cost: each run timed and
 * counted by program and outcome, for the cost model of bench/statement-cost (`queries --run-costs`). Off, as it
 * is unless asked, the verifier drops the code (its flag is read-only data). */
#pragma once

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

const volatile bool run_costs = false;

/* The programs measured (collect::queries::RUN_COST_PROGRAMS names them). */
enum run_cost_program : __u32 {
	COST_SOCK_RECV = 0,
	COST_SOCK_SEND,
	COST_SWITCH,
	COST_SYS_EXIT,
	COST_PROGRAMS,
};

/* What a run was (collect::queries::RUN_OUTCOMES names them). */
enum run_outcome : __u32 {
	RUN_OTHER_PROCESS = 0, /* not the server's: turned away by the first check */
	RUN_NO_BYTES,          /* the server's recv that found nothing (or a socket error) */
	RUN_NOT_FOLLOWED,      /* the server's, carrying no protocol byte followed (another call, a peek, TLS) */
	RUN_OUTSIDE,           /* a protocol call outside any statement (the handshake, a command not answered) */
	RUN_STARTS,            /* the read of a request, which starts a statement */
	RUN_IN_STATEMENT,      /* a call or switch of a thread in a statement (its reply's send ends it) */
	RUN_OUTCOMES,
};

struct run_cost {
	__u64 runs;
	__u64 ns;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, COST_PROGRAMS * RUN_OUTCOMES);
	__type(key, __u32);
	__type(value, struct run_cost);
} run_cost_table SEC(".maps");

static __always_inline __u64 run_cost_start(void)
{
	return run_costs ? bpf_ktime_get_ns() : 0;
}

static __always_inline void run_cost_end(enum run_cost_program program, enum run_outcome outcome, __u64 started)
{
	if (!run_costs)
		return;
	__u32 k = program * RUN_OUTCOMES + outcome;
	struct run_cost *c = bpf_map_lookup_elem(&run_cost_table, &k);
	if (c) {
		c->runs++;
		c->ns += bpf_ktime_get_ns() - started;
	}
}
