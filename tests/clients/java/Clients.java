// The Java configurations of the client conformance suite (../README.md): MariaDB Connector/J 3.5 and MySQL
// Connector/J 9.5 (pom.xml), each with its defaults and with server-side prepared statements and compression.
// Usage: Clients CONFIGURATION | --list. Prints what it sent on stdout; progress and errors on stderr.
//
// Every statement line is printed after the library returned it without error, its results checked. Besides the
// results, each mode checks the server's own count of the prepares and executions of the session
// (Com_stmt_prepare, Com_stmt_execute: a bulk execution counts as one) against the Prepare, Execute and
// Bulk_execute lines printed, so that a statement the library prepared or executed more or fewer times than said
// makes the run fail. At the start, the session's Compression status must match the configuration (its TLS
// cipher, if any, goes to stderr). Tables and procedures are named after MYPROBE_CLIENT_TAG.

import java.io.FileOutputStream;
import java.io.FileDescriptor;
import java.io.PrintStream;
import java.nio.ByteBuffer;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Properties;

public final class Clients {
    static final List<String> CONFIGURATIONS = List.of("mariadb", "mariadb-server-prepared", "mariadb-compressed",
            "mysql", "mysql-server-prepared", "mysql-compressed");
    static final List<String> MODES = List.of("text", "prepared", "batch", "pipeline", "multi", "call", "reset",
            "change_user", "load_local", "big");
    static final String TAG = env("MYPROBE_CLIENT_TAG");
    static final int BIG = 17 * 1024 * 1024;
    static final int BATCH = 50;
    static final int PIPELINE = 10;
    static final PrintStream OUT = new PrintStream(new FileOutputStream(FileDescriptor.out), true, StandardCharsets.UTF_8);
    static final PrintStream ERR = new PrintStream(new FileOutputStream(FileDescriptor.err), true, StandardCharsets.UTF_8);

    static String env(String name) {
        String value = System.getenv(name);
        return value == null ? "" : value;
    }

    static void check(boolean holds, String what) {
        if (!holds) throw new IllegalStateException(what);
    }

    static String esc(String text) {
        return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r");
    }

    /** Rows as strings, for comparing with what a statement must return. */
    static List<List<String>> rows(ResultSet rs) throws SQLException {
        List<List<String>> rows = new ArrayList<>();
        int columns = rs.getMetaData().getColumnCount();
        while (rs.next()) {
            List<String> row = new ArrayList<>();
            for (int i = 1; i <= columns; i++) row.add(rs.getString(i));
            rows.add(row);
        }
        rs.close();
        return rows;
    }

    static List<List<String>> expect(Object... row) {
        List<String> r = new ArrayList<>();
        for (Object o : row) r.add(String.valueOf(o));
        return List.of(r);
    }

    /** A client-side prepared statement's text as the library sends it: each ? replaced by its value, an int as
     *  its digits, a string (plain ASCII letters and digits here) in single quotes. */
    static String interpolate(String sql, Object... values) {
        StringBuilder out = new StringBuilder();
        int v = 0;
        for (char c : sql.toCharArray()) {
            if (c != '?') {
                out.append(c);
                continue;
            }
            Object value = values[v++];
            if (value instanceof String) {
                check(((String) value).matches("[A-Za-z0-9_-]*"), "a value this program cannot quote: " + value);
                out.append('\'').append(value).append('\'');
            } else {
                out.append(value);
            }
        }
        check(v == values.length, "values left over for " + sql);
        return out.toString();
    }

    static void bind(PreparedStatement ps, Object... values) throws SQLException {
        for (int i = 0; i < values.length; i++) {
            if (values[i] instanceof String) ps.setString(i + 1, (String) values[i]);
            else ps.setInt(i + 1, (Integer) values[i]);
        }
    }

