// The Go configurations of the client conformance suite (tests/clients/README.md): go-sql-driver/mysql through
// database/sql, one *sql.Conn (one server connection) per configuration. Usage: clients CONFIGURATION | --list.
//
//   - go-sql-driver: its defaults (no TLS; a query with arguments is prepared, executed and closed by the driver).
//   - go-sql-driver-interpolated: interpolateParams=true (a query with arguments is sent as text, its arguments in it).
//   - go-sql-driver-compressed: compress=true (the compressed protocol, since v1.9.0).
//
// Each has multiStatements=true (for the multi mode; it changes nothing else that is sent). Every Prepare/Execute
// line is checked against the server's counters (Com_stmt_prepare, Com_stmt_execute of SHOW SESSION STATUS) at the
// end of each mode.
package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/go-sql-driver/mysql"
)

var configurations = []string{"go-sql-driver", "go-sql-driver-interpolated", "go-sql-driver-compressed"}

var modes = []string{"text", "prepared", "batch", "pipeline", "multi", "call", "reset", "change_user",
	"load_local", "big"}

const big = 17 * 1024 * 1024

var (
	tag = os.Getenv("MYPROBE_CLIENT_TAG")
	ctx = context.Background()
)

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "clients: "+format+"\n", args...)
	os.Exit(1)
}

func check(err error, what string) {
	if err != nil {
		fail("%s: %v", what, err)
	}
}

func expect(ok bool, format string, args ...any) {
	if !ok {
		fail("not as expected: "+format, args...)
	}
}

