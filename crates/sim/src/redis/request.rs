//! Requests off the wire: RESP multibulk arrays of bulk strings, parsed without I/O.
//!
//! The parsing itself is mini-redis's `Frame::check` / `Frame::parse`, which already handle
//! partial and pipelined input. What mini-redis does not do is distrust its peer: a declared
//! bulk length near `u64::MAX` overflows its `len + 2`, and it accepts frames of any shape
//! and depth. So [`parse`] first walks the headers and enforces Redis's own request limits
//! (a multibulk of bulk strings, at most 1 Mi elements of at most 512 MiB), and only hands a
//! request that passed to mini-redis.

use std::io::Cursor;

use bytes::Bytes;
use mini_redis::Frame;

/// A request that can never be parsed: the connection must be closed after replying with
/// [`ProtocolError::reply`], as Redis does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtocolError {
    /// The request does not start with `*`. Redis would read it as an inline command (as
    /// typed into telnet); no client library sends those, so the simulator refuses them.
    InlineCommand,
    /// The element count is not a number or is above the limit.
    InvalidMultibulkLength,
    /// An element is not a bulk string (`$`).
    ExpectedBulk(u8),
    /// A bulk length is not a number or is above the limit.
    InvalidBulkLength,
    /// The header walk accepted bytes mini-redis then rejected (a bug in the walk).
    Malformed(String),
}

impl ProtocolError {
    /// The error reply Redis sends before closing the connection.
    pub fn reply(&self) -> super::Reply {
        super::Reply::error(match self {
            ProtocolError::InlineCommand => {
                "ERR Protocol error: inline commands are not supported by the simulated Redis"
                    .to_string()
            }
            ProtocolError::InvalidMultibulkLength => {
                "ERR Protocol error: invalid multibulk length".to_string()
            }
            ProtocolError::ExpectedBulk(got) => {
                format!(
                    "ERR Protocol error: expected '$', got '{}'",
                    char::from(*got)
                )
            }
            ProtocolError::InvalidBulkLength => {
                "ERR Protocol error: invalid bulk length".to_string()
            }
            ProtocolError::Malformed(why) => format!("ERR Protocol error: {why}"),
        })
    }
}

