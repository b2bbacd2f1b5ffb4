//! The connection layer: SQL to the traced server, for the commands that join what the probes see with what the
//! server says (`information_schema.PROCESSLIST`, performance_schema).
//!
//! Connecting follows the MySQL clients' conventions: flags (`ConnectArgs`), then the option file (`~/.my.cnf`
//! or `--defaults-file`, groups [client], [client-server], [client-mariadb]), then the environment
//! (`MYSQL_PWD`), then defaults: the OS user through the unix socket the traced server listens on. A password
//! is never taken on the command line. Every wait is bounded by `--connect-timeout` (2 s), and every failure is
//! a one-line error saying what was tried and what to do: callers print it and go on without SQL.

pub mod option_file;
pub mod socket;

use std::{
    fmt,
    path::{Path, PathBuf},
    sync::mpsc,
    time::Duration,
};

use anyhow::{anyhow, bail, Context, Result};
use mysql::{prelude::Queryable, Conn, OptsBuilder, Value};

use crate::collect::monotonic_ns;

// Flattened into the arguments of the commands that talk SQL (`#[command(flatten)]`).
/// How to reach the server for SQL: flags, then the option file, then MYSQL_PWD, then defaults.
#[derive(clap::Args, Clone, Debug)]
#[command(next_help_heading = "Connecting to the server for SQL")]
pub struct ConnectArgs {
    /// Unix socket of the server [default: the one the traced server listens on]
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Connect over TCP to HOST (`localhost` means the unix socket, as for the mysql client)
    #[arg(long, value_name = "HOST")]
    pub host: Option<String>,
    /// TCP port [default: 3306]; without --host, connects to 127.0.0.1
    #[arg(long, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub port: Option<u16>,
    /// User name [default: the option file's, else the OS user, whom unix-socket authentication admits]
    #[arg(long, value_name = "NAME")]
    pub user: Option<String>,
    /// Read the password from FILE (its only line); else MYSQL_PWD or the option file give it
    #[arg(long, value_name = "FILE")]
    pub password_file: Option<PathBuf>,
    /// Read this option file instead of ~/.my.cnf (groups [client], [client-server], [client-mariadb])
    #[arg(long, value_name = "FILE")]
    pub defaults_file: Option<PathBuf>,
    /// Seconds to wait for the server to accept the connection, and for each answer
    #[arg(long, value_name = "SECS", default_value_t = DEFAULT_TIMEOUT_SECS)]
    pub connect_timeout: f64,
    /// Refused with advice: a password on the command line is readable by every user (ps, /proc).
    #[arg(long = "password", hide = true, num_args = 0..=1, value_name = "PASSWORD")]
    pub password_on_command_line: Option<Option<String>>,
}

pub const DEFAULT_TIMEOUT_SECS: f64 = 2.0;

impl Default for ConnectArgs {
    fn default() -> Self {
        ConnectArgs {
            socket: None,
            host: None,
            port: None,
            user: None,
            password_file: None,
            defaults_file: None,
            connect_timeout: DEFAULT_TIMEOUT_SECS,
            password_on_command_line: None,
        }
    }
}

/// What the process environment gives a client; explicit so that tests need not change their own.
#[derive(Clone, Debug, Default)]
pub struct Environment {
    /// Where `~/.my.cnf` is.
    pub home: Option<PathBuf>,
    pub mysql_pwd: Option<String>,
    /// The effective user's name: the default user, as unix-socket authentication knows it.
    pub os_user: Option<String>,
}

impl Environment {
    pub fn current() -> Environment {
        Environment {
            home: std::env::var_os("HOME")
                .filter(|h| !h.is_empty())
                .map(PathBuf::from),
            mysql_pwd: std::env::var("MYSQL_PWD").ok().filter(|p| !p.is_empty()),
            os_user: effective_user_name(),
        }
    }
}

fn effective_user_name() -> Option<String> {
    // SAFETY: geteuid has no preconditions; getpwuid_r writes only into pw and buf, whose sizes it is given,
    // and result points into them or is null.
    unsafe {
        let mut pw: libc::passwd = std::mem::zeroed();
        let mut buf = vec![0 as libc::c_char; 4096];
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        let rc = libc::getpwuid_r(
            libc::geteuid(),
            &mut pw,
            buf.as_mut_ptr(),
            buf.len(),
            &mut result,
        );
        if rc != 0 || result.is_null() || pw.pw_name.is_null() {
            return std::env::var("USER").ok();
        }
        Some(
            std::ffi::CStr::from_ptr(pw.pw_name)
                .to_string_lossy()
                .into_owned(),
        )
    }
}

