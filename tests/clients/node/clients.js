'use strict';
// The Node.js configurations of the client conformance suite (tests/clients/README.md): mysql2 and MariaDB's
// Connector/Node.js (npm mariadb), each with its defaults and compressed. Usage: clients.js CONFIGURATION | --list.
// The libraries are required from MYPROBE_NODE_PREFIX/node_modules (./install puts them there).
//
// Every Prepare/Execute/Bulk_execute line is checked against the server's own counters (Com_stmt_prepare,
// Com_stmt_execute of SHOW SESSION STATUS) at the end of each mode, so that a statement the library took from its
// cache, or prepared once more, fails the run instead of printing a wrong expectation.

const fs = require('fs');
const path = require('path');
const { createRequire } = require('module');

// The compressed ones last: one can disturb myprobe's tracing of the connections after it (seen with myprobe as of
// this writing), which the uncompressed ones should not depend on.
const CONFIGURATIONS = ['mysql2', 'mariadb', 'mysql2-compressed', 'mariadb-compressed'];
const MODES = ['text', 'prepared', 'batch', 'pipeline', 'multi', 'call', 'reset', 'change_user', 'load_local', 'big'];
const env = process.env;
const TAG = env.MYPROBE_CLIENT_TAG || '';
const BIG = 17 * 1024 * 1024;
const MARIADB = env.MYPROBE_CLIENT_SERVER === 'mariadb';

const prefix = env.MYPROBE_NODE_PREFIX || '/var/cache/myprobe/clients/node';
const load = (name) => createRequire(path.join(prefix, 'package.json'))(name);

function esc(text) {
  return text.replace(/\\/g, '\\\\').replace(/\t/g, '\\t').replace(/\n/g, '\\n').replace(/\r/g, '\\r');
}

function assert(ok, what) {
  if (!ok) throw new Error(`not as expected: ${what}`);
}

const json = (v) => JSON.stringify(v, (_, x) => (typeof x === 'bigint' ? Number(x) : x));
const same = (a, b) => json(a) === json(b);

class Client {
  constructor(compress) {
    this.compress = compress;
    this.user = env.MYPROBE_CLIENT_USER;
    // Prepare/Execute lines printed since the last checkpoint, to compare with the server's counters.
    this.counted = { prepare: 0, execute: 0 };
  }

  async start() {
    this.conn = await this.connect(this.user, env.MYPROBE_CLIENT_PASSWORD, {});
    this.id = await this.connectionId(this.conn);
    this.baseline = await this.counters(this.conn);
  }

  sent(mode, command, text, id = this.id) {
    const data = Buffer.from(text, 'utf8');
    const shown = data.subarray(0, 4096).toString('utf8').replace(/\uFFFD+$/, '');
    if (command === 'Prepare') this.counted.prepare++;
    if (command === 'Execute' || command === 'Bulk_execute') this.counted.execute++;
    process.stdout.write(`statement\t${mode}\t${id}\t${this.user}\t${command}\t${data.length}\t${esc(shown)}\n`);
  }

  unsupported(mode, reason) {
    process.stdout.write(`unsupported\t${mode}\t${reason}\n`);
  }

  async connectionId(conn) {
    const rows = await this.rows(conn, 'SELECT CONNECTION_ID()');
    return Number(rows[0][0]);
  }

  async counters(conn) {
    const rows = await this.rows(
      conn,
      "SHOW SESSION STATUS WHERE Variable_name IN ('Com_stmt_prepare', 'Com_stmt_execute')"
    );
    const c = {};
    for (const [name, value] of rows) c[name.toLowerCase().replace('com_stmt_', '')] = Number(value);
    return c;
  }

  // The server counted as many prepares and executions as were printed since the last checkpoint.
  async checkpoint(mode) {
    const now = await this.counters(this.conn);
    for (const k of ['prepare', 'execute']) {
      const delta = now[k] - this.baseline[k];
      assert(delta === this.counted[k], `${mode}: the server counted ${delta} ${k}s, ${this.counted[k]} printed`);
    }
    this.rebase(now);
  }

  rebase(now) {
    this.baseline = now;
    this.counted = { prepare: 0, execute: 0 };
  }

  // A text statement, its results read whole: listed.
  async query(mode, text, conn = this.conn, id = this.id) {
    const rows = await this.rows(conn, text);
    this.sent(mode, 'Query', text, id);
    return rows;
  }

  async text() {
    for (let i = 0; i < 5; i++) {
      const rows = await this.query('text', `SELECT '${TAG}-text', ${i}`);
      assert(same(rows, [[`${TAG}-text`, i]]), json(rows));
    }
    const rows = await this.query('text', `SELECT '${TAG}-unicode: café, 東京, 🐬'`);
    assert(rows[0][0].endsWith('🐬'), json(rows));
  }

