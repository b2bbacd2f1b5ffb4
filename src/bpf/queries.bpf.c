// Per-statement accounting by following the client/server protocol through the server's socket calls.
//
// A connection thread reads a request as recv(fd, 4) (header: length, sequence 0) then recv(fd, length) (the
// command byte and its arguments); the statement runs; the reply leaves through one or more send(fd) calls;
// the thread then calls recv(fd) for the next request. So a statement starts at the header read, its
// record is complete at the last send before the next recv, and is sent to user space when that recv returns
// or blocks. Meanwhile the thread's futex waits, syncs and scheduler events are accounted.
// The recvs and sends are seen at the socket layer's tracepoints (sock_recv_length, sock_send_length), which
// run for socket calls only, inside the syscall: its registers name the descriptor and the bytes. Where the
// kernel has none, or with `syscall_cpu`, they are seen at every syscall exit instead (the registers still
// hold the arguments there), which also counts the statement's syscalls and bytes read and written. A blocked
// thread's syscall is read from its registers when it leaves the CPU, so the time it waits goes to that
// syscall's class; its time on a CPU inside syscalls is the statement's CPU time, unless `syscall_cpu` adds a
// program at every syscall entry of the host to split it out.
// Packets outside a statement (the server's greeting, the client's handshake response) are sent to user
// space as they are, so that it learns connection ids, users and databases.
// The framing is the client's to choose and so is never assumed: a header may arrive in pieces (reassembled),
// a packet may be empty (no body follows), a statement's text is cut at its packet's length, recvmsg and
// sendmsg carry their bytes in an iovec, and a recv entered before tracing began is parsed from the
// registers at its end, so that the stream is followed from its first byte.
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include <asm-generic/errno.h>
#include "compat.h"
#include "futex.h"
#include "lost.h"
#include "maps.h"
#include "protocol.h"
#include "queries.h"
#include "ringbuf.h"
#include "run_costs.h"
#include "stack_ids.h"
#include "target.h"
#include "wakeups.h"

char LICENSE[] SEC("license") = "GPL";

/* Argument layout of the server's dispatch_command (TLS fallback). */
const volatile enum dispatch_abi dispatch_abi = DISPATCH_MARIADB;
/* Whether a statement's longest futex wait gets its stack id (its site); off, lock waits cost no unwinding. */
const volatile bool wait_sites = true;
/* Set by user space while executions of statements prepared before tracing come back with column definitions
 * that would label them (most clients cache them and get none): only then are executions' replies kept long. */
bool want_results;
/* Whether a woken thread's wait for a CPU is read from the scheduler's own count at its switch in (the kernel
 * keeps it: user space probed it); otherwise on_wakeup marks it, a program run at every wakeup of the host. */
const volatile bool runq_from_sched_info = false;
/* Set by user space when a sampled period ends: the statements in flight are followed to their end, no new one
 * starts, and the programs are detached once none is left. */
bool closing;
/* Syscall number → class, filled by user space from the C library's numbers for this arch. */
const volatile enum syscall_class syscall_class[MAX_SYSCALL_NR] = {};
/* on_sys_enter is loaded: a statement's time on a CPU inside syscalls goes to their class, or sys. */
const volatile bool syscall_cpu = false;
/* --min-ms: a statement shorter than this, whose record nothing later needs, is counted and not sent. */
const volatile __u64 min_statement_ns = 0;
/* Statements not sent for being shorter than min_statement_ns. */
__u64 below_min_statements;

#define MSG_PEEK 0x02
/* MySQL's X protocol: another framing on another port, not followed. */
#define X_PROTOCOL_PORT 33060
/* Packets parsed after the first in one read (a server that reads ahead). */
#define MAX_READ_AHEAD 8

enum phase : __u8 {
	PHASE_IDLE = 0,   /* between statements */
	PHASE_BODY,       /* header read, the body comes next */
	PHASE_RUNNING,    /* request read, no reply yet */
	PHASE_REPLIED,    /* at least one reply send done: the record is ready, more sends may follow */
	PHASE_INFILE,     /* LOAD DATA LOCAL: the server asked for the file (0xfb); the client's file packets,
			   * whatever they hold, come until the server's final reply */
};

/* Where a thread in a statement is. */
enum thread_place : __u8 {
	PLACE_CPU = 0,
	PLACE_RUNQ,       /* preempted or woken, not yet back on a CPU */
	PLACE_BLOCKED,
};

/* The compressed protocol: asked for in the handshake response, it begins with the first command (the
 * authentication's packets are classic), and frames each packet with 7 bytes: its length, its sequence, and its
 * length inflated (0: sent as is, not deflated). */
enum compression : __u8 {
	COMPRESSION_NONE = 0,
	COMPRESSION_ASKED,
	COMPRESSION_ON,
};

/* Why a connection's bytes on its socket are not parsed: another framing (the X protocol's), or TLS (its plaintext
 * is followed at the server's vio_ssl_read and vio_ssl_write where they are probed). */
enum ignore_reason : __u8 {
	IGNORE_NONE = 0,
	IGNORE_FRAMING,
	IGNORE_CIPHERTEXT,
};

/* The server's TLS call a thread is in, entered while traced. */
enum tls_call : __u8 {
	TLS_NONE = 0,
	TLS_READ,
	TLS_WRITE,
};

struct query_thread {
	enum phase phase;
	__u8 via_dispatch;      /* started by the dispatch_command uprobe, ends at its return */
	__u8 header_seq;
	enum thread_place place; /* while a statement is in flight */
	enum time_part part;    /* the part the time since `since` goes to */
	__u8 hdr_have;          /* bytes of a packet header read so far (a header can come in pieces) */
	__u8 ignoring;          /* ignored_fd is set: IGNORE_* */
	__u8 hdr[8];            /* 4 bytes, 7 on a compressed connection (then the length inflated, 0: not deflated) */
	__u8 compression;       /* of compressed_fd's connection: COMPRESSION_* */
	__u8 packet_compressed; /* the packet being read is framed compressed */
	__u32 period;           /* attach_period when it was last followed */
	__s32 hdr_fd;           /* the socket the header pieces came from, or the skipped body's */
	__u32 skip;             /* bytes of a read-ahead packet's body still to come in later reads */
	__s32 ignored_fd;       /* a connection not followed: compressed, or the X protocol's */
	__s32 port_checked_fd;  /* the last socket whose port was checked */
	__s32 fd;               /* the client socket of the statement */
	__u32 header_len;       /* payload length announced by the header */
	__u64 header_ts;
	__u64 lock_block_ts;    /* when the futex wait in progress blocked, 0 if it has not */
	__u64 lock_block_addr;  /* its futex word */
	__u64 lock_block_stack; /* and its stack's id */
	__u64 lock_before;      /* the lock part when it blocked */
	__u32 wait_hint;        /* the type of the last ambiguous thd_wait_begin call in the statement (on_wait_type) */
	__u32 woken_by;         /* the server's thread that woke the futex wait in progress (on_waking; 0: none) */
	__u64 woken_at;         /* and when (CLOCK_MONOTONIC) */
	__u64 call_sk;          /* the socket of the call being handled, when the tracepoint names it (else 0) */
	__u64 statement_sk;     /* the call_sk the statement's request came on (its reply's sends are on it) */
	__u64 ignored_ino;      /* the inode of the socket of the connection not followed, when known */
	__s32 compressed_fd;    /* a connection that asked for the compressed protocol */
	__u32 inflated_len;     /* the packet being read: its length inflated, if deflated */
	__u32 text_more;        /* bytes of the statement's request still to come in later reads, for its text */
	__u32 classic_pending;  /* a packet whose header came alone in a compressed packet: its length (its body is in
				 * the next compressed packet) */
	__u64 compressed_ino;   /* its socket's inode, when known */
	enum tls_call tls_call; /* in vio_ssl_read or vio_ssl_write */
	__u8 tls_requested;     /* a TLS request was read: the next client packet is the handshake response */
	__u8 socket_unknown;    /* a statement seeded by start_statements: its socket is its first send's */
	__u8 tls_synced;        /* the TLS reads' bytes begin where a request does: its connection began while traced,
				 * or a reply went out since (a read entered before the probes went by unseen, and the
				 * next is not a header) */
	__s32 tls_fd;           /* the socket of the thread's TLS connection (its SSL request's, or its calls') */
	__u64 tls_buf;          /* the call's plaintext */
	__u64 tls_sk;           /* the socket of a syscall inside the call (0: none yet) */
	__u64 since;            /* while a statement is in flight: the last change of part */
	__u64 blocked_at;       /* when it last blocked in a statement, */
	enum time_part blocked_part; /* and the part that wait went to, */
	__s32 blocked_fd;       /* and its syscall's descriptor (an I/O part's) */
	__u64 regs;             /* where the thread's registers are kept when it enters the kernel (0: not known yet) */
	__u64 runq_before;      /* the scheduler's count of its waits for a CPU when it last switched out */
	struct query_counters c;
	struct query_event ev;  /* the statement being built; ev.c is the snapshot at the last reply send */
};

/* Per thread: found from the task without a hash lookup, as many as the server has threads (no table to
 * fill), freed with the thread (the compat build's hash entry at its exit). Made zeroed on a thread's first
 * socket syscall. */
struct {
	THREAD_STORAGE(struct query_thread, 4096);
} threads SEC(".maps");

