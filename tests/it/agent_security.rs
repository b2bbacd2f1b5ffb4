//! `myprobe agent --web.config.file`: the agent attached to the real test server, behind TLS with a certificate
//! made here by openssl and basic auth with a bcrypt hash made here, asked by curl; and configurations it must
//! refuse, each in one line.

use std::{
    path::Path,
    process::{Command, Stdio},
};

use crate::{
    agent::{agent, agent_turn, free_port},
    common::*,
};

/// What curl got: the status (0 when nothing HTTP answered), the headers and the body.
struct Reply {
    status: u16,
    headers: String,
    body: String,
}

/// `curl` with `args`, its headers and body on stdout, then the status on a line of its own.
fn curl(args: &[&str]) -> Reply {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "30", "-D", "-", "-w", "\n%{http_code}"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running curl (scripts/setup installs it)");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let (reply, status) = stdout.rsplit_once('\n').unwrap_or(("", &stdout));
    let (headers, body) = reply.split_once("\r\n\r\n").unwrap_or((reply, ""));
    Reply {
        status: status.trim().parse().unwrap_or(0),
        headers: headers.to_string(),
        body: body.to_string(),
    }
}

/// `openssl` with `args` split at spaces (the paths here have none), asserting success; its stdout.
fn openssl(args: &str) -> String {
    let out = Command::new("openssl")
        .args(args.split_whitespace())
        .stdin(Stdio::null())
        .output()
        .expect("running openssl (scripts/setup installs it)");
    assert!(
        out.status.success(),
        "openssl {args}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A self-signed certificate for localhost and 127.0.0.1 and its key, as `name`.pem and `name`.key in `dir`.
fn certificate(dir: &Path, name: &str, subject: &str) {
    let (cert, key) = (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}.key")),
    );
    // A server's is no CA's: rustls (history --agent-ca) takes a CA's certificate only as the issuer of another.
    let role = if name == "ca" { "CA:TRUE" } else { "CA:FALSE" };
    openssl(&format!(
        "req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj {subject} \
         -addext subjectAltName=DNS:localhost,IP:127.0.0.1 -addext basicConstraints=critical,{role} \
         -keyout {} -out {}",
        key.display(),
        cert.display()
    ));
}

/// The DER of the first certificate in PEM text, as openssl reads it.
fn der_of(pem: &str, dir: &Path) -> Vec<u8> {
    let first = pem
        .split_inclusive("-----END CERTIFICATE-----")
        .next()
        .and_then(|s| s.find("-----BEGIN CERTIFICATE-----").map(|at| &s[at..]))
        .unwrap_or_else(|| panic!("no certificate in: {pem}"));
    let (pem_file, der_file) = (dir.join("peer.pem"), dir.join("peer.der"));
    std::fs::write(&pem_file, first).unwrap();
    openssl(&format!(
        "x509 -in {} -outform DER -out {}",
        pem_file.display(),
        der_file.display()
    ));
    std::fs::read(der_file).unwrap()
}

const USER: &str = "prometheus";
const PASSWORD: &str = "right horse battery";

#[test]
fn tls_and_basic_auth_guard_every_endpoint_of_the_agent() {
    let db = testdb();
    let _turn = agent_turn();
    let dir = tempdir("agent-security");
    certificate(&dir, "server", "/CN=localhost");
    // Paths relative to the file's directory, as the exporters take them; a real bcrypt hash (cost 4: quick).
    let hash = bcrypt::hash(PASSWORD, 4).unwrap();
    let config = dir.join("web.yml");
    std::fs::write(
        &config,
        format!(
            "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  min_version: TLS12\n\
             http_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\n\
             basic_auth_users:\n  {USER}: '{hash}'\n"
        ),
    )
    .unwrap();
    let port = free_port();
    let running = agent(
        db.pid,
        port,
        &dir.join("windows"),
        &["--web.config.file", config.to_str().unwrap()],
    );
    let stderr = running.stderr_so_far();
    assert!(
        stderr.contains(&format!(
            "serving https://127.0.0.1:{port}/ (its page), /metrics"
        )),
        "{stderr}"
    );
    let ca = dir.join("server.pem");
    let ca = ca.to_str().unwrap();
    let url = |path: &str| format!("https://localhost:{port}{path}");
    only_the_right_password_gets_the_metrics(ca, &url("/metrics"));
    every_endpoint_asks_for_a_password(ca, &url);
    history_reads_the_agent_with_its_ca_and_credentials(&dir, ca, &url(""));
    the_certificate_served_is_the_one_given(&dir, port);
    plain_http_gets_no_metrics(port);
    let (_, stderr) = running.stop();
    assert!(!stderr.contains("panicked"), "{stderr}");
}

fn only_the_right_password_gets_the_metrics(ca: &str, metrics: &str) {
    // curl trusts the given certificate alone: each answer below came over TLS from its key.
    let without = curl(&["--cacert", ca, metrics]);
    assert_eq!(without.status, 401, "{}\n{}", without.headers, without.body);
    assert!(
        without
            .headers
            .contains("WWW-Authenticate: Basic realm=\"myprobe\""),
        "{}",
        without.headers
    );
    assert!(!without.body.contains("myprobe_"), "{}", without.body);
    let wrong = format!("{USER}:{PASSWORD}x");
    let wrong = curl(&["--cacert", ca, "-u", &wrong, metrics]);
    assert_eq!(wrong.status, 401, "{}", wrong.body);
    assert!(!wrong.body.contains("myprobe_"), "{}", wrong.body);
    let unknown = format!("someone:{PASSWORD}");
    assert_eq!(curl(&["--cacert", ca, "-u", &unknown, metrics]).status, 401);
    let right = format!("{USER}:{PASSWORD}");
    for _ in 0..3 {
        let ok = curl(&["--cacert", ca, "-u", &right, metrics]);
        assert_eq!(ok.status, 200, "{}\n{}", ok.headers, ok.body);
        assert!(
            ok.headers
                .contains("Content-Type: text/plain; version=0.0.4"),
            "{}",
            ok.headers
        );
        assert!(
            ok.headers.contains("X-Content-Type-Options: nosniff"),
            "{}",
            ok.headers
        );
        assert!(
            ok.body.contains("# TYPE myprobe_attaches_total counter")
                && ok.body.contains("myprobe_attaches_total 1"),
            "{}",
            ok.body
        );
    }
}

fn history_reads_the_agent_with_its_ca_and_credentials(dir: &Path, ca: &str, agent: &str) {
    let history = |args: &[&str], password: Option<&str>| {
        let mut cmd = myprobe();
        cmd.args(["history", "--from", "-5m", "--agent", agent, "-o", "-"])
            .args(args)
            .env_remove("MYPROBE_AGENT_PASSWORD");
        if let Some(p) = password {
            cmd.env("MYPROBE_AGENT_PASSWORD", p);
        }
        cmd.output().unwrap()
    };
    let ok = history(&["--agent-ca", ca, "--agent-user", USER], Some(PASSWORD));
    let stdout = String::from_utf8_lossy(&ok.stdout);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(stdout.contains("\"servers\""), "{stdout}");
    let file = dir.join("password");
    std::fs::write(&file, format!("{PASSWORD}\n")).unwrap();
    let from_file = history(
        &[
            "--agent-ca",
            ca,
            "--agent-user",
            USER,
            "--agent-password-file",
            file.to_str().unwrap(),
        ],
        None,
    );
    assert!(
        from_file.status.success(),
        "{}",
        String::from_utf8_lossy(&from_file.stderr)
    );
    // Each refusal is one line that says what to give.
    for (args, password, says) in [
        (
            vec!["--agent-ca", ca],
            None,
            "asks for a user and password: give --agent-user",
        ),
        (
            vec!["--agent-ca", ca, "--agent-user", USER],
            Some("wrong"),
            "refused the user and password given",
        ),
        (
            vec!["--agent-ca", ca, "--agent-user", USER],
            None,
            "needs its password",
        ),
        (
            vec!["--agent-user", USER],
            Some(PASSWORD),
            "asking the agent at",
        ),
    ] {
        let out = history(&args, password);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(says),
            "{args:?}: {stderr}"
        );
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    }
}

