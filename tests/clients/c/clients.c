/* The C configurations of the client conformance suite (tests/clients/README.md), one source built twice:
 * against MariaDB Connector/C (libmariadb: configurations libmariadb, libmariadb-compressed) and against MySQL's
 * own C API (libmysqlclient: libmysqlclient, libmysqlclient-zstd). Each statement is listed after the library
 * said it went through, and its results are checked; anything unexpected ends the program (exit 1).
 * Usage: clients-mariadb|clients-mysql CONFIGURATION. */
#include <mysql.h>
#include <errmsg.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef LIBMARIADB
#define LIBRARY "libmariadb"
#else
#define LIBRARY "libmysqlclient"
#endif

#define BIG (17 * 1024 * 1024)
#define SHOWN 4096

static MYSQL *db;
static const char *configuration, *tag, *user, *server;
static unsigned long long connection;
static int mariadb_server, compress, zstd;
static unsigned long long affected; /* the rows of run's last statement, as its first reply said */

static void die(const char *format, ...)
{
    va_list ap;
    va_start(ap, format);
    fprintf(stderr, "clients %s: ", configuration);
    vfprintf(stderr, format, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

static const char *env(const char *name)
{
    const char *value = getenv(name);
    if (!value || !*value)
        die("%s is not set", name);
    return value;
}

/* printf into a fresh buffer. */
static char *format(const char *fmt, ...)
{
    va_list ap;
    char *out;
    va_start(ap, fmt);
    if (vasprintf(&out, fmt, ap) < 0)
        die("out of memory");
    va_end(ap);
    return out;
}

/* One statement line: its first 4,096 bytes (not ending in a cut character), escaped. */
static void sent(const char *mode, const char *command, const char *text, size_t length)
{
    size_t shown = length, i;
    if (shown > SHOWN) {
        shown = SHOWN;
        while (shown > 0 && ((unsigned char)text[shown] & 0xc0) == 0x80)
            shown--;
    }
    printf("statement\t%s\t%llu\t%s\t%s\t%zu\t", mode, connection, user, command, length);
    for (i = 0; i < shown; i++) {
        switch (text[i]) {
        case '\\': fputs("\\\\", stdout); break;
        case '\t': fputs("\\t", stdout); break;
        case '\n': fputs("\\n", stdout); break;
        case '\r': fputs("\\r", stdout); break;
        default: putchar(text[i]);
        }
    }
    putchar('\n');
    fflush(stdout);
}

static void unsupported(const char *mode, const char *reason)
{
    printf("unsupported\t%s\t%s\n", mode, reason);
    fflush(stdout);
}

/* Appends to a growing string. */
static void append(char **out, size_t *len, const char *s, size_t n)
{
    *out = realloc(*out, *len + n + 1);
    if (!*out)
        die("out of memory");
    memcpy(*out + *len, s, n);
    *len += n;
    (*out)[*len] = 0;
}

/* Runs a text statement (COM_QUERY), reads every result: their rows, columns split by tabs, rows by newlines,
 * result sets by `|`. Not listed. */
static char *run(const char *text, size_t length)
{
    char *out = NULL;
    size_t len = 0;
    int status, sets = 0;
    append(&out, &len, "", 0);
    if (mysql_real_query(db, text, length))
        die("%.200s: %s", text, mysql_error(db));
    affected = mysql_affected_rows(db);
    do {
        MYSQL_RES *res = mysql_store_result(db);
        if (res) {
            MYSQL_ROW row;
            unsigned int n = mysql_num_fields(res), i, rows = 0;
            if (sets++)
                append(&out, &len, "|", 1);
            while ((row = mysql_fetch_row(res))) {
                unsigned long *lengths = mysql_fetch_lengths(res);
                if (rows++)
                    append(&out, &len, "\n", 1);
                for (i = 0; i < n; i++) {
                    if (i)
                        append(&out, &len, "\t", 1);
                    if (row[i])
                        append(&out, &len, row[i], lengths[i]);
                    else
                        append(&out, &len, "NULL", 4);
                }
            }
            mysql_free_result(res);
        } else if (mysql_field_count(db)) {
            die("%.200s: %s", text, mysql_error(db));
        }
        status = mysql_next_result(db);
        if (status > 0)
            die("%.200s: %s", text, mysql_error(db));
    } while (status == 0);
    return out;
}

static void expect(const char *what, const char *got, const char *wanted)
{
    if (strcmp(got, wanted))
        die("%.200s gave \"%.200s\", not \"%.200s\"", what, got, wanted);
}

/* A text statement, listed; its results checked when `wanted` is given. */
static void query(const char *mode, const char *text, const char *wanted)
{
    char *got = run(text, strlen(text));
    if (wanted)
        expect(text, got, wanted);
    sent(mode, "Query", text, strlen(text));
    free(got);
}

static unsigned long long connection_id(void)
{
    char *got = run("SELECT CONNECTION_ID()", 22);
    unsigned long long id = strtoull(got, NULL, 10);
    if (!id)
        die("SELECT CONNECTION_ID() gave \"%s\"", got);
    free(got);
    return id;
}

/* A connection as the configuration makes it, or NULL (the handle's error in *error). */
static MYSQL *try_connect(const char *name, const char *password, MYSQL **error)
{
    MYSQL *m = mysql_init(NULL);
    unsigned int local_infile = 1;
    if (!m)
        die("mysql_init failed");
    if (compress && mysql_options(m, MYSQL_OPT_COMPRESS, NULL))
        die("MYSQL_OPT_COMPRESS: %s", mysql_error(m));
#ifndef LIBMARIADB
    if (zstd && mysql_options(m, MYSQL_OPT_COMPRESSION_ALGORITHMS, "zstd"))
        die("MYSQL_OPT_COMPRESSION_ALGORITHMS: %s", mysql_error(m));
#endif
    if (mysql_options(m, MYSQL_OPT_LOCAL_INFILE, &local_infile))
        die("MYSQL_OPT_LOCAL_INFILE: %s", mysql_error(m));
    *error = m;
    if (!mysql_real_connect(m, env("MYPROBE_CLIENT_HOST"), name, password, env("MYPROBE_CLIENT_DB"),
                            (unsigned int)atoi(env("MYPROBE_CLIENT_PORT")), NULL, CLIENT_MULTI_STATEMENTS))
        return NULL;
    return m;
}

static MYSQL *connect_as(const char *name, const char *password)
{
    MYSQL *error, *m = try_connect(name, password, &error);
    if (!m)
        die("connecting as %s: %s", name, mysql_error(error));
    return m;
}

/* The value of a session status variable, or "" where the server has none of that name. */
static char *status(const char *name)
{
    char *text = format("SHOW SESSION STATUS LIKE '%s'", name);
    char *got = run(text, strlen(text)), *tab = strchr(got, '\t');
    char *value = strdup(tab ? tab + 1 : "");
    free(text);
    free(got);
    return value;
}

/* The connection compresses as the configuration says. */
static void check_compression(void)
{
    if (mariadb_server) {
        char *on = status("Compression");
        const char *wanted = compress ? "ON" : "OFF";
        if (strcmp(on, wanted))
            die("the session's Compression is \"%s\", not %s", on, wanted);
        free(on);
    } else {
        char *algorithm = status("Compression_algorithm");
        const char *wanted = zstd ? "zstd" : compress ? "zlib" : "";
        if (strcmp(algorithm, wanted))
            die("the session's Compression_algorithm is \"%s\", not \"%s\"", algorithm, wanted);
        free(algorithm);
    }
}

static void text(void)
{
    int i;
    for (i = 0; i < 5; i++) {
        char *q = format("SELECT '%s-text', %d", tag, i), *want = format("%s-text\t%d", tag, i);
        query("text", q, want);
        free(q);
        free(want);
    }
    char *q = format("SELECT '%s-unicode: café, 東京, 🐬'", tag), *want = format("%s-unicode: café, 東京, 🐬", tag);
    query("text", q, want);
    free(q);
    free(want);
}

static void bind_long(MYSQL_BIND *b, long long *value)
{
    memset(b, 0, sizeof *b);
    b->buffer_type = MYSQL_TYPE_LONGLONG;
    b->buffer = value;
}

/* The text of the prepared statements of a mode: the mode in it, to tell them from other modes'. */
static char *prepared_text(const char *mode)
{
    return format("SELECT id, '%s-%s' FROM sbtest1 WHERE id = ?", tag, mode);
}

/* Reads the one row of `SELECT id, 'TAG-MODE' ...` and checks it. */
static void fetch_row(MYSQL_STMT *st, long long id, const char *mode)
{
    MYSQL_BIND out[2];
    long long got = 0;
    char word[128];
    unsigned long word_length = 0;
    int rc;
    bind_long(&out[0], &got);
    memset(&out[1], 0, sizeof out[1]);
    out[1].buffer_type = MYSQL_TYPE_STRING;
    out[1].buffer = word;
    out[1].buffer_length = sizeof word - 1;
    out[1].length = &word_length;
    if (mysql_stmt_bind_result(st, out) || mysql_stmt_store_result(st))
        die("reading a prepared statement's row: %s", mysql_stmt_error(st));
    if ((rc = mysql_stmt_fetch(st)))
        die("fetching a prepared statement's row: %d %s", rc, mysql_stmt_error(st));
    word[word_length < sizeof word ? word_length : sizeof word - 1] = 0;
    if (got != id || strncmp(word, tag, strlen(tag)) || word[strlen(tag)] != '-' ||
        strcmp(word + strlen(tag) + 1, mode))
        die("a prepared statement gave (%lld, %s), not (%lld, %s-%s)", got, word, id, tag, mode);
    if (mysql_stmt_fetch(st) != MYSQL_NO_DATA)
        die("a prepared statement gave more than its row");
    mysql_stmt_free_result(st);
}

/* One statement prepared (COM_STMT_PREPARE), executed `times` times (COM_STMT_EXECUTE), closed. */
static void prepare_and_execute(const char *mode, int times)
{
    char *q = prepared_text(mode);
    MYSQL_STMT *st = mysql_stmt_init(db);
    MYSQL_BIND in;
    long long id;
    int i;
    if (!st || mysql_stmt_prepare(st, q, strlen(q)))
        die("preparing %s: %s", q, st ? mysql_stmt_error(st) : mysql_error(db));
    sent(mode, "Prepare", q, strlen(q));
    if (mysql_stmt_param_count(st) != 1)
        die("%s: %lu parameters", q, mysql_stmt_param_count(st));
    bind_long(&in, &id);
    if (mysql_stmt_bind_param(st, &in))
        die("binding: %s", mysql_stmt_error(st));
    for (i = 0; i < times; i++) {
        id = i + 1;
        if (mysql_stmt_execute(st))
            die("executing %s: %s", q, mysql_stmt_error(st));
        fetch_row(st, id, mode);
        sent(mode, "Execute", q, strlen(q));
    }
    if (mysql_stmt_close(st))
        die("closing a statement: %s", mysql_error(db));
    free(q);
}

static void prepared(void)
{
    prepare_and_execute("prepared", 5);
}

static char *table(const char *mode, const char *prefix)
{
    char *name = format("%s_%s", prefix, tag);
    char *q = format("CREATE TABLE %s (id INT PRIMARY KEY, word VARCHAR(64))", name);
    query(mode, q, NULL);
    free(q);
    return name;
}

static void drop(const char *mode, char *name)
{
    char *q = format("DROP TABLE %s", name);
    query(mode, q, NULL);
    free(q);
    free(name);
}

static void count(const char *mode, const char *name, int rows)
{
    char *q = format("SELECT COUNT(*) FROM %s", name), *want = format("%d", rows);
    query(mode, q, want);
    free(q);
    free(want);
}

#define ROWS 50

static void batch(void)
{
#ifdef LIBMARIADB
    /* Array binding: 50 rows in one COM_STMT_BULK_EXECUTE. */
    char *name = table("batch", "batch"), *q = format("INSERT INTO %s (id, word) VALUES (?, ?)", name);
    MYSQL_STMT *st = mysql_stmt_init(db);
    MYSQL_BIND in[2];
    int ids[ROWS], i;
    char words[ROWS][8], *pointers[ROWS];
    unsigned long lengths[ROWS];
    unsigned int size = ROWS;
    if (!st || mysql_stmt_prepare(st, q, strlen(q)))
        die("preparing %s: %s", q, st ? mysql_stmt_error(st) : mysql_error(db));
    sent("batch", "Prepare", q, strlen(q));
    for (i = 0; i < ROWS; i++) {
        ids[i] = i;
        lengths[i] = (unsigned long)snprintf(words[i], sizeof words[i], "w%d", i);
        pointers[i] = words[i];
    }
    memset(in, 0, sizeof in);
    in[0].buffer_type = MYSQL_TYPE_LONG;
    in[0].buffer = ids;
    in[1].buffer_type = MYSQL_TYPE_STRING;
    in[1].buffer = pointers; /* column-wise: one pointer a row */
    in[1].length = lengths;
    if (mysql_stmt_attr_set(st, STMT_ATTR_ARRAY_SIZE, &size) || mysql_stmt_bind_param(st, in))
        die("binding an array: %s", mysql_stmt_error(st));
    if (mariadb_server) {
        if (mysql_stmt_execute(st))
            die("bulk execution of %s: %s", q, mysql_stmt_error(st));
        if (mysql_stmt_affected_rows(st) != ROWS)
            die("bulk execution of %s: %llu rows", q, (unsigned long long)mysql_stmt_affected_rows(st));
        sent("batch", "Bulk_execute", q, strlen(q));
    } else {
        /* MySQL has no COM_STMT_BULK_EXECUTE: libmariadb refuses before sending anything. */
        if (!mysql_stmt_execute(st) || mysql_stmt_errno(st) != CR_FUNCTION_NOT_SUPPORTED)
            die("bulk execution against MySQL: not refused (%u %s)", mysql_stmt_errno(st), mysql_stmt_error(st));
        unsupported("batch", "libmariadb's array binding (COM_STMT_BULK_EXECUTE) is MariaDB's only: against MySQL "
                             "mysql_stmt_execute fails (CR_FUNCTION_NOT_SUPPORTED) and sends nothing");
    }
    if (mysql_stmt_close(st))
        die("closing a statement: %s", mysql_error(db));
    count("batch", name, mariadb_server ? ROWS : 0);
    drop("batch", name);
    free(q);
#else
    unsupported("batch", "libmysqlclient has no array binding and rewrites no batch");
#endif
}

static void pipeline(void)
{
#ifdef LIBMARIADB
    if (!mariadb_server) {
        unsupported("pipeline", "mariadb_stmt_execute_direct pipelines only against MariaDB: against MySQL it "
                                "prepares, waits, then executes");
        return;
    }
    if (compress) {
        unsupported("pipeline", "mariadb_stmt_execute_direct does not pipeline on a compressed connection: it "
                                "prepares, waits, then executes");
        return;
    }
    /* COM_STMT_PREPARE and COM_STMT_EXECUTE (of statement -1, the one just prepared) in one write, then both
     * replies. */
    char *q = prepared_text("pipeline");
    int i;
    for (i = 0; i < 3; i++) {
        MYSQL_STMT *st = mysql_stmt_init(db);
        MYSQL_BIND in;
        long long id = i + 1;
        unsigned int params = 1;
        if (!st || mysql_stmt_attr_set(st, STMT_ATTR_PREBIND_PARAMS, &params))
            die("a statement for execute_direct: %s", st ? mysql_stmt_error(st) : mysql_error(db));
        bind_long(&in, &id);
        if (mysql_stmt_bind_param(st, &in))
            die("binding: %s", mysql_stmt_error(st));
        if (mariadb_stmt_execute_direct(st, q, strlen(q)))
            die("mariadb_stmt_execute_direct %s: %s", q, mysql_stmt_error(st));
        fetch_row(st, id, "pipeline");
        sent("pipeline", "Prepare", q, strlen(q));
        sent("pipeline", "Execute", q, strlen(q));
        if (mysql_stmt_close(st))
            die("closing a statement: %s", mysql_error(db));
    }
    free(q);
#else
    unsupported("pipeline", "libmysqlclient waits for each reply (its nonblocking functions too)");
#endif
}

static void multi(void)
{
    char *q = format("SELECT '%s-multi', 1; SELECT '%s-multi', 2", tag, tag);
    char *want = format("%s-multi\t1|%s-multi\t2", tag, tag);
    query("multi", q, want);
    free(q);
    free(want);
}

static void call(void)
{
    char *create = format("CREATE PROCEDURE p_%s() BEGIN SELECT 1 AS first; SELECT 2 AS second; END", tag);
    char *q = format("CALL p_%s()", tag), *dropped = format("DROP PROCEDURE p_%s", tag);
    query("call", create, NULL);
    query("call", q, "1|2"); /* two result sets, then the CALL's own status */
    query("call", dropped, NULL);
    free(create);
    free(q);
    free(dropped);
}

static void reset(void)
{
    prepare_and_execute("reset", 2);
    if (mysql_reset_connection(db))
        die("mysql_reset_connection: %s", mysql_error(db));
    if (connection_id() != connection)
        die("another connection after mysql_reset_connection");
    /* The server forgot the statements: prepared again, numbered anew. */
    prepare_and_execute("reset", 2);
}

static void change_to(const char *name, const char *password)
{
    if (mysql_change_user(db, name, password, env("MYPROBE_CLIENT_DB")))
        die("mysql_change_user to %s: %s", name, mysql_error(db));
    user = name;
    if (connection_id() != connection)
        die("another connection after mysql_change_user");
}

static void change_user(void)
{
    int i;
    change_to(env("MYPROBE_CLIENT_USER2"), env("MYPROBE_CLIENT_PASSWORD2"));
    for (i = 0; i < 3; i++) {
        char *q = format("SELECT '%s-changed', %d, CURRENT_USER()", tag, i);
        char *got = run(q, strlen(q)), *want = format("%s-changed\t%d\t%s@", tag, i, user);
        if (strncmp(got, want, strlen(want)))
            die("%s gave \"%s\"", q, got);
        sent("change_user", "Query", q, strlen(q));
        free(q);
        free(got);
        free(want);
    }
    prepare_and_execute("change_user", 2);
    /* Back, for the modes after this one. */
    change_to(env("MYPROBE_CLIENT_USER"), env("MYPROBE_CLIENT_PASSWORD"));
}

static void load_local(void)
{
    const char *file = env("MYPROBE_CLIENT_INFILE");
    char *name = table("load_local", "load"), *q;
    if (strpbrk(file, "'\\"))
        die("MYPROBE_CLIENT_INFILE has a quote or a backslash: %s", file);
    q = format("LOAD DATA LOCAL INFILE '%s' INTO TABLE %s", file, name);
    free(run(q, strlen(q)));
    if (affected != 10)
        die("%s: %llu rows", q, affected);
    sent("load_local", "Query", q, strlen(q));
    free(q);
    count("load_local", name, 10);
    drop("load_local", name);
}

static void big(void)
{
    char *head = format("SELECT '%s-big', LENGTH('", tag), *q, *want = format("%s-big\t%d", tag, BIG), *got;
    size_t n = strlen(head), length = n + BIG + 2;
    q = malloc(length + 1);
    if (!q)
        die("out of memory");
    memcpy(q, head, n);
    memset(q + n, 'x', BIG);
    memcpy(q + n + BIG, "')", 3);
    got = run(q, length);
    expect("the big statement", got, want);
    sent("big", "Query", q, length);
    free(head);
    free(q);
    free(want);
    free(got);
}

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        void (*run)(void);
    } modes[] = {{"text", text},   {"prepared", prepared}, {"batch", batch},           {"pipeline", pipeline},
                 {"multi", multi}, {"call", call},         {"reset", reset},           {"change_user", change_user},
                 {"load_local", load_local},               {"big", big}};
    size_t i;
    configuration = argc == 2 ? argv[1] : "?";
#ifdef LIBMARIADB
    if (!strcmp(configuration, "libmariadb-compressed"))
        compress = 1;
    else if (strcmp(configuration, "libmariadb"))
        die("usage: %s libmariadb|libmariadb-compressed", argv[0]);
#else
    if (!strcmp(configuration, "libmysqlclient-zstd"))
        zstd = 1;
    else if (strcmp(configuration, "libmysqlclient"))
        die("usage: %s libmysqlclient|libmysqlclient-zstd", argv[0]);
#endif
    tag = env("MYPROBE_CLIENT_TAG");
    server = env("MYPROBE_CLIENT_SERVER");
    if (strcmp(server, "mariadb") && strcmp(server, "mysql"))
        die("MYPROBE_CLIENT_SERVER is %s, not mariadb or mysql", server);
    mariadb_server = !strcmp(server, "mariadb");
    if (mysql_library_init(0, NULL, NULL))
        die("mysql_library_init failed");
    user = env("MYPROBE_CLIENT_USER");
#ifndef LIBMARIADB
    if (zstd && mariadb_server) {
        /* MariaDB offers zlib only: asked for zstd alone, libmysqlclient does not connect. */
        MYSQL *error;
        if (try_connect(user, env("MYPROBE_CLIENT_PASSWORD"), &error) ||
            mysql_errno(error) != CR_COMPRESSION_WRONGLY_CONFIGURED)
            die("connecting with zstd to MariaDB: not refused (%u %s)", mysql_errno(error), mysql_error(error));
        for (i = 0; i < sizeof modes / sizeof modes[0]; i++)
            unsupported(modes[i].name, "MariaDB offers no zstd compression: libmysqlclient does not connect "
                                       "(CR_COMPRESSION_WRONGLY_CONFIGURED)");
        return 0;
    }
#endif
    db = connect_as(user, env("MYPROBE_CLIENT_PASSWORD"));
    connection = connection_id();
    fprintf(stderr, "clients %s: %s %s, server %s, connection %llu, character set %s, %s\n", configuration, LIBRARY,
            mysql_get_client_info(), mysql_get_server_info(db), connection, mysql_character_set_name(db),
            mysql_get_ssl_cipher(db) ? mysql_get_ssl_cipher(db) : "no TLS");
    if ((strstr(mysql_get_server_info(db), "MariaDB") != NULL) != mariadb_server)
        die("the server is %s, but MYPROBE_CLIENT_SERVER says %s", mysql_get_server_info(db), server);
    check_compression();
    for (i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        fprintf(stderr, "%s\n", modes[i].name);
        modes[i].run();
    }
    mysql_close(db);
    mysql_library_end();
    return 0;
}