/* A zeroed state, which the compat build's hash copies to make one. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct query_thread);
} thread_zero SEC(".maps");

/* Packet events are built here (they are not part of a thread's state). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct query_event);
} packets SEC(".maps");

/* Executions' texts are built here. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct executed_event);
} executions SEC(".maps");

/* The statements running when tracing began (see struct started_statement), filled by user space for one run of
 * start_statements; entries made only as filled. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct started_statement);
} started SEC(".maps");

/* Where the server's prepared statement object keeps its text (a pointer, then a 64-bit length), found by user
 * space on statements of its own; 0 while unknown (the object's address is sent instead). */
__u32 statement_text_offset;

/* The state of `task`; with `create`, made if it has none. Making it fails only without memory, or when the
 * task storage is in use by a program interrupted on this CPU: that event is counted and not followed. */
static __always_inline struct query_thread *thread_state(struct task_struct *task, bool create)
{
	__u32 zero = 0;
	void *none = COMPAT && create ? bpf_map_lookup_elem(&thread_zero, &zero) : 0;
	struct query_thread *st = COMPAT && create && !none ? 0 : task_thread_storage(&threads, task, create, none);
	if (!st && create)
		count_lost(state);
	if (st && st->period != attach_period) {
		/* Left by an earlier sampled period: what it read or was in since is unknown (the TLS probes stay
		 * attached: their stream is known where it was between requests). */
		st->tls_synced = st->tls_synced && st->phase == PHASE_IDLE && !st->hdr_have && !st->skip;
		st->period = attach_period;
		st->phase = PHASE_IDLE;
		st->hdr_have = 0;
		st->skip = 0;
		st->lock_block_ts = 0;
		st->via_dispatch = 0;
		st->tls_call = TLS_NONE;
		st->classic_pending = 0;
	}
	return st;
}

/* The current thread if it is the server's (its id in *tid), else NULL. Its task is needed anyway, and its ids are
 * read from it: one helper call fewer than bpf_get_current_pid_tgid's, and each call costs its return's
 * mitigation (AMD's Safe RET, retpolines) on top of its work. */
static __always_inline struct task_struct *current_target(__u32 *tid)
{
#ifdef MYPROBE_COMPAT
	__u64 id = bpf_get_current_pid_tgid();
	*tid = (__u32)id;
	return (__u32)(id >> 32) == target_tgid ? current_task() : NULL;
#else
	struct task_struct *task = bpf_get_current_task_btf();
	*tid = task->pid;
	return (__u32)task->tgid == target_tgid ? task : NULL;
#endif
}

/* The state of the current thread if it is the server's (its id in *tid); with `create`, made if it has none. */
static __always_inline struct query_thread *current_state(__u32 *tid, bool create)
{
	struct task_struct *task = current_target(tid);
	return task ? thread_state(task, create) : NULL;
}

static __always_inline void submit_waking(struct query_event *e, bool now)
{
	__u32 len = (__u32)e->text_len + e->result_len;
	__u64 size = QUERY_EVENT_HEADER_BYTES + (len & (MAX_TEXT - 1));
	if (len >= MAX_TEXT)
		size = sizeof(*e);
	submit_event_waking(e, size, now);
}

static __always_inline bool in_statement(struct query_thread *st)
{
	return st->phase == PHASE_RUNNING || st->phase == PHASE_REPLIED || st->phase == PHASE_INFILE;
}

/* The part of the time in a syscall of class `cls` (a futex: `futex_op`), on a CPU or blocked. */
static __always_inline enum time_part syscall_part(enum syscall_class cls, __u32 futex_op, bool on_cpu)
{
	switch (cls) {
	case SYSCALL_NET_RECV:
	case SYSCALL_NET_SEND:
	case SYSCALL_NET_POLL:
	case SYSCALL_NET_RECVMSG:
	case SYSCALL_NET_SENDMSG:
		return PART_NET;
	case SYSCALL_READ:
		return PART_READ;
	case SYSCALL_WRITE:
		return PART_WRITE;
	case SYSCALL_SYNC:
		return PART_SYNC;
	case SYSCALL_FUTEX:
		if (futex_op_waits(futex_op))
			return PART_LOCK;
		break;
	default:
		break;
	}
	return on_cpu ? PART_SYS : PART_OTHER;
}

static __always_inline bool is_recv(enum syscall_class cls)
{
	return cls == SYSCALL_NET_RECV || cls == SYSCALL_NET_RECVMSG;
}

/* The syscall whose registers are `regs`, as it entered the kernel: false if none (an exception's or an
 * interrupt's entry). x86-64's syscall entry saves -ENOSYS as the result, there until the syscall returns. */
static __always_inline bool syscall_of(struct pt_regs *regs, enum syscall_class *cls, __u64 *arg0, __u64 *arg1)
{
#if defined(__TARGET_ARCH_x86)
	/* The compat build's registers are a plain address (task_regs). */
	if (!regs || (COMPAT ? BPF_CORE_READ(regs, ax) : regs->ax) != (unsigned long)-ENOSYS)
		return false;
	long nr = COMPAT ? BPF_CORE_READ(regs, orig_ax) : regs->orig_ax;
	if (nr < 0 || nr >= MAX_SYSCALL_NR)
		return false;
	*cls = syscall_class[nr];
	*arg0 = COMPAT ? PT_REGS_PARM1_CORE_SYSCALL(regs) : PT_REGS_PARM1_SYSCALL(regs);
	*arg1 = COMPAT ? PT_REGS_PARM2_CORE_SYSCALL(regs) : PT_REGS_PARM2_SYSCALL(regs);
	return true;
#else
	return false;
#endif
}

/* The syscall `task` is in (see syscall_of). */
static __always_inline bool in_syscall(struct task_struct *task, enum syscall_class *cls, __u64 *arg0,
				       __u64 *arg1)
{
	return syscall_of(task_regs(task), cls, arg0, arg1);
}

/* The registers the current thread entered the kernel with. They stay at one place for the thread's life: its state
 * keeps where, and later runs read them there without a helper call, where the kernel casts an address to a type
 * (bpf_rdonly_cast, 6.2+). */
static __always_inline struct pt_regs *current_regs(struct task_struct *task, struct query_thread *st)
{
#ifndef MYPROBE_COMPAT
	if (st && st->regs && bpf_ksym_exists(bpf_rdonly_cast))
		return bpf_core_cast((void *)st->regs, struct pt_regs);
#endif
	struct pt_regs *regs = task_regs(task);
	if (st)
		st->regs = (__u64)regs;
	return regs;
}

/* The part of the time on a CPU from now on, `task` switched in. */
static __always_inline enum time_part on_cpu_part(struct task_struct *task)
{
	enum syscall_class cls;
	__u64 arg0, arg1;
	if (syscall_cpu && in_syscall(task, &cls, &arg0, &arg1))
		return syscall_part(cls, arg1, true);
	return PART_USER;
}

/* A futex wait of `ns` in the lock part at stack `stack`: to its slot, or the first free one (none: the part's
 * remainder). */
static __always_inline void add_wait(struct query_counters *c, __u64 stack, __u32 hint, __u64 ns, __u32 waker,
				     __u64 woken_at)
{
	if (!stack)
		return;
#pragma unroll
	for (int i = 0; i < WAIT_SLOTS; i++) {
		struct wait_slot *w = &c->waits[i];
		if (w->stack == 0) {
			w->stack = stack;
			w->hint = hint;
		} else if (w->stack != stack || w->hint != hint) {
			continue;
		}
		w->ns += ns;
		w->waits++;
		if (waker) {
			w->waker = waker;
			w->woken_ns = woken_at;
		}
		return;
	}
}

/* The time since the last change goes to the part it was in; `next` from now on. */
static __always_inline void charge(struct query_thread *st, __u64 now, enum time_part next)
{
	__u8 part = st->part;
	if (now > st->since && part < PARTS)
		st->c.part_ns[part] += now - st->since;
	st->since = now;
	st->part = next;
}

/* Copies up to MAX_TEXT bytes of user memory into e->text. */
static __always_inline void capture_text(struct query_event *e, __u64 src, long n)
{
	__u32 len = n <= 0 ? 0 : n > MAX_TEXT ? MAX_TEXT : n;
	if (len == 0 || bpf_probe_read_user(e->text, BOUNDED_SIZE(len, MAX_TEXT), (void *)src)) {
		e->text_len = 0;
		return;
	}
	e->text_len = len;
}

/* A connection's socket by its inode number, which the kernel gives each new socket afresh: its `struct sock`
 * is freed with the connection, and the next connection's is often made at the same address. */
static __always_inline __u64 socket_ino(__u64 sk)
{
	return sk ? BPF_CORE_READ((struct sock *)sk, sk_socket, file, f_inode, i_ino) : 0;
}

/* A packet outside any statement (handshake, authentication), sent for user space to parse: for PACKET_IN the
 * payload (its header is in packet_len/seq), for PACKET_OUT the bytes sent, headers included. */
static __always_inline void send_packet(__u32 kind, __u32 tid, __s32 fd, __u64 sk, __u32 packet_len, __u8 seq,
					__u64 buf, long n, __u64 now)
{
	__u32 zero = 0;
	struct query_event *e = bpf_map_lookup_elem(&packets, &zero);
	if (!e)
		return;
	e->kind = kind;
	e->tid = tid;
	e->fd = fd;
	e->socket_ino = socket_ino(sk);
	e->packet_len = packet_len;
	e->seq = seq;
	e->compressed = 0;
	e->inflated_len = 0;
	e->start_ns = now;
	e->end_ns = now;
	e->reply_len = 0;
	e->result_len = 0;
	if (n > MAX_PACKET_TEXT)
		n = MAX_PACKET_TEXT;
	capture_text(e, buf, n);
	/* A TLS request (the handshake response cut at its 32 bytes): user space attaches the dispatch_command
	 * uprobes, the sooner the likelier before the connection's first statement. */
	submit_waking(e, kind == EVENT_PACKET_IN && seq == 1 && packet_len == 32);
}

