/* What src/bpf/queries.bpf.c sends to user space (src/collect/queries.rs). */
#pragma once

#include "vmlinux.h"

#define MAX_SYSCALL_NR 512
/* query_event.compressed: the request kept is a packet's body, its header sent alone in the compressed packet before */
#define COMPRESSED_BODY 2
#define MAX_TEXT 1024         /* request bytes kept per statement: the SQL text, truncated (power of 2) */
_Static_assert(!(MAX_TEXT & (MAX_TEXT - 1)), "text lengths are masked with MAX_TEXT - 1");
#define MAX_PACKET_TEXT 512   /* bytes kept of a handshake packet */
#define REPLY_HEAD 32         /* bytes kept of the first reply send: header, OK/ERR/PREPARE_OK fields (power of 2) */
#define RESULT_HEAD 256       /* bytes kept of an execution's first reply send, after its request in text[]: the
			       * result set's column definitions, which name a statement prepared before tracing */
_Static_assert(RESULT_HEAD < MAX_TEXT, "an execution's reply is kept after its request");

/* How a syscall is accounted; user space fills syscall_class[] with these. */
enum syscall_class : __u8 {
	SYSCALL_OTHER = 0,
	SYSCALL_NET_RECV,   /* recvfrom, recvmsg: requests come in here */
	SYSCALL_NET_SEND,   /* sendto, sendmsg: replies go out here */
	SYSCALL_NET_POLL,   /* poll, ppoll: waiting for the client */
	SYSCALL_READ,       /* read, pread64, readv, preadv, preadv2 */
	SYSCALL_WRITE,      /* write, pwrite64, writev, pwritev, pwritev2 */
	SYSCALL_SYNC,       /* fsync, fdatasync, sync_file_range */
	SYSCALL_FUTEX,
	SYSCALL_NET_RECVMSG, /* recvmsg: as NET_RECV, the data in the first iovec of a struct msghdr */
	SYSCALL_NET_SENDMSG, /* sendmsg: as NET_SEND, likewise */
	SYSCALL_CLOSE,       /* close: the connection of a statement may end before its reply (KILL, a client gone) */
};

/* How the uprobe on dispatch_command finds the command and its text. */
enum dispatch_abi : __u32 {
	DISPATCH_MARIADB = 0,  /* dispatch_command(enum_server_command, THD *, char *packet, uint length, bool) */
	DISPATCH_MYSQL = 1,    /* dispatch_command(THD *, const COM_DATA *, enum_server_command) */
};

enum query_event_kind : __u32 {
	EVENT_STATEMENT = 1,
	EVENT_PACKET_IN = 2,   /* a client packet outside a statement (handshake response) */
	EVENT_PACKET_OUT = 3,  /* a server send outside a statement (greeting, authentication) */
	EVENT_EXECUTED = 4,    /* a prepared statement's execution began: its text, from the server's statement object */
};

/* Where a statement's time goes, each nanosecond in exactly one part (the response-time profile of Method R).
 * A syscall's time blocked is its class's; on a CPU, its class's with syscall_cpu, else PART_USER's; waiting for
 * a CPU is always PART_RUNQ. */
enum time_part : __u8 {
	PART_USER = 0,  /* on CPU (its page faults and interrupts included; its syscalls too without syscall_cpu) */
	PART_SYS,       /* syscall_cpu: on CPU in syscalls of no class below (futex wakes, mmap, ...) */
	PART_RUNQ,      /* runnable, waiting for a CPU */
	PART_LOCK,      /* in futex waits */
	PART_READ,      /* in read syscalls */
	PART_WRITE,     /* in write syscalls */
	PART_SYNC,      /* in fsync, fdatasync, sync_file_range */
	PART_NET,       /* in socket reads, sends and polls */
	PART_OTHER,     /* blocked elsewhere: other syscalls, page faults */
	PARTS,
};

/* The parts of blocked I/O, from PART_READ: read, write, sync. */
#define IO_PARTS 3

/* A statement's futex waits at one stack: the time they took from the lock part. */
#define WAIT_SLOTS 4
struct wait_slot {
	__u64 stack;    /* its id (stack_ids.h), 0: a free slot */
	__u64 ns;
	__u32 hint;     /* the type its thread's last ambiguous thd_wait_begin call announced (0: none) */
	__u32 waits;
	__u32 waker;    /* the server's thread that woke its last wait (0: none seen): a lock's releaser */
	__u32 waker_unused;
	__u64 woken_ns; /* when it was woken (CLOCK_MONOTONIC) */
};

