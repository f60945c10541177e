//! The peer's sans-I/O core, as quinn-proto's `Connection` is to quinn's driver: it takes
//! what happened ([`Input`]: a frame, a lost connection, a goodbye, a new peer, a failed
//! send, an opened link) with the time it happened, decides, and returns what to do
//! ([`Action`]: send, broadcast, connect, drop links, admit an identity, record). It owns
//! the algorithm's state machine, the membership state machine, the goodbye bookkeeping
//! and the refused-frame count; it has no socket, no runtime and no file. The shell
//! ([`super::driver::Driver`]) owns those, carries the actions out, and feeds back what
//! came of them.
//!
//! - [`policy`]: the pure decisions it asks ([`policy::Goodbyes`], [`policy::route`]);
//! - `membership`: departures, a restarted peer's hello and rejoin, the admission of a new
//!   peer ([`crate::control::membership`] decides; the core turns verdicts into actions);
//! - [`catch_up`]: a rejoining peer's x fetched in parts from several donors at once.

pub(crate) mod catch_up;
mod membership;
pub(super) mod policy;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use murmur_compress::Compressor;
use murmur_gossip::frame::{FrameHeader, FrameKind, FRAME_HEADER_LEN};
use murmur_gossip::{Gossip, GossipEvent, Rank};
use murmur_topology::MixingMatrix;
use rand::rngs::StdRng;
use rand::SeedableRng;
use tracing::{debug, warn};

use crate::control::membership::{Membership, Now, Welcome};
use crate::plane::Incarnation;
use crate::report::copy::{self, RecordCopy, RecordLine};
use crate::report::MembershipEvent;
use policy::{Goodbyes, Route};

/// Something that happened to this peer, fed to [`PeerCore::handle`].
#[derive(Debug)]
pub(crate) enum Input {
    /// A complete frame (header and payload, `bytes`) from peer `from`; `transfer`: the
    /// link's transfer time of it (QUIC only).
    Frame {
        from: Rank,
        header: FrameHeader,
        bytes: Bytes,
        transfer: Option<Duration>,
    },
    /// Peer `from` said goodbye and all its frames were delivered.
    Finished { from: Rank },
    /// Our link to `to` was closed by its receiver after our goodbye.
    LinkDone { to: Rank },
    /// A connection to or from `peer`'s process of incarnation `incarnation` failed before
    /// the goodbye.
    Lost {
        peer: Rank,
        incarnation: Incarnation,
        reason: String,
    },
    /// `peer`'s process of incarnation `incarnation` exited (its supervisor saw it): a
    /// [`Input::Lost`] that is also certain.
    Exited {
        peer: Rank,
        incarnation: Incarnation,
        reason: String,
    },
    /// The data plane refused a frame (it logged why).
    Refused { peer: Option<Rank>, reason: String },
    /// This peer's discovery admitted a new peer `peer_id` into the empty rank `rank`.
    Joined { rank: Rank, peer_id: libp2p::PeerId },
    /// A frame to `to` (the algorithm's, or a welcome) could not be sent: its link (to the
    /// process of incarnation `incarnation`) ended.
    SendFailed {
        to: Rank,
        incarnation: Incarnation,
        reason: String,
    },
    /// The link of [`Action::Connect`] to `to` is open.
    Connected { to: Rank },
}