static __always_inline void start_statement(struct query_thread *st, __u32 tid, __u64 buf, long n, __u64 now)
{
	if (closing) {
		st->phase = PHASE_IDLE;
		return;
	}
	__builtin_memset(&st->c, 0, sizeof(st->c));
	st->lock_block_ts = 0;
	st->wait_hint = 0;
	st->phase = PHASE_RUNNING;
	st->via_dispatch = 0;
	st->socket_unknown = 0;
	st->ev.before_tracing = 0;
	/* A header read alone began the statement: the time until its body's read is reading the request. */
	if (st->header_ts < now)
		st->c.part_ns[PART_NET] = now - st->header_ts;
	st->place = PLACE_CPU;
	st->part = PART_USER;
	st->since = now;
	st->ev.kind = EVENT_STATEMENT;
	st->ev.tid = tid;
	st->ev.fd = st->fd;
	st->statement_sk = st->call_sk;
	st->ev.socket_ino = socket_ino(st->call_sk);
	st->ev.packet_len = st->header_len;
	st->ev.seq = 0;
	st->ev.start_ns = st->header_ts;
	st->ev.end_ns = 0;
	st->ev.reply_len = 0;
	st->ev.result_len = 0;
	st->ev.compressed = 0;
	st->ev.inflated_len = 0;
	/* The packet only: what follows in the same read is the next packet. */
	if (n > st->header_len)
		n = st->header_len;
	capture_text(&st->ev, buf, n);
	/* The rest of the request, in later reads, up to what the text keeps. */
	st->text_more = 0;
	if (buf && n > 0 && st->ev.text_len == n && n < st->header_len) {
		long want = st->header_len < MAX_TEXT ? st->header_len : MAX_TEXT;
		st->text_more = want > n ? want - n : 0;
	}
	/* Commands the server does not answer: no record (the socket may even be reused before a send). */
	__u8 cmd = st->ev.text[0];
	if (st->ev.text_len == 0 || cmd == COM_QUIT || cmd == COM_STMT_SEND_LONG_DATA || cmd == COM_STMT_CLOSE)
		st->phase = PHASE_IDLE;
	/* User space forgets the statement closed (its prepared statements would only grow). */
	if (cmd == COM_STMT_CLOSE)
		send_packet(EVENT_PACKET_IN, tid, st->fd, st->call_sk, st->header_len, 0, buf, n, now);
}

/* A connection whose bytes on the socket are not followed: the X protocol's, or TLS. */
static __always_inline void ignore_connection(struct query_thread *st, __s32 fd, enum ignore_reason why)
{
	st->ignoring = why;
	st->ignored_fd = fd;
	st->ignored_ino = socket_ino(st->call_sk);
}

/* Whether the call on descriptor fd is on the connection a thread remembered (its descriptor and, where the socket
 * is known, its socket's inode): a descriptor reused by another connection on the same thread (a thread cache's) is
 * not that one, and that connection is over (no close is seen without the syscalls). */
static __always_inline bool same_connection(struct query_thread *st, __s32 fd, __s32 its_fd, __u64 its_ino)
{
	return fd == its_fd && (!st->call_sk || !its_ino || socket_ino(st->call_sk) == its_ino);
}

static __always_inline bool ignored(struct query_thread *st, __s32 fd)
{
	if (!st->ignoring || fd != st->ignored_fd)
		return false;
	if (!same_connection(st, fd, st->ignored_fd, st->ignored_ino))
		st->ignoring = 0;
	return st->ignoring;
}

/* Whether connection fd on this thread uses (or asked for) the compressed protocol: the one that asked. */
static __always_inline enum compression compression_of(struct query_thread *st, __s32 fd)
{
	if (st->compression == COMPRESSION_NONE || fd != st->compressed_fd)
		return COMPRESSION_NONE;
	if (!same_connection(st, fd, st->compressed_fd, st->compressed_ino))
		st->compression = COMPRESSION_NONE;
	return st->compression;
}

/* The record as of now is what will be sent. */
/* A futex wait that blocked ends, its thread back on a CPU: from its block to now. */
static __always_inline void lock_wait_ended(struct query_thread *st, __u64 now)
{
	if (!st->lock_block_ts)
		return;
	__u64 took = now - st->lock_block_ts;
	struct query_counters *c = &st->c;
	st->lock_block_ts = 0;
	c->lock_waits++;
	if (took > c->lock_max_ns) {
		c->lock_max_ns = took;
		c->lock_addr = st->lock_block_addr;
		c->lock_stack = st->lock_block_stack;
	}
	add_wait(c, st->lock_block_stack, st->wait_hint, c->part_ns[PART_LOCK] - st->lock_before, st->woken_by,
		 st->woken_at);
}

static __always_inline void reply_ended(struct query_thread *st, __u64 now)
{
	charge(st, now, st->part);
	/* Its own thread replies, so any wait has ended: one whose switch back to a CPU was not followed still counts,
	 * with its stack, in the record. */
	lock_wait_ended(st, now);
	st->ev.end_ns = now;
	st->ev.c = st->c;
}

/* The reply (or more of it) went out: the record as of now is what will be sent. */
static __always_inline void reply_sent(struct query_thread *st, __u64 buf, long n, __u64 now)
{
	if (st->phase == PHASE_RUNNING || st->phase == PHASE_INFILE) {
		long m = n > REPLY_HEAD ? REPLY_HEAD : n;
		if (m <= 0 || bpf_probe_read_user(st->ev.reply, BOUNDED_SIZE(m, REPLY_HEAD), (void *)buf))
			m = 0;
		st->ev.reply_len = m;
		/* A query's first reply packet starting with 0xfb asks for a LOAD DATA LOCAL file: not the end. On a
		 * compressed connection, the packet is inside one sent as is (a deflated request's command is not
		 * known here). */
		__u8 *r = st->ev.reply;
		__u8 cmd = st->ev.text[0];
		bool infile = st->ev.compressed ? m > 11 && !(r[4] | r[5] | r[6]) && r[11] == 0xfb &&
							(st->ev.inflated_len || cmd == COM_QUERY)
						: cmd == COM_QUERY && m > 4 && r[4] == 0xfb;
		if (st->phase == PHASE_RUNNING && infile) {
			st->phase = PHASE_INFILE;
			return;
		}
		/* Longer, after the request: an execution's reply, for its result set's column definitions; on a
		 * compressed connection, a prepare's (or a deflated request's), whose OK with the statement's id is
		 * deflated with the parameters' definitions. */
		bool keep = st->phase == PHASE_RUNNING &&
			    ((want_results && cmd == COM_STMT_EXECUTE) ||
			     (st->ev.compressed && (cmd == COM_STMT_PREPARE || st->ev.inflated_len)));
		__u32 off = st->ev.text_len;
		if (keep && off <= MAX_TEXT - RESULT_HEAD) {
			long k = n > RESULT_HEAD ? RESULT_HEAD : n;
			if (k > 0 && !bpf_probe_read_user(&st->ev.text[off], BOUNDED_SIZE(k, RESULT_HEAD), (void *)buf)) {
				st->ev.result_len = k;
				st->ev.reply_len = 0;
			}
		}
		st->phase = PHASE_REPLIED;
	}
	reply_ended(st, now);
}

/* Whether a statement's record is kept: not when it is shorter than --min-ms and says nothing that user space
 * needs for later ones (a prepare's id, a change of database or user). */
static __always_inline bool worth_sending(struct query_event *e)
{
	if (!min_statement_ns || e->end_ns - e->start_ns >= min_statement_ns)
		return true;
	__u8 cmd = e->text[0];
	/* USE, as a query, changes the connection's database. */
	bool use = e->text_len > 4 && (e->text[1] | 0x20) == 'u' && (e->text[2] | 0x20) == 's' &&
		   (e->text[3] | 0x20) == 'e';
	bool plain = cmd == COM_STMT_EXECUTE || cmd == COM_PING || cmd == COM_STMT_FETCH || (cmd == COM_QUERY && !use);
	if (plain)
		__sync_fetch_and_add(&below_min_statements, 1);
	return !plain;
}

static __always_inline void submit_statement(struct query_thread *st, bool wake)
{
	if (worth_sending(&st->ev))
		submit_waking(&st->ev, wake);
}

static __always_inline void finish_statement(struct query_thread *st)
{
	if (st->phase == PHASE_REPLIED)
		submit_statement(st, false);
	st->phase = PHASE_IDLE;
}

/* The connection ended within its statement (KILL, a client gone): the statement ends now, and the thread is
 * free for the next connection it serves. */
static __always_inline void connection_ended(struct query_thread *st, __u64 now)
{
	reply_ended(st, now);
	st->phase = PHASE_REPLIED;
	finish_statement(st);
}

/* The statement's connection ended unseen, and its thread went on to serve another (a KILL on MySQL: the server
 * closes the socket without a word, and no close is followed): the statement ended at the latest when its
 * thread last blocked, to wait for that connection. A record ready (its reply sent) is as of its last send. */
