//! `--web.config.file`: the web configuration file of Prometheus's exporters (exporter-toolkit's format, YAML):
//! TLS (`tls_server_config`), basic auth with bcrypt hashes (`basic_auth_users`) and response headers
//! (`http_server_config.headers`). Read once, when the agent starts: a key it does not know or does not support,
//! a file it cannot read, a certificate or key it cannot use, each is an error in one line, and the agent does not
//! start (a security setting is never ignored).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
};

use anyhow::{anyhow, bail, Context, Result};
use rustls::{
    pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer},
    server::WebPkiClientVerifier,
    RootCertStore, ServerConfig, SupportedProtocolVersion,
};
use serde::Deserialize;
use serde_norway::Value;

/// What the agent's HTTP server does beyond plain HTTP: nothing, without `--web.config.file`.
#[derive(Default)]
pub struct WebConfig {
    /// Served over TLS with this (`tls_server_config`).
    pub tls: Option<Arc<ServerConfig>>,
    /// User → bcrypt hash: every request must give one of them (`basic_auth_users`).
    pub users: BTreeMap<String, String>,
    /// Added to every response (`http_server_config.headers`).
    pub headers: Vec<(String, String)>,
}

/// The file as written: every key exporter-toolkit knows, so that those not supported are named as such.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct File {
    tls_server_config: Option<TlsFile>,
    http_server_config: Option<HttpFile>,
    basic_auth_users: Option<BTreeMap<String, String>>,
    rate_limit: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct TlsFile {
    cert: Option<String>,
    key: Option<String>,
    client_ca: Option<String>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    client_ca_file: Option<PathBuf>,
    client_auth_type: Option<String>,
    client_allowed_sans: Option<Value>,
    min_version: Option<String>,
    max_version: Option<String>,
    cipher_suites: Option<Value>,
    prefer_server_cipher_suites: Option<bool>,
    curve_preferences: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct HttpFile {
    /// Accepted either way: the agent speaks HTTP/1.1, which every client falls back to (ALPN offers only it).
    #[allow(dead_code)]
    http2: Option<bool>,
    headers: Option<BTreeMap<String, String>>,
}

/// The headers exporter-toolkit lets a file set, with the values it accepts (none listed: any).
const HEADERS_ALLOWED: [(&str, &[&str]); 5] = [
    ("Strict-Transport-Security", &[]),
    ("X-Content-Type-Options", &["nosniff"]),
    ("X-Frame-Options", &["deny", "sameorigin"]),
    ("X-XSS-Protection", &[]),
    ("Content-Security-Policy", &[]),
];

impl WebConfig {
    /// Reads `path`; errors say the file and what to fix, in one line.
    pub fn load(path: &Path) -> Result<WebConfig> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("--web.config.file {}: cannot read it", path.display()))?;
        // Relative paths in it are relative to its directory, as exporter-toolkit takes them.
        let dir = path.parent().unwrap_or(Path::new("."));
        WebConfig::parse(&text, dir)
            .with_context(|| format!("--web.config.file {}", path.display()))
    }

    fn parse(text: &str, dir: &Path) -> Result<WebConfig> {
        // An empty file (or one of comments only) is a valid configuration: plain HTTP, no auth.
        let file: File = serde_norway::from_str::<Option<File>>(text)
            .map_err(|e| anyhow!("{}", one_line(&e.to_string())))?
            .unwrap_or_default();
        if file.rate_limit.is_some() {
            bail!("rate_limit is not supported by myprobe: remove it (the agent serves 8 requests at once at most)");
        }
        let users = file.basic_auth_users.unwrap_or_default();
        for (user, hash) in &users {
            hash.parse::<bcrypt::HashParts>().map_err(|_| {
                anyhow!(
                    "basic_auth_users: the password of {user:?} is not a bcrypt hash: make one with \
                     `htpasswd -nBC 10 \"\" | tr -d ':\\n'`"
                )
            })?;
        }
        let http = file.http_server_config.unwrap_or_default();
        let headers = checked_headers(http.headers.unwrap_or_default())?;
        let tls = match file.tls_server_config {
            Some(t) => Some(Arc::new(server_config(&t, dir)?)),
            None => None,
        };
        Ok(WebConfig {
            tls,
            users,
            headers,
        })
    }
}