/// What the shell does for the core, in order.
#[derive(Debug)]
pub(crate) enum Action {
    /// Send `frame` on every link except those to `except`, best effort (a failing link is
    /// reported by the data plane on its own).
    Broadcast { frame: Bytes, except: Vec<Rank> },
    /// Send `frame` to `to` on the link held to it, best effort (no link, or a link that
    /// fails: logged; what asked for it has its own time-out).
    Send { to: Rank, frame: Bytes },
    /// Open a link to `to` (identity `id`, its process of incarnation `incarnation`) at
    /// `addr`, direct first and relayed as the fallback; once open, [`Input::Connected`] and
    /// then `then` is sent on it. A failure is logged and nothing more happens.
    Connect {
        to: Rank,
        incarnation: Incarnation,
        addr: SocketAddr,
        id: libp2p::PeerId,
        then: Option<Bytes>,
    },
    /// Close the link to `peer` and its connections to us, those of its processes of
    /// incarnations below `before` (a newer process's stay open).
    DropLinks { peer: Rank, before: Incarnation },
    /// Close the connections to us of `peer`'s processes of incarnations below `before`
    /// (its new process, of incarnation `before`, said hello).
    ForgetOldConnections { peer: Rank, before: Incarnation },
    /// Let the data plane accept identity `id` as rank `rank`.
    Admit { id: libp2p::PeerId, rank: Rank },
    /// Every rank is taken: the data plane refuses strangers at once again.
    CloseAdmission,
    /// A peer came back (or a new one took its rank): its process and data-plane address,
    /// for the directory discovery serves to restarted peers.
    Relocated(crate::control::discovery::PeerInfo),
    /// A line of `membership.jsonl` (`at`: the round a rejoining peer mixes from), for the
    /// record's keeper's collector (nothing on a peer that keeps no record).
    Record {
        event: MembershipEvent,
        at: Option<u64>,
    },
    /// An epoch report (the frame's payload) of `from`, for the collector of the record's
    /// keeper (a peer that becomes the keeper soon takes those it was sent first); a report
    /// the collector refuses is counted with [`PeerCore::refuse`].
    Collect { from: Rank, report: Bytes },
    /// The record's keeper as this peer sees it may have changed
    /// ([`PeerCore::record_keeper`]): the shell takes up the record, hands it back, or
    /// links to the new keeper and sends it the reports it kept.
    FollowRecord,
}

/// How a round ended, as the algorithm's state machine says.
#[derive(Debug)]
pub(crate) enum RoundEnd {
    /// Mixed: the next round may begin.
    Mixed,
    /// Not mixed: a neighbour's frame did not come in time, or training diverged. The
    /// message is the peer's error line.
    Failed(String),
}

/// One peer's state, apart from its model and its I/O.
pub(crate) struct PeerCore {
    pub(crate) rank: Rank,
    /// The algorithm's state machine.
    pub(crate) gossip: Box<dyn Gossip>,
    /// Who owes whom the counted goodbye.
    pub(crate) goodbyes: Goodbyes,
    /// Frames dropped as malformed, unexpected or not allowed.
    pub(crate) refused_frames: u64,
    /// The record's keeper when [`Action::FollowRecord`] was last asked for.
    keeper: Rank,
    /// Each rank's data-plane address as last heard (the directory, hellos, rejoin
    /// notices; `None`: unknown), to link to a new record keeper.
    addrs: Vec<Option<SocketAddr>>,
    /// The ranks not every peer can dial, as the directory had them
    /// ([`CoreSetup::behind_nat`]).
    behind_nat: Vec<Rank>,
    /// The run's mixing matrix W (n×n); re-weighted without the departed peers when used.
    w: MixingMatrix,
    /// Algorithm name, for messages.
    algorithm: String,
    /// The membership state machine: the peers that left the run (and have not rejoined),
    /// as this peer learned of them, and the rejoins it has taken part in.
    pub(crate) membership: Membership,
    /// The epoch being trained (0 before training).
    pub(crate) epoch: usize,
    /// When training started.
    pub(crate) started: Instant,
    /// Each rank's identity (`None`: an empty rank of an elastic run).
    peer_ids: Vec<Option<libp2p::PeerId>>,
    /// The ranks the shell holds a link to, as far as the core has asked for them.
    linked: BTreeSet<Rank>,
    /// A rejoining peer only: the answers to its hellos, by sender.
    welcomes: BTreeMap<Rank, Welcome>,
    /// A rejoining peer only, between its welcomes and its rejoin notice: the fetch of its
    /// x from donors ([`PeerCore::begin_catch_up`]).
    catch_up: Option<catch_up::CatchUp>,
    /// As a donor: the copy of its optimizer's state it answers catch-ups from, and the
    /// requests waiting for it ([`PeerCore::serve_optimizer_state`]).
    optimizer_copy: catch_up::StateCopy,
    /// The algorithm's catch-up state as a donor answers rejoining peers from it
    /// (`Gossip::catch_up_state`): made at the first request, kept as the optimizer's copy
    /// is (dropped once idle for [`catch_up::COPY_KEPT`]).
    algorithm_copy: catch_up::StateCopy,
    /// A rejoining peer only: the nearest present peers besides its in-neighbours that it
    /// also fetches x from, as it has fewer than [`catch_up::MIN_DONORS`] present
    /// in-neighbours ([`PeerCore::link_catch_up_helpers`]).
    helpers: BTreeSet<Rank>,
    /// The peers whose new process said hello to this one (restarted while it runs, or
    /// while both were away): they answer no hello of this peer's, they are welcomed.
    hellos: BTreeSet<Rank>,
    /// A rejoining peer still waiting for welcomes only: its hello, sent also on every link
    /// it opens meanwhile (to a peer whose rejoin it hears of: restarted at the same time,
    /// that process never had this hello).
    pending_hello: Option<Bytes>,
    /// A rejoining peer only: the round it mixes again from, and the in-neighbours whose
    /// frame for that round has arrived.
    first_frames: Option<(u64, HashSet<Rank>)>,
    /// The peers this one welcomed as a member whose rejoin notice has not come yet, with
    /// the round of the welcome ([`PeerCore::held_by`]).
    awaiting_rejoin: BTreeMap<Rank, u64>,
    /// Its key, to sign the admission of a new peer it admits (peer 0, or a member while
    /// every lower rank is away).
    admit_signer: Option<libp2p::identity::Keypair>,
    /// With a key: the new peers whose first round this peer has not reached yet, as
    /// (rank, first round); see [`PeerCore::settled_joins`].
    settling: Option<Vec<(Rank, u64)>>,
    /// This peer's copy of the run's record, from the keeper's floods and the welcomes it
    /// had: what it completes its run folder from when it keeps the record.
    pub(crate) record_copy: RecordCopy,
}