  async table(mode, table, conn = this.conn, id = this.id) {
    await this.query(mode, `CREATE TABLE ${table} (id INT PRIMARY KEY, word VARCHAR(64))`, conn, id);
  }

  async multi() {
    const text = `SELECT '${TAG}-multi', 1; SELECT '${TAG}-multi', 2`;
    const sets = await this.results(this.conn, text);
    assert(sets.length === 2 && same(sets[1], [[`${TAG}-multi`, 2]]), json(sets));
    this.sent('multi', 'Query', text);
  }

  async call() {
    const procedure = `p_${TAG}`;
    await this.query('call', `CREATE PROCEDURE ${procedure}() BEGIN SELECT 1 AS first; SELECT 2 AS second; END`);
    const text = `CALL ${procedure}()`;
    const sets = await this.results(this.conn, text);
    assert(same(sets.slice(0, 2), [[[1]], [[2]]]), json(sets));
    this.sent('call', 'Query', text);
    await this.query('call', `DROP PROCEDURE ${procedure}`);
  }

  async big() {
    const text = `SELECT '${TAG}-big', LENGTH('` + 'x'.repeat(BIG) + "')";
    const rows = await this.query('big', text);
    assert(same(rows, [[`${TAG}-big`, BIG]]), json(rows).slice(0, 200));
  }

  // Statement `sql` executed `times` times (parameters 1..times) through the library's server-side prepared
  // statements: `prepares` says whether the library sends a COM_STMT_PREPARE first (the checkpoint verifies).
  async executeTimes(mode, sql, times, prepares = true) {
    for (let i = 1; i <= times; i++) {
      const rows = await this.execute(sql, [i]);
      assert(same(rows, [[i, TAG]]), json(rows));
      if (i === 1 && prepares) this.sent(mode, 'Prepare', sql);
      this.sent(mode, 'Execute', sql);
    }
  }

  async prepared() {
    // Executed 5 times: the library prepares once and keeps the statement (its cache).
    await this.executeTimes('prepared', `SELECT id, '${TAG}' FROM sbtest1 WHERE id = ?`, 5);
  }

  async changeUserAndBack(mode) {
    await this.checkpoint(mode);
    await this.changeUser(env.MYPROBE_CLIENT_USER2, env.MYPROBE_CLIENT_PASSWORD2);
    this.user = env.MYPROBE_CLIENT_USER2;
    assert((await this.connectionId(this.conn)) === this.id, 'the same connection after COM_CHANGE_USER');
    this.rebase(await this.counters(this.conn));
    for (let i = 0; i < 3; i++) {
      const rows = await this.query(mode, `SELECT '${TAG}-changed', ${i}, CURRENT_USER()`);
      assert(rows[0][2].startsWith(`${env.MYPROBE_CLIENT_USER2}@`), json(rows));
    }
    // A statement of its own: the cache of the one before must not matter.
    await this.executeTimes(mode, `SELECT id, '${TAG}' FROM sbtest1 WHERE id = ? AND 'changed' = 'changed'`, 2);
    await this.checkpoint(mode);
    // Back, for the modes after this one.
    await this.changeUser(env.MYPROBE_CLIENT_USER, env.MYPROBE_CLIENT_PASSWORD);
    this.user = env.MYPROBE_CLIENT_USER;
    this.rebase(await this.counters(this.conn));
  }

  async resetAndPrepareAgain(mode) {
    const sql = `SELECT id, '${TAG}' FROM sbtest1 WHERE id = ? AND 'reset' = 'reset'`;
    await this.executeTimes(mode, sql, 2);
    await this.checkpoint(mode);
    await this.resetConnection();
    assert((await this.connectionId(this.conn)) === this.id, 'the same connection after COM_RESET_CONNECTION');
    this.rebase(await this.counters(this.conn));
    // The server forgot the statement, the library its cache: prepared again, numbered anew.
    await this.executeTimes(mode, sql, 2);
  }

  async run() {
    await this.start();
    for (const mode of MODES) {
      process.stderr.write(`${mode}\n`);
      await this[mode]();
      await this.checkpoint(mode);
    }
    await this.close();
  }
}

// mysql2 (its callback API, to see the text its batch rewriting sends): text statements with `query`, server-side
// prepared statements with `execute` (kept in its statement cache).
class Mysql2 extends Client {
  async connect(user, password, options) {
    const mysql = load('mysql2');
    const conn = mysql.createConnection({
      host: env.MYPROBE_CLIENT_HOST,
      port: Number(env.MYPROBE_CLIENT_PORT),
      user,
      password,
      database: env.MYPROBE_CLIENT_DB,
      multipleStatements: true,
      compress: this.compress,
      ...options,
    });
    await new Promise((resolve, reject) => conn.connect((err) => (err ? reject(err) : resolve())));
    return conn;
  }

