/* Which statement a thread of a traced server is running, read from the server's own memory when an event happens
 * on that thread: no probe on the statements, nothing run per statement. The thread's connection object (THD) is
 * at a fixed offset from its thread pointer (the server's thread-local `current_thd`), and the object holds the
 * statement's text and when it began, at offsets user space read from the server's exported accessors
 * (sessions::Layout). A sum or sample is labelled by when its statement began; the text is sent once per thread
 * and statement (`struct statement_text`), which user space fingerprints. */
#pragma once

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include "compat.h"
#include "lost.h"
#include "ringbuf.h"

/* Set by user space: label events by statement. */
const volatile bool statement_labels = false;

/* Where one server keeps its threads' statements (all offsets in bytes). */
struct statement_layout {
	__s64 thd_tpoff;      /* the thread's connection (THD *) at its thread pointer + this */
	__u32 id_offset;      /* the connection id, of id_width bytes (4 or 8) */
	__u32 id_width;
	__u32 query_offset;   /* { const char *str; size_t length; }: 0 length between statements */
	__u32 started_offset; /* { __u64 seconds; __u64 microseconds; } since the epoch */
};

/* By process; written by user space for each server traced. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, struct statement_layout);
} statement_layouts SEC(".maps");

/* A label that is no statement's start: not read (no layout for the process, its memory not readable then); a
 * connection's thread between statements; a thread without a connection (the server's own). */
#define STATEMENT_NONE 0
#define STATEMENT_IDLE 1
#define STATEMENT_NO_CONNECTION 2

#define STATEMENT_TEXT_MAX 1024

/* Sent once per thread and statement, the first time an event is labelled by it. */
struct statement_text {
	__u64 marker; /* 0: not a struct stack_event (whose stack id never is) */
	__u32 tgid;
	__u32 tid;
	__u64 started_us; /* the label */
	__u64 conn_id;
	__u64 thd;    /* the connection's object, where user space reads its user and database */
	__u32 length; /* the whole text's */
	__u32 kept;   /* bytes of it in text */
	char text[STATEMENT_TEXT_MAX];
};

#define STATEMENT_TEXT_HEADER_BYTES __builtin_offsetof(struct statement_text, text)

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct statement_text);
} statement_scratch SEC(".maps");

/* The statement each thread's text was last sent for. */
struct statement_sent {
	__u64 thd;
	__u64 started_us;
};

struct {
	THREAD_STORAGE(struct statement_sent, 16384);
} statements_sent SEC(".maps");

/* The current task, as task storage takes it (the compat build's storage is keyed by its id). */
static __always_inline struct task_struct *statement_current_task(void)
{
#ifdef MYPROBE_COMPAT
	return (struct task_struct *)bpf_get_current_task();
#else
	return bpf_get_current_task_btf();
#endif
}

/* Reads user memory of `task`: the current task's, or, given a sleepable task iterator's `seq` (a constant 0
 * otherwise, which leaves the iterator's helpers out of other programs), any task's. */
static __always_inline long read_task_user(void *dst, __u32 size, __u64 src, struct task_struct *task,
					   struct seq_file *seq)
{
#ifdef MYPROBE_COMPAT
	(void)task;
	(void)seq;
#else
	if (seq)
		return bpf_copy_from_user_task(dst, size, (const void *)src, task, 0);
#endif
	return bpf_probe_read_user(dst, size, (const void *)src);
}

/* Sends the text of the statement `q` of `thd`, begun at `started_us`, through the ring buffer, or a task
 * iterator's `seq` (the whole struct, which its reader takes for one record); whether it was sent. */
static __always_inline bool send_statement_text(const struct statement_layout *l, struct task_struct *task,
						struct seq_file *seq, __u32 tgid, __u64 thd, __u64 started_us,
						const __u64 *q)
{
	__u32 zero = 0;
	struct statement_text *t = bpf_map_lookup_elem(&statement_scratch, &zero);
	if (!t)
		return false;
	t->marker = 0;
	t->tgid = tgid;
	t->tid = BPF_CORE_READ(task, pid);
	t->started_us = started_us;
	t->thd = thd;
	t->conn_id = 0;
	__u32 width = l->id_width == 4 ? 4 : 8;
	read_task_user(&t->conn_id, width, thd + l->id_offset, task, seq);
	__u64 length = q[1];
	/* At most STATEMENT_TEXT_MAX - 1 bytes, a bound the mask shows the verifier. */
	__u32 kept = (length < STATEMENT_TEXT_MAX ? length : STATEMENT_TEXT_MAX - 1) & (STATEMENT_TEXT_MAX - 1);
	t->length = length > 0xffffffffULL ? 0xffffffffU : length;
	if (read_task_user(t->text, kept, q[0], task, seq))
		kept = 0;
	t->kept = kept;
#ifndef MYPROBE_COMPAT
	if (seq)
		return !bpf_seq_write(seq, t, sizeof(*t));
#endif
	if (bpf_ringbuf_output(&events, t, STATEMENT_TEXT_HEADER_BYTES + kept, 0)) {
		count_lost(ringbuf);
		return false;
	}
	return true;
}

/* The label of the statement `task` runs (the current task; or any, given a sleepable task iterator's `seq`,
 * to which its text then goes): when it began, in microseconds since the epoch; STATEMENT_IDLE between
 * statements, STATEMENT_NO_CONNECTION without a connection, STATEMENT_NONE where nothing could be read. */
static __always_inline __u64 task_statement(struct task_struct *task, struct seq_file *seq)
{
	if (!statement_labels)
		return STATEMENT_NONE;
	__u32 tgid = BPF_CORE_READ(task, tgid);
	struct statement_layout *l = bpf_map_lookup_elem(&statement_layouts, &tgid);
	if (!l)
		return STATEMENT_NONE;
	__u64 fsbase = BPF_CORE_READ(task, thread.fsbase);
	__u64 thd = 0;
	if (!fsbase || read_task_user(&thd, sizeof(thd), fsbase + l->thd_tpoff, task, seq))
		return STATEMENT_NONE;
	if (!thd)
		return STATEMENT_NO_CONNECTION;
	__u64 q[2];
	if (read_task_user(q, sizeof(q), thd + l->query_offset, task, seq))
		return STATEMENT_NONE;
	if (!q[0] || !q[1])
		return STATEMENT_IDLE;
	__u64 started[2];
	if (read_task_user(started, sizeof(started), thd + l->started_offset, task, seq))
		return STATEMENT_NONE;
	__u64 us = started[0] * 1000000 + started[1];
	if (us <= STATEMENT_NO_CONNECTION)
		return STATEMENT_NONE;
	struct statement_sent none = {};
	struct statement_sent *sent = task_thread_storage(&statements_sent, task, true, &none);
	if (!sent) {
		count_lost(state);
		return us;
	}
	if (sent->thd == thd && sent->started_us == us)
		return us;
	if (send_statement_text(l, task, seq, tgid, thd, us, q)) {
		sent->thd = thd;
		sent->started_us = us;
	}
	return us;
}

/* The label of the statement the current task runs (see task_statement). */
static __always_inline __u64 current_statement(struct task_struct *task)
{
	return task_statement(task, 0);
}

/* The thread to key a sum by with `label`: a statement's start names it only with its thread; the other labels
 * need none (0, which keeps a sum per stack rather than per thread). */
static __always_inline __u32 statement_thread(__u64 label, __u32 tid)
{
	return label > STATEMENT_NO_CONNECTION ? tid : 0;
}