var escaper = strings.NewReplacer(`\`, `\\`, "\t", `\t`, "\n", `\n`, "\r", `\r`)

type client struct {
	interpolated bool
	db           *sql.DB
	conn         *sql.Conn
	id           int64
	user         string
	// Prepare/Execute lines printed since the last checkpoint, and the server's counters then.
	counted, baseline map[string]int64
}

func (c *client) sent(mode, command, text string) {
	shown := text
	if len(shown) > 4096 {
		shown = strings.ToValidUTF8(shown[:4096], "")
	}
	switch command {
	case "Prepare":
		c.counted["prepare"]++
	case "Execute":
		c.counted["execute"]++
	}
	fmt.Printf("statement\t%s\t%d\t%s\t%s\t%d\t%s\n", mode, c.id, c.user, command, len(text), escaper.Replace(shown))
}

func unsupported(mode, reason string) {
	fmt.Printf("unsupported\t%s\t%s\n", mode, reason)
}

// Every row of every result set, each value as text (nil: NULL).
func scan(rows *sql.Rows) [][][]string {
	var sets [][][]string
	for {
		columns, err := rows.Columns()
		check(err, "columns")
		var set [][]string
		for rows.Next() {
			values := make([]any, len(columns))
			pointers := make([]any, len(columns))
			for i := range values {
				pointers[i] = &values[i]
			}
			check(rows.Scan(pointers...), "scan")
			row := make([]string, len(values))
			for i, v := range values {
				switch v := v.(type) {
				case []byte:
					row[i] = string(v)
				case nil:
					row[i] = "NULL"
				default:
					row[i] = fmt.Sprint(v)
				}
			}
			set = append(set, row)
		}
		check(rows.Err(), "rows")
		sets = append(sets, set)
		if !rows.NextResultSet() {
			break
		}
	}
	check(rows.Err(), "result sets")
	check(rows.Close(), "close rows")
	return sets
}

// The result sets of a query: a text statement when there are no arguments.
func (c *client) results(text string, args ...any) [][][]string {
	rows, err := c.conn.QueryContext(ctx, text, args...)
	check(err, text)
	return scan(rows)
}

func (c *client) rows(text string, args ...any) [][]string {
	return c.results(text, args...)[0]
}

func show(rows [][]string) string { return fmt.Sprintf("%q", rows) }

// A text statement, its rows read whole: listed.
func (c *client) query(mode, text string) [][]string {
	rows := c.rows(text)
	c.sent(mode, "Query", text)
	return rows
}

func (c *client) exec(mode, text string) sql.Result {
	result, err := c.conn.ExecContext(ctx, text)
	check(err, text)
	c.sent(mode, "Query", text)
	return result
}

func (c *client) counters() map[string]int64 {
	counters := map[string]int64{}
	for _, row := range c.rows("SHOW SESSION STATUS WHERE Variable_name IN ('Com_stmt_prepare', 'Com_stmt_execute')") {
		n, err := strconv.ParseInt(row[1], 10, 64)
		check(err, "a counter")
		counters[strings.TrimPrefix(strings.ToLower(row[0]), "com_stmt_")] = n
	}
	return counters
}

// The server counted as many prepares and executions as were printed since the last checkpoint.
func (c *client) checkpoint(mode string) {
	now := c.counters()
	for _, k := range []string{"prepare", "execute"} {
		delta := now[k] - c.baseline[k]
		expect(delta == c.counted[k], "%s: the server counted %d %ss, %d printed", mode, delta, k, c.counted[k])
	}
	c.baseline, c.counted = now, map[string]int64{}
}

func (c *client) text() {
	for i := 0; i < 5; i++ {
		rows := c.query("text", fmt.Sprintf("SELECT '%s-text', %d", tag, i))
		expect(show(rows) == show([][]string{{tag + "-text", strconv.Itoa(i)}}), "%s", show(rows))
	}
	rows := c.query("text", fmt.Sprintf("SELECT '%s-unicode: café, 東京, 🐬'", tag))
	expect(strings.HasSuffix(rows[0][0], "🐬"), "%s", show(rows))
}

func (c *client) prepared() {
	// A statement prepared by the application (server-side whatever interpolateParams says), executed 5 times,
	// closed (COM_STMT_CLOSE, not a statement).
	text := fmt.Sprintf("SELECT id, '%s' FROM sbtest1 WHERE id = ?", tag)
	stmt, err := c.conn.PrepareContext(ctx, text)
	check(err, text)
	c.sent("prepared", "Prepare", text)
	for i := 1; i <= 5; i++ {
		rows, err := stmt.QueryContext(ctx, i)
		check(err, text)
		got := scan(rows)[0]
		expect(show(got) == show([][]string{{strconv.Itoa(i), tag}}), "%s", show(got))
		c.sent("prepared", "Execute", text)
	}
	check(stmt.Close(), "close "+text)

	// Queries with arguments: the driver prepares, executes and closes each (database/sql's fallback when the
	// driver declines them), or, with interpolateParams, sends each as text with its argument in it.
	text = fmt.Sprintf("SELECT id, '%s' FROM sbtest1 WHERE id = ? AND 'arguments' = 'arguments'", tag)
	for i := 1; i <= 3; i++ {
		got := c.rows(text, i)
		expect(show(got) == show([][]string{{strconv.Itoa(i), tag}}), "%s", show(got))
		if c.interpolated {
			c.sent("prepared", "Query", strings.Replace(text, "?", strconv.Itoa(i), 1))
		} else {
			c.sent("prepared", "Prepare", text)
			c.sent("prepared", "Execute", text)
		}
	}
}

func (c *client) batch() {
	unsupported("batch", "go-sql-driver has no batch: no bulk execution, no rewriting of rows")
}

func (c *client) pipeline() {
	unsupported("pipeline", "go-sql-driver writes a command after reading the reply to the one before")
}

func (c *client) multi() {
	text := fmt.Sprintf("SELECT '%s-multi', 1; SELECT '%s-multi', 2", tag, tag)
	sets := c.results(text)
	expect(len(sets) == 2 && show(sets[1]) == show([][]string{{tag + "-multi", "2"}}), "%q", sets)
	c.sent("multi", "Query", text)
}

func (c *client) call() {
	procedure := "p_" + tag
	c.exec("call", fmt.Sprintf("CREATE PROCEDURE %s() BEGIN SELECT 1 AS first; SELECT 2 AS second; END", procedure))
	text := fmt.Sprintf("CALL %s()", procedure)
	sets := c.results(text)
	expect(len(sets) >= 2 && fmt.Sprintf("%q", sets[:2]) == `[[["1"]] [["2"]]]`, "%q", sets)
	c.sent("call", "Query", text)
	c.exec("call", "DROP PROCEDURE "+procedure)
}

func (c *client) reset() {
	unsupported("reset", "go-sql-driver has no COM_RESET_CONNECTION (its ResetSession only checks the connection is alive)")
}

func (c *client) changeUser() {
	unsupported("change_user", "go-sql-driver has no COM_CHANGE_USER: a user is a connection of its own")
}

func (c *client) loadLocal() {
	table := "load_" + tag
	file := os.Getenv("MYPROBE_CLIENT_INFILE")
	mysql.RegisterLocalFile(file)
	c.exec("load_local", fmt.Sprintf("CREATE TABLE %s (id INT PRIMARY KEY, word VARCHAR(64))", table))
	result := c.exec("load_local", fmt.Sprintf("LOAD DATA LOCAL INFILE '%s' INTO TABLE %s", file, table))
	n, err := result.RowsAffected()
	check(err, "LOAD DATA")
	expect(n == 10, "LOAD DATA affected %d rows", n)
	rows := c.query("load_local", "SELECT COUNT(*) FROM "+table)
	expect(show(rows) == show([][]string{{"10"}}), "%s", show(rows))
	c.exec("load_local", "DROP TABLE "+table)
}

func (c *client) big() {
	text := fmt.Sprintf("SELECT '%s-big', LENGTH('%s')", tag, strings.Repeat("x", big))
	rows := c.query("big", text)
	expect(show(rows) == show([][]string{{tag + "-big", strconv.Itoa(big)}}), "%.200s", show(rows))
}

func run(configuration string) {
	cfg := mysql.NewConfig()
	cfg.User = os.Getenv("MYPROBE_CLIENT_USER")
	cfg.Passwd = os.Getenv("MYPROBE_CLIENT_PASSWORD")
	cfg.Net = "tcp"
	cfg.Addr = os.Getenv("MYPROBE_CLIENT_HOST") + ":" + os.Getenv("MYPROBE_CLIENT_PORT")
	cfg.DBName = os.Getenv("MYPROBE_CLIENT_DB")
	cfg.MultiStatements = true
	c := &client{user: cfg.User, counted: map[string]int64{}}
	switch configuration {
	case "go-sql-driver":
	case "go-sql-driver-interpolated":
		cfg.InterpolateParams = true
		c.interpolated = true
	case "go-sql-driver-compressed":
		check(cfg.Apply(mysql.EnableCompression(true)), "compress")
	default:
		fmt.Fprintf(os.Stderr, "usage: clients {%s|--list}\n", strings.Join(configurations, "|"))
		os.Exit(2)
	}
	connector, err := mysql.NewConnector(cfg)
	check(err, "connector")
	c.db = sql.OpenDB(connector)
	c.conn, err = c.db.Conn(ctx)
	check(err, "connect")
	id, err := strconv.ParseInt(c.rows("SELECT CONNECTION_ID()")[0][0], 10, 64)
	check(err, "CONNECTION_ID()")
	c.id = id
	c.baseline = c.counters()
	steps := map[string]func(){
		"text": c.text, "prepared": c.prepared, "batch": c.batch, "pipeline": c.pipeline, "multi": c.multi,
		"call": c.call, "reset": c.reset, "change_user": c.changeUser, "load_local": c.loadLocal, "big": c.big,
	}
	for _, mode := range modes {
		fmt.Fprintln(os.Stderr, mode)
		steps[mode]()
		c.checkpoint(mode)
	}
	check(c.conn.Close(), "close")
	check(c.db.Close(), "close")
}

func main() {
	switch {
	case len(os.Args) == 2 && os.Args[1] == "--list":
		fmt.Println(strings.Join(configurations, "\n"))
	case len(os.Args) == 2:
		run(os.Args[1])
	default:
		fmt.Fprintf(os.Stderr, "usage: clients {%s|--list}\n", strings.Join(configurations, "|"))
		os.Exit(2)
	}
}