static __always_inline void connection_vanished(struct query_thread *st, __u64 now)
{
	st->hdr_have = 0;
	st->skip = 0;
	if (st->phase == PHASE_REPLIED) {
		finish_statement(st);
		return;
	}
	charge(st, now, st->part);
	__u64 end = st->blocked_at > st->ev.start_ns && st->blocked_at < now ? st->blocked_at : now;
	/* The time since, given back: from the part its last wait went to, then from its time on a CPU. */
	__u64 extra = now - end;
	__u64 *waited = &st->c.part_ns[st->blocked_part < PARTS ? st->blocked_part : PART_OTHER];
	__u64 back = extra < *waited ? extra : *waited;
	*waited -= back;
	extra -= back;
	__u64 *on_cpu = &st->c.part_ns[PART_USER];
	*on_cpu -= extra < *on_cpu ? extra : *on_cpu;
	if (st->blocked_part == PART_LOCK && now > end) {
		/* That wait was not the statement's: its longest lock wait is not known any more. */
		if (st->c.lock_waits)
			st->c.lock_waits--;
		if (st->c.lock_max_ns > end - st->ev.start_ns) {
			st->c.lock_max_ns = 0;
			st->c.lock_addr = 0;
			st->c.lock_stack = 0;
		}
	}
	st->ev.end_ns = end;
	st->ev.c = st->c;
	st->phase = PHASE_REPLIED;
	finish_statement(st);
}

/* Whether a send of a thread in a statement is a greeting, on another connection than the statement's: it serves
 * a new one, and the statement's ended unseen. At sequence 0 a server's packet is a greeting (protocol 10, then its
 * version) or, on the statement's own socket, a row of a result whose sequence went round. */
static __always_inline bool greets_another_connection(struct query_thread *st, __s32 fd, __u64 buf, long n)
{
	__u8 h[6];
	if (n < (long)sizeof(h) || bpf_probe_read_user(h, sizeof(h), (void *)buf) || h[3] != 0 || h[4] != 10 ||
	    h[5] < '0' || h[5] > '9')
		return false;
	if (fd != st->fd)
		return true;
	__u64 ino = socket_ino(st->call_sk);
	return ino && st->ev.socket_ino && ino != st->ev.socket_ino;
}

/* A statement that ran when tracing began learns its socket from its thread's first send: its reply. */
static __always_inline void adopt_socket(struct query_thread *st, __s32 fd)
{
	st->socket_unknown = 0;
	st->fd = fd;
	st->ev.fd = fd;
	st->statement_sk = st->call_sk;
	st->ev.socket_ino = socket_ino(st->call_sk);
}

/* A statement that ran when tracing began whose thread reads a request before sending anything ended between
 * user space's read of it and its seeding: it is dropped, unseen (its reply went out before). */
static __always_inline bool started_and_ended(struct query_thread *st)
{
	if (!st->socket_unknown)
		return false;
	st->socket_unknown = 0;
	st->phase = PHASE_IDLE;
	return true;
}

/* With `syscall_cpu`: a statement's time on a CPU inside a syscall goes to its class (sys for the others). Every
 * syscall of the host comes here: other processes' are turned away by the first instructions. */
SEC("tp_btf/sys_enter")
int BPF_PROG(on_sys_enter, struct pt_regs *regs, long id)
{
	(void)ctx; /* declared by the BPF_PROG/BPF_KPROBE macros */
	__u32 tid;
	struct task_struct *task = current_target(&tid);
	if (!task || (__u64)id >= MAX_SYSCALL_NR)
		return 0;
	struct query_thread *st = thread_state(task, false);
	if (st && in_statement(st))
		charge(st, bpf_ktime_get_ns(), syscall_part(syscall_class[id], PT_REGS_PARM2_SYSCALL(regs), true));
	return 0;
}

/* The file of descriptor fd of the current task (NULL if none). */
static __always_inline struct file *fd_file(__s32 fd)
{
	struct task_struct *task = current_task();
	struct fdtable *fdt = BPF_CORE_READ(task, files, fdt);
	if (fd < 0 || (__u32)fd >= BPF_CORE_READ(fdt, max_fds))
		return 0;
	struct file **fds = BPF_CORE_READ(fdt, fd);
	struct file *file;
	if (bpf_probe_read_kernel(&file, sizeof(file), &fds[fd]))
		return 0;
	return file;
}

/* The local port of socket fd of the current task (0 if unknown, or not an internet socket). */
static __always_inline __u16 local_port(__s32 fd)
{
	struct file *file = fd_file(fd);
	if (!file)
		return 0;
	struct socket *sock = BPF_CORE_READ(file, private_data);
	return BPF_CORE_READ(sock, sk, __sk_common.skc_num);
}

/* Whether the socket of the current task's statement is known and no longer open on its descriptor (closed, or
 * the descriptor reused). */
static __always_inline bool statement_socket_closed(struct query_thread *st)
{
	if (!st->ev.socket_ino || st->fd < 0 || st->via_dispatch)
		return false;
	struct file *file = fd_file(st->fd);
	return !file || BPF_CORE_READ(file, f_inode, i_ino) != st->ev.socket_ino;
}

/* A client packet outside a statement (not a command: handshake, authentication) goes to user space. */
static __always_inline void client_packet(struct query_thread *st, __u32 tid, __s32 fd, __u64 buf, long n, __u64 now)
{
	if (n > st->header_len)
		n = st->header_len;
	send_packet(EVENT_PACKET_IN, tid, fd, st->call_sk, st->header_len, st->header_seq, buf, n, now);
	/* A TLS request (the response cut at its 32 bytes): what follows on the socket is encrypted, its plaintext
	 * followed at vio_ssl_read and vio_ssl_write (or at dispatch_command); read as packets, the ciphertext would start
	 * statements that hide the real ones. A handshake response (at sequence 1, or 2 after a TLS request) asking
	 * for compression: the commands that follow are framed compressed. Its first bytes are the client's
	 * capabilities. */
	__u32 caps = 0;
	/* At sequence 2 otherwise: the authentication of a COM_CHANGE_USER. */
	bool response = st->header_seq == 1 || (st->header_seq == 2 && st->tls_requested);
	st->tls_requested = 0;
	if (!response || n < 4 || bpf_probe_read_user(&caps, sizeof(caps), (void *)buf))
		return;
	if (st->header_seq == 1 && st->header_len == 32 && (caps & CLIENT_SSL)) {
		ignore_connection(st, fd, IGNORE_CIPHERTEXT);
		st->tls_fd = fd;
		st->tls_requested = 1;
		st->tls_synced = 1;
	} else if (caps & (CLIENT_COMPRESS | CLIENT_ZSTD_COMPRESSION_ALGORITHM)) {
		st->compression = COMPRESSION_ASKED;
		st->compressed_fd = fd;
		st->compressed_ino = socket_ino(st->call_sk);
	} else if (fd == st->compressed_fd) {
		st->compression = COMPRESSION_NONE; /* a new connection on the descriptor of a compressed one */
	}
}

struct read_ahead_args {
	__u64 buf;
	__u64 now;
	long off;
	long n;
	__u32 tid;
	__s32 fd;
};

/* Packets after the first in one read, from `off`: a server that reads ahead (MariaDB does not) has the
 * client's next packets in its buffer and handles them with no syscall between. Each goes to user space as a
 * PACKET_IN (at sequence 0, a pipelined command: user space records it within the time of the statement
 * before it); a body or header cut by the read's end continues in the next read.
 * A global function: the verifier checks it once, not at every place it is called from. Before 5.12 a global
 * function takes no pointers, and checked at each call it passes the verifier's limit: the compat build counts
 * such reads lost. */
__noinline int read_ahead(struct query_thread *st, struct read_ahead_args *a)
{
	if (!st || !a)
		return 0;
	long off = a->off, n = a->n;
	for (int i = 0; i < MAX_READ_AHEAD; i++) {
		long left = n - off;
		if (left <= 0)
			return 0;
		if (left < 4) {
			if (!bpf_probe_read_user(st->hdr, left & 3, (void *)(a->buf + off))) {
				st->hdr_have = left;
				st->hdr_fd = a->fd;
			}
			return 0;
		}
		__u8 h[4];
		if (bpf_probe_read_user(h, 4, (void *)(a->buf + off)))
			return 0;
		long len = h[0] | (h[1] << 8) | (h[2] << 16);
		off += 4;
		left -= 4;
		send_packet(EVENT_PACKET_IN, a->tid, a->fd, st->call_sk, len, h[3], a->buf + off, left < len ? left : len,
			    a->now);
		if (len > left) {
			st->skip = len - left;
			st->hdr_fd = a->fd;
			return 0;
		}
		off += len;
	}
	if (off < n)
		count_lost(state); /* more packets than parsed: the stream is lost until its next statement */
	return 0;
}

/* The packet that began in this read ends at offset `end` of it (maybe beyond its n bytes). */
static __always_inline void packet_read(struct query_thread *st, __u32 tid, __s32 fd, __u64 buf, long end, long n,
					__u64 now)
{
	if (end < n && st->packet_compressed) {
		count_lost(state); /* compressed packets read ahead: not parsed */
	} else if (end < n && COMPAT) {
		count_lost(state); /* packets read ahead: not parsed (read_ahead) */
	} else if (end < n) {
		struct read_ahead_args a = { .buf = buf, .now = now, .off = end, .n = n, .tid = tid, .fd = fd };
		read_ahead(st, &a);
	} else if (!in_statement(st)) {
		/* The rest of a body no statement reads (an authentication packet, COM_STMT_SEND_LONG_DATA) comes
		 * in the next reads: it is not a header. A statement's own body is read while it runs. */
		st->skip = end - n;
		st->hdr_fd = fd;
	}
}

/* Where a recv's bytes are (`tls`: the plaintext of a TLS read): the offset of the first byte of a packet's body
 * in it, or none to handle. */