/// Where the server is reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `origin` says where the path came from (`--socket`, the option file, listening in PID N, the default).
    Socket {
        path: PathBuf,
        origin: String,
    },
    Tcp {
        host: String,
        port: u16,
    },
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Socket { path, origin } => write!(f, "socket {} ({origin})", path.display()),
            Endpoint::Tcp { host, port } if host.contains(':') => write!(f, "TCP [{host}]:{port}"),
            Endpoint::Tcp { host, port } => write!(f, "TCP {host}:{port}"),
        }
    }
}

/// Everything decided before connecting: what [`Client::connect`] tries, and says it tried.
#[derive(Clone)]
pub struct Settings {
    pub endpoint: Endpoint,
    pub user: String,
    password: Option<String>,
    /// Where the password came from (`--password-file F`, `MYSQL_PWD`, the option file's path), if any.
    pub password_source: Option<String>,
    /// Bounds the connection and each read and write.
    pub timeout: Duration,
    /// What was not followed in the option file, for the caller to say.
    pub notes: Vec<String>,
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
            .field("endpoint", &self.endpoint)
            .field("user", &self.user)
            .field("password_source", &self.password_source)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Settings {
    /// "socket X (origin) as 'user' with the password from Y": the attempt, for messages.
    pub fn describe(&self) -> String {
        let password = match &self.password_source {
            Some(source) => format!("with the password from {source}"),
            None => "without a password".into(),
        };
        format!("{} as '{}' {password}", self.endpoint, self.user)
    }

    fn timeout_text(&self) -> String {
        format!("{} s", trim_float(self.timeout.as_secs_f64()))
    }
}

fn trim_float(x: f64) -> String {
    let s = format!("{x:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

impl ConnectArgs {
    /// The settings for reaching the server with PID `server_pid` (whose socket is looked for when none is given),
    /// in this process's environment.
    pub fn settings(&self, server_pid: Option<u32>) -> Result<Settings> {
        self.settings_in(&Environment::current(), server_pid)
    }

    /// As [`ConnectArgs::settings`], in the environment `env`.
    pub fn settings_in(&self, env: &Environment, server_pid: Option<u32>) -> Result<Settings> {
        if self.password_on_command_line.is_some() {
            bail!(
                "myprobe takes no password on its command line, where every user can read it (ps, /proc): \
                 use --password-file FILE, MYSQL_PWD, or password= under [client] in ~/.my.cnf"
            );
        }
        if !(self.connect_timeout.is_finite()
            && self.connect_timeout > 0.0
            && self.connect_timeout <= 3600.0)
        {
            bail!(
                "--connect-timeout {} is not a number of seconds in (0, 3600]",
                self.connect_timeout
            );
        }
        let (file, file_path) = self.option_file(env)?;
        let file_source = file_path
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default();

        let endpoint = self.endpoint(&file, &file_source, server_pid);
        let user = match (&self.user, &file.user, &env.os_user) {
            (Some(u), _, _) | (None, Some(u), _) | (None, None, Some(u)) => u.clone(),
            (None, None, None) => bail!(
                "cannot tell which user to connect as (no --user, no user= in the option file, and the OS user has \
                 no name): give --user"
            ),
        };
        if user.is_empty() {
            bail!("the user name is empty: give --user NAME");
        }
        let (password, password_source) = if let Some(path) = &self.password_file {
            (
                Some(read_password_file(path, "--password-file")?),
                Some(format!("--password-file {}", path.display())),
            )
        } else if let Some(p) = &file.password {
            (Some(p.clone()), Some(file_source.clone()))
        } else if let Some(p) = &env.mysql_pwd {
            (Some(p.clone()), Some("MYSQL_PWD".into()))
        } else {
            (None, None)
        };
        Ok(Settings {
            endpoint,
            user,
            password,
            password_source,
            timeout: Duration::from_secs_f64(self.connect_timeout),
            notes: file
                .notes
                .iter()
                .map(|n| format!("{file_source}: {n}"))
                .collect(),
        })
    }

    /// `--defaults-file`, else `~/.my.cnf` if there is one; and its path.
    fn option_file(
        &self,
        env: &Environment,
    ) -> Result<(option_file::ClientOptions, Option<PathBuf>)> {
        if let Some(path) = &self.defaults_file {
            return Ok((option_file::read(path)?, Some(path.clone())));
        }
        let Some(path) = env.home.as_ref().map(|h| h.join(".my.cnf")) else {
            return Ok(Default::default());
        };
        match std::fs::metadata(&path) {
            Ok(_) => Ok((option_file::read(&path)?, Some(path))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Default::default()),
            Err(e) => Err(anyhow!("cannot read {}: {e}", path.display())),
        }
    }

    /// A flag names the endpoint over anything in the file; `localhost` means the unix socket, as for MySQL's
    /// clients; a port alone means TCP to the local server.
    fn endpoint(
        &self,
        file: &option_file::ClientOptions,
        file_source: &str,
        server_pid: Option<u32>,
    ) -> Endpoint {
        let port = self.port.or(file.port).unwrap_or(3306);
        let socket = |flag: bool| -> Endpoint {
            match (&self.socket, &file.socket) {
                (Some(path), _) => Endpoint::Socket {
                    path: path.clone(),
                    origin: "--socket".into(),
                },
                (None, Some(path)) if !flag => Endpoint::Socket {
                    path: path.into(),
                    origin: file_source.to_string(),
                },
                _ => {
                    let found = socket::server_socket(server_pid);
                    Endpoint::Socket {
                        path: found.path,
                        origin: found.origin,
                    }
                }
            }
        };
        let tcp = |host: &str| Endpoint::Tcp {
            host: host.to_string(),
            port,
        };
        if self.socket.is_some() {
            return socket(true);
        }
        match (&self.host, self.port) {
            (Some(h), _) if h == "localhost" => return socket(true),
            (Some(h), _) => return tcp(h),
            (None, Some(_)) => return tcp("127.0.0.1"),
            (None, None) => {}
        }
        match &file.host {
            Some(h) if h != "localhost" => tcp(h),
            _ => socket(false),
        }
    }
}

/// The password a file holds alone (a line, its end of line not part of it), as option `flag` gave it.
pub fn read_password_file(path: &Path, flag: &str) -> Result<String> {
    let bytes =
        std::fs::read(path).with_context(|| format!("cannot read {flag} {}", path.display()))?;
    let text = String::from_utf8(bytes)
        .map_err(|_| anyhow!("{flag} {}: the password is not UTF-8 text", path.display()))?;
    let password = text
        .strip_suffix('\n')
        .map(|t| t.strip_suffix('\r').unwrap_or(t))
        .unwrap_or(&text);
    if password.contains('\n') {
        bail!(
            "{flag} {}: more than one line; the file should hold the password alone",
            path.display()
        );
    }
    Ok(password.to_string())
}

/// Resolves `args` for the server with PID `server_pid` and connects; what the option file had that was not
/// followed is said on stderr.
pub fn connect(args: &ConnectArgs, server_pid: Option<u32>) -> Result<Client> {
    let settings = args.settings(server_pid)?;
    for note in &settings.notes {
        say!("myprobe: note: {note}");
    }
    Client::connect(&settings)
}

/// An open connection to the server.
pub struct Client {
    conn: Conn,
    version: String,
    connection_id: u64,
    timeout: Duration,
    /// Whether performance_schema is on, once asked (it can only change at the server's start).
    performance_schema: Option<bool>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("version", &self.version)
            .field("connection_id", &self.connection_id)
            .finish_non_exhaustive()
    }
}

/// Whether performance_schema is on: asked once per connection (a tracer knows its own statement by it).
pub const PERFORMANCE_SCHEMA_ON_SQL: &str = "SELECT @@performance_schema";

/// A statement prepared on a connection ([`Client::prepared_statements`]).
#[derive(Clone, Debug, PartialEq)]
pub struct PreparedStatement {
    /// The OS thread of its connection, as the server's PID namespace numbers it.
    pub tid: u32,
    /// The id the protocol gives it (what COM_STMT_EXECUTE names).
    pub id: u32,
    pub text: String,
    /// The text is as long as the server keeps one: it may have been cut.
    pub truncated: bool,
}

/// The server's process list at one moment, the own connection apart.
#[derive(Clone, Debug)]
pub struct Processlist {
    /// CLOCK_MONOTONIC (the clock of `bpf_ktime_get_ns`), ns, just before the query was sent: a statement in
    /// a row began before this.
    pub sent_ns: u64,
    /// CLOCK_MONOTONIC, ns, just after the last row was read: the rows were true at some moment in between.
    pub received_ns: u64,
    pub rows: Vec<ProcessRow>,
    /// The own connection's row: its `time_ms` counts from the start of the statement that read the list, one
    /// clock reading of the server's for all rows.
    pub own: Option<ProcessRow>,
}

/// One connection or server thread.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessRow {
    /// The connection id (`CONNECTION_ID()`, what KILL takes).
    pub id: u64,
    /// The OS thread id serving it (MariaDB's `TID`): the tid of BPF events. None when the server gives none.
    pub tid: Option<u32>,
    pub user: String,
    pub db: Option<String>,
    /// `Query`, `Sleep`, `Daemon`, ...
    pub command: String,
    /// Time in the current state, ms (`TIME_MS`).
    pub time_ms: f64,
    pub state: Option<String>,
    /// The statement's text as the client sent it: it may hold secrets and terminal escapes; callers normalize
    /// it or pass it through `render::terminal_safe`.
    pub info: Option<String>,
}

impl Client {
    /// Connects as `settings` say, within `settings.timeout`, and reads the server's version.
    pub fn connect(settings: &Settings) -> Result<Client> {
        let timeout = settings.timeout;
        let mut opts = OptsBuilder::new()
            .user(Some(settings.user.clone()))
            .pass(settings.password.clone())
            .read_timeout(Some(timeout))
            .write_timeout(Some(timeout))
            .tcp_connect_timeout(Some(timeout))
            // The endpoint asked for, not a socket the server reports over TCP.
            .prefer_socket(false)
            .stmt_cache_size(0);
        opts = match &settings.endpoint {
            Endpoint::Socket { path, .. } => {
                let path = path
                    .to_str()
                    .ok_or_else(|| anyhow!("the socket path {} is not UTF-8", path.display()))?;
                opts.socket(Some(path))
            }
            Endpoint::Tcp { host, port } => opts.ip_or_hostname(Some(host.clone())).tcp_port(*port),
        };
        // The connection is made in a thread of its own, so that no step the socket timeouts miss (a unix
        // connect to a full backlog, several reads each just under the timeout) can hold the caller longer.
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("myprobe-connect".into())
            .spawn(move || {
                let result = Conn::new(opts).and_then(|mut conn| {
                    let version: Option<String> = conn.query_first("SELECT VERSION()")?;
                    Ok((conn, version.unwrap_or_default()))
                });
                let _ = tx.send(result);
            })
            .context("cannot start a thread to connect")?;
        let fail = |reason: String, hint: &str| {
            let hint = if hint.is_empty() {
                String::new()
            } else {
                format!(": {hint}")
            };
            anyhow!(
                "cannot connect to the server through {}: {reason}{hint}",
                settings.describe()
            )
        };
        match rx.recv_timeout(timeout + Duration::from_millis(250)) {
            Ok(Ok((conn, version))) => Ok(Client {
                connection_id: u64::from(conn.connection_id()),
                conn,
                version,
                timeout,
                performance_schema: None,
            }),
            Ok(Err(e)) => {
                let (reason, hint) = explain(&e, &settings.timeout_text());
                Err(fail(reason, hint))
            }
            Err(_) => Err(fail(
                format!(
                    "the server did not answer within {}",
                    settings.timeout_text()
                ),
                HINT_TIMEOUT,
            )),
        }
    }

