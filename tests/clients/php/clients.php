<?php
// The PHP configurations of the client conformance suite (tests/clients/README.md), Debian 12's PHP 8.2 and its
// mysqlnd: mysqli with its defaults (no TLS; text queries, server-side prepares, multi_query, change_user),
// mysqli-compressed (MYSQLI_CLIENT_COMPRESS), pdo (PDO MySQL's defaults: emulated prepares, so a prepared statement
// is sent as text with its values in it) and pdo-native (PDO::ATTR_EMULATE_PREPARES false: PDO::query and
// PDO::prepare prepare on the server; PDO::exec sends text). Each statement is listed after the library said it
// went through, and its results are checked; anything unexpected ends the program (exit 1).
// Usage: php clients.php CONFIGURATION | --list.
declare(strict_types=1);

const CONFIGURATIONS = ['mysqli', 'mysqli-compressed', 'pdo', 'pdo-native'];
const MODES = ['text', 'prepared', 'batch', 'pipeline', 'multi', 'call', 'reset', 'change_user', 'load_local', 'big'];
const BIG = 17 * 1024 * 1024;
const SHOWN = 4096;

$configuration = $argv[1] ?? '';

function fail(string $message): never
{
    global $configuration;
    fwrite(STDERR, "clients $configuration: $message\n");
    exit(1);
}

set_error_handler(function (int $no, string $message, string $file, int $line): bool {
    fail("PHP: $message ($file:$line)");
});
set_exception_handler(function (Throwable $e): void {
    fail(get_class($e) . ': ' . $e->getMessage() . ' (' . $e->getFile() . ':' . $e->getLine() . ')');
});

function env(string $name): string
{
    $value = getenv($name);
    if ($value === false || $value === '') {
        fail("$name is not set");
    }
    return $value;
}

/** Result sets as a string: columns split by tabs, rows by newlines, result sets by `|`. */
function show(array $sets): string
{
    return implode('|', array_map(fn($rows) => implode("\n", array_map(
        fn($row) => implode("\t", array_map(fn($v) => $v === null ? 'NULL' : (string) $v, $row)),
        $rows
    )), $sets));
}

function expect(string $what, string $got, string $wanted): void
{
    if ($got !== $wanted) {
        fail(sprintf('%.200s gave "%.200s", not "%.200s"', $what, $got, $wanted));
    }
}

abstract class Client
{
    public string $tag;
    public string $user;
    public int $id;
    public bool $mariadb;

    public function __construct(public string $configuration)
    {
        $this->tag = env('MYPROBE_CLIENT_TAG');
        $server = env('MYPROBE_CLIENT_SERVER');
        if ($server !== 'mariadb' && $server !== 'mysql') {
            fail("MYPROBE_CLIENT_SERVER is $server, not mariadb or mysql");
        }
        $this->mariadb = $server === 'mariadb';
        $this->user = env('MYPROBE_CLIENT_USER');
        $this->connect($this->user, env('MYPROBE_CLIENT_PASSWORD'));
        $this->id = $this->connectionId();
        $version = $this->sets('SELECT VERSION()')[0][0][0];
        if (str_contains($version, 'MariaDB') !== $this->mariadb) {
            fail("the server is $version, but MYPROBE_CLIENT_SERVER says $server");
        }
        fwrite(STDERR, "clients $configuration: PHP " . PHP_VERSION . ", server $version, connection {$this->id}\n");
    }

    abstract protected function connect(string $user, string $password): void;

    /** A statement's result sets, by whatever the configuration sends for it; not listed. */
    abstract protected function sets(string $text): array;

    /** Lists a statement sent as text (COM_QUERY), or prepared and executed, as the configuration sends it. */
    abstract protected function listed(string $mode, string $text): void;

    public function sent(string $mode, string $command, string $text): void
    {
        $shown = strlen($text);
        if ($shown > SHOWN) {
            $shown = SHOWN;
            while ($shown > 0 && (ord($text[$shown]) & 0xc0) === 0x80) {
                $shown--;
            }
        }
        $escaped = strtr(substr($text, 0, $shown), ["\\" => "\\\\", "\t" => "\\t", "\n" => "\\n", "\r" => "\\r"]);
        echo "statement\t$mode\t{$this->id}\t{$this->user}\t$command\t" . strlen($text) . "\t$escaped\n";
    }

    public function unsupported(string $mode, string $reason): void
    {
        echo "unsupported\t$mode\t$reason\n";
    }

    protected function connectionId(): int
    {
        $id = (int) $this->sets('SELECT CONNECTION_ID()')[0][0][0];
        if ($id <= 0) {
            fail('no connection id');
        }
        return $id;
    }

