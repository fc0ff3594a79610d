//! A private real `redis-server` spoken to in raw RESP, for tests that compare the
//! simulated Redis's replies with Redis's own, byte for byte.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::{Mutex, OnceLock};

use rein_redis_harness::RedisServer;

/// One private redis-server per test binary, with a plain RESP connection to it. Tests that
/// share it hold the lock for their whole run and start with `FLUSHALL`.
pub fn real_server() -> &'static Mutex<RealRedis> {
    static REAL: OnceLock<Mutex<RealRedis>> = OnceLock::new();
    REAL.get_or_init(|| {
        let server = RedisServer::start().expect("start a private redis-server");
        let stream = TcpStream::connect(server.addr()).expect("connect to redis-server");
        let reader = BufReader::new(stream.try_clone().expect("clone stream"));
        Mutex::new(RealRedis {
            _server: server,
            stream,
            reader,
        })
    })
}

/// A connection to the private server (which lives as long as this does).
pub struct RealRedis {
    _server: RedisServer,
    stream: TcpStream,
    reader: BufReader<TcpStream>,
}

impl RealRedis {
    /// Sends one request and returns the raw bytes of its reply.
    pub fn request(&mut self, args: &[impl AsRef<[u8]>]) -> Vec<u8> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for arg in args {
            let arg = arg.as_ref();
            out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            out.extend_from_slice(arg);
            out.extend_from_slice(b"\r\n");
        }
        self.stream.write_all(&out).expect("write to redis-server");
        let mut reply = Vec::new();
        self.read_reply(&mut reply);
        reply
    }

    fn read_reply(&mut self, reply: &mut Vec<u8>) {
        let start = reply.len();
        self.reader
            .read_until(b'\n', reply)
            .expect("read from redis-server");
        let line = String::from_utf8_lossy(&reply[start..])
            .trim_end()
            .to_string();
        let count = || line[1..].parse::<i64>().expect("length");
        match line.as_bytes().first() {
            Some(b'$') if count() >= 0 => {
                let mut body = vec![0; count() as usize + 2];
                self.reader.read_exact(&mut body).expect("read bulk");
                reply.extend_from_slice(&body);
            }
            Some(b'*') => {
                for _ in 0..count().max(0) {
                    self.read_reply(reply);
                }
            }
            Some(_) => {}
            None => panic!("redis-server closed the connection (crashed?)"),
        }
    }
}

/// Bytes as printable text, for assertion messages.
pub fn escape(bytes: &[u8]) -> String {
    bytes.escape_ascii().to_string()
}