  // [rows, the text as sent]
  sendQuery(conn, options, values) {
    return new Promise((resolve, reject) => {
      const cb = (err, rows) => (err ? reject(err) : resolve([rows, cmd.sql]));
      const cmd = values === undefined ? conn.query(options, cb) : conn.query(options, values, cb);
    });
  }

  async rows(conn, sql) {
    const [rows, sent] = await this.sendQuery(conn, { sql, rowsAsArray: true });
    assert(sent === sql, `mysql2 sent ${sent.slice(0, 200)} for ${sql.slice(0, 200)}`);
    return rows;
  }

  async results(conn, sql) {
    const [sets, sent] = await this.sendQuery(conn, { sql, rowsAsArray: true });
    assert(sent === sql, `mysql2 sent ${sent} for ${sql}`);
    return sets.filter(Array.isArray);
  }

  execute(sql, values) {
    return new Promise((resolve, reject) =>
      this.conn.execute({ sql, rowsAsArray: true }, values, (err, rows) => (err ? reject(err) : resolve(rows)))
    );
  }

  async batch() {
    const table = `batch_${TAG}`;
    await this.table('batch', table);
    const rows = Array.from({ length: 50 }, (_, i) => [i, `w${i}`]);
    // Nested arrays for one `?`: mysql2 rewrites the rows into one INSERT, the statement as sent.
    const [result, sent] = await this.sendQuery(this.conn, `INSERT INTO ${table} (id, word) VALUES ?`, [rows]);
    assert(result.affectedRows === 50 && sent.startsWith(`INSERT INTO ${table} (id, word) VALUES (0, 'w0'), (1, `), sent);
    this.sent('batch', 'Query', sent);
    assert(same(await this.query('batch', `SELECT COUNT(*) FROM ${table}`), [[50]]), 'COUNT(*)');
    await this.query('batch', `DROP TABLE ${table}`);
  }

  async pipeline() {
    this.unsupported('pipeline', "mysql2 queues commands: each is written after the reply to the one before is read");
  }

  resetConnection() {
    assert(typeof this.conn.reset === 'function', 'mysql2 has reset()');
    return new Promise((resolve, reject) => this.conn.reset((err) => (err ? reject(err) : resolve())));
  }

  async reset() {
    await this.resetAndPrepareAgain('reset');
  }

  changeUser(user, password) {
    return new Promise((resolve, reject) =>
      this.conn.changeUser({ user, password, database: env.MYPROBE_CLIENT_DB }, (err) =>
        err ? reject(err) : resolve()
      )
    );
  }

  async change_user() {
    await this.changeUserAndBack('change_user');
  }

  async load_local() {
    const table = `load_${TAG}`;
    const file = env.MYPROBE_CLIENT_INFILE;
    await this.table('load_local', table);
    const text = `LOAD DATA LOCAL INFILE '${file}' INTO TABLE ${table}`;
    const [result, sent] = await this.sendQuery(this.conn, {
      sql: text,
      infileStreamFactory: () => fs.createReadStream(file),
    });
    assert(sent === text && result.affectedRows === 10, json(result));
    this.sent('load_local', 'Query', text);
    assert(same(await this.query('load_local', `SELECT COUNT(*) FROM ${table}`), [[10]]), 'COUNT(*)');
    await this.query('load_local', `DROP TABLE ${table}`);
  }

  close() {
    return new Promise((resolve) => this.conn.end(() => resolve()));
  }
}

// MariaDB's Connector/Node.js (its promise API), with its defaults: pipelining (every command written at once,
// and on MariaDB a COM_STMT_PREPARE followed by its COM_STMT_EXECUTE before the prepare's reply), bulk batches
// (COM_STMT_BULK_EXECUTE on MariaDB), its cache of prepared statements (256).
class Mariadb extends Client {
  async connect(user, password, options) {
    const mariadb = load('mariadb');
    return mariadb.createConnection({
      host: env.MYPROBE_CLIENT_HOST,
      port: Number(env.MYPROBE_CLIENT_PORT),
      user,
      password,
      database: env.MYPROBE_CLIENT_DB,
      multipleStatements: true,
      compress: this.compress,
      // caching_sha2_password (MySQL's default) without TLS needs the server's RSA key; ignored by MariaDB.
      allowPublicKeyRetrieval: true,
      ...options,
    });
  }

  async rows(conn, sql) {
    return conn.query({ sql, rowsAsArray: true });
  }

