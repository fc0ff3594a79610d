//! The byte forms stores persist: fixed little-endian u64 words, one tag byte per limit.

use crate::DecodeError;

pub(crate) fn words<const N: usize, const B: usize>(values: [u64; N]) -> [u8; B] {
    debug_assert_eq!(B, N * 8);
    let mut out = [0; B];
    for (chunk, value) in out.chunks_exact_mut(8).zip(values) {
        chunk.copy_from_slice(&value.to_le_bytes());
    }
    out
}

pub(crate) fn from_words<const N: usize>(bytes: &[u8]) -> Result<[u64; N], DecodeError> {
    if bytes.len() != N * 8 {
        return Err(DecodeError::WrongLength);
    }
    let mut out = [0; N];
    for (value, chunk) in out.iter_mut().zip(bytes.chunks_exact(8)) {
        let mut word = [0; 8];
        word.copy_from_slice(chunk);
        *value = u64::from_le_bytes(word);
    }
    Ok(out)
}