    /** One configuration: a library, its settings, its connection, what it prints. */
    abstract static class Client {
        final String name;
        final boolean serverPrepared;
        final boolean compressed;
        final boolean onMariaDB = env("MYPROBE_CLIENT_SERVER").equals("mariadb");
        Connection conn;
        long id;
        String user;
        // The session's Com_stmt_prepare and Com_stmt_execute when the current segment began, and the Prepare and
        // Execute (or Bulk_execute) lines printed since.
        long[] base;
        int prepares, executes;

        Client(String name, boolean serverPrepared, boolean compressed) {
            this.name = name;
            this.serverPrepared = serverPrepared;
            this.compressed = compressed;
        }

        abstract Connection connect(String user, String password) throws SQLException;

        void open() throws SQLException {
            user = env("MYPROBE_CLIENT_USER");
            conn = connect(user, env("MYPROBE_CLIENT_PASSWORD"));
            id = connectionId();
            // The transport, as the server sees it: compressed where the configuration says so; TLS or not.
            try (Statement st = conn.createStatement()) {
                List<List<String>> got = rows(st.executeQuery(
                        "SHOW SESSION STATUS WHERE Variable_name IN ('Compression', 'Ssl_cipher')"));
                String compression = "", cipher = "";
                for (List<String> row : got) {
                    if (row.get(0).equalsIgnoreCase("Compression")) compression = row.get(1);
                    else cipher = row.get(1) == null ? "" : row.get(1);
                }
                check(compression.equals(compressed ? "ON" : "OFF"), name + ": Compression is " + compression);
                ERR.println(name + ": connection " + id + ", " + (compressed ? "compressed, " : "")
                        + (cipher.isEmpty() ? "no TLS" : "TLS (" + cipher + ")"));
            }
        }

        long connectionId() throws SQLException {
            try (Statement st = conn.createStatement()) {
                return Long.parseLong(rows(st.executeQuery("SELECT CONNECTION_ID()")).get(0).get(0));
            }
        }

        void sent(String mode, String command, String text) {
            byte[] data = text.getBytes(StandardCharsets.UTF_8);
            String shown = text;
            if (data.length > 4096) {
                try {
                    shown = StandardCharsets.UTF_8.newDecoder().onMalformedInput(CodingErrorAction.IGNORE)
                            .decode(ByteBuffer.wrap(data, 0, 4096)).toString();
                } catch (java.nio.charset.CharacterCodingException e) {
                    throw new IllegalStateException(e);
                }
            }
            if (command.equals("Prepare")) prepares++;
            if (command.equals("Execute") || command.equals("Bulk_execute")) executes++;
            OUT.println("statement\t" + mode + "\t" + id + "\t" + user + "\t" + command + "\t" + data.length + "\t"
                    + esc(shown));
        }

        void unsupported(String mode, String reason) {
            OUT.println("unsupported\t" + mode + "\t" + reason);
        }

        long[] counters() throws SQLException {
            long[] c = new long[2];
            try (Statement st = conn.createStatement()) {
                for (List<String> row : rows(st.executeQuery(
                        "SHOW SESSION STATUS WHERE Variable_name IN ('Com_stmt_prepare', 'Com_stmt_execute')"))) {
                    c[row.get(0).equalsIgnoreCase("Com_stmt_prepare") ? 0 : 1] = Long.parseLong(row.get(1));
                }
            }
            return c;
        }

        /** A segment of statements whose prepares and executions are counted from here. */
        void begin() throws SQLException {
            base = counters();
            prepares = 0;
            executes = 0;
        }

        /** The server counted as many prepares and executions as the lines printed since begin(). */
        void verify(String mode) throws SQLException {
            long[] now = counters();
            long p = now[0] - base[0], e = now[1] - base[1];
            check(p == prepares && e == executes, name + " " + mode + ": the server counted " + p + " prepares and "
                    + e + " executions, the lines printed say " + prepares + " and " + executes);
        }