struct query_counters {
	__u64 part_ns[PARTS];
	/* The lock part by stack, for the first WAIT_SLOTS stacks a statement waits at (the rest: the part's
	 * remainder). */
	struct wait_slot waits[WAIT_SLOTS];
	__u64 lock_max_ns;    /* the longest futex wait, */
	__u64 lock_addr;      /* its futex word */
	__u64 lock_stack;     /* and the id of its stack (stack_ids.h), 0 if none */
	__u64 read_bytes;
	__u64 write_bytes;
	__u64 net_bytes;
	/* 64 bits: one statement can last for days (a binlog dump, a replica's connection). */
	__u64 lock_waits;
	__u64 syncs;
	__u64 syscalls;
	/* Each I/O part's (read, write, sync) longest blocked syscall: its time and descriptor, for user space to name
	 * its file (the descriptor is valid where the time is not 0). */
	__u64 io_max_ns[IO_PARTS];
	__s32 io_fd[IO_PARTS];
	/* What the server's status counters Created_tmp_disk_tables and Sort_merge_passes count, for this statement
	 * (on_tmp_disk_table, on_sort_merge_pass). */
	__u32 tmp_disk_tables;
	__u32 sort_merge_passes;
	__u32 spills_unused;
};

/* Shares the ring buffer with the definitions of stacks (stack_event.h), whose first word, half a stack id, is
 * never 0: this one's is. */
struct query_event {
	__u32 not_a_stack;
	enum query_event_kind kind;
	__u32 tid;
	__s32 fd;
	__u32 packet_len;     /* request payload length from its header (the text may be truncated) */
	__u64 start_ns;       /* CLOCK_MONOTONIC */
	__u64 end_ns;
	__u64 socket_ino;     /* the inode of its socket, when known (0: not known): a descriptor's number is reused */
	struct query_counters c;
	__u32 inflated_len;       /* a compressed request deflated: its length inflated (text[] holds the deflated bytes) */
	__u16 text_len;
	__u8 reply_len;
	__u8 seq;
	__u16 result_len;         /* an execution's reply kept in text[] after the request (reply_len is 0 then) */
	__u8 compressed;          /* the connection uses the compressed protocol: the reply kept is its framing;
				   * COMPRESSED_BODY: the request kept is a packet's body, its header sent alone before */
	__u8 before_tracing;      /* it ran when tracing began (seeded by start_statements): its text is user space's */
	__u8 reply[REPLY_HEAD];   /* first bytes of the reply, header included */
	__u8 text[MAX_TEXT];      /* request payload: command byte, then its arguments */
};

/* Sent by the uprobe on the server's Prepared_statement::execute while the execution of a statement prepared
 * before tracing is awaited (src/query/executed.rs). Until user space knows where the object keeps its text
 * (statement_text_offset), the object's address instead, for user space to find it there on statements of its
 * own. */
struct executed_event {
	__u32 not_a_stack;
	enum query_event_kind kind;   /* EVENT_EXECUTED */
	__u32 tid;
	__u32 statement_id;           /* from the COM_STMT_EXECUTE the thread runs */
	__u64 object;                 /* the Prepared_statement (`this`) */
	__u64 full_len;               /* the text's length as the object gives it (text_len is at most MAX_TEXT) */
	__u32 text_len;               /* 0 while the offset is unknown */
	__u8 text[MAX_TEXT];
};

/* A statement the server ran when tracing began, read from its memory by user space (src/query/started.rs), by
 * its thread's id: followed from then on as if traced from its start. */
struct started_statement {
	__u64 start_ns;     /* its real start, CLOCK_MONOTONIC */
	__u64 wait_stack;   /* the id of the stack its thread waited on when read (0: none), for a futex wait */
	__u8 command;       /* COM_QUERY, COM_STMT_EXECUTE, ... */
};

#define EXECUTED_EVENT_HEADER_BYTES ((unsigned long)&((struct executed_event *)0)->text)

#define QUERY_EVENT_HEADER_BYTES ((unsigned long)&((struct query_event *)0)->text)