    /// `VERSION()`, e.g. `10.11.19-MariaDB-0+deb12u1`.
    pub fn server_version(&self) -> &str {
        &self.version
    }

    /// The server's ways, from its version.
    pub fn server(&self) -> &'static dyn crate::server::Server {
        crate::server::of_version(&self.version)
    }

    /// This connection's id (`CONNECTION_ID()`).
    pub fn connection_id(&self) -> u64 {
        self.connection_id
    }

    /// Runs `sql` and returns its first result's rows as text, NULL as None (bytes that are not UTF-8 replaced).
    /// Each read waits at most the timeout: this is for short statements.
    pub fn query(&mut self, sql: &str) -> Result<Vec<Vec<Option<String>>>> {
        let timeout = trim_float(self.timeout.as_secs_f64());
        let rows: Vec<mysql::Row> = self.conn.query(sql).map_err(|e| {
            let (reason, _) = explain(&e, &format!("{timeout} s"));
            anyhow!("query `{}` failed: {reason}", first_words(sql))
        })?;
        Ok(rows
            .into_iter()
            .map(|row| row.unwrap().into_iter().map(text_of).collect())
            .collect())
    }

    /// The server's threads and connections, this one apart (`own`), with the OS thread serving each (as the
    /// server's PID namespace numbers it: `process::tids` maps it to the host's).
    pub fn processlist(&mut self) -> Result<Processlist> {
        self.read_processlist(self.server().processlist_sql())
    }