/// What [`PeerCore::new`] needs besides the state machine.
pub(crate) struct CoreSetup {
    pub(crate) rank: Rank,
    /// The run's W (n×n).
    pub(crate) w: MixingMatrix,
    pub(crate) algorithm: String,
    /// Each rank's identity (`None`: an empty rank).
    pub(crate) peer_ids: Vec<Option<libp2p::PeerId>>,
    /// The ranks a link is open to.
    pub(crate) linked: Vec<Rank>,
    /// The peers that owe this one a goodbye.
    pub(crate) expected_in: Vec<Rank>,
    /// Its key, to sign the admissions it makes.
    pub(crate) admit_signer: Option<libp2p::identity::Keypair>,
    /// Each rank's incarnation as the directory has it (0: unknown or empty), this peer's
    /// own process's included.
    pub(crate) incarnations: Vec<Incarnation>,
    /// Each rank's data-plane address as the directory has it (`None`: unknown or empty).
    pub(crate) addrs: Vec<Option<SocketAddr>>,
    /// The ranks the directory has as not
    /// [`reachable`](crate::control::discovery::PeerInfo::reachable) (behind a NAT): a
    /// stand-in keeper of the record is chosen among the others where it can be.
    pub(crate) behind_nat: Vec<Rank>,
}

impl PeerCore {
    /// The core of peer `setup.rank` running `gossip`, training not yet started.
    pub(crate) fn new(gossip: Box<dyn Gossip>, setup: CoreSetup, started: Instant) -> Self {
        let n = setup.w.n();
        Self {
            rank: setup.rank,
            goodbyes: Goodbyes::new(setup.linked.iter().copied(), setup.expected_in),
            linked: setup.linked.into_iter().collect(),
            gossip,
            refused_frames: 0,
            keeper: 0,
            addrs: setup.addrs,
            behind_nat: setup.behind_nat,
            w: setup.w,
            algorithm: setup.algorithm,
            membership: {
                let mut m = Membership::new(setup.rank, n);
                for (r, &i) in setup.incarnations.iter().enumerate() {
                    m.learn_incarnation(r, i);
                }
                m
            },
            epoch: 0,
            started,
            peer_ids: setup.peer_ids,
            welcomes: BTreeMap::new(),
            catch_up: None,
            optimizer_copy: catch_up::StateCopy::default(),
            algorithm_copy: catch_up::StateCopy::default(),
            helpers: BTreeSet::new(),
            hellos: BTreeSet::new(),
            pending_hello: None,
            first_frames: None,
            awaiting_rejoin: BTreeMap::new(),
            settling: setup.admit_signer.is_some().then(Vec::new),
            admit_signer: setup.admit_signer,
            record_copy: RecordCopy::default(),
        }
    }