        /** A text statement (COM_QUERY), its results read whole and returned: listed. */
        List<List<String>> query(String mode, String text) throws SQLException {
            List<List<String>> rows = new ArrayList<>();
            try (Statement st = conn.createStatement()) {
                if (st.execute(text)) rows = rows(st.getResultSet());
                while (st.getMoreResults() || st.getUpdateCount() != -1) {
                    // nothing more is expected, but read it all
                    ResultSet rs = st.getResultSet();
                    if (rs != null) rs.close();
                }
            }
            sent(mode, "Query", text);
            return rows;
        }

        /** Every result set of one text statement. */
        List<List<List<String>>> resultSets(String text) throws SQLException {
            List<List<List<String>>> sets = new ArrayList<>();
            try (Statement st = conn.createStatement()) {
                boolean isSet = st.execute(text);
                while (true) {
                    if (isSet) sets.add(rows(st.getResultSet()));
                    else if (st.getUpdateCount() == -1) break;
                    isSet = st.getMoreResults();
                }
            }
            return sets;
        }

        /** Sets (set) or reads a user variable of the session: gone after COM_RESET_CONNECTION. */
        boolean marked(boolean set) throws SQLException {
            try (Statement st = conn.createStatement()) {
                if (set) st.execute("SET @myprobe_mark = 1");
                return rows(st.executeQuery("SELECT @myprobe_mark")).equals(expect(1));
            }
        }

        void table(String mode, String table) throws SQLException {
            query(mode, "CREATE TABLE " + table + " (id INT PRIMARY KEY, word VARCHAR(64))");
        }

        void count(String mode, String table, int rows) throws SQLException {
            List<List<String>> got = query(mode, "SELECT COUNT(*) FROM " + table);
            check(got.equals(expect(rows)), mode + ": " + table + " holds " + got + " rows, not " + rows);
        }

        // --- modes ---

        void text() throws SQLException {
            for (int i = 0; i < 5; i++) {
                List<List<String>> got = query("text", "SELECT '" + TAG + "-text', " + i);
                check(got.equals(expect(TAG + "-text", i)), "text: " + got);
            }
            String unicode = TAG + "-unicode: caf\u00e9, \u6771\u4eac, \ud83d\udc2c";
            List<List<String>> got = query("text", "SELECT '" + unicode + "'");
            check(got.equals(expect(unicode)), "text: " + got);
        }

        /** A statement prepared on the server as this configuration prepares it, its Prepare line printed (the
         *  server-side configurations only). */
        abstract PreparedStatement serverPrepare(String mode, String sql) throws SQLException;

        /** SELECT … WHERE id = ? prepared once and executed `times` times: server-side, a Prepare and the
         *  executions; client-side (the library's default), text statements with the values in them. */
        void prepareAndExecute(String mode, int times) throws SQLException {
            String sql = "SELECT id, '" + TAG + "-" + mode + "' FROM sbtest1 WHERE id = ?";
            PreparedStatement ps = serverPrepared ? serverPrepare(mode, sql) : conn.prepareStatement(sql);
            for (int i = 1; i <= times; i++) {
                ps.setInt(1, i);
                List<List<String>> got = rows(ps.executeQuery());
                check(got.equals(expect(i, TAG + "-" + mode)), mode + ": " + got);
                if (serverPrepared) sent(mode, "Execute", sql);
                else sent(mode, "Query", interpolate(sql, i));
            }
            ps.close();
        }

        void prepared() throws SQLException {
            prepareAndExecute("prepared", 5);
        }

        /** What this configuration sends for a batch of INSERTs over BATCH rows, as lines. */
        abstract void batchSent(String sql, List<Object[]> rows) throws SQLException;

        void batch() throws SQLException {
            String table = "batch_" + TAG;
            table("batch", table);
            String sql = "INSERT INTO " + table + " (id, word) VALUES (?, ?)";
            List<Object[]> rows = new ArrayList<>();
            for (int i = 0; i < BATCH; i++) rows.add(new Object[] {i, "w" + i});
            try (PreparedStatement ps = conn.prepareStatement(sql)) {
                if (serverPrepared) checkServerPrepared(ps);
                for (Object[] row : rows) {
                    bind(ps, row);
                    ps.addBatch();
                }
                int[] counts = ps.executeBatch();
                check(counts.length == BATCH, "batch: " + counts.length + " update counts");
                batchSent(sql, rows);
            }
            count("batch", table, BATCH);
            query("batch", "DROP TABLE " + table);
        }