    /// The connections executing a prepared statement (command `Execute`), whose `info` is the statement's text
    /// with its placeholders, and the own row: what `query::texts` joins with traced executions.
    pub fn executing_prepared(&mut self) -> Result<Processlist> {
        self.read_processlist(self.server().executing_prepared_sql())
    }

    /// Whether performance_schema is on (asked once: it can only change at the server's start).
    pub fn performance_schema_on(&mut self) -> Result<bool> {
        if self.performance_schema.is_none() {
            let on = self.query(PERFORMANCE_SCHEMA_ON_SQL)?;
            let on = on.first().and_then(|r| r.first()).cloned().flatten();
            self.performance_schema = Some(on.as_deref() == Some("1"));
        }
        Ok(self.performance_schema == Some(true))
    }

    /// Prepares `sql` (a statement without parameters) and executes it once, through the binary protocol; its id.
    /// The statement stays prepared: the connection's statement cache holds it.
    pub fn execute_own(&mut self, sql: &str) -> Result<u32> {
        let failed = |e: mysql::Error| {
            let timeout = trim_float(self.timeout.as_secs_f64());
            let (reason, _) = explain(&e, &format!("{timeout} s"));
            anyhow!("`{}` failed: {reason}", first_words(sql))
        };
        let statement = self.conn.prep(sql).map_err(failed)?;
        self.conn.exec_drop(&statement, ()).map_err(failed)?;
        Ok(statement.id())
    }