fn every_endpoint_asks_for_a_password(ca: &str, url: &dyn Fn(&str) -> String) {
    // A page that does not exist too: the check comes before any path is looked at.
    for path in [
        "/",
        "/healthz",
        "/debug/pprof/",
        "/debug/pprof/profile?seconds=1",
        "/debug/pprof/windows/",
        "/no/such/page",
    ] {
        let reply = curl(&["--cacert", ca, &url(path)]);
        assert_eq!(reply.status, 401, "{path}: {}", reply.body);
    }
    let right = format!("{USER}:{PASSWORD}");
    let health = curl(&["--cacert", ca, "-u", &right, &url("/healthz")]);
    assert_eq!(health.status, 200, "{}", health.body);
    assert!(
        health.body.starts_with("ok: tracing PID"),
        "{}",
        health.body
    );
}

fn the_certificate_served_is_the_one_given(dir: &Path, port: u16) {
    let shown = openssl(&format!(
        "s_client -connect 127.0.0.1:{port} -servername localhost -showcerts"
    ));
    let given = std::fs::read_to_string(dir.join("server.pem")).unwrap();
    assert_eq!(der_of(&shown, dir), der_of(&given, dir), "{shown}");
}

fn plain_http_gets_no_metrics(port: u16) {
    let plain = curl(&[&format!("http://127.0.0.1:{port}/metrics")]);
    assert_ne!(plain.status, 200, "{}", plain.body);
    assert!(!plain.body.contains("myprobe_"), "{}", plain.body);
}