        abstract void checkServerPrepared(PreparedStatement ps) throws SQLException;

        abstract void pipeline() throws SQLException;

        void multi() throws SQLException {
            String text = "SELECT '" + TAG + "-multi', 1; SELECT '" + TAG + "-multi', 2";
            List<List<List<String>>> sets = resultSets(text);
            check(sets.equals(List.of(expect(TAG + "-multi", 1), expect(TAG + "-multi", 2))), "multi: " + sets);
            sent("multi", "Query", text);
        }

        void call() throws SQLException {
            String procedure = "p_" + TAG;
            query("call", "CREATE PROCEDURE " + procedure + "() BEGIN SELECT 1 AS first; SELECT 2 AS second; END");
            String text = "CALL " + procedure + "()";
            List<List<List<String>>> sets = resultSets(text);
            check(sets.equals(List.of(expect(1), expect(2))), "call: " + sets);
            sent("call", "Query", text);
            query("call", "DROP PROCEDURE " + procedure);
        }

        abstract void reset() throws SQLException;

        abstract void changeUser() throws SQLException;

        void loadLocal() throws SQLException {
            String table = "load_" + TAG;
            String infile = env("MYPROBE_CLIENT_INFILE");
            check(!infile.isEmpty() && !infile.contains("'") && !infile.contains("\\"),
                    "load_local: MYPROBE_CLIENT_INFILE is empty or needs quoting: " + infile);
            table("load_local", table);
            query("load_local", "LOAD DATA LOCAL INFILE '" + infile + "' INTO TABLE " + table);
            count("load_local", table, 10);
            query("load_local", "DROP TABLE " + table);
        }

        void big() throws SQLException {
            String text = "SELECT '" + TAG + "-big', LENGTH('" + "x".repeat(BIG) + "')";
            List<List<String>> got = query("big", text);
            check(got.equals(expect(TAG + "-big", BIG)), "big: " + got);
        }

        void run() throws Exception {
            open();
            for (String mode : MODES) {
                ERR.println(name + ": " + mode);
                begin();
                switch (mode) {
                    case "text": text(); break;
                    case "prepared": prepared(); break;
                    case "batch": batch(); break;
                    case "pipeline": pipeline(); break;
                    case "multi": multi(); break;
                    case "call": call(); break;
                    case "reset": reset(); break;
                    case "change_user": changeUser(); break;
                    case "load_local": loadLocal(); break;
                    case "big": big(); break;
                    default: throw new IllegalStateException(mode);
                }
                verify(mode);
            }
            conn.close();
        }
    }

    /** MariaDB Connector/J 3.5: client-side prepared statements by default (useServerPrepStmts=false). */
    static final class MariaDB extends Client {
        MariaDB(String name, boolean serverPrepared, boolean compressed) {
            super(name, serverPrepared, compressed);
        }

        @Override
        Connection connect(String user, String password) throws SQLException {
            Properties p = new Properties();
            p.setProperty("user", user);
            p.setProperty("password", password);
            // What the modes need: several statements in one COM_QUERY, LOAD DATA LOCAL (allowed by default),
            // COM_RESET_CONNECTION from Connection#reset() (off by default: reset() then only resets the driver's
            // state), and on MySQL caching_sha2_password without TLS (no TLS by default: sslMode=disable).
            p.setProperty("allowMultiQueries", "true");
            p.setProperty("allowLocalInfile", "true");
            p.setProperty("useResetConnection", "true");
            p.setProperty("allowPublicKeyRetrieval", "true");
            if (serverPrepared) p.setProperty("useServerPrepStmts", "true");
            if (compressed) p.setProperty("useCompression", "true");
            String url = "jdbc:mariadb://" + env("MYPROBE_CLIENT_HOST") + ":" + env("MYPROBE_CLIENT_PORT") + "/"
                    + env("MYPROBE_CLIENT_DB");
            Connection c = new org.mariadb.jdbc.Driver().connect(url, p);
            check(c != null, "the MariaDB driver refused " + url);
            return c;
        }