    /** A statement whose results are read, listed; checked when `wanted` is given. */
    protected function query(string $mode, string $text, ?string $wanted = null): void
    {
        $got = show($this->sets($text));
        if ($wanted !== null) {
            expect($text, $got, $wanted);
        }
        $this->listed($mode, $text);
    }

    /** A statement that returns no rows (DDL, LOAD DATA): its affected rows. */
    abstract protected function execute(string $mode, string $text): int;

    public function text(): void
    {
        for ($i = 0; $i < 5; $i++) {
            $this->query('text', "SELECT '{$this->tag}-text', $i", "{$this->tag}-text\t$i");
        }
        $this->query('text', "SELECT '{$this->tag}-unicode: café, 東京, 🐬'", "{$this->tag}-unicode: café, 東京, 🐬");
    }

    /** The text of the prepared statements of a mode: the mode in it, to tell them from other modes'. */
    protected function preparedText(string $mode): string
    {
        return "SELECT id, '{$this->tag}-$mode' FROM sbtest1 WHERE id = ?";
    }

    protected function checkRow(array $row, int $id, string $mode): void
    {
        expect('a prepared statement', show([[$row]]), "$id\t{$this->tag}-$mode");
    }

    public function call(): void
    {
        $procedure = "p_{$this->tag}";
        $this->execute('call', "CREATE PROCEDURE $procedure() BEGIN SELECT 1 AS first; SELECT 2 AS second; END");
        $this->query('call', "CALL $procedure()", $this->callSets());
        $this->execute('call', "DROP PROCEDURE $procedure");
    }

    /** What the CALL's result sets read as: its two, then its own status (no result set). */
    protected function callSets(): string
    {
        return '1|2';
    }

    public function table(string $mode, string $prefix): string
    {
        $table = "{$prefix}_{$this->tag}";
        $this->execute($mode, "CREATE TABLE $table (id INT PRIMARY KEY, word VARCHAR(64))");
        return $table;
    }

    public function load_local(): void
    {
        $file = env('MYPROBE_CLIENT_INFILE');
        if (strpbrk($file, "'\\") !== false) {
            fail("MYPROBE_CLIENT_INFILE has a quote or a backslash: $file");
        }
        $table = $this->table('load_local', 'load');
        $rows = $this->execute('load_local', "LOAD DATA LOCAL INFILE '$file' INTO TABLE $table");
        if ($rows !== 10) {
            fail("LOAD DATA LOCAL INFILE: $rows rows");
        }
        $this->query('load_local', "SELECT COUNT(*) FROM $table", '10');
        $this->execute('load_local', "DROP TABLE $table");
    }

    public function big(): void
    {
        $this->query('big', "SELECT '{$this->tag}-big', LENGTH('" . str_repeat('x', BIG) . "')",
            "{$this->tag}-big\t" . BIG);
    }

    public function run(): void
    {
        foreach (MODES as $mode) {
            fwrite(STDERR, "$mode\n");
            $this->$mode();
        }
        $this->close();
    }

    abstract protected function close(): void;
}

class MysqliClient extends Client
{
    private mysqli $db;

    protected function connect(string $user, string $password): void
    {
        mysqli_report(MYSQLI_REPORT_ERROR | MYSQLI_REPORT_STRICT);
        $this->db = mysqli_init();
        $this->db->options(MYSQLI_OPT_LOCAL_INFILE, true);
        $this->db->real_connect(env('MYPROBE_CLIENT_HOST'), $user, $password, env('MYPROBE_CLIENT_DB'),
            (int) env('MYPROBE_CLIENT_PORT'), null, $this->compressed() ? MYSQLI_CLIENT_COMPRESS : 0);
    }

    private function compressed(): bool
    {
        return $this->configuration === 'mysqli-compressed';
    }

    public function __construct(string $configuration)
    {
        parent::__construct($configuration);
        // The connection compresses as the configuration says.
        if ($this->mariadb) {
            $status = $this->sets("SHOW SESSION STATUS LIKE 'Compression'")[0];
            expect('the session\'s Compression', $status[0][1] ?? '', $this->compressed() ? 'ON' : 'OFF');
        } else {
            $status = $this->sets("SHOW SESSION STATUS LIKE 'Compression_algorithm'")[0];
            expect('the session\'s Compression_algorithm', $status[0][1] ?? '', $this->compressed() ? 'zlib' : '');
        }
    }

    private function results(): array
    {
        $sets = [];
        do {
            $result = $this->db->store_result();
            if ($result !== false) {
                $sets[] = $result->fetch_all(MYSQLI_NUM);
                $result->free();
            } elseif ($this->db->errno) {
                fail($this->db->error);
            }
        } while ($this->db->more_results() && $this->db->next_result());
        return $sets;
    }