#[test]
fn a_client_certificate_is_required_where_the_file_asks_for_one() {
    let db = testdb();
    let _turn = agent_turn();
    let dir = tempdir("agent-mtls");
    certificate(&dir, "server", "/CN=localhost");
    // The clients' CA is a self-signed certificate of its own; the client's is signed by it.
    certificate(&dir, "ca", "/CN=myprobe-test-clients");
    let path = |name: &str| dir.join(name).display().to_string();
    openssl(&format!(
        "req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=scraper -keyout {} -out {}",
        path("client.key"),
        path("client.csr")
    ));
    // Version 3, for a client (webpki takes no version 1 certificate, openssl's default without extensions).
    std::fs::write(
        dir.join("client.ext"),
        "basicConstraints=CA:FALSE
extendedKeyUsage=clientAuth
",
    )
    .unwrap();
    openssl(&format!(
        "x509 -req -in {} -CA {} -CAkey {} -days 2 -extfile {} -out {}",
        path("client.csr"),
        path("ca.pem"),
        path("ca.key"),
        path("client.ext"),
        path("client.pem")
    ));
    let config = dir.join("web.yml");
    std::fs::write(
        &config,
        "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  \
         client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.pem\n",
    )
    .unwrap();
    let port = free_port();
    let running = agent(
        db.pid,
        port,
        &dir.join("windows"),
        &["--web.config.file", config.to_str().unwrap()],
    );
    let metrics = format!("https://localhost:{port}/metrics");
    let without = curl(&["--cacert", &path("server.pem"), &metrics]);
    assert_eq!(without.status, 0, "{}", without.body);
    // A certificate of its own making, not signed by the CA, is refused too.
    let unsigned = curl(&[
        "--cacert",
        &path("server.pem"),
        "--cert",
        &path("server.pem"),
        "--key",
        &path("server.key"),
        &metrics,
    ]);
    assert_eq!(unsigned.status, 0, "{}", unsigned.body);
    let with = curl(&[
        "--cacert",
        &path("server.pem"),
        "--cert",
        &path("client.pem"),
        "--key",
        &path("client.key"),
        &metrics,
    ]);
    assert_eq!(with.status, 200, "{}", with.body);
    assert!(
        with.body.contains("myprobe_attaches_total 1"),
        "{}",
        with.body
    );
    running.stop();
}

/// myprobe agent with the configuration `yaml` (in `dir`): it must exit at once, non-zero, with one line.
fn refused(dir: &Path, yaml: &str) -> String {
    let config = dir.join("bad.yml");
    std::fs::write(&config, yaml).unwrap();
    // A PID that is no server: were the file taken, the agent would still end at once, saying so.
    let own = std::process::id().to_string();
    let out = myprobe()
        .args(["agent", "-p", &own, "--listen", "127.0.0.1:0", "--dir"])
        .arg(dir.join("windows"))
        .arg("--web.config.file")
        .arg(&config)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{yaml}: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{yaml}: {stderr}");
    assert!(stderr.contains(config.to_str().unwrap()), "{stderr}");
    stderr
}

#[test]
fn a_web_configuration_that_cannot_be_followed_stops_the_agent_in_one_line() {
    let dir = tempdir("agent-web-config");
    certificate(&dir, "server", "/CN=localhost");
    let unknown = refused(
        &dir,
        "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  min_versoin: TLS13\n",
    );
    assert!(unknown.contains("unknown field `min_versoin`"), "{unknown}");
    let missing = refused(
        &dir,
        "tls_server_config:\n  cert_file: missing.pem\n  key_file: server.key\n",
    );
    let missing_path = dir.join("missing.pem");
    assert!(
        missing.contains(&format!(
            "cert_file {}: cannot read it",
            missing_path.display()
        )),
        "{missing}"
    );
    let unsupported = refused(
        &dir,
        "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  cipher_suites: [TLS_AES_128_GCM_SHA256]\n",
    );
    assert!(
        unsupported.contains("cipher_suites is not supported"),
        "{unsupported}"
    );
    let swapped = refused(
        &dir,
        "tls_server_config:\n  cert_file: server.key\n  key_file: server.pem\n",
    );
    assert!(swapped.contains("no PEM certificate"), "{swapped}");
    let plain = refused(&dir, "basic_auth_users:\n  alice: secret\n");
    assert!(plain.contains("\"alice\" is not a bcrypt hash"), "{plain}");
    let missing_file = myprobe()
        .args(["agent", "--web.config.file"])
        .arg(dir.join("none.yml"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&missing_file.stderr);
    assert!(!missing_file.status.success(), "{stderr}");
    assert!(stderr.contains("none.yml: cannot read it"), "{stderr}");
}