    /// The time of an event for the membership state machine.
    fn now(&self, at: Instant) -> Now {
        Now {
            round: self.gossip.round(),
            epoch: self.epoch,
            wall_seconds: at.saturating_duration_since(self.started).as_secs_f64(),
        }
    }

    /// Counts a refused frame (the caller logged it).
    pub(crate) fn refuse(&mut self) {
        self.refused_frames += 1;
    }

    /// Handles `input`, which happened at `now`, and returns what to do.
    ///
    /// # Errors
    /// The run cannot go on here: the survivors cannot re-weight W, or the algorithm
    /// cannot continue without a departed peer (peer 0 included).
    pub(crate) fn handle(&mut self, now: Instant, input: Input) -> anyhow::Result<Vec<Action>> {
        let mut out = self.handle_input(now, input)?;
        let keeper = self.record_keeper();
        if keeper != self.keeper {
            self.keeper = keeper;
            out.push(Action::FollowRecord);
        }
        Ok(out)
    }

    /// [`PeerCore::handle`] but for the record's keeper.
    fn handle_input(&mut self, now: Instant, input: Input) -> anyhow::Result<Vec<Action>> {
        let mut out = Vec::new();
        match input {
            Input::Joined { rank, peer_id } => self.admit_new_peer(rank, peer_id, &mut out)?,
            Input::Frame {
                from,
                header,
                bytes,
                transfer,
            } => self.on_frame(now, from, header, bytes, transfer, &mut out)?,
            Input::Finished { from } => self.goodbyes.finished(from),
            Input::Exited {
                peer,
                incarnation,
                reason,
            } => {
                self.membership.exited(peer, incarnation);
                let lost = Input::Lost {
                    peer,
                    incarnation,
                    reason,
                };
                return self.handle_input(now, lost);
            }
            Input::LinkDone { to } => self.goodbyes.link_done(to),
            Input::Lost {
                peer,
                incarnation,
                reason,
            } if self.membership.has_left(peer)
                || incarnation < self.membership.incarnation(peer) =>
            {
                // An old process's connection, or a departed peer's new process gone as
                // well: only that process's links are closed.
                debug!(
                    peer,
                    incarnation, "lost the connection to a departed process: {reason}"
                );
                if incarnation >= self.membership.incarnation(peer) {
                    // The new process this peer welcomed will not say its round.
                    self.awaiting_rejoin.remove(&peer);
                }
                self.drop_links(peer, incarnation.saturating_add(1), &mut out);
            }
            Input::Lost {
                peer,
                incarnation,
                reason,
            } => {
                // Harmless once nothing more is owed either way on that peer's links.
                if self.goodbyes.loss_matters(peer) {
                    let round = self.gossip.round();
                    let gone = (peer, incarnation.saturating_add(1));
                    self.on_departure(now, gone, reason, self.rank, round, &mut out)?;
                }
            }
            Input::SendFailed {
                to,
                incarnation,
                reason,
            } => {
                let round = self.gossip.round();
                let gone = (to, incarnation.saturating_add(1));
                self.on_departure(now, gone, reason, self.rank, round, &mut out)?;
            }
            Input::Refused { peer, reason } => {
                self.refuse();
                // The data plane logged it when it refused it.
                debug!(?peer, "refused a frame: {reason}");
            }
            Input::Connected { to } => {
                self.linked.insert(to);
                self.goodbyes.linked(to);
            }
        }
        Ok(out)
    }

