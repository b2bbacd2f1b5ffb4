/* Which statement a thread of a traced server is running, read from the server's own memory when an event happens
 * on that thread: no probe on the statements, nothing run per statement. The thread's connection object (THD) is
 * at a fixed offset from its thread pointer (the server's thread-local `current_thd`), and the object holds the
 * statement's text and when it began, at offsets user space read from the server's exported accessors
 * (sessions::Layout). A sum or sample is labelled by its statement's text, hashed without its literals once per
 * run of the statement on its thread, and by its connection; each label's text goes to user space once (`struct
 * statement_text`), which fingerprints it, and each thread's connection when it changes. */
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

/* A label that is no statement: not read (no layout for the process, its memory not readable then); a
 * connection object without a statement (between a client's statements); a thread without a connection (the
 * server's own). Other labels: a statement's text hashed without its literals (STATEMENT_HASHED set), the same
 * for every run of it on any thread; or, where its text could not be read (or in the compat build), the statement's
 * start in microseconds since the epoch, which names it with its thread. */
#define STATEMENT_NONE 0
#define STATEMENT_IDLE 1
#define STATEMENT_NO_CONNECTION 2
#define STATEMENT_HASHED (1ULL << 63)

#define STATEMENT_TEXT_MAX 1024

/* What statement.h sends user space: each is a record whose first word is 0 (no stack's id is). */
enum statement_record_kind : __u32 {
	STATEMENT_TEXT = 0,       /* a label's text: once per hashed label, once per run for the others */
	STATEMENT_CONNECTION = 1, /* a thread's connection, when it changes: where its user and database are */
};

struct statement_text {
	__u64 marker; /* 0 */
	enum statement_record_kind kind;
	__u32 tgid;
	__u32 tid;    /* the thread it ran on (a label by start names a statement with its thread) */
	__u32 length; /* the whole text's */
	__u64 label;
	__u32 kept;   /* bytes of it in text */
	__u32 _pad;
	char text[STATEMENT_TEXT_MAX];
};

#define STATEMENT_TEXT_HEADER_BYTES __builtin_offsetof(struct statement_text, text)

struct statement_connection {
	__u64 marker; /* 0 */
	enum statement_record_kind kind;
	__u32 tgid;
	__u64 connection; /* its id */
	__u64 thd;        /* its object, where user space reads its user and database */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct statement_text);
} statement_scratch SEC(".maps");

/* The statement a thread ran at its last event, and its label: read again only when its start changes. */
struct statement_thread {
	__u64 thd;
	__u64 started_us;
	__u64 label;
	__u64 connection;
};

struct {
	THREAD_STORAGE(struct statement_thread, 16384);
} statement_threads SEC(".maps");

struct statement_text_key {
	__u32 tgid;
	__u32 _pad;
	__u64 label;
};

/* The hashed labels whose text was sent; one forgotten is sent again. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct statement_text_key);
	__type(value, __u8);
} statement_texts_sent SEC(".maps");

/* An event's statement: its label, and its connection's id (0 without one). */
struct statement_label {
	__u64 label;
	__u64 connection;
};

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

/* Sends a record through the ring buffer, or a task iterator's `seq` (a whole struct, which its reader takes for
 * one record); whether it was sent. */
static __always_inline bool send_statement_record(void *record, __u64 size, __u64 whole, struct seq_file *seq)
{
#ifdef MYPROBE_COMPAT
	(void)whole;
	(void)seq;
#else
	if (seq)
		return !bpf_seq_write(seq, record, whole);
#endif
	return submit_event(record, size);
}

#define FNV_OFFSET 0xcbf29ce484222325ULL
#define FNV_PRIME 0x100000001b3ULL

/* Where the normalizing hash is in a statement's text: between tokens, in a word (an identifier's letters and
 * digits), in a number, in a quoted string (after its backslash), in a backquoted name. */
enum statement_scan : __u32 {
	SCAN_PLAIN = 0,
	SCAN_WORD,
	SCAN_NUMBER,
	SCAN_QUOTED,
	SCAN_ESCAPED,
	SCAN_BACKQUOTED,
};

