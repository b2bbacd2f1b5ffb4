"""The Python configurations of the client conformance suite (tests/clients/README.md): PyMySQL (its defaults:
no TLS, text statements, client-side interpolation) and MySQL's Connector/Python (its defaults: TLS, its C
extension). Usage: clients.py CONFIGURATION | --list."""
import os
import sys

CONFIGURATIONS = ["pymysql", "connector"]
env = os.environ.get
TAG = env("MYPROBE_CLIENT_TAG", "")
BIG = 17 * 1024 * 1024


def esc(text):
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


class Client:
    """One configuration: its connection, what it prints."""

    def __init__(self):
        self.user = env("MYPROBE_CLIENT_USER")
        self.conn = self.connect(self.user, env("MYPROBE_CLIENT_PASSWORD"))
        self.id = self.connection_id()

    def sent(self, mode, command, text):
        data = bytes(text) if isinstance(text, (bytes, bytearray)) else text.encode()
        shown = data[:4096].decode(errors="ignore")
        print(f"statement\t{mode}\t{self.id}\t{self.user}\t{command}\t{len(data)}\t{esc(shown)}", flush=True)

    def unsupported(self, mode, reason):
        print(f"unsupported\t{mode}\t{reason}", flush=True)

    def connection_id(self):
        return self.rows("SELECT CONNECTION_ID()")[0][0]

    def query(self, mode, text):
        """A text statement, its results read whole: listed."""
        rows = self.rows(text)
        self.sent(mode, "Query", text)
        return rows

    def text(self):
        for i in range(5):
            assert self.query("text", f"SELECT '{TAG}-text', {i}") == [(f"{TAG}-text", i)]
        assert self.query("text", f"SELECT '{TAG}-unicode: café, 東京, 🐬'")[0][0].endswith("🐬")

    def tables(self, mode, table):
        self.query(mode, f"CREATE TABLE {table} (id INT PRIMARY KEY, word VARCHAR(64))")

    def call(self):
        procedure = f"p_{TAG}"
        self.query("call", f"CREATE PROCEDURE {procedure}() BEGIN SELECT 1 AS first; SELECT 2 AS second; END")
        self.call_procedure("call", f"CALL {procedure}()")
        self.query("call", f"DROP PROCEDURE {procedure}")

    def load_local(self):
        table = f"load_{TAG}"
        self.tables("load_local", table)
        self.execute_only("load_local", f"LOAD DATA LOCAL INFILE '{env('MYPROBE_CLIENT_INFILE')}' INTO TABLE {table}")
        assert self.query("load_local", f"SELECT COUNT(*) FROM {table}") == [(10,)]
        self.query("load_local", f"DROP TABLE {table}")

    def big(self):
        text = f"SELECT '{TAG}-big', LENGTH('" + "x" * BIG + "')"
        assert self.query("big", text) == [(f"{TAG}-big", BIG)]

    def run(self):
        for mode in ["text", "prepared", "batch", "pipeline", "multi", "call", "reset", "change_user",
                     "load_local", "big"]:
            print(f"{mode}", file=sys.stderr, flush=True)
            getattr(self, mode)()
        self.conn.close()


class PyMySQL(Client):
    def connect(self, user, password):
        import pymysql
        from pymysql.constants import CLIENT
        return pymysql.connect(host=env("MYPROBE_CLIENT_HOST"), port=int(env("MYPROBE_CLIENT_PORT")), user=user,
                               password=password, database=env("MYPROBE_CLIENT_DB"), local_infile=True,
                               client_flag=CLIENT.MULTI_STATEMENTS)

    def rows(self, text):
        with self.conn.cursor() as cur:
            cur.execute(text)
            rows = list(cur.fetchall())
            while cur.nextset():
                pass
            return [tuple(r) for r in rows]

    def execute_only(self, mode, text):
        self.query(mode, text)

    def call_procedure(self, mode, text):
        with self.conn.cursor() as cur:
            cur.execute(text)
            sets = [cur.fetchall()]
            while cur.nextset():
                sets.append(cur.fetchall())
        assert sets[:2] == [((1,),), ((2,),)], sets
        self.sent(mode, "Query", text)

    def prepared(self):
        self.unsupported("prepared", "PyMySQL interpolates parameters on the client: its statements are text")

    def batch(self):
        table = f"batch_{TAG}"
        self.tables("batch", table)
        with self.conn.cursor() as cur:
            cur.executemany(f"INSERT INTO {table} (id, word) VALUES (%s, %s)", [(i, f"w{i}") for i in range(50)])
            # executemany rewrites the rows into one INSERT: the statement as sent.
            self.sent("batch", "Query", cur._executed)
        assert self.query("batch", f"SELECT COUNT(*) FROM {table}") == [(50,)]
        self.query("batch", f"DROP TABLE {table}")

    def pipeline(self):
        self.unsupported("pipeline", "PyMySQL waits for each reply")

    def multi(self):
        text = f"SELECT '{TAG}-multi', 1; SELECT '{TAG}-multi', 2"
        with self.conn.cursor() as cur:
            cur.execute(text)
            sets = [cur.fetchall()]
            while cur.nextset():
                sets.append(cur.fetchall())
        assert len(sets) == 2, sets
        self.sent("multi", "Query", text)

    def reset(self):
        self.unsupported("reset", "PyMySQL has no COM_RESET_CONNECTION")

    def change_user(self):
        self.unsupported("change_user", "PyMySQL has no COM_CHANGE_USER")