/// serde_norway's messages may span lines (a quoted excerpt); errors here are one line.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn checked_headers(headers: BTreeMap<String, String>) -> Result<Vec<(String, String)>> {
    let mut checked = Vec::new();
    for (name, value) in headers {
        let Some((_, values)) = HEADERS_ALLOWED.iter().find(|(n, _)| *n == name) else {
            let names: Vec<&str> = HEADERS_ALLOWED.iter().map(|(n, _)| *n).collect();
            bail!(
                "http_server_config.headers: {name:?} cannot be set; these can: {}",
                names.join(", ")
            );
        };
        if !values.is_empty() && !values.contains(&value.as_str()) {
            bail!(
                "http_server_config.headers: {name} must be one of {}, not {value:?}",
                values.join(", ")
            );
        }
        // Checked here rather than dropped when a response is made: a security header is never left out unsaid.
        if !value
            .bytes()
            .all(|b| b == b' ' || b == b'\t' || b.is_ascii_graphic())
        {
            bail!("http_server_config.headers: the value of {name} must be printable ASCII");
        }
        // Unset if blank, as exporter-toolkit has it.
        if !value.is_empty() {
            checked.push((name, value));
        }
    }
    Ok(checked)
}

/// How the client's certificate is asked for (`client_auth_type`): rustls verifies every certificate it takes,
/// so Go's kinds that take one unverified are refused.
enum ClientAuth {
    None,
    VerifyIfGiven,
    Require,
}

fn client_auth(kind: Option<&str>) -> Result<ClientAuth> {
    Ok(match kind.unwrap_or("NoClientCert") {
        "NoClientCert" => ClientAuth::None,
        "VerifyClientCertIfGiven" => ClientAuth::VerifyIfGiven,
        "RequireAndVerifyClientCert" => ClientAuth::Require,
        unverified @ ("RequestClientCert" | "RequireAnyClientCert") => bail!(
            "tls_server_config.client_auth_type {unverified} (a client certificate taken unverified) is not \
             supported by myprobe: use RequireAndVerifyClientCert with client_ca_file"
        ),
        other => bail!(
            "tls_server_config.client_auth_type {other:?} is unknown: use NoClientCert, VerifyClientCertIfGiven \
             or RequireAndVerifyClientCert"
        ),
    })
}

/// `TLS12`, `TLS13`: the versions rustls speaks (none older).
fn version(key: &str, name: &str) -> Result<&'static SupportedProtocolVersion> {
    match name {
        "TLS12" => Ok(&rustls::version::TLS12),
        "TLS13" => Ok(&rustls::version::TLS13),
        "TLS10" | "TLS11" => bail!(
            "tls_server_config.{key} {name} is not supported by myprobe (rustls speaks TLS 1.2 and 1.3): use TLS12"
        ),
        _ => bail!("tls_server_config.{key} {name:?} is unknown: use TLS12 or TLS13"),
    }
}

fn versions(t: &TlsFile) -> Result<Vec<&'static SupportedProtocolVersion>> {
    let min = version("min_version", t.min_version.as_deref().unwrap_or("TLS12"))?;
    let max = version("max_version", t.max_version.as_deref().unwrap_or("TLS13"))?;
    let all = [&rustls::version::TLS12, &rustls::version::TLS13];
    let rank = |v: &SupportedProtocolVersion| all.iter().position(|a| a.version == v.version);
    let chosen: Vec<_> = all
        .into_iter()
        .filter(|v| rank(v) >= rank(min) && rank(v) <= rank(max))
        .collect();
    if chosen.is_empty() {
        bail!("tls_server_config: min_version is above max_version");
    }
    Ok(chosen)
}

/// The PEM of `key`, inline (`inline`) or in a file (`file`, relative to the configuration's directory); `None`
/// where neither is given.
fn pem(
    inline: &Option<String>,
    file: &Option<PathBuf>,
    key: &str,
    dir: &Path,
) -> Result<Option<(Vec<u8>, String)>> {
    match (inline, file) {
        (Some(_), Some(_)) => {
            bail!("tls_server_config: give {key} or {key}_file, not both")
        }
        (Some(text), None) => Ok(Some((text.as_bytes().to_vec(), format!("{key} (inline)")))),
        (None, Some(path)) => {
            let path = dir.join(path);
            let bytes = std::fs::read(&path).with_context(|| {
                format!(
                    "tls_server_config.{key}_file {}: cannot read it",
                    path.display()
                )
            })?;
            Ok(Some((bytes, path.display().to_string())))
        }
        (None, None) => Ok(None),
    }
}

