//! MySQL/MariaDB option files (`~/.my.cnf`): the groups a client reads, and the connection keys in them.
//!
//! The syntax of mysys's `my_default.c`: `[group]` headers, `key=value` or a bare `key`, `#` and `;` comment
//! lines, a `#` outside quotes ending a value, quotes around a value stripped, `\n \t \r \b \s \\` escapes.
//! `!include` and `!includedir` are not followed (they are noted): the files a client needs are few and named.

use std::path::Path;

use anyhow::{bail, Context, Result};

/// The groups a MySQL or MariaDB client reads, in the order their values apply (a later value wins).
pub const CLIENT_GROUPS: [&str; 3] = ["client", "client-server", "client-mariadb"];

/// What an option file says about connecting.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientOptions {
    pub user: Option<String>,
    pub password: Option<String>,
    pub socket: Option<String>,
    pub host: Option<String>,
    pub port: Option<u16>,
    /// What was read but not followed (`!include` lines), for the caller to say.
    pub notes: Vec<String>,
}

/// Reads `path`'s client groups. A file that does not exist is an error: the caller decides whether that matters.
pub fn read(path: &Path) -> Result<ClientOptions> {
    use std::os::unix::fs::PermissionsExt;
    // Any user could point root's connection elsewhere through it; MySQL's clients ignore such files too.
    let mode = std::fs::metadata(path)
        .with_context(|| format!("cannot read {}", path.display()))?
        .permissions()
        .mode();
    if mode & 0o002 != 0 {
        bail!(
            "{} is writable by every user: not read (chmod o-w it)",
            path.display()
        );
    }
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let text = String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "{}: not UTF-8 text (byte {})",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })?;
    parse(&text).with_context(|| format!("option file {}", path.display()))
}

/// Parses an option file's text; the error names the line.
pub fn parse(text: &str) -> Result<ClientOptions> {
    let mut options = ClientOptions::default();
    // None: before the first group header, where only comments and directives may stand.
    let mut in_client_group: Option<bool> = None;
    for (n, raw) in text.lines().enumerate() {
        let line_no = n + 1;
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(directive) = line.strip_prefix('!') {
            let name = directive.split_whitespace().next().unwrap_or("");
            match name {
                "include" | "includedir" => options.notes.push(format!(
                    "line {line_no}: `!{name}` is not followed; put the options myprobe needs in this file or pass \
                     --defaults-file"
                )),
                _ => bail!("line {line_no}: unknown directive `!{name}` (only !include and !includedir exist)"),
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix('[') {
            let Some(end) = rest.find(']') else {
                bail!(
                    "line {line_no}: group header without a closing `]`: {}",
                    shorten(line)
                );
            };
            let after = rest[end + 1..].trim();
            if !(after.is_empty() || after.starts_with('#') || after.starts_with(';')) {
                bail!(
                    "line {line_no}: text after the group header: {}",
                    shorten(line)
                );
            }
            let group = rest[..end].trim();
            if group.is_empty() {
                bail!("line {line_no}: empty group name `[]`");
            }
            // Group names are not case-sensitive.
            in_client_group = Some(CLIENT_GROUPS.iter().any(|g| g.eq_ignore_ascii_case(group)));
            continue;
        }
        let Some(in_client) = in_client_group else {
            bail!(
                "line {line_no}: an option before any [group] header: {}",
                shorten(line)
            );
        };
        let (key, value) = match line.find('=') {
            Some(eq) => (line[..eq].trim(), Some(value_of(&line[eq + 1..], line_no)?)),
            None => (strip_end_comment(line).trim(), None),
        };
        if key.is_empty() {
            bail!("line {line_no}: `=` without an option name before it");
        }
        if !in_client {
            continue;
        }
        // `-` and `_` are the same in option names, and a `loose-` prefix only makes unknown names harmless.
        let key = key.replace('_', "-").to_ascii_lowercase();
        let key = key.strip_prefix("loose-").unwrap_or(&key);
        match (key, value) {
            ("user", Some(v)) => options.user = Some(v),
            ("password", Some(v)) => options.password = Some(v),
            // A bare `password` asks a client to prompt; myprobe never prompts, so it means no password here.
            ("password", None) => options.password = None,
            ("socket", Some(v)) => options.socket = Some(v),
            ("host", Some(v)) => options.host = Some(v),
            ("port", Some(v)) => {
                options.port =
                    Some(v.parse::<u16>().ok().filter(|&p| p != 0).with_context(|| {
                        format!("line {line_no}: port `{v}` is not a TCP port (1-65535)")
                    })?)
            }
            ("user" | "socket" | "host" | "port", None) => {
                bail!("line {line_no}: `{key}` without a value (`{key}=...`)")
            }
            _ => {}
        }
    }
    Ok(options)
}

/// A value after `=`: an end comment removed, spaces trimmed, quotes stripped, escapes replaced.
fn value_of(raw: &str, line_no: usize) -> Result<String> {
    let value = strip_end_comment(raw).trim();
    let quote = value.chars().next().filter(|c| *c == '"' || *c == '\'');
    let inner = match quote {
        Some(q) => {
            if value.len() < 2 || !value.ends_with(q) {
                bail!(
                    "line {line_no}: a value opened with {q} is not closed by one: {}",
                    shorten(value)
                );
            }
            &value[1..value.len() - 1]
        }
        None => value,
    };
    Ok(unescape(inner))
}

/// The text before a `#` that is outside quotes (mysys's remove_end_comment).
fn strip_end_comment(s: &str) -> &str {
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        if (c == '"' || c == '\'') && !escaped {
            match quote {
                None => quote = Some(c),
                Some(q) if q == c => quote = None,
                Some(_) => {}
            }
        }
        if quote.is_none() && c == '#' {
            return &s[..i];
        }
        escaped = quote.is_some() && c == '\\' && !escaped;
    }
    s
}

fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some('b') => out.push('\u{8}'),
            Some('s') => out.push(' '),
            Some('\\') => out.push('\\'),
            Some('"') => out.push('"'),
            Some('\'') => out.push('\''),
            // Other backslashes are kept, as the server's own reader keeps them (Windows paths).
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out
}