class Connector(Client):
    def connect(self, user, password):
        import mysql.connector
        return mysql.connector.connect(host=env("MYPROBE_CLIENT_HOST"), port=int(env("MYPROBE_CLIENT_PORT")),
                                       user=user, password=password, database=env("MYPROBE_CLIENT_DB"),
                                       allow_local_infile=True)

    def rows(self, text):
        cur = self.conn.cursor()
        cur.execute(text)
        rows = cur.fetchall() if cur.with_rows else []
        cur.close()
        return [tuple(r) for r in rows]

    def execute_only(self, mode, text):
        self.query(mode, text)

    def call_procedure(self, mode, text):
        cur = self.conn.cursor()
        cur.execute(text)
        sets = [cur.fetchall()]
        while cur.nextset():
            if cur.with_rows:
                sets.append(cur.fetchall())
        cur.close()
        assert sets[:2] == [[(1,)], [(2,)]], sets
        self.sent(mode, "Query", text)

    def prepare_and_execute(self, mode, times):
        cur = self.conn.cursor(prepared=True)
        statement = f"SELECT id, '{TAG}' FROM sbtest1 WHERE id = %s"
        for i in range(times):
            cur.execute(statement, (i + 1,))
            cur.fetchall()
            if i == 0:
                self.sent(mode, "Prepare", statement.replace("%s", "?"))
            self.sent(mode, "Execute", statement.replace("%s", "?"))
        cur.close()

    def prepared(self):
        self.prepare_and_execute("prepared", 5)

    def batch(self):
        table = f"batch_{TAG}"
        self.tables("batch", table)
        cur = self.conn.cursor()
        cur.executemany(f"INSERT INTO {table} (id, word) VALUES (%s, %s)", [(i, f"w{i}") for i in range(50)])
        # executemany rewrites the rows into one INSERT: the statement as sent.
        self.sent("batch", "Query", cur.statement)
        cur.close()
        self.conn.commit()
        assert self.query("batch", f"SELECT COUNT(*) FROM {table}") == [(50,)]
        self.query("batch", f"DROP TABLE {table}")

    def pipeline(self):
        self.unsupported("pipeline", "Connector/Python waits for each reply")

    def multi(self):
        text = f"SELECT '{TAG}-multi', 1; SELECT '{TAG}-multi', 2"
        cur = self.conn.cursor()
        cur.execute(text)
        sets = [cur.fetchall()]
        while cur.nextset():
            sets.append(cur.fetchall())
        cur.close()
        assert len(sets) == 2, sets
        self.sent("multi", "Query", text)

    def reset(self):
        self.prepare_and_execute("reset", 2)
        self.conn.cmd_reset_connection()
        # The server forgot the statements: prepared again, numbered anew.
        self.prepare_and_execute("reset", 2)

    def change_user(self):
        self.conn.cmd_change_user(username=env("MYPROBE_CLIENT_USER2"), password=env("MYPROBE_CLIENT_PASSWORD2"),
                                  database=env("MYPROBE_CLIENT_DB"))
        self.user = env("MYPROBE_CLIENT_USER2")
        assert self.connection_id() == self.id
        for i in range(3):
            self.query("change_user", f"SELECT '{TAG}-changed', {i}, CURRENT_USER()")
        self.prepare_and_execute("change_user", 2)
        # Back, for the modes after this one.
        self.conn.cmd_change_user(username=env("MYPROBE_CLIENT_USER"), password=env("MYPROBE_CLIENT_PASSWORD"),
                                  database=env("MYPROBE_CLIENT_DB"))
        self.user = env("MYPROBE_CLIENT_USER")


if __name__ == "__main__":
    if sys.argv[1:] == ["--list"]:
        print("\n".join(CONFIGURATIONS))
    elif sys.argv[1:2] == ["pymysql"]:
        PyMySQL().run()
    elif sys.argv[1:2] == ["connector"]:
        Connector().run()
    else:
        sys.exit(f"usage: clients.py {{{'|'.join(CONFIGURATIONS)}|--list}}")