    /// A data-plane frame from `from`, routed by [`policy::route`].
    fn on_frame(
        &mut self,
        now: Instant,
        from: Rank,
        header: FrameHeader,
        bytes: Bytes,
        transfer: Option<Duration>,
        out: &mut Vec<Action>,
    ) -> anyhow::Result<()> {
        let departed = self.membership.has_left(from);
        match policy::route(header.kind, departed) {
            Route::Membership => self.on_membership_frame(now, from, header, &bytes, out)?,
            Route::Departed => debug!(from, "dropped a frame of a peer that has left"),
            Route::Algorithm => self.on_algorithm_frame(now, from, &header, &bytes, transfer),
            Route::Report => out.push(Action::Collect {
                from,
                report: bytes.slice(FRAME_HEADER_LEN..),
            }),
            Route::Leave => {
                self.on_leave_frame(now, from, header.round, &bytes[FRAME_HEADER_LEN..], out)?
            }
            Route::Record => match copy::decode(&bytes[FRAME_HEADER_LEN..]) {
                Ok(lines) => out.extend(self.keep_record(now, lines, &[from])?),
                Err(e) => {
                    self.refuse();
                    warn!(from, "dropped a record frame: {e:#}");
                }
            },
            Route::Refuse => {
                self.refuse();
                warn!(from, kind = ?header.kind, "dropped a frame no one here takes (a report goes to peer 0)");
            }
        }
        Ok(())
    }

    /// Takes lines of the run's record, which came in at `now`, into this peer's copy (the
    /// keeper's own, as it writes them, or a flood's from `except`) and passes on those new
    /// to it, on every link but to `except`.
    ///
    /// # Errors
    /// The lines do not serialize (not expected).
    pub(crate) fn keep_record(
        &mut self,
        now: Instant,
        lines: Vec<RecordLine>,
        except: &[Rank],
    ) -> anyhow::Result<Option<Action>> {
        let new = self.record_copy.merge(lines, now);
        if new.is_empty() {
            return Ok(None);
        }
        for line in &new {
            if let RecordLine::Epoch { row, .. } = line {
                debug!(
                    epoch = row.epoch,
                    "the copy of the record holds epoch {}", row.epoch
                );
            }
        }
        Ok(Some(Action::Broadcast {
            frame: Bytes::from(copy::encode(self.rank, &new)?),
            except: except.to_vec(),
        }))
    }

    /// An algorithm frame from `from`: the link's measured transfer time to the algorithm,
    /// the frame to its state machine; a refused frame is counted (a late frame of a round
    /// both ends mixed without is not: it is a straggler's, not a bad one).
    fn on_algorithm_frame(
        &mut self,
        now: Instant,
        from: Rank,
        header: &FrameHeader,
        bytes: &[u8],
        transfer: Option<Duration>,
    ) {
        if let Some(t) = transfer {
            self.gossip.observe_link(from, bytes.len(), t.as_secs_f64());
        }
        if let Some((at, arrived)) = self.first_frames.as_mut() {
            if header.round == self.gossip.frame_round(*at) {
                arrived.insert(from);
            }
        }
        match self.gossip.handle_message(now, from, bytes) {
            Ok(()) => {}
            Err(murmur_gossip::GossipError::Skipped { round, .. }) => {
                debug!(from, round, "dropped the frame of a skipped round")
            }
            Err(e) => {
                self.refuse();
                warn!(from, "dropped an algorithm frame: {e}");
            }
        }
    }

    /// Stops linking to and expecting anything of `gone`'s processes of incarnations below
    /// `before`: the shell closes their link and their connections to us.
    fn drop_links(&mut self, gone: Rank, before: Incarnation, out: &mut Vec<Action>) {
        self.linked.remove(&gone);
        self.goodbyes.forget(gone);
        out.push(Action::DropLinks { peer: gone, before });
    }