/* The scan's state, in map memory rather than on the stack: the verifier does not follow values through map
 * memory, so each byte's step starts from one state whatever the bytes before it, which keeps the callback's
 * verification to one pass over its paths. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} statement_scan_state SEC(".maps");

/* FNV-1a of a statement's text without its literals (numbers, and quoted strings' contents), 8 bytes a step (a
 * bpf_loop callback, verified once): every run of one statement, whatever its literals or parameters, has one
 * label. User space fingerprints the first text sent of each label. A backquoted name is hashed whole, and a
 * word's digits are kept (sbtest1 is not sbtest2); double quotes, which name things in ANSI_QUOTES mode, are
 * not read as strings. */
struct statement_hashing {
	__u64 h;
	__u32 kept;
	__u32 _pad;
};

static __always_inline bool statement_word_byte(__u8 c)
{
	return (__u8)((c | 0x20) - 'a') < 26 || (__u8)(c - '0') < 10 || c == '_' || c == '$' || c >= 0x80;
}

static long statement_hash_word(__u32 i, void *data)
{
	struct statement_hashing *s = data;
	__u32 zero = 0;
	struct statement_text *t = bpf_map_lookup_elem(&statement_scratch, &zero);
	volatile __u32 *scan = bpf_map_lookup_elem(&statement_scan_state, &zero);
	__u32 at = i * 8;
	if (!t || !scan || at >= s->kept || at >= STATEMENT_TEXT_MAX)
		return 1;
	__u64 h = s->h;
#pragma unroll
	for (int j = 0; j < 8; j++) {
		__u32 k = at + j;
		if (k >= s->kept)
			break;
		__u8 c = t->text[k & (STATEMENT_TEXT_MAX - 1)];
		__u32 was = *scan, next = SCAN_PLAIN;
		bool keep = false;
		if (was == SCAN_QUOTED) {
			keep = c == '\'';
			next = c == '\\' ? SCAN_ESCAPED : keep ? SCAN_PLAIN : SCAN_QUOTED;
		} else if (was == SCAN_ESCAPED) {
			next = SCAN_QUOTED;
		} else if (was == SCAN_BACKQUOTED) {
			keep = true;
			next = c == '`' ? SCAN_PLAIN : SCAN_BACKQUOTED;
		} else if (was == SCAN_NUMBER && (statement_word_byte(c) || c == '.')) {
			next = SCAN_NUMBER; /* 1.5e3, 0x1F */
		} else if (c == '\'') {
			keep = true;
			next = SCAN_QUOTED;
		} else if (c == '`') {
			keep = true;
			next = SCAN_BACKQUOTED;
		} else if ((__u8)(c - '0') < 10 && was != SCAN_WORD) {
			next = SCAN_NUMBER;
		} else {
			keep = true;
			next = statement_word_byte(c) ? SCAN_WORD : SCAN_PLAIN;
		}
		*scan = next;
		if (keep)
			h = (h ^ c) * FNV_PRIME;
	}
	s->h = h;
	return 0;
}

static __always_inline __u64 statement_hash(__u32 kept)
{
	__u32 zero = 0;
	__u32 *scan = bpf_map_lookup_elem(&statement_scan_state, &zero);
	if (!scan)
		return STATEMENT_NONE;
	*scan = SCAN_PLAIN;
	struct statement_hashing s = { .h = FNV_OFFSET, .kept = kept };
	bpf_loop((kept + 7) / 8, statement_hash_word, &s, 0);
	return s.h | STATEMENT_HASHED;
}

/* The label of the statement `q` (its `{ str, length }`), begun at `started_us` on `task`: its text read into the
 * scratch record and sent where user space has not had it; 0 where the scratch is missing. */