        @Override
        void checkServerPrepared(PreparedStatement ps) {
            check(ps instanceof org.mariadb.jdbc.ServerPreparedStatement, "not a server-side prepared statement: "
                    + ps.getClass().getName());
        }

        /** Connector/J 3.x prepares when a statement is first executed, in the same exchange as that execution
         *  on MariaDB (the pipeline mode); getParameterMetaData() prepares it alone, beforehand. */
        @Override
        PreparedStatement serverPrepare(String mode, String sql) throws SQLException {
            PreparedStatement ps = conn.prepareStatement(sql);
            checkServerPrepared(ps);
            ps.getParameterMetaData();
            sent(mode, "Prepare", sql);
            return ps;
        }

        @Override
        void batchSent(String sql, List<Object[]> rows) {
            if (onMariaDB) {
                // An INSERT batch is sent as COM_STMT_PREPARE and one COM_STMT_BULK_EXECUTE (naming the statement as
                // -1) in one exchange, by client-side prepared statements too (useBulkStmtsForInserts is on by
                // default; useBulkStmts, off, is for the other statements).
                sent("batch", "Prepare", sql);
                sent("batch", "Bulk_execute", sql);
            } else if (serverPrepared) {
                // MySQL has no bulk execution: a COM_STMT_PREPARE, its reply read, then a COM_STMT_EXECUTE per row,
                // all sent before their replies are read.
                sent("batch", "Prepare", sql);
                for (int i = 0; i < rows.size(); i++) sent("batch", "Execute", sql);
            } else {
                // MySQL has no bulk execution: a COM_QUERY per row, all sent before their replies are read.
                for (Object[] row : rows) sent("batch", "Query", interpolate(sql, row));
            }
        }

        @Override
        void pipeline() throws SQLException {
            if (serverPrepared && onMariaDB) {
                // A statement's first execution: COM_STMT_PREPARE and COM_STMT_EXECUTE in one exchange, the
                // execution naming the statement as -1, the last prepared (on MariaDB only: on MySQL the driver
                // prepares, reads the reply, then executes).
                String sql = "SELECT id, '" + TAG + "-pipeline' FROM sbtest1 WHERE id = ?";
                try (PreparedStatement ps = conn.prepareStatement(sql)) {
                    checkServerPrepared(ps);
                    ps.setInt(1, 7);
                    List<List<String>> got = rows(ps.executeQuery());
                    check(got.equals(expect(7, TAG + "-pipeline")), "pipeline: " + got);
                    sent("pipeline", "Prepare", sql);
                    sent("pipeline", "Execute", sql);
                }
            }
            // A batch that is not an INSERT (no bulk execution then): client-side, a COM_QUERY per row, all sent
            // before the replies are read; server-side, COM_STMT_PREPARE and a COM_STMT_EXECUTE per row in one
            // exchange on MariaDB (each execution naming the statement as -1), on MySQL the prepare alone first.
            String table = "pipeline_" + TAG;
            table("pipeline", table);
            String sql = "REPLACE INTO " + table + " (id, word) VALUES (?, ?)";
            List<Object[]> rows = new ArrayList<>();
            for (int i = 0; i < PIPELINE; i++) rows.add(new Object[] {i, "p" + i});
            try (PreparedStatement ps = conn.prepareStatement(sql)) {
                if (serverPrepared) checkServerPrepared(ps);
                for (Object[] row : rows) {
                    bind(ps, row);
                    ps.addBatch();
                }
                int[] counts = ps.executeBatch();
                check(counts.length == PIPELINE, "pipeline: " + counts.length + " update counts");
                if (serverPrepared) {
                    sent("pipeline", "Prepare", sql);
                    for (int i = 0; i < PIPELINE; i++) sent("pipeline", "Execute", sql);
                } else {
                    for (Object[] row : rows) sent("pipeline", "Query", interpolate(sql, row));
                }
            }
            count("pipeline", table, PIPELINE);
            query("pipeline", "DROP TABLE " + table);
        }

