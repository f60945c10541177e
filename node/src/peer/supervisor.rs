//! News from the peer's supervisor (`murmur launch`): the launcher sees a peer process
//! exit the moment it does, and tells every other peer it runs, one line on their standard
//! input, so that a dead peer is noticed in a fraction of a second rather than after
//! `--peer-timeout-secs` of silence. A peer reads these lines only when started with
//! `MURMUR_SUPERVISED=1` (the launcher sets it); each notice is handled as a lost
//! connection to that process (the membership ignores it if a newer process of the rank is
//! known, [`crate::plane::Incarnation`]) that is certain: a link being opened to that
//! process is given up at once ([`Exits`]), and a rejoin notice about it that arrives later
//! is ignored.

use std::io::BufRead;

use murmur_gossip::Rank;
use tokio::sync::mpsc;
use tracing::warn;

use crate::plane::{Exits, Incarnation, NetEvent};

/// The environment variable that makes a peer read its supervisor's notices on stdin.
pub(crate) const SUPERVISED: &str = "MURMUR_SUPERVISED";

/// The line telling a peer that rank `rank`'s process of incarnation `incarnation` exited
/// (`how`: e.g. `SIGKILL`, `status 1`).
pub(crate) fn exit_notice(rank: Rank, incarnation: Incarnation, how: &str) -> String {
    format!("exited {rank} {incarnation} {how}\n")
}

/// Inverse of [`exit_notice`] (without its newline): (rank, incarnation, how); `None` for
/// anything else.
fn parse_exit_notice(line: &str) -> Option<(Rank, Incarnation, String)> {
    let mut words = line.trim_end().splitn(4, ' ');
    if words.next()? != "exited" {
        return None;
    }
    let rank = words.next()?.parse().ok()?;
    let incarnation = words.next()?.parse().ok()?;
    Some((rank, incarnation, words.next().unwrap_or("").to_string()))
}

/// With [`SUPERVISED`] set: a thread that marks each process of an exit notice on stdin in
/// `exits` and sends a [`NetEvent::Exited`] for rank `< n` on `events`, until stdin closes.
/// Malformed lines are logged and skipped.
pub(crate) fn listen(events: mpsc::Sender<NetEvent>, exits: std::sync::Arc<Exits>, n: usize) {
    if std::env::var_os(SUPERVISED).is_none() {
        return;
    }
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { return };
            match parse_exit_notice(&line) {
                Some((peer, incarnation, how)) if peer < n => {
                    let reason = format!("its process exited ({how}), as the launcher saw");
                    exits.mark(peer, incarnation);
                    let lost = NetEvent::Exited {
                        peer,
                        incarnation,
                        reason,
                    };
                    if events.blocking_send(lost).is_err() {
                        return;
                    }
                }
                _ => warn!(
                    line,
                    "ignored a line from the supervisor that is no exit notice"
                ),
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_notices_round_trip_and_other_lines_are_not_notices() {
        let line = exit_notice(3, 1_764_000_000_123_456, "SIGKILL");
        assert_eq!(
            parse_exit_notice(line.trim_end()),
            Some((3, 1_764_000_000_123_456, "SIGKILL".to_string()))
        );
        let status = exit_notice(5, 7, "status 1");
        assert_eq!(
            parse_exit_notice(&status),
            Some((5, 7, "status 1".to_string()))
        );
        for bad in [
            "",
            "exited",
            "exited x 1 SIGKILL",
            "exited 3 -1 x",
            "left 3 1 x",
        ] {
            assert_eq!(parse_exit_notice(bad), None, "{bad:?}");
        }
    }
}
