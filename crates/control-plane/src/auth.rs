//! The one bearer-token parser and the one constant-time secret check,
//! shared by the REST API (account tokens) and the gRPC Registry (the
//! agent secret).
//!
//! Imports nothing of this crate.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Longest bearer token accepted.
pub const MAX_TOKEN_BYTES: usize = 512;

/// Why an `Authorization` value is not a bearer token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BearerError {
    /// No `Authorization` header (metadata) at all.
    Missing,
    /// Present but not `Bearer <token>` (or longer than [`MAX_TOKEN_BYTES`]).
    Malformed,
}

/// The token of an `Authorization: Bearer <token>` value (the scheme is
/// case-insensitive, surrounding spaces are dropped).
pub fn bearer(value: Option<&[u8]>) -> Result<&str, BearerError> {
    let value = value.ok_or(BearerError::Missing)?;
    let value = std::str::from_utf8(value).map_err(|_| BearerError::Malformed)?;
    let (scheme, token) = value.trim().split_once(' ').ok_or(BearerError::Malformed)?;
    let token = token.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() || token.len() > MAX_TOKEN_BYTES {
        return Err(BearerError::Malformed);
    }
    Ok(token)
}

/// Whether two secrets are equal, in time independent of their contents
/// and lengths: both are hashed, and the digests compared in constant time.
pub fn secrets_equal(a: &[u8], b: &[u8]) -> bool {
    Sha256::digest(a).ct_eq(&Sha256::digest(b)).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_values() {
        assert_eq!(bearer(Some(b"Bearer abc")), Ok("abc"));
        assert_eq!(bearer(Some(b"bearer  abc ")), Ok("abc"));
        assert_eq!(bearer(None), Err(BearerError::Missing));
        for bad in [
            &b"Basic abc"[..],
            b"Bearer",
            b"Bearer ",
            b"abc",
            b"Bearer \xff",
        ] {
            assert_eq!(bearer(Some(bad)), Err(BearerError::Malformed), "{bad:?}");
        }
        let long = format!("Bearer {}", "a".repeat(MAX_TOKEN_BYTES + 1));
        assert_eq!(bearer(Some(long.as_bytes())), Err(BearerError::Malformed));
    }

    #[test]
    fn secrets() {
        assert!(secrets_equal(b"same-secret", b"same-secret"));
        assert!(!secrets_equal(b"same-secret", b"same-secreT"));
        assert!(!secrets_equal(b"short", b"short-but-longer"));
        assert!(!secrets_equal(b"", b"x"));
    }
}