        @Override
        void reset() throws SQLException {
            if (!onMariaDB) {
                unsupported("reset", "Connector/J 3.x's Connection#reset() sends COM_RESET_CONNECTION to MariaDB"
                        + " only (MySQL bug 97633): on MySQL it resets the driver's state alone");
                return;
            }
            prepareAndExecute("reset", 2);
            verify("reset");
            // What the driver's pool does when a connection is given back: COM_RESET_CONNECTION (useResetConnection)
            // and its cache of prepared statements emptied.
            check(marked(true), "reset: no user variable set");
            conn.unwrap(org.mariadb.jdbc.Connection.class).reset();
            check(connectionId() == id, "reset: another connection");
            check(!marked(false), "reset: the session's user variable outlived Connection#reset()");
            begin();
            // The server forgot the statements: prepared again, numbered anew.
            prepareAndExecute("reset", 2);
        }

        @Override
        void changeUser() {
            unsupported("change_user", "MariaDB Connector/J has no call that sends COM_CHANGE_USER");
        }

        @Override
        void loadLocal() throws SQLException {
            if (compressed) {
                // Tried: the server drops the connection once the file is sent, on MariaDB and MySQL alike (the
                // mariadb client, compressed, loads the same file).
                unsupported("load_local", "Connector/J 3.5.11 with useCompression breaks LOAD DATA LOCAL: the"
                        + " server aborts the connection (Got packets out of order)");
                return;
            }
            super.loadLocal();
        }
    }

    /** MySQL Connector/J 9.5: client-side prepared statements and TLS (sslMode=PREFERRED) by default. */
    static final class MySQL extends Client {
        MySQL(String name, boolean serverPrepared, boolean compressed) {
            super(name, serverPrepared, compressed);
        }

        @Override
        Connection connect(String user, String password) throws SQLException {
            Properties p = new Properties();
            p.setProperty("user", user);
            p.setProperty("password", password);
            // What the modes need: several statements in one COM_QUERY, LOAD DATA LOCAL (both off by default).
            p.setProperty("allowMultiQueries", "true");
            p.setProperty("allowLoadLocalInfile", "true");
            if (serverPrepared) {
                p.setProperty("useServerPrepStmts", "true");
                p.setProperty("rewriteBatchedStatements", "true");
            }
            if (compressed) p.setProperty("useCompression", "true");
            String url = "jdbc:mysql://" + env("MYPROBE_CLIENT_HOST") + ":" + env("MYPROBE_CLIENT_PORT") + "/"
                    + env("MYPROBE_CLIENT_DB");
            Connection c = new com.mysql.cj.jdbc.Driver().connect(url, p);
            check(c != null, "the MySQL driver refused " + url);
            return c;
        }

        @Override
        void checkServerPrepared(PreparedStatement ps) {
            check(ps instanceof com.mysql.cj.jdbc.ServerPreparedStatement, "not a server-side prepared statement: "
                    + ps.getClass().getName());
        }

        /** Connector/J prepares on the server when the statement is made. */
        @Override
        PreparedStatement serverPrepare(String mode, String sql) throws SQLException {
            PreparedStatement ps = conn.prepareStatement(sql);
            checkServerPrepared(ps);
            sent(mode, "Prepare", sql);
            return ps;
        }