static __always_inline long packet_start(struct query_thread *st, __s32 fd, __u64 buf, long n, __u64 now, bool tls)
{
	if (st->phase == PHASE_BODY && fd == st->fd)
		return 0;
	if (in_statement(st))
		return -1; /* data the statement itself reads from the client (LOAD DATA LOCAL) */
	if (ignored(st, fd) && !(tls && st->ignoring == IGNORE_CIPHERTEXT))
		return -1;
	if (fd != st->port_checked_fd) {
		st->port_checked_fd = fd;
		struct sock *sk = (struct sock *)st->call_sk;
		if ((sk ? BPF_CORE_READ(sk, __sk_common.skc_num) : local_port(fd)) == X_PROTOCOL_PORT) {
			ignore_connection(st, fd, IGNORE_FRAMING);
			return -1;
		}
	}
	if ((st->hdr_have || st->skip) && st->hdr_fd != fd) {
		st->hdr_have = 0;
		st->skip = 0;
	}
	/* The rest of a read-ahead packet's body. */
	long used = 0;
	if (st->skip) {
		used = st->skip < n ? st->skip : n;
		st->skip -= used;
		if (used == n)
			return -1;
	}
	/* A packet header: 3 bytes length, 1 byte sequence, and with compression 3 bytes of length inflated; a client
	 * can send it in pieces, and each piece is then read alone. */
	enum compression comp = compression_of(st, fd);
	if (!st->hdr_have && n - used >= 4) {
		/* The usual case, in one read of the 4 bytes. */
		if (bpf_probe_read_user(st->hdr, 4, (void *)(buf + used)))
			return -1;
		st->hdr_have = 4;
		used += 4;
	}
	long need = 4;
	for (int i = 0; i < 8; i++) {
		/* The first command of a connection that asked for compression is framed compressed. */
		if (comp == COMPRESSION_ASKED && st->hdr_have >= 4 && st->hdr[3] == 0) {
			comp = COMPRESSION_ON;
			st->compression = COMPRESSION_ON;
		}
		need = comp == COMPRESSION_ON ? 7 : 4;
		if (st->hdr_have >= need || used >= n)
			break;
		if (bpf_probe_read_user(&st->hdr[st->hdr_have & 7], 1, (void *)(buf + used))) {
			st->hdr_have = 0;
			return -1;
		}
		st->hdr_have++;
		used++;
	}
	if (st->hdr_have < need) {
		st->hdr_fd = fd;
		return -1;
	}
	st->hdr_have = 0;
	st->fd = fd;
	st->header_len = st->hdr[0] | (st->hdr[1] << 8) | (st->hdr[2] << 16);
	st->header_seq = st->hdr[3];
	st->packet_compressed = comp == COMPRESSION_ON;
	st->inflated_len = st->packet_compressed ? st->hdr[4] | (st->hdr[5] << 8) | (st->hdr[6] << 16) : 0;
	st->header_ts = now;
	if (st->header_len == 0)
		return used; /* an empty packet: no body (the server answers it as an unknown command) */
	if (used == n) {
		st->phase = PHASE_BODY;
		return -1;
	}
	return used; /* header and body in one read */
}

/* A compressed packet's payload, n bytes of it at buf. At sequence 0 a command: sent as is, it holds a classic
 * packet, followed as any; deflated, its bytes are kept for user space to inflate (its command is not known
 * here, and it is taken as one the server answers). A classic header sent alone (mysql2 frames a packet of 16 MB
 * so) has its body in the packet at sequence 1. Past that, data of a statement gone by. */
static __always_inline void compressed_request(struct query_thread *st, __u32 tid, __u64 buf, long n, __u64 now)
{
	__u32 inflated = st->inflated_len;
	__u32 body_of = st->classic_pending;
	st->classic_pending = 0;
	if (st->header_seq == 1 && body_of) {
		start_statement(st, tid, buf, n, now);
		st->ev.compressed = COMPRESSED_BODY;
		st->ev.inflated_len = inflated;
		st->ev.packet_len = body_of;
		return;
	}
	if (st->header_seq != 0) {
		st->phase = PHASE_IDLE;
		return;
	}
	if (!inflated) {
		__u8 inner[4];
		if (n < 4 || bpf_probe_read_user(inner, sizeof(inner), (void *)buf)) {
			st->phase = PHASE_IDLE;
			return;
		}
		__u32 whole = st->header_len;
		st->header_len = inner[0] | (inner[1] << 8) | (inner[2] << 16);
		if (whole == 4 && st->header_len) {
			st->classic_pending = st->header_len;
			st->phase = PHASE_IDLE;
			return;
		}
		buf += 4;
		n -= 4;
	}
	start_statement(st, tid, buf, n, now);
	st->ev.compressed = 1;
	st->ev.inflated_len = inflated;
}

#define TEXT_CHUNK 64

/* Where a request's text goes on being read (request_continues). */
struct text_read {
	struct query_thread *st;
	__u64 buf;
	long off;
	long left;
	bool failed;
};

/* One read of a request's text: a chunk where a whole one fits, else a byte. A bpf_loop callback, verified once:
 * as unrolled loops, older verifiers went past their million instructions on the paths of each byte. */
static long text_read_step(__u64 step __attribute__((unused)), struct text_read *r)
{
	long off = r->off, k = 1;
	if (r->left <= 0 || off < 0 || off >= MAX_TEXT)
		return 1;
	if (off <= MAX_TEXT - TEXT_CHUNK) {
		k = r->left < TEXT_CHUNK ? r->left : TEXT_CHUNK;
		/* The bound checked again on the register used, which the compiler would take for proven. */
		barrier_var(off);
		if (off < 0 || off > MAX_TEXT - TEXT_CHUNK)
			return 1;
		r->failed = bpf_probe_read_user(&r->st->ev.text[off], BOUNDED_SIZE(k, TEXT_CHUNK), (void *)r->buf);
	} else {
		barrier_var(off);
		r->failed = bpf_probe_read_user(&r->st->ev.text[off & (MAX_TEXT - 1)], 1, (void *)r->buf);
	}
	if (r->failed)
		return 1;
	r->off += k;
	r->buf += k;
	r->left -= k;
	return 0;
}

/* More of the running statement's request, n bytes at buf (a client that writes it in pieces, a network's
 * segments): its text goes on from where the last read left it, up to what is kept. */
static __always_inline void request_continues(struct query_thread *st, __u64 buf, long n)
{
#ifdef MYPROBE_COMPAT
	/* No bpf_loop: the text stays as its first read had it (user space marks it truncated). */
	(void)buf;
	(void)n;
	st->text_more = 0;
	return;
#endif
	struct text_read r = {
		.st = st,
		.buf = buf,
		.off = st->ev.text_len,
		.left = st->text_more < n ? st->text_more : n,
	};
	bpf_loop(MAX_TEXT / TEXT_CHUNK + TEXT_CHUNK, text_read_step, &r, 0);
	__u32 got = r.off - st->ev.text_len;
	st->ev.text_len = r.off;
	st->text_more = r.failed || got >= st->text_more ? 0 : st->text_more - got;
}

/* A recv on a socket returned n > 0 bytes at buf (`tls`: a TLS read, its plaintext). */
static __always_inline void on_recv(struct query_thread *st, __u32 tid, __s32 fd, __u64 buf, long n, __u64 now,
				    bool tls)
{
	if (st->text_more && st->phase == PHASE_RUNNING && fd == st->fd) {
		request_continues(st, buf, n);
		return;
	}
	long body = packet_start(st, fd, buf, n, now, tls);
	if (body < 0 || body > n)
		return;
	long end = body + st->header_len;
	if (st->header_len && body < n) {
		if (st->packet_compressed) {
			compressed_request(st, tid, buf + body, n - body, now);
		} else if (st->header_seq == 0) {
			start_statement(st, tid, buf + body, n - body, now);
		} else {
			client_packet(st, tid, fd, buf + body, n - body, now);
			st->phase = PHASE_IDLE;
		}
	}
	packet_read(st, tid, fd, buf, end, n, now);
}

/* The data of a recvmsg/sendmsg that returned `ret` bytes: its first iovec, as (buffer, length). */
static __always_inline bool msghdr_data(__u64 msg, long ret, __u64 *buf, long *n)
{
	struct user_msghdr m;
	struct iovec iov;
	if (bpf_probe_read_user(&m, sizeof(m), (void *)msg) || m.msg_iovlen == 0 ||
	    bpf_probe_read_user(&iov, sizeof(iov), m.msg_iov))
		return false;
	*buf = (__u64)iov.iov_base;
	*n = ret < (long)iov.iov_len ? ret : (long)iov.iov_len;
	return true;
}

static __always_inline bool is_send(enum syscall_class cls)
{
	return cls == SYSCALL_NET_SEND || cls == SYSCALL_NET_SENDMSG;
}

/* A failed send: the client is gone (a send that would block is retried, not failed). */
static __always_inline bool connection_failed(long ret)
{
	return ret < 0 && ret != -EAGAIN && ret != -EINTR;
}

/* A statement's socket call (`each_syscall`: seen at the syscall's exit, and counted as one) returned `ret`. */
static __always_inline void count_net_call(struct query_thread *st, __u64 now, long ret, bool each_syscall)
{
	charge(st, now, PART_USER);
	if (each_syscall)
		st->c.syscalls++;
	if (ret > 0)
		st->c.net_bytes += ret;
}

/* A recv or send of the server's thread on socket fd returned `ret` (class `cls`, its bytes at `buf` or in the
 * msghdr there). With `each_syscall` (the sys_exit program) the statement also counts it as a syscall. The
 * statement's record as of now is ready after its reply's send. */
