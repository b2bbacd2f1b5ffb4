//! Who may read the agent's HTTP endpoints: basic auth against `--web.config.file`'s bcrypt hashes, checked for
//! every request before it is routed, and the headers added to every response.
//!
//! bcrypt costs tens of milliseconds a check by design, so each answer is remembered by user and SHA-256 of the
//! password given (never the password itself): a scrape every second checks once. Checks run one at a time, as
//! exporter-toolkit's do, so that wrong passwords in a loop take one CPU at most.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Mutex,
};

use base64::Engine;

/// Answers remembered: past it they are forgotten and checked again (a few users, a few passwords each).
const REMEMBERED: usize = 100;

/// The realm a browser shows when it asks for the user and password.
pub const REALM: &str = "myprobe";

pub struct Access {
    /// User → bcrypt hash; none: every request is let in.
    users: BTreeMap<String, String>,
    /// A hash of the users' cost for a user unknown, so that an unknown user takes as long as a known one.
    decoy: String,
    /// (user, SHA-256 of the password given) → whether it is the user's.
    verified: Mutex<HashMap<(String, [u8; 32]), bool>>,
    /// Held while bcrypt runs: one check at a time, while answers remembered are given meanwhile.
    checking: Mutex<()>,
    headers: Vec<(String, String)>,
}

impl Access {
    pub fn new(users: BTreeMap<String, String>, headers: Vec<(String, String)>) -> Access {
        let cost = users
            .values()
            .filter_map(|h| h.parse::<bcrypt::HashParts>().ok())
            .map(|p| p.get_cost())
            .max();
        let decoy = cost
            .and_then(|cost| bcrypt::hash("not a password of anyone's", cost).ok())
            .unwrap_or_default();
        Access {
            users,
            decoy,
            verified: Mutex::new(HashMap::new()),
            checking: Mutex::new(()),
            headers,
        }
    }

    /// Whether a request with this `Authorization` header may be served.
    pub fn allows(&self, authorization: Option<&str>) -> bool {
        if self.users.is_empty() {
            return true;
        }
        let Some((user, password)) = authorization.and_then(basic_credentials) else {
            return false;
        };
        let digest = ring::digest::digest(&ring::digest::SHA256, password.as_bytes());
        let key = (
            user,
            digest.as_ref().try_into().expect("SHA-256 is 32 bytes"),
        );
        let remembered = |key: &(String, [u8; 32])| {
            let verified = self.verified.lock().unwrap_or_else(|e| e.into_inner());
            verified.get(key).copied()
        };
        if let Some(answer) = remembered(&key) {
            return answer;
        }
        let _checking = self.checking.lock().unwrap_or_else(|e| e.into_inner());
        // Checked by another request while this one waited its turn.
        if let Some(answer) = remembered(&key) {
            return answer;
        }
        let hash = self.users.get(&key.0);
        let matches = bcrypt::verify(&password, hash.unwrap_or(&self.decoy)).unwrap_or(false);
        let answer = hash.is_some() && matches;
        let mut verified = self.verified.lock().unwrap_or_else(|e| e.into_inner());
        if verified.len() >= REMEMBERED {
            verified.clear();
        }
        verified.insert(key, answer);
        answer
    }

    /// The headers `http_server_config.headers` adds to every response.
    pub fn headers(&self) -> &[(String, String)] {
        &self.headers
    }
}

/// `Basic base64(user:password)` (RFC 7617): the user, and the password after the first colon.
fn basic_credentials(authorization: &str) -> Option<(String, String)> {
    let (scheme, encoded) = authorization.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    Some((user.to_string(), password.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basic(credentials: &str) -> String {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(credentials)
        )
    }

    #[test]
    fn only_the_right_password_of_a_known_user_is_let_in_and_answers_are_remembered() {
        let users = BTreeMap::from([("alice".to_string(), bcrypt::hash("s3cr:t", 4).unwrap())]);
        let access = Access::new(users, Vec::new());
        assert!(access.allows(Some(&basic("alice:s3cr:t"))));
        assert!(access.allows(Some(&basic("alice:s3cr:t"))));
        assert!(!access.allows(Some(&basic("alice:s3cr"))));
        assert!(!access.allows(Some(&basic("bob:s3cr:t"))));
        assert!(!access.allows(Some("Bearer abc")));
        assert!(!access.allows(Some("Basic !!!")));
        assert!(!access.allows(None));
        let verified = access.verified.lock().unwrap();
        assert_eq!(verified.len(), 3);
        assert!(verified.keys().all(|(_, digest)| digest.len() == 32));
    }

    #[test]
    fn without_users_everyone_is_let_in() {
        assert!(Access::new(BTreeMap::new(), Vec::new()).allows(None));
    }
}
