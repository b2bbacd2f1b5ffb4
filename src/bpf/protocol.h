/* The client/server protocol's numbers that the statements' programs and user space (src/wire/protocol.rs) both
 * read: enums rather than #defines, so that they are in BTF, from which build.rs generates `wire::abi` (this header
 * compiled alone). Rust writes none of them again. */
#pragma once

#include "vmlinux.h"

/* Command bytes: the first payload byte of a client request. */
enum mysql_command : __u8 {
	COM_SLEEP = 0x00,
	COM_QUIT = 0x01,
	COM_INIT_DB = 0x02,
	COM_QUERY = 0x03,
	COM_FIELD_LIST = 0x04,
	COM_CREATE_DB = 0x05,
	COM_DROP_DB = 0x06,
	COM_REFRESH = 0x07,
	COM_SHUTDOWN = 0x08,
	COM_STATISTICS = 0x09,
	COM_PROCESS_INFO = 0x0a,
	COM_CONNECT = 0x0b,
	COM_PROCESS_KILL = 0x0c,
	COM_DEBUG = 0x0d,
	COM_PING = 0x0e,
	COM_TIME = 0x0f,
	COM_DELAYED_INSERT = 0x10,
	COM_CHANGE_USER = 0x11,
	COM_BINLOG_DUMP = 0x12,
	COM_TABLE_DUMP = 0x13,
	COM_CONNECT_OUT = 0x14,
	COM_REGISTER_SLAVE = 0x15,
	COM_STMT_PREPARE = 0x16,
	COM_STMT_EXECUTE = 0x17,
	COM_STMT_SEND_LONG_DATA = 0x18,
	COM_STMT_CLOSE = 0x19,
	COM_STMT_RESET = 0x1a,
	COM_SET_OPTION = 0x1b,
	COM_STMT_FETCH = 0x1c,
	COM_DAEMON = 0x1d,
	COM_BINLOG_DUMP_GTID = 0x1e,
	COM_RESET_CONNECTION = 0x1f,
	/* MySQL 8. */
	COM_CLONE = 0x20,
	/* MariaDB: array binding of a prepared statement (statement id follows, like COM_STMT_EXECUTE). */
	COM_STMT_BULK_EXECUTE = 0xfa,
	/* MariaDB (10.2 - 10.5): several commands in one packet. */
	COM_MULTI = 0xfe,
};

/* Capability flags (greeting and handshake response). */
enum client_capability : __u32 {
	CLIENT_LONG_PASSWORD = 0x00000001,
	CLIENT_FOUND_ROWS = 0x00000002,
	CLIENT_LONG_FLAG = 0x00000004,
	CLIENT_CONNECT_WITH_DB = 0x00000008,
	CLIENT_NO_SCHEMA = 0x00000010,
	CLIENT_COMPRESS = 0x00000020,
	CLIENT_LOCAL_FILES = 0x00000080,
	CLIENT_IGNORE_SPACE = 0x00000100,
	CLIENT_PROTOCOL_41 = 0x00000200,
	CLIENT_INTERACTIVE = 0x00000400,
	CLIENT_SSL = 0x00000800,
	CLIENT_TRANSACTIONS = 0x00002000,
	CLIENT_SECURE_CONNECTION = 0x00008000,
	CLIENT_MULTI_STATEMENTS = 0x00010000,
	CLIENT_MULTI_RESULTS = 0x00020000,
	CLIENT_PS_MULTI_RESULTS = 0x00040000,
	CLIENT_PLUGIN_AUTH = 0x00080000,
	CLIENT_CONNECT_ATTRS = 0x00100000,
	CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA = 0x00200000,
	CLIENT_SESSION_TRACK = 0x00800000,
	CLIENT_DEPRECATE_EOF = 0x01000000,
	/* MySQL's compressed protocol with zstd instead of zlib. */
	CLIENT_ZSTD_COMPRESSION_ALGORITHM = 0x04000000,
	/* MySQL 8.0.23 on: COM_QUERY and COM_STMT_EXECUTE carry named parameters (query attributes) before the
	 * statement (MariaDB has no such bit). */
	CLIENT_QUERY_ATTRIBUTES = 0x08000000,
};