        /** INSERT … VALUES (?, ?),(?, ?),… for n rows, as rewriteBatchedStatements writes it. */
        static String multiValues(String sql, int n) {
            int values = sql.indexOf("(?, ?)");
            check(values > 0 && sql.endsWith("(?, ?)"), "not an INSERT … VALUES (?, ?): " + sql);
            StringBuilder out = new StringBuilder(sql.substring(0, values));
            for (int i = 0; i < n; i++) out.append(i == 0 ? "" : ",").append("(?, ?)");
            return out.toString();
        }

        @Override
        void batchSent(String sql, List<Object[]> rows) {
            if (serverPrepared) {
                // rewriteBatchedStatements: the statement as made (prepared, never executed), then the rows in one
                // multi-row INSERT, prepared and executed (all of BATCH rows fit in one packet).
                sent("batch", "Prepare", sql);
                String rewritten = multiValues(sql, rows.size());
                sent("batch", "Prepare", rewritten);
                sent("batch", "Execute", rewritten);
            } else {
                // Without rewriteBatchedStatements: a text statement per row, one after the other.
                for (Object[] row : rows) sent("batch", "Query", interpolate(sql, row));
            }
        }

        @Override
        void pipeline() {
            unsupported("pipeline", "Connector/J reads each reply before it sends the next request");
        }

        @Override
        void reset() throws SQLException {
            prepareAndExecute("reset", 2);
            verify("reset");
            // What its pools (MysqlPooledConnection) call: COM_RESET_CONNECTION, then the session set up again.
            check(marked(true), "reset: no user variable set");
            conn.unwrap(com.mysql.cj.jdbc.JdbcConnection.class).resetServerState();
            check(connectionId() == id, "reset: another connection");
            check(!marked(false), "reset: the session's user variable outlived resetServerState()");
            begin();
            // The server forgot the statements: prepared again, numbered anew.
            prepareAndExecute("reset", 2);
        }

        @Override
        void changeUser() throws SQLException {
            com.mysql.cj.jdbc.JdbcConnection c = conn.unwrap(com.mysql.cj.jdbc.JdbcConnection.class);
            String user2 = env("MYPROBE_CLIENT_USER2");
            c.changeUser(user2, env("MYPROBE_CLIENT_PASSWORD2"));
            user = user2;
            check(connectionId() == id, "change_user: another connection");
            begin();
            for (int i = 0; i < 3; i++) {
                List<List<String>> got = query("change_user", "SELECT '" + TAG + "-changed', " + i + ", CURRENT_USER()");
                check(got.size() == 1 && got.get(0).get(2).startsWith(user2 + "@"), "change_user: " + got);
            }
            prepareAndExecute("change_user", 2);
            verify("change_user");
            // Back, for the modes after this one.
            c.changeUser(env("MYPROBE_CLIENT_USER"), env("MYPROBE_CLIENT_PASSWORD"));
            user = env("MYPROBE_CLIENT_USER");
            begin();
        }
    }

    public static void main(String[] args) {
        if (args.length == 1 && args[0].equals("--list")) {
            CONFIGURATIONS.forEach(OUT::println);
            return;
        }
        if (args.length != 1 || !CONFIGURATIONS.contains(args[0])) {
            ERR.println("usage: run {" + String.join("|", CONFIGURATIONS) + "|--list}");
            System.exit(2);
        }
        String name = args[0];
        Client client;
        switch (name) {
            case "mariadb": client = new MariaDB(name, false, false); break;
            case "mariadb-server-prepared": client = new MariaDB(name, true, false); break;
            case "mariadb-compressed": client = new MariaDB(name, false, true); break;
            case "mysql": client = new MySQL(name, false, false); break;
            case "mysql-server-prepared": client = new MySQL(name, true, false); break;
            case "mysql-compressed": client = new MySQL(name, false, true); break;
            default: throw new IllegalStateException(name);
        }
        try {
            check(TAG.matches("[a-z0-9_]+"), "MYPROBE_CLIENT_TAG is not a word: " + TAG);
            client.run();
        } catch (Exception e) {
            ERR.println("tests/clients/java " + name + ": " + e);
            e.printStackTrace(ERR);
            System.exit(1);
        }
    }
}