    protected function sets(string $text): array
    {
        // mysqli::query reads the first result only: real_query and every result, for CALL.
        $this->db->real_query($text);
        return $this->results();
    }

    protected function listed(string $mode, string $text): void
    {
        $this->sent($mode, 'Query', $text);
    }

    protected function execute(string $mode, string $text): int
    {
        $this->db->query($text);
        $rows = $this->db->affected_rows;
        $this->sent($mode, 'Query', $text);
        return (int) $rows;
    }

    private function prepareAndExecute(string $mode, int $times): void
    {
        $text = $this->preparedText($mode);
        $statement = $this->db->prepare($text);
        $this->sent($mode, 'Prepare', $text);
        $id = 0;
        $statement->bind_param('i', $id);
        for ($i = 1; $i <= $times; $i++) {
            $id = $i;
            $statement->execute();
            $result = $statement->get_result();
            $rows = $result->fetch_all(MYSQLI_NUM);
            if (count($rows) !== 1) {
                fail(count($rows) . " rows from $text");
            }
            $this->checkRow($rows[0], $i, $mode);
            $result->free();
            $this->sent($mode, 'Execute', $text);
        }
        $statement->close();
    }

    public function prepared(): void
    {
        $this->prepareAndExecute('prepared', 5);
    }

    public function batch(): void
    {
        $this->unsupported('batch', 'mysqli has no batch: no array binding, no rewriting');
    }

    public function pipeline(): void
    {
        $this->unsupported('pipeline', 'mysqlnd waits for each reply (MYSQLI_ASYNC leaves one query in flight)');
    }

    public function multi(): void
    {
        $text = "SELECT '{$this->tag}-multi', 1; SELECT '{$this->tag}-multi', 2";
        // multi_query turns the server's multi-statement option on (COM_SET_OPTION) around its COM_QUERY.
        $this->db->multi_query($text);
        expect($text, show($this->results()), "{$this->tag}-multi\t1|{$this->tag}-multi\t2");
        $this->sent('multi', 'Query', $text);
    }

    public function reset(): void
    {
        $this->unsupported('reset', 'mysqli has no COM_RESET_CONNECTION (mysqlnd has no call that sends it)');
    }

    private function changeTo(string $user, string $password): void
    {
        $this->db->change_user($user, $password, env('MYPROBE_CLIENT_DB'));
        $this->user = $user;
        if ($this->connectionId() !== $this->id) {
            fail('another connection after change_user');
        }
    }

    public function change_user(): void
    {
        $this->changeTo(env('MYPROBE_CLIENT_USER2'), env('MYPROBE_CLIENT_PASSWORD2'));
        for ($i = 0; $i < 3; $i++) {
            $text = "SELECT '{$this->tag}-changed', $i, CURRENT_USER()";
            $got = show($this->sets($text));
            if (!str_starts_with($got, "{$this->tag}-changed\t$i\t{$this->user}@")) {
                fail("$text gave $got");
            }
            $this->sent('change_user', 'Query', $text);
        }
        $this->prepareAndExecute('change_user', 2);
        // Back, for the modes after this one.
        $this->changeTo(env('MYPROBE_CLIENT_USER'), env('MYPROBE_CLIENT_PASSWORD'));
    }

    protected function close(): void
    {
        $this->db->close();
    }
}

class PdoClient extends Client
{
    private PDO $db;

    private function native(): bool
    {
        return $this->configuration === 'pdo-native';
    }

    protected function connect(string $user, string $password): void
    {
        $dsn = sprintf('mysql:host=%s;port=%s;dbname=%s', env('MYPROBE_CLIENT_HOST'), env('MYPROBE_CLIENT_PORT'),
            env('MYPROBE_CLIENT_DB'));
        $options = [
            PDO::ATTR_ERRMODE => PDO::ERRMODE_EXCEPTION,
            PDO::MYSQL_ATTR_MULTI_STATEMENTS => true,
            PDO::MYSQL_ATTR_LOCAL_INFILE => true,
        ];
        if ($this->native()) {
            $options[PDO::ATTR_EMULATE_PREPARES] = false;
        }
        $this->db = new PDO($dsn, $user, $password, $options);
        if ((bool) $this->db->getAttribute(PDO::ATTR_EMULATE_PREPARES) === $this->native()) {
            fail('PDO::ATTR_EMULATE_PREPARES is not as configured');
        }
    }

    private function rowsets(PDOStatement $statement): array
    {
        $sets = [];
        do {
            if ($statement->columnCount() > 0) {
                $sets[] = $statement->fetchAll(PDO::FETCH_NUM);
            }
        } while ($statement->nextRowset());
        $statement->closeCursor();
        return $sets;
    }

