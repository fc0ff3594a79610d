//! What the simulated Redis answers, and its RESP2 encoding.
//!
//! mini-redis parses frames but has no public encoder, and its `Frame::Integer` is unsigned,
//! while scripts return negative integers all the time. So replies
//! are a type of their own, encoded here byte for byte as Redis 7.0 writes them.

use bytes::Bytes;

/// One RESP2 reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`, `+PONG`, `+string`: a status line.
    Status(Bytes),
    /// `-ERR message`: the text after the dash, its first word being the error code.
    Error(Bytes),
    /// `:n`.
    Integer(i64),
    /// `$len` followed by the bytes.
    Bulk(Bytes),
    /// `$-1`: the nil bulk string (a missing key or field).
    Nil,
    /// `*len` followed by the elements.
    Array(Vec<Reply>),
}

impl Reply {
    /// `+OK`.
    pub fn ok() -> Self {
        Reply::Status(Bytes::from_static(b"OK"))
    }

    /// A status line from a static string (`PONG`, a type name).
    pub fn status(text: &'static str) -> Self {
        Reply::Status(Bytes::from_static(text.as_bytes()))
    }

    /// An error reply; `message` starts with its code (`ERR`, `WRONGTYPE`, `NOSCRIPT`).
    pub fn error(message: impl Into<String>) -> Self {
        Reply::Error(Bytes::from(message.into()))
    }

    /// A bulk string copied from `bytes`.
    pub fn bulk(bytes: impl AsRef<[u8]>) -> Self {
        Reply::Bulk(Bytes::copy_from_slice(bytes.as_ref()))
    }

    /// Whether this is an error reply.
    pub fn is_error(&self) -> bool {
        matches!(self, Reply::Error(_))
    }

    /// The error code (the first word of an error reply), if this is one.
    pub fn error_code(&self) -> Option<&[u8]> {
        match self {
            Reply::Error(message) => message.split(|&b| b == b' ').next(),
            _ => None,
        }
    }

    /// Appends the RESP2 encoding to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Reply::Status(text) => encode_line(b'+', text, out),
            Reply::Error(message) => encode_line(b'-', message, out),
            Reply::Integer(n) => {
                out.push(b':');
                out.extend_from_slice(n.to_string().as_bytes());
                out.extend_from_slice(b"\r\n");
            }
            Reply::Bulk(bytes) => {
                out.push(b'$');
                out.extend_from_slice(bytes.len().to_string().as_bytes());
                out.extend_from_slice(b"\r\n");
                out.extend_from_slice(bytes);
                out.extend_from_slice(b"\r\n");
            }
            Reply::Nil => out.extend_from_slice(b"$-1\r\n"),
            Reply::Array(items) => {
                out.push(b'*');
                out.extend_from_slice(items.len().to_string().as_bytes());
                out.extend_from_slice(b"\r\n");
                for item in items {
                    item.encode(out);
                }
            }
        }
    }

    /// The RESP2 encoding as a fresh buffer.
    pub fn to_resp(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode(&mut out);
        out
    }
}

/// A status or error line. A CR or LF inside would end the line early and desynchronise the
/// client, so Redis turns both into spaces; so does this.
fn encode_line(prefix: u8, text: &[u8], out: &mut Vec<u8>) {
    out.push(prefix);
    out.extend(
        text.iter()
            .map(|&b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
    );
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negative_integers_are_encoded_with_their_sign() {
        assert_eq!(Reply::Integer(-2).to_resp(), b":-2\r\n");
        assert_eq!(
            Reply::Integer(i64::MIN).to_resp(),
            b":-9223372036854775808\r\n"
        );
    }

    #[test]
    fn nested_arrays_nil_and_bulk_are_encoded_like_redis() {
        let reply = Reply::Array(vec![
            Reply::bulk("a"),
            Reply::Nil,
            Reply::Array(vec![Reply::Integer(1), Reply::ok()]),
            Reply::bulk(""),
        ]);
        assert_eq!(
            reply.to_resp(),
            b"*4\r\n$1\r\na\r\n$-1\r\n*2\r\n:1\r\n+OK\r\n$0\r\n\r\n"
        );
    }

    #[test]
    fn line_breaks_inside_status_and_error_lines_become_spaces() {
        assert_eq!(
            Reply::Status(Bytes::from_static(b"a\r\nb")).to_resp(),
            b"+a  b\r\n"
        );
        assert_eq!(Reply::error("ERR x\ny").to_resp(), b"-ERR x y\r\n");
    }

    #[test]
    fn error_code_is_the_first_word() {
        assert_eq!(
            Reply::error("WRONGTYPE Operation").error_code(),
            Some(&b"WRONGTYPE"[..])
        );
        assert_eq!(Reply::ok().error_code(), None);
    }
}