    /// Every prepared statement of every connection, from performance_schema: the OS thread of its connection (the
    /// server's PID namespace's id), the id the protocol gives it, its text and whether the text may have been
    /// cut. An error says why there is none to read (a server that keeps none, performance_schema off).
    pub fn prepared_statements(&mut self) -> Result<Vec<PreparedStatement>> {
        let server = self.server();
        let Some(sql) = server.prepared_statements_sql() else {
            bail!("{} keeps no table of prepared statements", server.name());
        };
        if !self.performance_schema_on()? {
            bail!(
                "performance_schema is off on this server: the texts of statements prepared before tracing are \
                 in performance_schema.prepared_statements_instances (performance_schema=ON, at the server's start)"
            );
        }
        let max = server.prepared_statement_text_max();
        self.query(sql)?
            .into_iter()
            .map(|row| {
                let [tid, id, text]: [Option<String>; 3] =
                    row.try_into().map_err(|r: Vec<_>| {
                        anyhow!(
                            "prepared_statements_instances gave a row of {} columns, not 3",
                            r.len()
                        )
                    })?;
                let number = |v: Option<String>, name: &str| {
                    v.as_deref()
                        .and_then(|s| s.parse::<u32>().ok())
                        .ok_or_else(|| {
                            anyhow!("prepared_statements_instances' {name} `{v:?}` is not a number")
                        })
                };
                let text = text.unwrap_or_default();
                Ok(PreparedStatement {
                    tid: number(tid, "THREAD_OS_ID")?,
                    id: number(id, "STATEMENT_ID")?,
                    truncated: text.len() >= max,
                    text,
                })
            })
            .collect()
    }

