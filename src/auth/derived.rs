//! SCRAM secrets derived from the auth file's plaintext passwords, kept for the life of
//! one loaded configuration.
//!
//! A SCRAM login against a plaintext password needs a SCRAM secret for it: PBKDF2 over
//! `scram_iterations` rounds, ~0.5 ms of CPU (4096 rounds, SHA-NI). Deriving it anew at
//! every login, with a fresh salt each time, made such a login cost the pooler 4x what
//! one against a stored SCRAM secret costs (docs/performance.md, thirtieth round). The
//! secret is derived once per user instead, with a random salt of its own, as
//! PostgreSQL stores one salt per role: the exchange stays as safe (the nonces are
//! still fresh at each login), and the salt a client sees is stable, as it would be
//! against PostgreSQL itself.
//!
//! The cache belongs to one [`crate::config::Config`]: a reload, or the console's `SET`,
//! makes a new configuration and so a new, empty cache, so a changed password or
//! iteration count is never answered from a stale entry. Entries are only ever made for
//! users listed with a plaintext password, so the operator's file bounds its size.

use std::fmt;
use std::sync::Mutex;

use rustc_hash::FxHashMap;

use super::ScramSecret;

/// Derived SCRAM secrets by user name. Cloning gives a new, empty cache (see the module
/// notes): a copied configuration may differ in exactly what the entries depend on.
#[derive(Default)]
pub struct DerivedSecrets {
    // Fx hashing: only `insert` grows the table, and only for names from the auth file.
    map: Mutex<FxHashMap<String, ScramSecret>>,
}

impl DerivedSecrets {
    /// The secret derived for `user`, if one was.
    pub fn get(&self, user: &str) -> Option<ScramSecret> {
        self.lock().get(user).cloned()
    }

    /// Keeps `secret` for `user`; a secret derived meanwhile by a concurrent login wins,
    /// so every login after the first sees the same salt.
    pub fn insert(&self, user: &str, secret: ScramSecret) -> ScramSecret {
        self.lock().entry(user.to_owned()).or_insert(secret).clone()
    }

    /// How many users have a derived secret.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no secret has been derived yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FxHashMap<String, ScramSecret>> {
        // A panic while holding the lock cannot leave a half-made entry (inserts are
        // whole), so a poisoned map is still sound.
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Clone for DerivedSecrets {
    fn clone(&self) -> Self {
        DerivedSecrets::default()
    }
}

impl fmt::Debug for DerivedSecrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DerivedSecrets({} users)", self.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{scram_secret_from_password, Secret};

    fn secret(password: &str, salt: &[u8]) -> ScramSecret {
        match Secret::parse(&scram_secret_from_password(password, salt, 16)) {
            Secret::Scram(s) => s,
            other => panic!("not a SCRAM secret: {other:?}"),
        }
    }

    #[test]
    fn the_first_secret_kept_for_a_user_is_the_one_every_later_login_gets() {
        let cache = DerivedSecrets::default();
        assert!(cache.get("alice").is_none());
        let first = secret("pw", b"salt-one");
        assert_eq!(cache.insert("alice", first.clone()), first);
        // A login that derived its own meanwhile gets the one already kept.
        assert_eq!(cache.insert("alice", secret("pw", b"salt-two")), first);
        assert_eq!(cache.get("alice"), Some(first));
        assert!(cache.get("bob").is_none());
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn a_copy_of_the_cache_starts_empty() {
        let cache = DerivedSecrets::default();
        cache.insert("alice", secret("pw", b"salt"));
        let copy = cache.clone();
        assert!(copy.is_empty());
        assert_eq!(cache.len(), 1);
    }
}