  async results(conn, sql) {
    const sets = await conn.query({ sql, rowsAsArray: true });
    return sets.filter(Array.isArray);
  }

  execute(sql, values) {
    return this.conn.execute({ sql, rowsAsArray: true }, values);
  }

  async batch() {
    const table = `batch_${TAG}`;
    await this.table('batch', table);
    const sql = `INSERT INTO ${table} (id, word) VALUES (?, ?)`;
    const rows = Array.from({ length: 50 }, (_, i) => [i, `w${i}`]);
    const result = await this.conn.batch(sql, rows);
    // One result for all the rows (bulk), or one a row (executions, on MySQL).
    const affected = [result].flat().reduce((sum, r) => sum + Number(r.affectedRows), 0);
    assert(affected === 50, json(result));
    this.sent('batch', 'Prepare', sql);
    if (MARIADB) {
      // One COM_STMT_BULK_EXECUTE carries all the rows (MARIADB_CLIENT_STMT_BULK_OPERATIONS).
      this.sent('batch', 'Bulk_execute', sql);
    } else {
      // No bulk on MySQL: one COM_STMT_EXECUTE a row, written without waiting for the replies.
      for (let i = 0; i < rows.length; i++) this.sent('batch', 'Execute', sql);
    }
    assert(same(await this.query('batch', `SELECT COUNT(*) FROM ${table}`), [[50n]]), 'COUNT(*)');
    await this.query('batch', `DROP TABLE ${table}`);
  }

  async pipeline() {
    // Five queries written at once, before any reply is read.
    const texts = [0, 1, 2, 3, 4].map((i) => `SELECT '${TAG}-pipeline', ${i}`);
    const all = await Promise.all(texts.map((sql) => this.conn.query({ sql, rowsAsArray: true })));
    all.forEach((rows, i) => assert(same(rows, [[`${TAG}-pipeline`, i]]), json(rows)));
    for (const text of texts) this.sent('pipeline', 'Query', text);
    if (MARIADB) {
      // A statement not prepared yet: COM_STMT_PREPARE and COM_STMT_EXECUTE (of statement -1, "the last
      // prepared") written together; the execution after it takes the statement from the cache.
      await this.executeTimes('pipeline', `SELECT id, '${TAG}' FROM sbtest1 WHERE id = ? AND 'pipelined' = 'pipelined'`, 2);
    } else {
      process.stderr.write('pipeline: on MySQL, the connector waits for the prepare before it executes\n');
    }
  }

  async resetConnection() {
    await this.conn.reset();
  }

  async reset() {
    await this.resetAndPrepareAgain('reset');
  }

  changeUser(user, password) {
    return this.conn.changeUser({ user, password, database: env.MYPROBE_CLIENT_DB });
  }

  async change_user() {
    if (!MARIADB) {
      this.unsupported('change_user', 'the connector refuses changeUser on MySQL servers (MySQL Bug #83472)');
      return;
    }
    await this.changeUserAndBack('change_user');
  }

  async load_local() {
    // permitLocalInfile and pipelining are exclusive in this connector: a connection of its own.
    const conn = await this.connect(this.user, env.MYPROBE_CLIENT_PASSWORD, { permitLocalInfile: true });
    const id = await this.connectionId(conn);
    const table = `load_${TAG}`;
    await this.table('load_local', table, conn, id);
    const text = `LOAD DATA LOCAL INFILE '${env.MYPROBE_CLIENT_INFILE}' INTO TABLE ${table}`;
    const result = await conn.query(text);
    assert(Number(result.affectedRows) === 10, json(result));
    this.sent('load_local', 'Query', text, id);
    assert(same(await this.query('load_local', `SELECT COUNT(*) FROM ${table}`, conn, id), [[10n]]), 'COUNT(*)');
    await this.query('load_local', `DROP TABLE ${table}`, conn, id);
    await conn.end();
  }

  close() {
    return this.conn.end();
  }
}

async function main() {
  const args = process.argv.slice(2);
  if (args.length === 1 && args[0] === '--list') {
    process.stdout.write(CONFIGURATIONS.join('\n') + '\n');
    return;
  }
  const classes = {
    mysql2: () => new Mysql2(false),
    'mysql2-compressed': () => new Mysql2(true),
    mariadb: () => new Mariadb(false),
    'mariadb-compressed': () => new Mariadb(true),
  };
  if (args.length !== 1 || !classes[args[0]]) {
    process.stderr.write(`usage: clients.js {${CONFIGURATIONS.join('|')}|--list}\n`);
    process.exit(2);
  }
  await classes[args[0]]().run();
}

main().catch((err) => {
  process.stderr.write(`${err && err.stack ? err.stack : err}\n`);
  process.exit(1);
});