    fn read_processlist(&mut self, sql: &str) -> Result<Processlist> {
        let sent_ns = monotonic_ns();
        let rows = self.query(sql)?;
        let received_ns = monotonic_ns();
        let (own, rows): (Vec<_>, Vec<_>) = rows
            .into_iter()
            .map(process_row)
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .partition(|r| r.id == self.connection_id);
        Ok(Processlist {
            sent_ns,
            received_ns,
            rows,
            own: own.into_iter().next(),
        })
    }
}

fn process_row(row: Vec<Option<String>>) -> Result<ProcessRow> {
    let [id, tid, user, db, command, time_ms, state, info]: [Option<String>; 8] = row
        .try_into()
        .map_err(|r: Vec<_>| anyhow!("PROCESSLIST gave a row of {} columns, not 8", r.len()))?;
    let number = |name: &str, v: &Option<String>| -> Result<Option<f64>> {
        v.as_deref()
            .map(|s| {
                s.trim()
                    .parse::<f64>()
                    .map_err(|_| anyhow!("PROCESSLIST's {name} `{s}` is not a number"))
            })
            .transpose()
    };
    let id = id.as_deref().unwrap_or("").parse::<u64>();
    let id = id.map_err(|_| anyhow!("PROCESSLIST has a row without a connection id"))?;
    let tid = match tid.as_deref() {
        None | Some("0") => None,
        Some(t) => Some(
            t.parse::<u32>()
                .map_err(|_| anyhow!("PROCESSLIST's TID `{t}` is not a thread id"))?,
        ),
    };
    Ok(ProcessRow {
        id,
        tid,
        user: user.unwrap_or_default(),
        db,
        command: command.unwrap_or_default(),
        time_ms: number("TIME_MS", &time_ms)?.unwrap_or(0.0),
        state: state.filter(|s| !s.is_empty()),
        info,
    })
}

fn text_of(v: Value) -> Option<String> {
    match v {
        Value::NULL => None,
        Value::Bytes(b) => Some(
            String::from_utf8(b).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into()),
        ),
        Value::Int(i) => Some(i.to_string()),
        Value::UInt(u) => Some(u.to_string()),
        Value::Float(f) => Some(f.to_string()),
        Value::Double(d) => Some(d.to_string()),
        other => Some(other.as_sql(true)),
    }
}

/// The start of a statement, for a message.
fn first_words(sql: &str) -> String {
    let one_line: String = sql.split_whitespace().collect::<Vec<_>>().join(" ");
    match one_line.char_indices().nth(60) {
        Some((i, _)) => format!("{}...", &one_line[..i]),
        None => one_line,
    }
}

const HINT_TIMEOUT: &str = "it may be hung or overloaded; --connect-timeout SECS waits longer";
const HINT_CREDENTIALS: &str = "give the right --user and --password-file (or MYSQL_PWD, or user= and password= \
     under [client] in ~/.my.cnf); without a password, unix-socket authentication admits only the OS user it names";