/// The certificates of `pem` (read from `from`): at least one, all of them PEM.
pub fn certificates(pem: &[u8], from: &str) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow!("{from}: not PEM certificates: {e}"))?;
    if certs.is_empty() {
        bail!("{from}: no PEM certificate (-----BEGIN CERTIFICATE-----) in it");
    }
    Ok(certs)
}

fn unsupported(t: &TlsFile) -> Result<()> {
    let given = [
        ("client_allowed_sans", t.client_allowed_sans.is_some()),
        ("cipher_suites", t.cipher_suites.is_some()),
        ("curve_preferences", t.curve_preferences.is_some()),
    ];
    if let Some((key, _)) = given.iter().find(|(_, given)| *given) {
        bail!(
            "tls_server_config.{key} is not supported by myprobe: remove it (rustls's own choices are used: \
             TLS 1.3's suites and TLS 1.2's ECDHE with AES-GCM or ChaCha20-Poly1305, over X25519, P-256 or P-384)"
        );
    }
    Ok(())
}

const NEEDS_CERT_AND_KEY: &str =
    "tls_server_config needs cert_file and key_file (or cert and key inline)";

/// rustls's server configuration from `tls_server_config`, its files read now.
fn server_config(t: &TlsFile, dir: &Path) -> Result<ServerConfig> {
    unsupported(t)?;
    let versions = versions(t)?;
    let auth = client_auth(t.client_auth_type.as_deref())?;
    // Said before any file is read.
    if (t.cert.is_none() && t.cert_file.is_none()) || (t.key.is_none() && t.key_file.is_none()) {
        bail!(NEEDS_CERT_AND_KEY);
    }
    let (Some((cert_pem, cert_from)), Some((key_pem, key_from))) = (
        pem(&t.cert, &t.cert_file, "cert", dir)?,
        pem(&t.key, &t.key_file, "key", dir)?,
    ) else {
        bail!(NEEDS_CERT_AND_KEY);
    };
    let certs = certificates(&cert_pem, &cert_from)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|e| anyhow!("{key_from}: no PEM private key in it: {e}"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&versions)
        .map_err(|e| anyhow!("tls_server_config: {e}"))?;
    let ca = pem(&t.client_ca, &t.client_ca_file, "client_ca", dir)?;
    let builder = match (auth, ca) {
        (ClientAuth::None, None) => builder.with_no_client_auth(),
        (ClientAuth::None, Some(_)) => bail!(
            "tls_server_config: a client CA is given without client_auth_type: set RequireAndVerifyClientCert"
        ),
        (_, None) => bail!("tls_server_config.client_auth_type verifies clients: give client_ca_file"),
        (auth, Some((ca_pem, ca_from))) => {
            let mut roots = RootCertStore::empty();
            for cert in certificates(&ca_pem, &ca_from)? {
                roots
                    .add(cert)
                    .map_err(|e| anyhow!("{ca_from}: not a CA certificate rustls can use: {e}"))?;
            }
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), Arc::clone(&provider));
            let verifier = match auth {
                ClientAuth::VerifyIfGiven => verifier.allow_unauthenticated(),
                _ => verifier,
            };
            builder.with_client_cert_verifier(
                verifier
                    .build()
                    .map_err(|e| anyhow!("{ca_from}: the client CA cannot be used: {e}"))?,
            )
        }
    };
    let mut config = builder.with_single_cert(certs, key).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => {
            anyhow!(
                "{key_from} is not the private key of {cert_from}: give the certificate's own key"
            )
        }
        e => anyhow!("{cert_from} with {key_from}: the certificate and key cannot be used: {e}"),
    })?;
    // Go's prefer_server_cipher_suites, true unless said otherwise.
    config.ignore_client_order = t.prefer_server_cipher_suites.unwrap_or(true);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(text: &str) -> String {
        match WebConfig::parse(text, Path::new("/nonexistent")) {
            Ok(_) => panic!("accepted: {text}"),
            Err(e) => format!("{e:#}"),
        }
    }

    #[test]
    fn an_empty_file_is_plain_http_without_auth() {
        for text in ["", "# nothing\n", "basic_auth_users:\n"] {
            let c = WebConfig::parse(text, Path::new(".")).unwrap();
            assert!(c.tls.is_none() && c.users.is_empty() && c.headers.is_empty());
        }
    }

    #[test]
    fn every_unknown_or_unsupported_key_is_an_error_in_one_line_naming_it() {
        for (text, named) in [
            ("tls_server_config:\n  cert_fil: a\n", "cert_fil"),
            ("basic_auth_user:\n  a: b\n", "basic_auth_user"),
            (
                "tls_server_config:\n  cipher_suites: [TLS_AES_128_GCM_SHA256]\n",
                "cipher_suites",
            ),
            (
                "tls_server_config:\n  curve_preferences: [X25519]\n",
                "curve_preferences",
            ),
            (
                "tls_server_config:\n  client_allowed_sans: [a]\n",
                "client_allowed_sans",
            ),
            (
                "tls_server_config:\n  min_version: TLS10\n",
                "min_version TLS10",
            ),
            (
                "tls_server_config:\n  client_auth_type: RequireAnyClientCert\n",
                "RequireAnyClientCert",
            ),
            ("rate_limit:\n  interval: 1s\n", "rate_limit"),
            ("http_server_config:\n  http3: true\n", "http3"),
            (
                "http_server_config:\n  headers:\n    Server: x\n",
                "\"Server\" cannot be set",
            ),
            (
                "http_server_config:\n  headers:\n    X-Frame-Options: allow\n",
                "X-Frame-Options",
            ),
            (
                "basic_auth_users:\n  alice: secret\n",
                "\"alice\" is not a bcrypt hash",
            ),
            (
                "http_server_config:\n  headers:\n    Content-Security-Policy: \"a\\nb\"\n",
                "Content-Security-Policy must be printable ASCII",
            ),
            ("tls_server_config:\n  key_file: k.pem\n", "cert_file"),
            ("tls_server_config: [\n", "tls_server_config"),
        ] {
            let e = error(text);
            assert!(e.contains(named), "{text:?}: {e}");
            assert!(!e.contains('\n'), "{text:?}: {e}");
        }
    }

    #[test]
    fn a_missing_file_is_named() {
        let e = format!(
            "{:#}",
            WebConfig::parse(
                "tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n",
                Path::new("/nonexistent-dir")
            )
            .err()
            .unwrap()
        );
        assert!(
            e.contains("/nonexistent-dir/cert.pem: cannot read it"),
            "{e}"
        );
    }

    #[test]
    fn the_example_shipped_has_only_keys_taken() {
        let example = include_str!("../../dist/web-config.example.yml");
        // Its certificate is the one thing it cannot have here.
        let e = format!(
            "{:#}",
            WebConfig::parse(example, Path::new("/")).err().unwrap()
        );
        assert!(
            e.contains("cert_file /etc/myprobe/tls/agent.crt: cannot read it"),
            "{e}"
        );
        let without_tls: String = example
            .lines()
            .skip_while(|l| !l.starts_with("http_server_config:"))
            .map(|l| format!("{l}\n"))
            .collect();
        let c = WebConfig::parse(&without_tls, Path::new("/")).unwrap();
        assert_eq!(c.users.len(), 1);
        assert_eq!(c.headers.len(), 2);
    }

    #[test]
    fn users_and_headers_are_kept() {
        let hash = bcrypt::hash("secret", 4).unwrap();
        let c = WebConfig::parse(
            &format!(
                "basic_auth_users:\n  alice: '{hash}'\nhttp_server_config:\n  http2: false\n  headers:\n    \
                 X-Frame-Options: deny\n    Content-Security-Policy: ''\n"
            ),
            Path::new("."),
        )
        .unwrap();
        assert_eq!(
            c.users.get("alice").map(String::as_str),
            Some(hash.as_str())
        );
        assert_eq!(
            c.headers,
            [("X-Frame-Options".to_string(), "deny".to_string())]
        );
    }
}