/// Parses the first request in `buf`.
///
/// Returns `Ok(None)` while the request is incomplete, and otherwise the arguments with the
/// number of bytes the request took. An empty argument list (`*0`, `*-1`) is valid and
/// answered by nothing, as in Redis.
pub fn parse(buf: &[u8]) -> Result<Option<(Vec<Bytes>, usize)>, ProtocolError> {
    let Some(shape) = check_shape(buf)? else {
        return Ok(None);
    };
    if let Shape::Empty(consumed) = shape {
        return Ok(Some((Vec::new(), consumed)));
    }
    let mut cursor = Cursor::new(buf);
    match Frame::check(&mut cursor) {
        Ok(()) => {}
        Err(mini_redis::frame::Error::Incomplete) => return Ok(None),
        Err(e) => return Err(ProtocolError::Malformed(e.to_string())),
    }
    let consumed = cursor.position() as usize;
    cursor.set_position(0);
    let frame = Frame::parse(&mut cursor).map_err(|e| ProtocolError::Malformed(e.to_string()))?;
    let Frame::Array(items) = frame else {
        return Err(ProtocolError::Malformed("request is not an array".into()));
    };
    let args = items
        .into_iter()
        .map(|item| match item {
            Frame::Bulk(bytes) => Ok(bytes),
            other => Err(ProtocolError::Malformed(format!(
                "unexpected element {other:?}"
            ))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some((args, consumed)))
}

/// What the header walk found.
enum Shape {
    /// `*0` or a negative count: no command, this many bytes.
    Empty(usize),
    /// A complete multibulk of bulk strings within limits.
    Complete,
}

/// Walks the headers of the first request. `Ok(None)` means incomplete.
fn check_shape(buf: &[u8]) -> Result<Option<Shape>, ProtocolError> {
    let Some(&first) = buf.first() else {
        return Ok(None);
    };
    if first != b'*' {
        return Err(ProtocolError::InlineCommand);
    }
    let Some((count, mut pos)) = line(buf, 1) else {
        return Ok(None);
    };
    let count = decimal(count).ok_or(ProtocolError::InvalidMultibulkLength)?;
    if count <= 0 {
        return Ok(Some(Shape::Empty(pos)));
    }
    if count > MAX_MULTIBULK_LEN {
        return Err(ProtocolError::InvalidMultibulkLength);
    }
    for _ in 0..count {
        let Some(&kind) = buf.get(pos) else {
            return Ok(None);
        };
        if kind != b'$' {
            return Err(ProtocolError::ExpectedBulk(kind));
        }
        let Some((len, after)) = line(buf, pos + 1) else {
            return Ok(None);
        };
        let len = decimal(len).ok_or(ProtocolError::InvalidBulkLength)?;
        if !(0..=MAX_BULK_LEN).contains(&len) {
            return Err(ProtocolError::InvalidBulkLength);
        }
        // Both terms are bounded above, so the sum cannot overflow.
        pos = after + len as usize + 2;
        if pos > buf.len() {
            return Ok(None);
        }
    }
    Ok(Some(Shape::Complete))
}

/// The line starting at `start` (without CRLF) and the position after its CRLF.
fn line(buf: &[u8], start: usize) -> Option<(&[u8], usize)> {
    let rest = buf.get(start..)?;
    let end = rest.windows(2).position(|w| w == b"\r\n")?;
    Some((&rest[..end], start + end + 2))
}

/// A header number: optional minus sign and at most 18 digits, so it fits an `i64`.
fn decimal(text: &[u8]) -> Option<i64> {
    let (negative, digits) = match text.split_first() {
        Some((b'-', digits)) => (true, digits),
        _ => (false, text),
    };
    if digits.is_empty() || digits.len() > 18 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let value = digits
        .iter()
        .fold(0i64, |n, &d| n * 10 + i64::from(d - b'0'));
    Some(if negative { -value } else { value })
}

/// Redis's limit on the number of arguments of one request.
const MAX_MULTIBULK_LEN: i64 = 1024 * 1024;

/// Redis's default `proto-max-bulk-len` (512 MiB).
const MAX_BULK_LEN: i64 = 512 * 1024 * 1024;

#[cfg(test)]
mod tests {
    use super::*;

    fn args(parsed: Option<(Vec<Bytes>, usize)>) -> (Vec<String>, usize) {
        let (args, used) = parsed.expect("complete request");
        (
            args.iter()
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect(),
            used,
        )
    }

    #[test]
    fn a_complete_request_is_parsed_with_its_length() {
        let buf = b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n";
        let (parsed, used) = args(parse(buf).unwrap());
        assert_eq!(
            (parsed, used),
            (vec!["GET".to_string(), "k".to_string()], buf.len())
        );
    }

    #[test]
    fn every_proper_prefix_of_a_request_is_incomplete() {
        let buf = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nva\r\nl\r\n";
        for end in 0..buf.len() {
            assert_eq!(parse(&buf[..end]), Ok(None), "prefix of {end} bytes");
        }
        assert_eq!(args(parse(buf).unwrap()).0, vec!["SET", "k", "va\r\nl"]);
    }

    #[test]
    fn pipelined_requests_are_taken_one_at_a_time() {
        let buf = b"*1\r\n$4\r\nPING\r\n*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\n*1\r\n$4\r\nPI";
        let (first, used) = args(parse(buf).unwrap());
        assert_eq!(first, vec!["PING"]);
        let (second, used2) = args(parse(&buf[used..]).unwrap());
        assert_eq!(second, vec!["ECHO", "hi"]);
        assert_eq!(parse(&buf[used + used2..]), Ok(None));
    }

    #[test]
    fn empty_multibulk_is_consumed_without_a_command() {
        assert_eq!(parse(b"*0\r\n*1\r\n"), Ok(Some((vec![], 4))));
        assert_eq!(parse(b"*-1\r\n"), Ok(Some((vec![], 5))));
    }

    #[test]
    fn hostile_lengths_are_protocol_errors_not_panics() {
        let huge = b"*1\r\n$18446744073709551615\r\nx\r\n";
        assert_eq!(parse(huge), Err(ProtocolError::InvalidBulkLength));
        assert_eq!(
            parse(b"*1\r\n$-5\r\n"),
            Err(ProtocolError::InvalidBulkLength)
        );
        assert_eq!(
            parse(b"*99999999999\r\n"),
            Err(ProtocolError::InvalidMultibulkLength)
        );
        assert_eq!(parse(b"*x\r\n"), Err(ProtocolError::InvalidMultibulkLength));
        assert_eq!(
            parse(b"*1\r\n*1\r\n$1\r\na\r\n"),
            Err(ProtocolError::ExpectedBulk(b'*'))
        );
        assert_eq!(
            parse(b"*1\r\n:5\r\n"),
            Err(ProtocolError::ExpectedBulk(b':'))
        );
        assert_eq!(parse(b"PING\r\n"), Err(ProtocolError::InlineCommand));
    }
}