    /// When the state machine next needs [`PeerCore::handle_timeout`] (`None`: not until
    /// an input).
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.gossip.poll_timeout()
    }

    /// The state machine's deadline passed at `now`.
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        self.gossip.handle_timeout(now);
    }

    /// Whether the round under way has ended, and how (`None`: not yet). `waited`: how long
    /// the shell has waited for it, for the message.
    pub(crate) fn poll_round_end(&mut self, waited: Duration) -> Option<RoundEnd> {
        while let Some(ev) = self.gossip.poll_event() {
            match ev {
                GossipEvent::Mixed { .. } => return Some(RoundEnd::Mixed),
                GossipEvent::RoundTimedOut { round, missing } => {
                    return Some(RoundEnd::Failed(format!(
                        "round {round} timed out after {:.0} s waiting for peers {missing:?}",
                        waited.as_secs_f64()
                    )))
                }
                GossipEvent::Diverged { round, reason } => {
                    return Some(RoundEnd::Failed(format!(
                    "training diverged in round {round}: {reason} (try a smaller --lr or --gamma)"
                )))
                }
                other => debug!(?other, "gossip event"),
            }
        }
        None
    }

    /// The lowest rank this peer counts in the run (not departed, not empty; itself at
    /// most): the member that admits new peers, as this peer sees it.
    pub(crate) fn lowest_live(&self) -> Rank {
        self.membership.lowest_live()
    }

    /// The peer that keeps the run's record (collects the epoch reports, writes
    /// `epochs.csv`, `membership.jsonl`, `summary.json` and the model), as this peer sees
    /// it: peer 0 while it counts in the run or while this peer holds a link to its new
    /// process (which takes the record back); else the lowest live rank that is not behind
    /// a NAT (every peer can link to it: a peer behind a NAT reaches it by dialling out),
    /// or, every live peer behind one, the lowest live rank. It stands in. Every survivor
    /// derives the same keeper from the departures they all learn and the directory.
    pub(crate) fn record_keeper(&self) -> Rank {
        if !self.membership.has_left(0) || self.linked.contains(&0) {
            return 0;
        }
        let live = |r: Rank| r == self.rank || !self.membership.has_left(r);
        (0..self.addrs.len())
            .find(|&r| live(r) && !self.behind_nat.contains(&r))
            .unwrap_or_else(|| self.lowest_live())
    }

    /// A link to the record's keeper ([`Action::Connect`]; `None` if this peer keeps the
    /// record or does not know where the keeper is), for a shell that holds none: also
    /// one that said goodbye on its links already (a peer that finished its last epoch
    /// owes a new keeper the reports it kept).
    pub(crate) fn connect_to_keeper(&self) -> Option<Action> {
        let keeper = self.record_keeper();
        if keeper == self.rank {
            return None;
        }
        match self.addrs.get(keeper).copied().flatten() {
            Some(addr) => self.connect_action(keeper, addr, None),
            None => {
                warn!(
                    keeper,
                    "cannot link to peer {keeper}, which keeps the record now: its address is not known here"
                );
                None
            }
        }
    }

    /// The new peers whose first round this peer has now reached; its discovery lets the
    /// next new peer in once told.
    pub(crate) fn settled_joins(&mut self) -> Vec<Rank> {
        let round = self.gossip.round();
        let Some(settling) = self.settling.as_mut() else {
            return Vec::new();
        };
        let mut done = Vec::new();
        settling.retain(|&(rank, at)| {
            if round >= at {
                done.push(rank);
            }
            round < at
        });
        done
    }
}

/// `--inject-bad-frames`: the five malformed frames sent to every destination (see
/// [`crate::config::RunArgs::inject_bad_frames`]) by peer `rank` of a model of `d`
/// parameters at round `round` — garbage, a truncated frame, an oversized length, NaN
/// parameters and a frame 1000 rounds ahead — each of which the receiver must refuse.
pub(crate) fn bad_frames(rank: Rank, round: u64, d: usize) -> [Bytes; 5] {
    let header = |payload_len: u32, round: u64| {
        let mut f = Vec::new();
        FrameHeader {
            kind: FrameKind::Gossip,
            sender: rank,
            round,
            dim: d as u32,
            payload_len,
        }
        .emit(&mut f);
        f
    };
    let identity = |value: f32| {
        let mut out = Vec::new();
        let mut rng = StdRng::seed_from_u64(0);
        murmur_compress::Identity.compress(&vec![value; d], &mut rng, &mut out);
        out
    };
    let garbage = vec![0xFFu8; 64];
    let mut truncated = header(1000, round);
    truncated.extend_from_slice(&[0u8; 10]);
    let mut oversized = header(u32::MAX, round);
    oversized.extend_from_slice(&[0u8; 8]);
    let nan_msg = identity(f32::NAN);
    let mut nan = header(nan_msg.len() as u32, round);
    nan.extend_from_slice(&nan_msg);
    let ok_msg = identity(0.0);
    let mut late = header(ok_msg.len() as u32, round + 1000);
    late.extend_from_slice(&ok_msg);
    [garbage, truncated, oversized, nan, late].map(Bytes::from)
}

#[cfg(test)]
mod tests;
