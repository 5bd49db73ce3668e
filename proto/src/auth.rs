//! Password hashes for `user:` identities (server/src/acl.rs has the
//! rules): PBKDF2-HMAC-SHA256 with a random 16-byte salt and [`ITERATIONS`]
//! rounds. The client hashes a new user's password; a member verifies an
//! `auth` against the stored hash in constant time. Both sides use this
//! module, so the parameters cannot drift apart.

use std::num::NonZeroU32;

/// PBKDF2 rounds.
pub const ITERATIONS: u32 = 100_000;

fn rounds() -> NonZeroU32 {
    NonZeroU32::new(ITERATIONS).unwrap_or(NonZeroU32::MIN)
}

/// A salted hash of `password`.
pub fn hash_password(password: &str, salt: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; 32];
    ring::pbkdf2::derive(ring::pbkdf2::PBKDF2_HMAC_SHA256, rounds(), salt, password.as_bytes(), &mut out);
    out
}

/// True when `password` matches `hash` (constant time).
pub fn verify_password(password: &str, salt: &[u8], hash: &[u8]) -> bool {
    ring::pbkdf2::verify(ring::pbkdf2::PBKDF2_HMAC_SHA256, rounds(), salt, password.as_bytes(), hash).is_ok()
}

/// A new random salt.
pub fn new_salt() -> Result<[u8; 16], String> {
    use ring::rand::SecureRandom;
    let mut salt = [0u8; 16];
    ring::rand::SystemRandom::new().fill(&mut salt).map_err(|_| "no system randomness".to_string())?;
    Ok(salt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords() {
        let h = hash_password("s3cret", &[7; 16]);
        assert!(verify_password("s3cret", &[7; 16], &h));
        assert!(!verify_password("s3cret!", &[7; 16], &h));
        assert!(!verify_password("s3cret", &[8; 16], &h));
        assert_ne!(new_salt(), new_salt());
    }
}