static __always_inline void socket_call(struct query_thread *st, __u32 tid, enum syscall_class cls, __s32 fd,
					__u64 buf, long ret, bool each_syscall)
{
	bool recv = is_recv(cls);
	bool counted = in_statement(st);
	long n = ret;
	/* The bytes: the buffer argument, or a msghdr's first iovec. */
	if (cls == SYSCALL_NET_RECVMSG || cls == SYSCALL_NET_SENDMSG) {
		if (ret <= 0 || !msghdr_data(buf, ret, &buf, &n))
			n = 0;
	}
	/* The next request's read (on its socket, or on another: the thread serves another connection): the
	 * statement ended with its last send. */
	if (counted && recv && st->phase == PHASE_REPLIED) {
		finish_statement(st);
		counted = false;
	}
	/* Outside a statement nothing read or sent (a read that found nothing yet) needs the time: the clock
	 * is read only past here. */
	if (!counted && n <= 0)
		return;
	__u64 now = bpf_ktime_get_ns();
	/* The client closed its connection before the reply (the rest of a request that never comes): the server
	 * cannot answer. */
	if (counted && recv && ret == 0 && fd == st->fd) {
		connection_ended(st, now);
		return;
	}
	/* A send on the statement's own socket (the same descriptor and socket: a reply) is no greeting: its bytes are
	 * not read for one. */
	bool own_socket = fd == st->fd && st->call_sk == st->statement_sk;
	if (counted && !recv && n > 0 && !own_socket && greets_another_connection(st, fd, buf, n)) {
		connection_vanished(st, now);
		counted = false;
	}
	if (counted && n > 0 && st->socket_unknown) {
		if (!recv)
			adopt_socket(st, fd);
		else if (started_and_ended(st))
			counted = false;
	}

	if (recv && n > 0)
		on_recv(st, tid, fd, buf, n, now, false);
	else if (!recv && n > 0 && !counted && !ignored(st, fd))
		send_packet(EVENT_PACKET_OUT, tid, fd, st->call_sk, st->header_len, st->header_seq, buf, n, now);

	if (!counted)
		return;
	count_net_call(st, now, ret, each_syscall);
	if (!recv && fd == st->fd) {
		if (n > 0)
			reply_sent(st, buf, n, now);
		else if (connection_failed(ret))
			connection_ended(st, now);
	}
}

/* A syscall on socket fd (`sk` if known) inside the server's TLS call returned `ret`: its bytes are the ciphertext,
 * and its descriptor the connection's, whose plaintext the call's return gives. */
static __always_inline void tls_socket_call(struct query_thread *st, __s32 fd, __u64 sk, long ret, bool each_syscall)
{
	st->tls_fd = fd;
	st->tls_sk = sk;
	if (in_statement(st))
		count_net_call(st, bpf_ktime_get_ns(), ret, each_syscall);
}

/* The kernel's socket tracepoints: run at the end of each recv and send on a socket of the host (not at every
 * syscall), inside the syscall, whose registers name the descriptor and the bytes (not io_uring's, nor readv's:
 * only the calls of socket_call's classes are followed, and read and write within the server's TLS calls). */
static __always_inline enum run_outcome on_socket(struct sock *sk, long ret, bool recv)
{
	__u32 tid;
	struct task_struct *task = current_target(&tid);
	if (!task)
		return RUN_OTHER_PROCESS;
	struct query_thread *st = thread_state(task, false);
	/* A recv that found nothing (the next request not there yet: MariaDB's read before it polls) can only end a
	 * statement whose reply went out, or add to one's time: its registers are not read (TLS's calls aside). */
	if (recv && ret <= 0) {
		if (!st)
			return RUN_NO_BYTES;
		if (!st->tls_call) {
			if (st->phase == PHASE_REPLIED)
				finish_statement(st);
			else if (ret == 0 && in_statement(st) && st->ev.socket_ino &&
				 socket_ino((__u64)sk) == st->ev.socket_ino)
				connection_ended(st, bpf_ktime_get_ns()); /* the client closed it before the reply */
			else if (in_statement(st))
				count_net_call(st, bpf_ktime_get_ns(), ret, false);
			return RUN_NO_BYTES;
		}
	}
	enum syscall_class cls;
	__u64 fd, buf;
	if (!syscall_of(current_regs(task, st), &cls, &fd, &buf))
		return RUN_NOT_FOLLOWED;
	bool followed = recv ? is_recv(cls) : is_send(cls);
	/* OpenSSL's socket calls are read and write. */
	if (!followed && cls != (recv ? SYSCALL_READ : SYSCALL_WRITE))
		return RUN_NOT_FOLLOWED;
	/* A thread's state is made at its first socket call. */
	if (!st && followed)
		st = thread_state(task, true);
	if (!st)
		return RUN_NOT_FOLLOWED;
	if (st->tls_call) {
		tls_socket_call(st, (__s32)fd, (__u64)sk, ret, false);
		return RUN_NOT_FOLLOWED;
	}
	if (!followed)
		return RUN_NOT_FOLLOWED;
	st->call_sk = (__u64)sk;
	bool was = in_statement(st);
	socket_call(st, tid, cls, (__s32)fd, buf, ret, false);
	return was ? RUN_IN_STATEMENT : in_statement(st) ? RUN_STARTS : RUN_OUTSIDE;
}

SEC("tp_btf/sock_recv_length")
int BPF_PROG(on_sock_recv, struct sock *sk, int ret, int flags)
{
	(void)ctx; /* declared by the BPF_PROG/BPF_KPROBE macros */
	__u64 started = run_cost_start();
	/* A peek is a look at what is there (a check that the client is connected): read again later. */
	run_cost_end(COST_SOCK_RECV, flags & MSG_PEEK ? RUN_NOT_FOLLOWED : on_socket(sk, ret, true), started);
	return 0;
}

SEC("tp_btf/sock_send_length")
int BPF_PROG(on_sock_send, struct sock *sk, int ret, int flags)
{
	(void)ctx; /* declared by the BPF_PROG/BPF_KPROBE macros */
	(void)flags;
	__u64 started = run_cost_start();
	run_cost_end(COST_SOCK_SEND, on_socket(sk, ret, false), started);
	return 0;
}

/* Where the kernel has no socket tracepoints, or with `syscall_cpu`: the same from every syscall exit, and the
 * statement's syscalls and bytes read and written counted. */
static __always_inline enum run_outcome sys_exit(struct pt_regs *regs, long ret)
{
	/* Every syscall of the host comes here, half of them other processes' under load: the first
	 * instructions turn those away, before any map or storage is touched. */
	__u32 tid;
	struct task_struct *task = current_target(&tid);
	if (!task)
		return RUN_OTHER_PROCESS;
	long id = regs->orig_ax;
	if (id < 0 || id >= MAX_SYSCALL_NR)
		return RUN_NOT_FOLLOWED;
	enum syscall_class cls = syscall_class[id];
	bool net = is_recv(cls) || is_send(cls);
	/* A thread's state is made at its first socket syscall: one that was in a recv when tracing began (a
	 * connection waiting for its next request) is followed from what that recv read. */
	struct query_thread *st = thread_state(task, net);
	if (!st)
		return RUN_NOT_FOLLOWED;
	bool counted = in_statement(st);
	__s32 fd = (__s32)PT_REGS_PARM1_SYSCALL(regs);
	if (st->tls_call && (net || cls == SYSCALL_READ || cls == SYSCALL_WRITE)) {
		tls_socket_call(st, fd, 0, ret, true);
		return RUN_NOT_FOLLOWED;
	}
	if (!counted && !net && cls != SYSCALL_CLOSE)
		return RUN_NOT_FOLLOWED;
	__u64 buf = PT_REGS_PARM2_SYSCALL(regs);
	st->call_sk = 0;
	if (net) {
		socket_call(st, tid, cls, fd, buf, ret, true);
		/* Told apart only where measured: the verifier follows no more paths otherwise. */
		if (!run_costs || counted)
			return RUN_IN_STATEMENT;
		return in_statement(st) ? RUN_STARTS : ret <= 0 ? RUN_NO_BYTES : RUN_OUTSIDE;
	}
	if (cls == SYSCALL_CLOSE) {
		if (ignored(st, fd))
			st->ignoring = 0; /* the socket number may next be a followed connection's */
		if (counted && fd == st->fd) {
			connection_ended(st, bpf_ktime_get_ns());
			return RUN_IN_STATEMENT;
		}
	}
	if (!counted)
		return RUN_NOT_FOLLOWED;
	charge(st, bpf_ktime_get_ns(), PART_USER);
	struct query_counters *c = &st->c;
	c->syscalls++;
	if (ret > 0 && cls == SYSCALL_READ)
		c->read_bytes += ret;
	else if (ret > 0 && cls == SYSCALL_WRITE)
		c->write_bytes += ret;
	return RUN_IN_STATEMENT;
}

SEC("tp_btf/sys_exit")
int BPF_PROG(on_sys_exit, struct pt_regs *regs, long ret)
{
	(void)ctx; /* declared by the BPF_PROG/BPF_KPROBE macros */
	__u64 started = run_cost_start();
	run_cost_end(COST_SYS_EXIT, sys_exit(regs, ret), started);
	return 0;
}

/* TLS fallback: where the socket carries encrypted bytes, statements are seen at the server's command
 * dispatcher instead. Attached by user space only when needed; a statement the socket path already started
 * is left alone. */
