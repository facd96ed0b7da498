//! systemd's notify protocol without libsystemd: one datagram per message to
//! `$NOTIFY_SOCKET` (a path, or `@name` in the abstract namespace).
//!
//! Messages: `READY=1` once every context is warm and gated, `STATUS=...` with the loop's
//! figures, `WATCHDOG=1` from the loop's own health, `STOPPING=1` on the way out.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

pub struct Notifier {
    socket: UnixDatagram,
    addr: std::os::unix::net::SocketAddr,
}

impl Notifier {
    /// The notifier of this service, if systemd gave one (and notifying is enabled).
    pub fn from_env() -> Option<Self> {
        let path = std::env::var_os("NOTIFY_SOCKET")?;
        let bytes = path.as_encoded_bytes();
        let addr = if let Some(name) = bytes.strip_prefix(b"@") {
            use std::os::linux::net::SocketAddrExt;
            std::os::unix::net::SocketAddr::from_abstract_name(name).ok()?
        } else {
            std::os::unix::net::SocketAddr::from_pathname(std::path::Path::new(&path)).ok()?
        };
        let socket = UnixDatagram::unbound().ok()?;
        // A notify socket whose queue is full must never stall the daemon's main loop: a
        // dropped STATUS is harmless, and the next WATCHDOG follows half an interval later.
        socket.set_nonblocking(true).ok()?;
        Some(Self { socket, addr })
    }

    /// Sends one datagram, never blocking: a full queue drops the message.
    pub fn send(&self, message: &str) -> Sent {
        match self.socket.send_to_addr(message.as_bytes(), &self.addr) {
            Ok(_) => Sent::Queued,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                log::debug!(
                    "sd_notify queue full; dropped `{}`",
                    message.lines().next().unwrap_or("")
                );
                Sent::Dropped
            }
            Err(e) => {
                log::warn!("sd_notify `{}`: {e}", message.lines().next().unwrap_or(""));
                Sent::Failed
            }
        }
    }
}

/// What became of one notify message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sent {
    Queued,
    /// The receiver's queue was full (nobody reading): dropped rather than waited for.
    Dropped,
    /// Any other error (logged).
    Failed,
}

/// Half the watchdog interval systemd expects from this process, if it expects one.
pub fn watchdog_interval() -> Option<Duration> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    if let Ok(pid) = std::env::var("WATCHDOG_PID") {
        if pid.parse::<u32>().ok()? != std::process::id() {
            return None;
        }
    }
    (usec > 0).then(|| Duration::from_micros(usec / 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_datagrams_to_a_path_socket() {
        let dir = std::env::temp_dir().join(format!("vlad-notify-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("notify.sock");
        let _ = std::fs::remove_file(&path);
        let server = UnixDatagram::bind(&path).unwrap();
        let addr = std::os::unix::net::SocketAddr::from_pathname(&path).unwrap();
        let socket = UnixDatagram::unbound().unwrap();
        socket.set_nonblocking(true).unwrap();
        let n = Notifier { socket, addr };
        n.send("READY=1\nSTATUS=warm");
        let mut buf = [0u8; 64];
        let len = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1\nSTATUS=warm");
        // Nobody reading: the queue fills and sends are dropped instead of blocking (a
        // blocking socket would hang here, which the harness cannot tell from slowness, so
        // the outcome of every send is counted).
        let outcomes: Vec<Sent> = (0..1000).map(|_| n.send("STATUS=flood")).collect();
        let queued = outcomes.iter().filter(|o| **o == Sent::Queued).count();
        let dropped = outcomes.iter().filter(|o| **o == Sent::Dropped).count();
        assert_eq!(queued + dropped, 1000, "no send failed otherwise");
        assert!(
            queued > 0 && dropped > 0,
            "{queued} queued, {dropped} dropped"
        );
        // Exactly the queued ones arrive; then the queue is empty and sending works again.
        server.set_nonblocking(true).unwrap();
        let mut received = 0;
        while let Ok(len) = server.recv(&mut buf) {
            assert_eq!(&buf[..len], b"STATUS=flood");
            received += 1;
        }
        assert_eq!(received, queued);
        assert_eq!(n.send("WATCHDOG=1"), Sent::Queued);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