/// A line quoted in an error, short and without the rest of a long secret.
fn shorten(s: &str) -> String {
    const MAX: usize = 40;
    match s.char_indices().nth(MAX) {
        Some((i, _)) => format!("`{}...`", &s[..i]),
        None => format!("`{s}`"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_groups_and_keys() {
        let o = parse(
            "# a comment\n; another\n[mysqld]\nuser = mysql\nsocket=/run/server.sock\n\n[client]\nuser=alice\n\
             password = secret\nsocket=/tmp/a.sock\nhost=db.example\nport=3307\nskip-ssl\n",
        )
        .unwrap();
        assert_eq!(o.user.as_deref(), Some("alice"));
        assert_eq!(o.password.as_deref(), Some("secret"));
        assert_eq!(o.socket.as_deref(), Some("/tmp/a.sock"));
        assert_eq!(o.host.as_deref(), Some("db.example"));
        assert_eq!(o.port, Some(3307));
        assert!(o.notes.is_empty());
    }

    #[test]
    fn later_groups_win_and_others_are_ignored() {
        let o = parse("[client]\nuser=a\n[mysql]\nuser=b\n[Client-MariaDB]\nuser=c\n[client-server]\npassword=p\n")
            .unwrap();
        assert_eq!(o.user.as_deref(), Some("c"));
        assert_eq!(o.password.as_deref(), Some("p"));
    }

    #[test]
    fn quotes_comments_and_escapes() {
        let o = parse(
            "[client]\npassword=\"pa#ss word\" # why\nuser='bob' ; not a comment here\nsocket=/tmp/x.sock # c\n\
             host=h\\sx\n",
        );
        // Only `#` ends a value: after `;`, the quote opened is not the value's last character.
        assert!(format!("{:#}", o.unwrap_err()).contains("line 3"));
        let o = parse("[client]\npassword=\"pa#ss word\" # why\nuser='bob'\nsocket=/tmp/x.sock # c\nhost=h\\sx\n")
            .unwrap();
        assert_eq!(o.password.as_deref(), Some("pa#ss word"));
        assert_eq!(o.user.as_deref(), Some("bob"));
        assert_eq!(o.socket.as_deref(), Some("/tmp/x.sock"));
        assert_eq!(o.host.as_deref(), Some("h x"));
        let o = parse("[client]\npassword=\"a\\\"b\\\\c\"\n").unwrap();
        assert_eq!(o.password.as_deref(), Some("a\"b\\c"));
        let o = parse("[client]\npassword=a#b\n").unwrap();
        assert_eq!(o.password.as_deref(), Some("a"));
    }

    #[test]
    fn spellings_of_keys() {
        let o = parse("[client]\nloose_user=x\nLOOSE-PASSWORD=y\n").unwrap();
        assert_eq!(o.user.as_deref(), Some("x"));
        assert_eq!(o.password.as_deref(), Some("y"));
        let o = parse("[client]\npassword=y\npassword\n").unwrap();
        assert_eq!(o.password, None);
        let o = parse("[client]\npassword=\n").unwrap();
        assert_eq!(o.password.as_deref(), Some(""));
    }

    #[test]
    fn includes_are_noted() {
        let o =
            parse("!includedir /etc/mysql/conf.d/\n[client]\n!include /etc/other.cnf\nuser=u\n")
                .unwrap();
        assert_eq!(o.user.as_deref(), Some("u"));
        assert_eq!(o.notes.len(), 2);
        assert!(o.notes[0].contains("line 1") && o.notes[0].contains("!includedir"));
    }

    #[test]
    fn malformed_input_is_a_clear_error() {
        let cases = [
            ("user=x\n", "line 1: an option before any [group] header"),
            (
                "[client\nuser=x\n",
                "line 1: group header without a closing `]`",
            ),
            ("[]\n", "line 1: empty group name"),
            ("[client] user=x\n", "line 1: text after the group header"),
            ("[client]\n=x\n", "line 2: `=` without an option name"),
            (
                "[client]\npassword=\"abc\n",
                "line 2: a value opened with \" is not closed",
            ),
            (
                "[client]\npassword='\n",
                "line 2: a value opened with ' is not closed",
            ),
            (
                "[client]\nport=http\n",
                "line 2: port `http` is not a TCP port",
            ),
            ("[client]\nport=70000\n", "line 2: port `70000`"),
            ("[client]\nport=0\n", "line 2: port `0`"),
            ("[client]\nsocket\n", "line 2: `socket` without a value"),
            (
                "[client]\n!inclde x\n",
                "line 2: unknown directive `!inclde`",
            ),
        ];
        for (text, expected) in cases {
            let err = format!("{:#}", parse(text).unwrap_err());
            assert!(err.contains(expected), "{text:?}: {err}");
            assert!(!err.contains('\n'), "one line: {err}");
        }
        // Errors in groups a client does not read still count: the file is broken for every reader.
        assert!(parse("[mysqld]\nsocket=\"/x\n").is_err());
    }

    #[test]
    fn a_long_secret_is_not_quoted_whole() {
        let secret = "s".repeat(200);
        let err = format!(
            "{:#}",
            parse(&format!("[client]\npassword=\"{secret}\n")).unwrap_err()
        );
        assert!(err.len() < 150, "{err}");
    }

    #[test]
    fn any_bytes_parse_or_fail_without_panicking() {
        for text in [
            "[",
            "]",
            "[[]]",
            "=",
            "\"",
            "'\n[client]\n",
            "[client]\n#\n=\n",
            "[client]\nport=\u{0}\n",
        ] {
            let _ = parse(text);
        }
    }

    #[test]
    fn file_errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("my.cnf");
        assert!(format!("{:#}", read(&path).unwrap_err()).contains("my.cnf"));
        std::fs::write(&path, b"[client]\nuser=\xff\n").unwrap();
        let err = format!("{:#}", read(&path).unwrap_err());
        assert!(err.contains("not UTF-8"), "{err}");
        std::fs::write(&path, b"[client]\nuser=x\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        let err = format!("{:#}", read(&path).unwrap_err());
        assert!(err.contains("writable by every user"), "{err}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(read(&path).unwrap().user.as_deref(), Some("x"));
        std::fs::write(&path, b"[client]\nuser=x\n[bad\n").unwrap();
        let err = format!("{:#}", read(&path).unwrap_err());
        assert!(err.contains("my.cnf") && err.contains("line 3"), "{err}");
    }
}