SEC("uprobe")
int BPF_KPROBE(on_dispatch, __u64 arg0, __u64 arg1, __u64 arg2, __u64 arg3)
{
	(void)ctx; /* declared by the BPF_PROG/BPF_KPROBE macros */
	__u32 tid;
	struct query_thread *st = current_state(&tid, true);
	if (!st || (in_statement(st) && !st->via_dispatch))
		return 0;
	__u64 now = bpf_ktime_get_ns();
	__u8 command;
	__u64 text;
	__u32 len;
	__u64 id = 0;
	bool by_id = false;
	if (dispatch_abi == DISPATCH_MYSQL) {
		/* dispatch_command(THD *, const COM_DATA *, enum_server_command): the server has parsed the packet
		 * into the COM_DATA union (query attributes read past). COM_QUERY_DATA, COM_STMT_PREPARE_DATA and
		 * COM_INIT_DB_DATA lead with the text and its length (uint, uint, size_t); COM_STMT_EXECUTE_DATA with
		 * the statement id (unsigned long), written back as the packet's own id so that user space reads
		 * both paths alike. */
		command = arg2;
		text = 0;
		len = 0;
		if (command == COM_QUERY || command == COM_STMT_PREPARE || command == COM_INIT_DB) {
			bpf_probe_read_user(&text, sizeof(text), (void *)arg1);
			bpf_probe_read_user(&len, sizeof(len), (void *)(arg1 + 8));
		} else if (command == COM_STMT_EXECUTE || command == COM_STMT_RESET) {
			bpf_probe_read_user(&id, sizeof(id), (void *)arg1);
			by_id = true;
			len = 4;
		}
	} else {
		/* MariaDB: dispatch_command(enum_server_command, THD *, char *packet, uint length, bool) */
		command = arg0;
		text = arg2;
		len = arg3;
	}
	if (command == COM_QUIT || command == COM_STMT_SEND_LONG_DATA || command == COM_STMT_CLOSE || closing)
		return 0;
	st->fd = -1;
	st->call_sk = 0; /* its socket is not known here */
	st->header_len = len + 1;
	st->header_ts = now;
	start_statement(st, tid, 0, 0, now);
	st->phase = PHASE_RUNNING;
	st->via_dispatch = 1;
	st->ev.text[0] = command;
	if (by_id) {
		__builtin_memcpy(&st->ev.text[1], &id, 4);
		st->ev.text_len = 1 + 4;
		return 0;
	}
	long n = len;
	if (n > MAX_TEXT - 1)
		n = MAX_TEXT - 1;
	if (n <= 0 || !text || bpf_probe_read_user(&st->ev.text[1], n, (void *)text))
		n = 0;
	st->ev.text_len = n + 1;
	return 0;
}

SEC("uretprobe")
int BPF_KRETPROBE(on_dispatch_return)
{
	(void)ctx; /* declared by the BPF_PROG/BPF_KPROBE macros */
	__u32 tid;
	struct query_thread *st = current_state(&tid, false);
	if (!st || !st->via_dispatch || st->phase != PHASE_RUNNING)
		return 0;
	reply_ended(st, bpf_ktime_get_ns());
	/* A prepare whose reply (with the statement's id) user space cannot read: it reads the server's table of
	 * prepared statements as soon as it learns of it, while the statement is likely still there. */
	submit_statement(st, st->ev.text[0] == COM_STMT_PREPARE);
	st->phase = PHASE_IDLE;
	return 0;
}

/* TLS: the plaintext of a connection is followed at the server's own vio_ssl_read and vio_ssl_write (MariaDB's
 * and MySQL's one layer above OpenSSL, whose entries the kernel emulates: OpenSSL's SSL_read is single-stepped, ten
 * times dearer), as the socket's bytes are. Entered, the call's buffer is kept; the socket calls inside it (read
 * and write, on ciphertext) name the connection; its return gives the bytes. The next request's read ends a
 * statement whose reply went out. */
static __always_inline int tls_enter(enum tls_call call, __u64 buf)
{
	__u32 tid;
	struct query_thread *st = current_state(&tid, true);
	if (!st)
		return 0;
	/* The two do not call each other: a call entered is a new one (one before it that returned unseen is over). */
	st->tls_call = call;
	st->tls_buf = buf;
	st->tls_sk = 0;
	if (call == TLS_READ && st->phase == PHASE_REPLIED)
		finish_statement(st);
	return 0;
}

/* vio_ssl_read(Vio *, uchar *buf, size_t size) and vio_ssl_write(Vio *, const uchar *buf, size_t size) */
SEC("uprobe")
int BPF_KPROBE(on_tls_read, __u64 vio, __u64 buf)
{
	(void)ctx; /* declared by the BPF_PROG/BPF_KPROBE macros */
	(void)vio;
	return tls_enter(TLS_READ, buf);
}

SEC("uprobe")
int BPF_KPROBE(on_tls_write, __u64 vio, __u64 buf)
{
	(void)ctx; /* declared by the BPF_PROG/BPF_KPROBE macros */
	(void)vio;
	return tls_enter(TLS_WRITE, buf);
}

/* The return of either: the bytes read or written (-1: an error), handled as a recv's or a send's are. */
SEC("uretprobe")
int BPF_KRETPROBE(on_tls_return, long ret)
{
	(void)ctx; /* declared by the BPF_PROG/BPF_KPROBE macros */
	__u32 tid;
	struct query_thread *st = current_state(&tid, false);
	if (!st || !st->tls_call)
		return 0;
	enum tls_call call = st->tls_call;
	st->tls_call = TLS_NONE;
	long n = ret;
	__s32 fd = st->tls_fd;
	if (n <= 0 || fd < 0)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	st->call_sk = st->tls_sk;
	if (call == TLS_READ) {
		if (in_statement(st))
			started_and_ended(st);
		if (st->tls_synced)
			on_recv(st, tid, fd, st->tls_buf, n, now, true);
		return 0;
	}
	st->tls_synced = 1; /* the next read begins a request */
	if (in_statement(st) && st->socket_unknown)
		adopt_socket(st, fd);
	if (!in_statement(st))
		send_packet(EVENT_PACKET_OUT, tid, fd, st->call_sk, st->header_len, st->header_seq, st->tls_buf, n, now);
	else if (fd == st->fd)
		reply_sent(st, st->tls_buf, n, now);
	return 0;
}

/* At a call of the server's thd_wait_begin(thd, type) whose type is one of several (InnoDB's lock wait: a row lock
 * or a table lock), placed on the call instruction itself, where its second argument is set: the waits that follow
 * in the statement at that function's stacks are of this type. Called only before such a wait. */
SEC("uprobe")
int BPF_KPROBE(on_wait_type, __u64 thd, __u64 type)
{
	(void)ctx;
	(void)thd;
	__u32 tid;
	struct query_thread *st = current_state(&tid, false);
	if (st && in_statement(st))
		st->wait_hint = (__u32)type;
	return 0;
}

/* A statement's internal temporary table gone to disk, and its sort's merge passes (a sort that outgrew its buffer):
 * at the server's THD::inc_status_created_tmp_disk_tables() and THD::inc_status_sort_merge_passes(), which MariaDB
 * and MySQL export and call just there. Each runs once per table or pass, never in a statement that spills nothing;
 * attached for the whole trace. */
SEC("uprobe")
int BPF_KPROBE(on_tmp_disk_table)
{
	(void)ctx;
	__u32 tid;
	struct query_thread *st = current_state(&tid, false);
	if (st && in_statement(st))
		st->c.tmp_disk_tables++;
	return 0;
}

SEC("uprobe")
int BPF_KPROBE(on_sort_merge_pass)
{
	(void)ctx;
	__u32 tid;
	struct query_thread *st = current_state(&tid, false);
	if (st && in_statement(st))
		st->c.sort_merge_passes++;
	return 0;
}

/* The texts of statements prepared before tracing: at the server's Prepared_statement::execute, attached by
 * user space only while executions of a statement of unknown text come. `this` is the statement object, which
 * keeps the text it was prepared with; sent only for a thread the socket path (or dispatch_command) sees
 * executing a statement, with the statement's id from its request, for user space to join with that
 * execution's record. */
SEC("uprobe")
int BPF_KPROBE(on_execute, __u64 object)
{
	(void)ctx; /* declared by the BPF_PROG/BPF_KPROBE macros */
	__u32 tid;
	struct query_thread *st = current_state(&tid, false);
	if (!st || st->phase != PHASE_RUNNING || st->ev.text_len < 5 ||
	    (st->ev.text[0] != COM_STMT_EXECUTE && st->ev.text[0] != COM_STMT_BULK_EXECUTE))
		return 0;
	__u32 zero = 0;
	struct executed_event *e = bpf_map_lookup_elem(&executions, &zero);
	if (!e)
		return 0;
	e->kind = EVENT_EXECUTED;
	e->tid = tid;
	__builtin_memcpy(&e->statement_id, &st->ev.text[1], 4);
	e->object = object;
	e->full_len = 0;
	e->text_len = 0;
	__u32 offset = statement_text_offset;
	if (offset) {
		__u64 text = 0;
		if (bpf_probe_read_user(&text, sizeof(text), (void *)(object + offset)) ||
		    bpf_probe_read_user(&e->full_len, sizeof(e->full_len), (void *)(object + offset + 8)))
			return 0;
		__u64 n = e->full_len;
		if (n > MAX_TEXT)
			n = MAX_TEXT;
		if (n && text && !bpf_probe_read_user(e->text, n, (void *)text))
			e->text_len = n;
	}
	__u64 size = EXECUTED_EVENT_HEADER_BYTES + (e->text_len & (MAX_TEXT - 1));
	if (e->text_len >= MAX_TEXT)
		size = sizeof(*e);
	submit_event(e, size);
	return 0;
}