static __always_inline __u64 label_statement(struct task_struct *task, struct seq_file *seq, __u32 tgid,
					     __u64 started_us, const __u64 *q)
{
	__u32 zero = 0;
	struct statement_text *t = bpf_map_lookup_elem(&statement_scratch, &zero);
	if (!t)
		return STATEMENT_NONE;
	__u64 length = q[1];
	/* At most STATEMENT_TEXT_MAX - 1 bytes, a bound the mask shows the verifier. */
	__u32 kept = (length < STATEMENT_TEXT_MAX ? length : STATEMENT_TEXT_MAX - 1) & (STATEMENT_TEXT_MAX - 1);
	if (read_task_user(t->text, kept, q[0], task, seq))
		kept = 0;
#ifdef MYPROBE_COMPAT
	/* No bpf_loop before 5.17: every statement labelled by its start. */
	bool hashed = false;
	__u64 label = started_us;
#else
	/* A text read whole, or its first STATEMENT_TEXT_MAX - 1 bytes (what user space is sent and fingerprints). */
	bool hashed = kept && kept == (length < STATEMENT_TEXT_MAX ? length : STATEMENT_TEXT_MAX - 1);
	__u64 label = hashed ? statement_hash(kept) : started_us;
	if (label == STATEMENT_NONE)
		return label;
#endif
	struct statement_text_key k = { .tgid = tgid, .label = label };
	if (hashed && bpf_map_lookup_elem(&statement_texts_sent, &k))
		return label;
	t->marker = 0;
	t->kind = STATEMENT_TEXT;
	t->tgid = tgid;
	t->tid = BPF_CORE_READ(task, pid);
	t->length = length > 0xffffffffULL ? 0xffffffffU : length;
	t->label = label;
	t->kept = kept;
	if (send_statement_record(t, STATEMENT_TEXT_HEADER_BYTES + kept, sizeof(*t), seq) && hashed) {
		__u8 one = 1;
		bpf_map_update_elem(&statement_texts_sent, &k, &one, BPF_ANY);
	}
	return label;
}

/* The statement `task` runs (the current task; or any, given a sleepable task iterator's `seq`, to which its
 * records then go), read from its connection object: three reads of its memory, and at the first event of each of
 * its statements the text, hashed. */
static __always_inline struct statement_label task_statement(struct task_struct *task, struct seq_file *seq)
{
	struct statement_label none = { .label = STATEMENT_NONE };
	if (!statement_labels)
		return none;
	__u32 tgid = BPF_CORE_READ(task, tgid);
	struct statement_layout *l = bpf_map_lookup_elem(&statement_layouts, &tgid);
	if (!l)
		return none;
	__u64 fsbase = BPF_CORE_READ(task, thread.fsbase);
	__u64 thd = 0;
	if (!fsbase || read_task_user(&thd, sizeof(thd), fsbase + l->thd_tpoff, task, seq))
		return none;
	struct statement_label found = { .label = STATEMENT_NO_CONNECTION };
	if (!thd)
		return found;
	__u64 q[2];
	if (read_task_user(q, sizeof(q), thd + l->query_offset, task, seq))
		return none;
	found.label = STATEMENT_IDLE;
	if (!q[0] || !q[1])
		return found;
	__u64 started[2];
	if (read_task_user(started, sizeof(started), thd + l->started_offset, task, seq))
		return none;
	__u64 us = started[0] * 1000000 + started[1];
	if (us <= STATEMENT_NO_CONNECTION || us >= STATEMENT_HASHED)
		return none;
	struct statement_thread empty = {};
	struct statement_thread *st = task_thread_storage(&statement_threads, task, true, &empty);
	if (!st) {
		count_lost(state);
		return none;
	}
	if (st->thd == thd && st->started_us == us) {
		found.label = st->label;
		found.connection = st->connection;
		return found;
	}
	/* Another statement: its connection's id, said where it changed, and its label. */
	__u64 connection = 0;
	read_task_user(&connection, l->id_width == 4 ? 4 : 8, thd + l->id_offset, task, seq);
	if (st->thd != thd || st->connection != connection) {
		struct statement_connection c = {
			.kind = STATEMENT_CONNECTION, .tgid = tgid, .connection = connection, .thd = thd
		};
		if (!send_statement_record(&c, sizeof(c), sizeof(c), seq))
			return none;
		st->thd = thd;
		st->connection = connection;
	}
	__u64 label = label_statement(task, seq, tgid, us, q);
	if (label == STATEMENT_NONE)
		return none;
	st->started_us = us;
	st->label = label;
	found.label = label;
	found.connection = connection;
	return found;
}

/* The statement the current task runs (see task_statement). */
static __always_inline struct statement_label current_statement(struct task_struct *task)
{
	return task_statement(task, 0);
}

/* The thread to key a sum by with `label`: a label by start names a statement only with its thread; the other
 * labels need none (0, which keeps a sum per stack rather than per thread). */
static __always_inline __u32 statement_thread(__u64 label, __u32 tid)
{
	return label > STATEMENT_NO_CONNECTION && label < STATEMENT_HASHED ? tid : 0;
}