    protected function sets(string $text): array
    {
        return $this->rowsets($this->db->query($text));
    }

    protected function listed(string $mode, string $text): void
    {
        if ($this->native()) {
            // PDO::query prepares and executes on the server.
            $this->sent($mode, 'Prepare', $text);
            $this->sent($mode, 'Execute', $text);
        } else {
            $this->sent($mode, 'Query', $text);
        }
    }

    protected function execute(string $mode, string $text): int
    {
        // PDO::exec sends text, prepares emulated or not.
        $rows = $this->db->exec($text);
        $this->sent($mode, 'Query', $text);
        return $rows;
    }

    public function text(): void
    {
        if (!$this->native()) {
            parent::text();
            return;
        }
        // PDO::query prepares on the server: text statements are PDO::exec's, which reads no rows.
        for ($i = 0; $i < 5; $i++) {
            expect('DO', (string) $this->execute('text', "DO '{$this->tag}-text', $i"), '0');
        }
        expect('DO', (string) $this->execute('text', "DO '{$this->tag}-unicode: café, 東京, 🐬'"), '0');
    }

    /** The text an emulated prepare sent, as PDOStatement::debugDumpParams shows it. */
    private function sentText(PDOStatement $statement): string
    {
        ob_start();
        $statement->debugDumpParams();
        $dump = ob_get_clean();
        if (!preg_match('/^Sent SQL: \[(\d+)\] /m', $dump, $m, PREG_OFFSET_CAPTURE)) {
            fail("no Sent SQL in debugDumpParams: $dump");
        }
        return substr($dump, $m[0][1] + strlen($m[0][0]), (int) $m[1][0]);
    }

    public function prepared(): void
    {
        $text = $this->preparedText('prepared');
        $statement = $this->db->prepare($text);
        if ($this->native()) {
            $this->sent('prepared', 'Prepare', $text);
        }
        for ($i = 1; $i <= 5; $i++) {
            $statement->execute([$i]);
            $rows = $statement->fetchAll(PDO::FETCH_NUM);
            if (count($rows) !== 1) {
                fail(count($rows) . " rows from $text");
            }
            $this->checkRow($rows[0], $i, 'prepared');
            if ($this->native()) {
                $this->sent('prepared', 'Execute', $text);
            } else {
                // Emulated: the values quoted into the text, one COM_QUERY each (execute() binds them as strings).
                $sent = $this->sentText($statement);
                expect('the emulated statement', $sent, str_replace('?', "'$i'", $text));
                $this->sent('prepared', 'Query', $sent);
            }
        }
        $statement = null;
    }

    public function batch(): void
    {
        $this->unsupported('batch', 'PDO has no batch: no array binding, no rewriting');
    }

    public function pipeline(): void
    {
        $this->unsupported('pipeline', 'PDO waits for each reply');
    }

    public function multi(): void
    {
        if ($this->native()) {
            // Statements cannot be prepared together: PDO::exec sends them as text. It reads the results of the
            // statements after the first away only when the first returned no rows (else the connection is left
            // with pending result sets): statements without rows.
            $text = "DO '{$this->tag}-multi', 1; DO '{$this->tag}-multi', 2";
            expect($text, (string) $this->execute('multi', $text), '0');
            return;
        }
        $text = "SELECT '{$this->tag}-multi', 1; SELECT '{$this->tag}-multi', 2";
        expect($text, show($this->sets($text)), "{$this->tag}-multi\t1|{$this->tag}-multi\t2");
        $this->sent('multi', 'Query', $text);
    }

    protected function callSets(): string
    {
        // Prepared on the server, the CALL's closing status reads as a third rowset, with columns and no rows.
        return $this->native() ? '1|2|' : '1|2';
    }

    public function reset(): void
    {
        $this->unsupported('reset', 'PDO has no COM_RESET_CONNECTION');
    }

    public function change_user(): void
    {
        $this->unsupported('change_user', 'PDO has no COM_CHANGE_USER');
    }

    protected function close(): void
    {
        unset($this->db);
    }
}

if ($configuration === '--list') {
    echo implode("\n", CONFIGURATIONS), "\n";
} elseif (str_starts_with($configuration, 'mysqli') && in_array($configuration, CONFIGURATIONS, true)) {
    (new MysqliClient($configuration))->run();
} elseif (str_starts_with($configuration, 'pdo') && in_array($configuration, CONFIGURATIONS, true)) {
    (new PdoClient($configuration))->run();
} else {
    fail('usage: clients.php {' . implode('|', CONFIGURATIONS) . '|--list}');
}
