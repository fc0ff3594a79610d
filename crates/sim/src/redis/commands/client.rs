//! `CLIENT`: the only per-connection state the simulator keeps is the client name.
//!
//! `CLIENT SETINFO` is answered OK as Redis 7.2 does (7.0 does not know it), so a client
//! configured to announce its library works against the simulator either way.

use bytes::Bytes;

use super::{Reply, is};

/// What one connection has told the server about itself.
#[derive(Clone, Debug, Default)]
pub struct Session {
    name: Option<Bytes>,
}

impl Session {
    /// Runs `CLIENT <subcommand> ...` (subcommand and arity already checked).
    pub fn client_command(&mut self, args: &[Bytes]) -> Reply {
        let sub = &args[1];
        if is(sub, "setname") {
            let name = &args[2];
            if name.iter().any(|&b| !(b'!'..=b'~').contains(&b)) {
                return Reply::error(
                    "ERR Client names cannot contain spaces, newlines or special characters.",
                );
            }
            self.name = (!name.is_empty()).then(|| name.clone());
            Reply::ok()
        } else if is(sub, "getname") {
            self.name.clone().map_or(Reply::Nil, Reply::Bulk)
        } else if is(sub, "setinfo") {
            Reply::ok()
        } else {
            let sub = String::from_utf8_lossy(sub);
            Reply::error(format!("ERR unknown subcommand '{sub}'. Try CLIENT HELP."))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<Bytes> {
        a.iter()
            .map(|s| Bytes::copy_from_slice(s.as_bytes()))
            .collect()
    }

    #[test]
    fn the_name_is_kept_per_session() {
        let mut session = Session::default();
        assert_eq!(
            session.client_command(&args(&["CLIENT", "GETNAME"])),
            Reply::Nil
        );
        assert_eq!(
            session.client_command(&args(&["CLIENT", "SETNAME", "node-1"])),
            Reply::ok()
        );
        assert_eq!(
            session.client_command(&args(&["CLIENT", "GETNAME"])),
            Reply::bulk("node-1")
        );
        assert!(
            session
                .client_command(&args(&["CLIENT", "SETNAME", "a b"]))
                .is_error()
        );
        assert_eq!(
            session.client_command(&args(&["CLIENT", "SETINFO", "lib-name", "redis-rs"])),
            Reply::ok()
        );
    }
}
