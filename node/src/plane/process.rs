//! A process on this host, named so that a reused pid is not taken for it: its pid and its
//! start time (`/proc/<pid>/stat`, field 22, in clock ticks since boot). A shared-memory
//! link's ends tell each other theirs ([`super::local_link`]), so each can see at once
//! whether the other's process has exited, or is stopped ([`ProcessId::state`]).

use std::sync::OnceLock;

/// A process of this host: pid and start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessId {
    /// Its pid (in this host's pid namespace).
    pub pid: u32,
    /// Its start time, clock ticks since boot.
    pub start: u64,
}

/// What `/proc` says of a [`ProcessId`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessState {
    /// Running or sleeping (it may still be hung).
    Alive,
    /// Stopped (SIGSTOP, a debugger): paused, not dead.
    Stopped,
    /// Exited (a zombie, or no such process), or the pid now names another process.
    Gone,
}

/// Bytes of a [`ProcessId`] on the wire: pid (u32 LE), start (u64 LE).
pub const WIRE_LEN: usize = 12;

impl ProcessId {
    /// This process, or `None` where `/proc` does not say.
    pub fn this() -> Option<ProcessId> {
        static THIS: OnceLock<Option<ProcessId>> = OnceLock::new();
        *THIS.get_or_init(|| {
            let pid = std::process::id();
            let (_, start) = read_stat(pid)?;
            Some(ProcessId { pid, start })
        })
    }

    /// Its state now. A pid whose start time differs is another process: the one named
    /// is [`ProcessState::Gone`].
    pub fn state(&self) -> ProcessState {
        match read_stat(self.pid) {
            Some((state, start)) if start == self.start => match state {
                'T' | 't' => ProcessState::Stopped,
                'Z' | 'X' | 'x' => ProcessState::Gone,
                _ => ProcessState::Alive,
            },
            _ => ProcessState::Gone,
        }
    }

    /// The wire form ([`WIRE_LEN`] bytes).
    pub fn to_bytes(self) -> [u8; WIRE_LEN] {
        let mut b = [0u8; WIRE_LEN];
        b[..4].copy_from_slice(&self.pid.to_le_bytes());
        b[4..].copy_from_slice(&self.start.to_le_bytes());
        b
    }

    /// From the wire form; `None` unless exactly [`WIRE_LEN`] bytes.
    pub fn from_bytes(b: &[u8]) -> Option<ProcessId> {
        let b: &[u8; WIRE_LEN] = b.try_into().ok()?;
        let (pid, start) = b.split_at(4);
        Some(ProcessId {
            pid: u32::from_le_bytes(pid.try_into().ok()?),
            start: u64::from_le_bytes(start.try_into().ok()?),
        })
    }
}

/// Whether process `pid` is stopped (SIGSTOP, a debugger), by `/proc`; `false` if `/proc`
/// does not say (a launcher's child, known by its pid alone).
pub fn is_stopped(pid: u32) -> bool {
    read_stat(pid).is_some_and(|(state, _)| matches!(state, 'T' | 't'))
}

/// The state letter and start time of process `pid`, from `/proc/<pid>/stat`.
fn read_stat(pid: u32) -> Option<(char, u64)> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The state letter (field 3) and start time (field 22) of a `/proc/<pid>/stat` line. The
/// command name (field 2) is in parentheses and may hold spaces and parentheses, so the
/// fields are counted from the last `)`.
fn parse_stat(line: &str) -> Option<(char, u64)> {
    let rest = &line[line.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // Fields 4..21 come between the state and the start time.
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stat_line_is_read_from_the_last_parenthesis() {
        let line = "4242 (a (strange) name) T 1 4242 4242 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 \
                    3 0 987654 12345678 300 18446744073709551615";
        assert_eq!(parse_stat(line), Some(('T', 987654)));
        assert_eq!(parse_stat("1 (init) S 0"), None);
        assert_eq!(parse_stat("no parenthesis"), None);
    }

    #[test]
    fn a_child_is_alive_stopped_then_gone_and_a_reused_pid_is_not_it() {
        let me = ProcessId::this().expect("/proc says who this process is");
        assert_eq!(me.state(), ProcessState::Alive);
        assert_eq!(ProcessId::from_bytes(&me.to_bytes()), Some(me));
        assert_eq!(ProcessId::from_bytes(&me.to_bytes()[1..]), None);
        let other = ProcessId {
            start: me.start + 1,
            ..me
        };
        assert_eq!(other.state(), ProcessState::Gone, "another start time");
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        let (_, start) = read_stat(pid).unwrap();
        let it = ProcessId { pid, start };
        let kill = |sig| {
            // SAFETY: a signal to this test's own child.
            unsafe { libc::kill(pid as i32, sig) }
        };
        kill(libc::SIGSTOP);
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while it.state() != ProcessState::Stopped && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(it.state(), ProcessState::Stopped);
        kill(libc::SIGCONT);
        kill(libc::SIGKILL);
        child.wait().unwrap();
        assert_eq!(it.state(), ProcessState::Gone);
    }
}