/* A blocked syscall ends (its thread woken, or back on a CPU): the longest of each I/O part keeps its descriptor. */
static __always_inline void io_unblocked(struct query_thread *st, __u64 now)
{
	__u32 i = st->blocked_part - PART_READ;
	if (i >= IO_PARTS || now < st->blocked_at)
		return;
	__u64 took = now - st->blocked_at;
	if (took > st->c.io_max_ns[i]) {
		st->c.io_max_ns[i] = took;
		st->c.io_fd[i] = st->blocked_fd;
	}
}

SCHED_SWITCH_PROG(on_switch)
{
	(void)ctx; /* declared by the BPF_PROG/BPF_KPROBE macros */
	__u64 started = run_cost_start();
	enum run_outcome outcome = RUN_OTHER_PROCESS;
	__u64 now = 0;
	if (task_is_target(prev)) {
		struct query_thread *st = thread_state(prev, false);
		outcome = RUN_NOT_FOLLOWED;
		if (st && in_statement(st)) {
			outcome = RUN_IN_STATEMENT;
			now = bpf_ktime_get_ns();
			if (preempt || prev_state == TASK_RUNNING) {
				charge(st, now, PART_RUNQ);
				st->place = PLACE_RUNQ;
			} else {
				/* Blocked: in the syscall its registers name (none: a page fault). */
				enum syscall_class cls = SYSCALL_OTHER;
				__u64 arg0 = 0, arg1 = 0;
				enum time_part part = PART_OTHER;
				if (in_syscall(prev, &cls, &arg0, &arg1))
					part = syscall_part(cls, arg1, false);
				/* OpenSSL's read and write: the connection's. */
				if (st->tls_call && (part == PART_READ || part == PART_WRITE))
					part = PART_NET;
				/* A futex wait once the statement's socket is closed: its connection ended unseen
				 * (MySQL closes a KILLed one without a word; no close is followed on the socket
				 * path), and its thread waits for the next connection in the server's thread cache. */
				if (part == PART_LOCK && statement_socket_closed(st)) {
					if (st->phase == PHASE_REPLIED)
						finish_statement(st);
					else
						connection_ended(st, now);
				} else {
					if (part == PART_LOCK && !st->lock_block_ts) {
						/* Where it waits: its registers are still those it entered the kernel
						 * with. */
						st->lock_block_ts = now;
						st->lock_block_addr = arg0;
						st->lock_block_stack = wait_sites ? stack_id_of_call(ctx, false) : 0;
						st->woken_by = 0;
					}
					if (part == PART_SYNC)
						st->c.syncs++;
					/* The next request's read blocks (a blocking socket): the statement ended
					 * with its last send, and is sent now rather than when a request comes. */
					if (st->phase == PHASE_REPLIED && is_recv(cls) && (__s32)arg0 == st->fd) {
						finish_statement(st);
					} else {
						charge(st, now, part);
						st->lock_before = st->c.part_ns[PART_LOCK];
						st->place = PLACE_BLOCKED;
						st->blocked_at = now;
						st->blocked_part = part;
						st->blocked_fd = (__s32)arg0;
						if (runq_from_sched_info)
							st->runq_before = prev->sched_info.run_delay;
					}
				}
			}
		}
	}
	if (task_is_target(next)) {
		struct query_thread *st = thread_state(next, false);
		if (outcome == RUN_OTHER_PROCESS)
			outcome = RUN_NOT_FOLLOWED;
		if (st && in_statement(st)) {
			outcome = RUN_IN_STATEMENT;
			if (!now)
				now = bpf_ktime_get_ns();
			if (st->place == PLACE_BLOCKED)
				io_unblocked(st, now);
			if (runq_from_sched_info && st->place == PLACE_BLOCKED) {
				/* Blocked until woken, then waiting for a CPU: the scheduler counted the wait. */
				__u64 waited = runq_total(next) - st->runq_before;
				__u64 woken = now > st->since && waited < now - st->since ? now - waited : st->since;
				charge(st, woken, PART_RUNQ);
			}
			charge(st, now, on_cpu_part(next));
			st->place = PLACE_CPU;
			lock_wait_ended(st, now);
		}
	}
	run_cost_end(COST_SWITCH, outcome, started);
	return 0;
}

/* A blocked thread woken waits for a CPU from now on (kernels that do not count the waits themselves). A new
 * thread has no state, so sched_wakeup_new is not followed. */
SEC("tp_btf/sched_wakeup")
int BPF_PROG(on_wakeup, struct task_struct *p)
{
	(void)ctx;
	if (!task_is_target(p))
		return 0;
	struct query_thread *st = thread_state(p, false);
	if (st && in_statement(st) && st->place == PLACE_BLOCKED) {
		__u64 now = bpf_ktime_get_ns();
		io_unblocked(st, now);
		charge(st, now, PART_RUNQ);
		st->place = PLACE_RUNQ;
	}
	return 0;
}

/* Who woke a statement's futex wait: where another of the server's threads did (a lock's release grants it to the
 * waiter and wakes it: InnoDB's lock_grant, the metadata lock's release), that thread let the wait go, and its
 * connection held what was waited for. Run at every wakeup of the host (in the waker's context), turned away by
 * the woken thread's tgid first; attached by user space only while statements wait for locks (with wait_sites). */
SEC("tp_btf/sched_waking")
int BPF_PROG(on_waking, struct task_struct *p)
{
	(void)ctx;
	if (!task_is_target(p))
		return 0;
	__u32 tid;
	struct task_struct *waker = current_target(&tid);
	if (!waker || tid == (__u32)p->pid)
		return 0;
	struct query_thread *st = thread_state(p, false);
	if (!st || !st->lock_block_ts || st->place != PLACE_BLOCKED)
		return 0;
	/* Woken by a futex call on its word (a release), not by an interrupt that came upon a thread of the server (a
	 * timed wait's end). */
	enum syscall_class cls;
	__u64 word = 0, op;
	if (!in_syscall(waker, &cls, &word, &op) || cls != SYSCALL_FUTEX || word != st->lock_block_addr)
		return 0;
	st->woken_by = tid;
	/* While the releaser is still in the statement that let it go (its COMMIT): what it ran before. */
	st->woken_at = bpf_ktime_get_ns();
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(on_exit, struct task_struct *p)
{
	(void)ctx;
	if (!task_is_target(p))
		return 0;
	struct query_thread *st = thread_state(p, false);
	if (st) {
		finish_statement(st);
		task_thread_storage_delete(&threads, p);
	}
	return 0;
}

/* Run once when tracing ends: the state of each thread of the process in a statement, for the statements
 * still in flight. */
SEC("iter/task")
int in_flight(struct bpf_iter__task *ctx)
{
	struct task_struct *task = ctx->task;
	if (!task || !task_is_target(task))
		return 0;
	struct query_thread *st = task_thread_storage(&threads, task, false, 0);
	if (st && in_statement(st) && st->period == attach_period)
		bpf_seq_write(ctx->meta->seq, st, sizeof(*st));
	return 0;
}

/* Run once, just after the tracepoints are attached: each thread that runs a statement user space read from the
 * server's memory (`started`) is put in it, as if it had been followed from the statement's start; its time is
 * followed from now on, where it is now (on a CPU, or blocked in a syscall: a futex wait is the statement's lock
 * wait, on the stack user space read). A thread seen to begin a statement since the probes were attached is left
 * as it is: the one read began since too, or was over by then (it ran, and may have ended, while the memory was
 * read). */
SEC("iter/task")
int start_statements(struct bpf_iter__task *ctx)
{
	struct task_struct *task = ctx->task;
	if (!task || !task_is_target(task))
		return 0;
	__u32 tid = BPF_CORE_READ(task, pid);
	struct started_statement *s = bpf_map_lookup_elem(&started, &tid);
	if (!s)
		return 0;
	struct query_thread *st = thread_state(task, true);
	if (!st || in_statement(st) || st->ev.start_ns)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	__builtin_memset(&st->c, 0, sizeof(st->c));
	st->phase = PHASE_RUNNING;
	st->via_dispatch = 0;
	st->socket_unknown = 1;
	st->fd = -1;
	st->statement_sk = 0;
	st->text_more = 0;
	st->lock_block_ts = 0;
	st->wait_hint = 0;
	st->ev.kind = EVENT_STATEMENT;
	st->ev.tid = tid;
	st->ev.fd = -1;
	st->ev.socket_ino = 0;
	st->ev.packet_len = 1;
	st->ev.seq = 0;
	st->ev.start_ns = s->start_ns < now ? s->start_ns : now;
	st->ev.end_ns = 0;
	st->ev.reply_len = 0;
	st->ev.result_len = 0;
	st->ev.compressed = 0;
	st->ev.inflated_len = 0;
	st->ev.text[0] = s->command;
	st->ev.text_len = 1;
	st->ev.before_tracing = 1;
	st->since = now;
	st->place = PLACE_CPU;
	st->part = PART_USER;
	if (task_state(task) != TASK_RUNNING) {
		enum syscall_class cls = SYSCALL_OTHER;
		__u64 arg0 = 0, arg1 = 0;
		enum time_part part = PART_OTHER;
		if (in_syscall(task, &cls, &arg0, &arg1))
			part = syscall_part(cls, arg1, false);
		st->place = PLACE_BLOCKED;
		st->part = part;
		st->blocked_at = now;
		st->blocked_part = part;
		st->blocked_fd = (__s32)arg0;
		if (runq_from_sched_info)
			st->runq_before = BPF_CORE_READ(task, sched_info.run_delay);
		if (part == PART_LOCK) {
			st->lock_block_ts = now;
			st->lock_block_addr = arg0;
			st->lock_block_stack = s->wait_stack;
			st->woken_by = 0;
			st->lock_before = 0;
		}
	}
	return 0;
}