/// What went wrong, in a phrase, and what to do about it.
fn explain(e: &mysql::Error, timeout: &str) -> (String, &'static str) {
    // The I/O error's kind and text, wherever the driver put it.
    let io: Option<(std::io::ErrorKind, String)> = match e {
        mysql::Error::IoError(io) => Some((io.kind(), io.to_string())),
        // Its type is not exported; its source is the I/O error, if it is one.
        mysql::Error::CodecError(c) => std::error::Error::source(c)
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .map(|io| (io.kind(), io.to_string())),
        mysql::Error::DriverError(mysql::DriverError::CouldNotConnect(Some((_, text, kind)))) => {
            Some((*kind, text.clone()))
        }
        mysql::Error::DriverError(mysql::DriverError::ConnectTimeout) => {
            Some((std::io::ErrorKind::TimedOut, String::new()))
        }
        _ => None,
    };
    if let Some((kind, text)) = io {
        use std::io::ErrorKind::*;
        return match kind {
            WouldBlock | TimedOut => (
                format!("the server did not answer within {timeout}"),
                HINT_TIMEOUT,
            ),
            NotFound | ConnectionRefused => (
                text,
                "no server listens there: give --socket PATH, or --host and --port",
            ),
            PermissionDenied => (
                text,
                "run myprobe as root, or as a user who may open the socket",
            ),
            BrokenPipe | ConnectionReset | UnexpectedEof => (
                format!("the server closed the connection ({text})"),
                "it may be shutting down, or refusing this client (see its error log)",
            ),
            _ => (text, ""),
        };
    }
    match e {
        mysql::Error::MySqlError(m) => {
            let reason = format!("{} (error {})", m.message, m.code);
            let hint = match m.code {
                // ER_DBACCESS_DENIED, ER_ACCESS_DENIED, ER_ACCESS_DENIED_NO_PASSWORD
                1044 | 1045 | 1698 => HINT_CREDENTIALS,
                // ER_CON_COUNT_ERROR, ER_TOO_MANY_USER_CONNECTIONS
                1040 | 1203 => "the server has no connection to spare (max_connections); retry when fewer clients \
                     are connected",
                _ => "",
            };
            (reason, hint)
        }
        other => (other.to_string().replace('\n', " "), ""),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        connect: ConnectArgs,
    }

    fn args(argv: &[&str]) -> ConnectArgs {
        let mut full = vec!["myprobe"];
        full.extend_from_slice(argv);
        Cli::try_parse_from(full).unwrap().connect
    }

    fn env_with(home: &Path) -> Environment {
        Environment {
            home: Some(home.to_path_buf()),
            mysql_pwd: None,
            os_user: Some("osuser".into()),
        }
    }

    #[test]
    fn help_documents_the_flags_but_not_the_refused_password() {
        use clap::CommandFactory;
        let help = Cli::command().render_long_help().to_string();
        for flag in [
            "--socket",
            "--host",
            "--port",
            "--user",
            "--password-file",
            "--defaults-file",
            "--connect-timeout",
        ] {
            assert!(help.contains(flag), "{flag} missing from: {help}");
        }
        assert!(!help.contains("--password "), "{help}");
    }

    #[test]
    fn a_password_on_the_command_line_is_refused_with_advice() {
        let dir = tempfile::tempdir().unwrap();
        for argv in [&["--password=secret"][..], &["--password"]] {
            let err = args(argv)
                .settings_in(&env_with(dir.path()), None)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("--password-file") && !err.contains("secret"),
                "{err}"
            );
        }
    }

    #[test]
    fn defaults_are_the_os_user_on_the_servers_socket() {
        let dir = tempfile::tempdir().unwrap();
        let s = args(&[]).settings_in(&env_with(dir.path()), None).unwrap();
        assert_eq!(s.user, "osuser");
        assert_eq!(s.password_source, None);
        assert_eq!(s.timeout, Duration::from_secs(2));
        assert_eq!(
            s.endpoint,
            Endpoint::Socket {
                path: socket::DEFAULT_SOCKET.into(),
                origin: "the default".into()
            }
        );
    }

    #[test]
    fn flags_win_over_the_file_and_the_file_over_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(".my.cnf"),
            "[client]\nuser=fileuser\npassword=filepw\nsocket=/file.sock\nport=3400\n",
        )
        .unwrap();
        let mut env = env_with(dir.path());
        env.mysql_pwd = Some("envpw".into());
        let s = args(&[]).settings_in(&env, None).unwrap();
        assert_eq!(
            (s.user.as_str(), s.password.as_deref()),
            ("fileuser", Some("filepw"))
        );
        let file_origin = dir.path().join(".my.cnf").display().to_string();
        assert_eq!(
            s.endpoint,
            Endpoint::Socket {
                path: "/file.sock".into(),
                origin: file_origin
            }
        );

        let pwfile = dir.path().join("pw");
        std::fs::write(&pwfile, "flagpw\n").unwrap();
        let s = args(&[
            "--user",
            "flaguser",
            "--password-file",
            pwfile.to_str().unwrap(),
            "--socket",
            "/flag.sock",
        ])
        .settings_in(&env, None)
        .unwrap();
        assert_eq!(
            (s.user.as_str(), s.password.as_deref()),
            ("flaguser", Some("flagpw"))
        );
        assert_eq!(
            s.endpoint,
            Endpoint::Socket {
                path: "/flag.sock".into(),
                origin: "--socket".into()
            }
        );
        // A host flag beats the file's socket; the file's port still applies.
        let s = args(&["--host", "10.1.2.3"])
            .settings_in(&env, None)
            .unwrap();
        assert_eq!(
            s.endpoint,
            Endpoint::Tcp {
                host: "10.1.2.3".into(),
                port: 3400
            }
        );
        let s = args(&["--port", "3500"]).settings_in(&env, None).unwrap();
        assert_eq!(
            s.endpoint,
            Endpoint::Tcp {
                host: "127.0.0.1".into(),
                port: 3500
            }
        );
        let s = args(&["--host", "localhost"])
            .settings_in(&env, None)
            .unwrap();
        assert!(
            matches!(s.endpoint, Endpoint::Socket { ref origin, .. } if origin == "the default")
        );

        std::fs::remove_file(dir.path().join(".my.cnf")).unwrap();
        let s = args(&[]).settings_in(&env, None).unwrap();
        assert_eq!(
            (s.password.as_deref(), s.password_source.as_deref()),
            (Some("envpw"), Some("MYSQL_PWD"))
        );
    }

    #[test]
    fn a_defaults_file_replaces_my_cnf() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(".my.cnf"), "[client]\nuser=home\n").unwrap();
        let other = dir.path().join("other.cnf");
        std::fs::write(&other, "[client-mariadb]\nhost=db.example\n").unwrap();
        let s = args(&["--defaults-file", other.to_str().unwrap()])
            .settings_in(&env_with(dir.path()), None)
            .unwrap();
        assert_eq!(s.user, "osuser");
        assert_eq!(
            s.endpoint,
            Endpoint::Tcp {
                host: "db.example".into(),
                port: 3306
            }
        );
        let missing = dir.path().join("missing.cnf");
        let err = format!(
            "{:#}",
            args(&["--defaults-file", missing.to_str().unwrap()])
                .settings_in(&env_with(dir.path()), None)
                .unwrap_err()
        );
        assert!(err.contains("missing.cnf"), "{err}");
    }

    #[test]
    fn bad_settings_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let env = env_with(dir.path());
        for t in ["0", "-1", "NaN", "inf", "4000"] {
            let flag = format!("--connect-timeout={t}");
            let err = args(&[&flag])
                .settings_in(&env, None)
                .unwrap_err()
                .to_string();
            assert!(err.contains("--connect-timeout"), "{err}");
        }
        let pw = dir.path().join("pw");
        std::fs::write(&pw, "a\nb\n").unwrap();
        let err = args(&["--password-file", pw.to_str().unwrap()])
            .settings_in(&env, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("more than one line"), "{err}");
        std::fs::write(&pw, "s3cr3t\r\n").unwrap();
        let s = args(&["--password-file", pw.to_str().unwrap()])
            .settings_in(&env, None)
            .unwrap();
        assert_eq!(s.password.as_deref(), Some("s3cr3t"));
        assert!(
            !format!("{s:?}").contains("s3cr3t"),
            "Debug shows no password: {s:?}"
        );
        let err = format!(
            "{:#}",
            args(&["--password-file", "/nonexistent"])
                .settings_in(&env, None)
                .unwrap_err()
        );
        assert!(err.contains("/nonexistent"), "{err}");
        std::fs::write(dir.path().join(".my.cnf"), "[client]\nport=x\n").unwrap();
        let err = format!("{:#}", args(&[]).settings_in(&env, None).unwrap_err());
        assert!(err.contains(".my.cnf") && err.contains("line 2"), "{err}");
        assert!(Cli::try_parse_from(["myprobe", "--port", "0"]).is_err());
    }

    #[test]
    fn processlist_rows() {
        let row = |v: &[Option<&str>]| v.iter().map(|s| s.map(String::from)).collect::<Vec<_>>();
        let r = process_row(row(&[
            Some("7"),
            Some("1234"),
            Some("root"),
            None,
            Some("Query"),
            Some("1500.250"),
            Some("User sleep"),
            Some("SELECT SLEEP(2)"),
        ]))
        .unwrap();
        assert_eq!(
            (r.id, r.tid, r.time_ms, r.db),
            (7, Some(1234), 1500.25, None)
        );
        let bad = process_row(row(&[
            Some("7"),
            Some("x"),
            None,
            None,
            None,
            None,
            None,
            None,
        ]));
        assert!(bad.unwrap_err().to_string().contains("TID `x`"));
        assert!(process_row(row(&[Some("7")])).is_err());
    }
}
