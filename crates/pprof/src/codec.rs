//! Bytes ⇄ [`Profile`]: gzip detection, a bound on decompressed size, and
//! deterministic gzip'd output.

use std::io::{Read, Write};

use flate2::{Compression, GzBuilder, read::GzDecoder};
use prost::Message;

use crate::{Profile, ValidationError, validate};

/// Largest decompressed profile [`decode`] accepts (1 GiB): a gzip bomb fails
/// with [`DecodeError::TooLarge`] instead of exhausting memory.
pub const DEFAULT_MAX_DECODED_BYTES: u64 = 1 << 30;

/// Why bytes are not a usable profile.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The input is empty.
    #[error("empty input: a profile has at least a string table")]
    Empty,
    /// The input starts with the gzip magic but does not inflate.
    #[error("bad gzip data: {0}")]
    Gzip(String),
    /// Inflating would exceed the size limit.
    #[error("decompressed profile exceeds the limit of {limit} bytes")]
    TooLarge {
        /// The limit that was hit, in bytes.
        limit: u64,
    },
    /// The (inflated) bytes are not a `perftools.profiles.Profile` message.
    #[error("not a pprof protobuf: {0}")]
    Protobuf(#[from] prost::DecodeError),
    /// The message decodes but breaks a pprof invariant.
    #[error("invalid profile: {0}")]
    Invalid(#[from] ValidationError),
}

/// Decodes a gzip'd or raw pprof protobuf and validates it.
pub fn decode(bytes: &[u8]) -> Result<Profile, DecodeError> {
    decode_with_limit(bytes, DEFAULT_MAX_DECODED_BYTES)
}

/// [`decode`] with an explicit bound on the decompressed size.
pub fn decode_with_limit(bytes: &[u8], max_decoded_bytes: u64) -> Result<Profile, DecodeError> {
    if bytes.is_empty() {
        return Err(DecodeError::Empty);
    }
    let profile = if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut raw = Vec::new();
        let mut reader = GzDecoder::new(bytes).take(max_decoded_bytes.saturating_add(1));
        reader
            .read_to_end(&mut raw)
            .map_err(|e| DecodeError::Gzip(e.to_string()))?;
        if raw.len() as u64 > max_decoded_bytes {
            return Err(DecodeError::TooLarge {
                limit: max_decoded_bytes,
            });
        }
        Profile::decode(raw.as_slice())?
    } else {
        if bytes.len() as u64 > max_decoded_bytes {
            return Err(DecodeError::TooLarge {
                limit: max_decoded_bytes,
            });
        }
        Profile::decode(bytes)?
    };
    validate(&profile)?;
    Ok(profile)
}

/// Encodes as gzip'd protobuf, the form `go tool pprof` writes. The output
/// depends only on the profile (no timestamp or file name in the gzip header).
pub fn encode(profile: &Profile) -> Vec<u8> {
    let raw = encode_raw(profile);
    let mut out = Vec::with_capacity(raw.len() / 4 + 64);
    {
        let mut gz = GzBuilder::new()
            .mtime(0)
            .write(&mut out, Compression::new(6));
        gz.write_all(&raw).expect("writing to a Vec cannot fail");
        gz.finish().expect("writing to a Vec cannot fail");
    }
    out
}

/// Encodes as raw (uncompressed) protobuf.
pub fn encode_raw(profile: &Profile) -> Vec<u8> {
    profile.encode_to_vec()
}
