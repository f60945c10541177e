//! Membership in the core: turns what the membership state machine
//! ([`crate::control::membership`]) decides about departures, a restarted peer's hello and
//! rejoin, and the admission of a new peer into a running run into the algorithm's
//! re-weighting and [`Action`]s (send, link, drop links, admit, record), with the log lines.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use murmur_gossip::frame::{FrameHeader, FrameKind, FRAME_HEADER_LEN};
use murmur_gossip::Rank;
use murmur_topology::MixingMatrix;
use tracing::{debug, info, warn};

use super::catch_up::{self, Answer, Part, Vector};
use super::{Action, PeerCore};
use crate::control::discovery::PeerInfo;
use crate::control::membership::{
    encode_hello, surviving, Admission, Departure, Flood, Membership, MembershipError, Refusal,
    RejoinError, RejoinPlan, Restart, Verdict, Welcome,
};
use crate::plane::Incarnation;
use crate::report::frames::{decode_with_params_sized, encode_with_params};

/// A restarted peer's agreed way back, from [`PeerCore::plan_rejoin`].
#[derive(Debug)]
pub(crate) struct Rejoining {
    /// The round it mixes again from; the run's last round plus one for a peer 0 that
    /// came back too late to train again and only collects the record
    /// ([`PeerCore::plan_rejoin`]).
    pub(crate) at: u64,
}

/// `flood` as a broadcast.
fn broadcast(flood: Flood) -> Action {
    Action::Broadcast {
        frame: Bytes::from(flood.frame),
        except: flood.except,
    }
}

impl PeerCore {
    /// Counts and logs a refused membership frame from `from`.
    fn refuse_membership(&mut self, from: Rank, refusal: Refusal) {
        self.refuse();
        match refusal {
            Refusal::Unsigned { rank }
            | Refusal::NotEmpty { rank }
            | Refusal::Conflict { rank } => {
                warn!(from, rank, "{refusal}")
            }
            _ => warn!(from, "{refusal}"),
        }
    }

    /// What was accepted of `verdict` on a frame from `from`; a refusal is counted and logged.
    fn accepted<T>(&mut self, verdict: Verdict<T>, from: Rank) -> Option<T> {
        match verdict {
            Verdict::Accept(t) => Some(t),
            Verdict::Ignore => None,
            Verdict::Refuse(r) => {
                self.refuse_membership(from, r);
                None
            }
        }
    }

    /// Peer `gone.0`'s processes of incarnations below `gone.1` left the run (`reason`,
    /// noticed by peer `noticed_by` in its round `noticed_round`): see
    /// [`PeerCore::departure`]. Known departures, and notices about a process older than
    /// the newest known, are ignored.
    ///
    /// # Errors
    /// `gone` is peer 0 (the metrics collector), W' cannot be formed (a directed topology)
    /// or the algorithm cannot continue without a peer.
    pub(super) fn on_departure(
        &mut self,
        now: Instant,
        gone: (Rank, Incarnation),
        reason: String,
        noticed_by: Rank,
        noticed_round: u64,
        out: &mut Vec<Action>,
    ) -> anyhow::Result<()> {
        let now = self.now(now);
        let departure = self
            .membership
            .depart(gone, reason, noticed_by, noticed_round, now);
        match departure {
            Some(d) => self.departure(d, out),
            None => Ok(()),
        }
    }

    /// A `Leave` frame of round `noticed_round` from `from` (its `payload`).
    pub(super) fn on_leave_frame(
        &mut self,
        now: Instant,
        from: Rank,
        noticed_round: u64,
        payload: &[u8],
        out: &mut Vec<Action>,
    ) -> anyhow::Result<()> {
        let now = self.now(now);
        let verdict = self.membership.on_leave(from, noticed_round, payload, now);
        match self.accepted(verdict, from) {
            Some(d) => self.departure(d, out),
            None => Ok(()),
        }
    }

    /// Carries out a departure the state machine recorded: re-weights W without the
    /// departed peers (Metropolis–Hastings on the surviving graph), tells the algorithm,
    /// stops sending to and waiting for the peer, and passes the news on to every peer this
    /// one has a link to, so that every survivor uses the same W'. Only the links of the
    /// departed processes close: a new process of the peer (that said hello, or whose
    /// connection arrived before the notice) keeps its own.
    fn departure(&mut self, d: Departure, out: &mut Vec<Action>) -> anyhow::Result<()> {
        let Departure {
            gone,
            reason,
            noticed_by,
            round,
            record,
            all_gone,
            before,
            flood,
        } = d;
        self.awaiting_rejoin.remove(&gone);
        warn!(
            gone,
            round, noticed_by, "peer {gone} left the run: {reason}"
        );
        let (surviving, components) = self.surviving(&all_gone).map_err(|e| {
            anyhow!("peer {gone} left the run during round {round} ({reason}) and the survivors cannot re-weight: {e}")
        })?;
        if let Some(split) = components {
            warn!(
                "the surviving graph is DISCONNECTED after peer {gone} left ({split}): each \
                 part trains on by itself and the peers will not reach consensus"
            );
        }
        self.gossip
            .peer_left(gone, &surviving)
            .map_err(|e| {
                anyhow!(
                    "peer {gone} left the run during round {round} ({reason}); {} cannot go on without it: {e}",
                    self.algorithm
                )
            })?;
        if gone == 0 {
            warn!(
                "peer 0 left: the lowest live peer keeps the run's record (epochs.csv, \
                 summary.json) until peer 0's new process links to it (launch \
                 --restart-failed and murmur.sbatch restart it at once)"
            );
        }
        self.drop_links(gone, before, out);
        out.push(broadcast(flood));
        self.record(record, None, out);
        Ok(())
    }

    /// The record's keeper records a line of `membership.jsonl` (the shell of a peer that
    /// keeps no record drops it).
    fn record(
        &self,
        event: crate::report::MembershipEvent,
        at: Option<u64>,
        out: &mut Vec<Action>,
    ) {
        out.push(Action::Record { event, at });
    }

    /// The mixing matrix for the survivors once the peers in `gone` have left, and, if the
    /// surviving graph is not (strongly) connected, a description of its parts (see
    /// [`surviving`]).
    ///
    /// # Errors
    /// A re-weighting algorithm on a directed topology.
    pub(crate) fn surviving(
        &self,
        gone: &[Rank],
    ) -> Result<(MixingMatrix, Option<String>), murmur_topology::TopologyError> {
        surviving(&self.w, self.gossip.reweights(), gone)
    }

    /// A restarted peer `from` says hello with its new data-plane address: if it was still
    /// counted as a member it has left (its old process is gone); open a link to it and,
    /// once open, answer with this peer's round, the departed peers and x.
    fn on_hello(
        &mut self,
        now: Instant,
        from: Rank,
        payload: &[u8],
        out: &mut Vec<Action>,
    ) -> anyhow::Result<()> {
        let now = self.now(now);
        let verdict = self.membership.on_hello(from, payload, now);
        let Some(hello) = self.accepted(verdict, from) else {
            return Ok(());
        };
        self.hellos.insert(from);
        self.addrs[from] = Some(hello.addr);
        // The old process's connections are closed; the hello came on the newest one.
        match hello.restart {
            Restart::KnownDeparted { before } => {
                out.push(Action::ForgetOldConnections { peer: from, before })
            }
            Restart::Departed(d) => self.departure(*d, out)?,
            Restart::Unchanged => {}
        }
        let mut welcome = self.membership.welcome(from, self.gossip.round());
        // What it needs to keep the record in a run folder of its own one day.
        welcome.record = self.record_copy.lines();
        if self.pending_hello.is_none() && self.first_frames.is_none() {
            // A member (not rejoining itself): it begins no round from which `from` could
            // mix again until `from` has said which it takes ([`PeerCore::held_by`]).
            self.awaiting_rejoin.insert(from, welcome.round);
        }
        let frame =
            encode_with_params(FrameKind::Welcome, self.rank, welcome.round, &welcome, &[])?;
        info!(
            from,
            round = welcome.round,
            bytes = frame.len(),
            "welcoming a restarted or new peer"
        );
        self.connect(from, hello.addr, Some(Bytes::from(frame)), out);
        Ok(())
    }

    /// Asks the shell to open a link to `to` at `addr` (then to send `then` on it), if its
    /// identity is known here.
    pub(super) fn connect(
        &self,
        to: Rank,
        addr: SocketAddr,
        then: Option<Bytes>,
        out: &mut Vec<Action>,
    ) {
        out.extend(self.connect_action(to, addr, then));
    }

    /// The [`Action::Connect`] of [`PeerCore::connect`] (`None`, logged, if the identity of
    /// `to` is not known here).
    pub(super) fn connect_action(
        &self,
        to: Rank,
        addr: SocketAddr,
        then: Option<Bytes>,
    ) -> Option<Action> {
        let Some(id) = self.peer_ids[to] else {
            warn!(
                to,
                "cannot connect to peer {to}: its identity is not known here"
            );
            return None;
        };
        Some(Action::Connect {
            to,
            incarnation: self.membership.incarnation(to),
            addr,
            id,
            then,
        })
    }

    /// The ranks of an elastic run that nobody has taken yet (`empty`) are out of the run
    /// from the start: the algorithm mixes without them, nothing is sent to or awaited from
    /// them, and peer 0 records them in `membership.jsonl` (event `empty`). They come in
    /// later through an admission and a rejoin.
    ///
    /// # Errors
    /// The algorithm cannot go on without a peer, or W cannot be re-weighted.
    pub(crate) fn start_without(&mut self, empty: &[Rank]) -> anyhow::Result<Vec<Action>> {
        let mut out = Vec::new();
        if empty.is_empty() {
            return Ok(out);
        }
        let (w, split) = self.surviving(empty)?;
        if let Some(split) = split {
            warn!("the graph of the initial peers is DISCONNECTED ({split}): the parts train apart until the empty ranks join");
        }
        for record in self.membership.start_empty(empty) {
            let g = record.peer;
            self.gossip
                .peer_left(g, &w)
                .map_err(|e| anyhow!("{} cannot start without peer {g}: {e}", self.algorithm))?;
            self.goodbyes.not_expected(g);
            self.record(record, None, &mut out);
        }
        info!(empty = ?empty, "elastic run: starting without the empty ranks");
        Ok(out)
    }

    /// This peer's discovery admitted a new peer with identity `id` to the empty rank
    /// `rank`: this peer signs the admission with its key, admits the identity to its data
    /// plane and floods the notice ([`crate::control::membership::Membership::admit`]; a
    /// notice from another peer goes through [`Membership::on_admit`]).
    pub(super) fn admit_new_peer(
        &mut self,
        rank: Rank,
        id: libp2p::PeerId,
        out: &mut Vec<Action>,
    ) -> anyhow::Result<()> {
        let key = self.admit_signer.as_ref();
        let verdict = (self.membership).admit(rank, id, None, self.rank, &self.peer_ids, key);
        self.admission(verdict, self.rank, out)
    }

    /// Carries out the state machine's verdict on an admission told by `from`.
    fn admission(
        &mut self,
        verdict: Result<Verdict<Admission>, MembershipError>,
        from: Rank,
        out: &mut Vec<Action>,
    ) -> anyhow::Result<()> {
        let Some(admission) = self.accepted(verdict?, from) else {
            return Ok(());
        };
        let (rank, id) = (admission.rank, admission.id);
        info!(rank, %id, "a new peer takes rank {rank}");
        self.peer_ids[rank] = Some(id);
        out.push(Action::Admit { id, rank });
        out.push(broadcast(admission.flood));
        Ok(())
    }

    /// A `Rejoin` frame from `from` (its `payload`): peer `back` mixes again from round `at`
    /// — re-weight with it, admit it if it is a neighbour (opening a link to its new address
    /// if this peer sends to it and its hello did not come here: a directed graph), and
    /// pass the news on. Handled once per (peer, round).
    fn on_rejoin(
        &mut self,
        now: Instant,
        from: Rank,
        payload: &[u8],
        out: &mut Vec<Action>,
    ) -> anyhow::Result<()> {
        let verdict = self.membership.on_rejoin(from, payload);
        let Some(notice) = self.accepted(verdict, from) else {
            return Ok(());
        };
        self.take_back(now, notice, out)
    }

    /// Carries out a rejoin notice the state machine accepted (see [`PeerCore::on_rejoin`]).
    fn take_back(
        &mut self,
        now: Instant,
        notice: crate::control::membership::RejoinNotice,
        out: &mut Vec<Action>,
    ) -> anyhow::Result<()> {
        let (back, at) = (notice.back, notice.at);
        self.awaiting_rejoin.remove(&back);
        let (w, _) = self.surviving(&notice.still_gone)?;
        // This peer rejoining too, from a later round (both restarted at once): it mixes no
        // round before its own first, so it takes `back` in from that one; `back` heard this
        // peer's rejoin notice and mixes with it from there too.
        let from_round = match self.first_frames {
            Some((first, _)) => at.max(first),
            None => at,
        };
        if let Err(e) = self.gossip.peer_rejoined(back, &w, from_round) {
            warn!(
                back,
                at, "peer {back} asked to mix again from round {at} and was not admitted: {e}"
            );
            return Ok(());
        }
        info!(back, at, "peer {back} rejoins the run from round {at}");
        let readmitted = self.membership.readmit(&notice);
        if readmitted.new {
            if let Some(settling) = self.settling.as_mut() {
                settling.push((back, at));
            }
        }
        if readmitted.all_taken {
            out.push(Action::CloseAdmission);
        }
        self.addrs[back] = Some(notice.addr);
        self.link_to(back, notice.addr, out);
        if self.gossip.in_peers().contains(&back) || self.rank == 0 {
            self.goodbyes.expect(back);
        }
        out.push(broadcast(readmitted.flood));
        if let Some(id) = self.peer_ids.get(back).copied().flatten() {
            out.push(Action::Relocated(PeerInfo {
                rank: back,
                peer_id: id.to_string(),
                data_addr: notice.addr,
                nat_published: None,
                incarnation: notice.incarnation,
                control: Vec::new(),
            }));
        }
        let record = Membership::rejoin_record(back, at, readmitted.new, self.now(now));
        self.record(record, Some(at), out);
        Ok(())
    }

    /// Opens a link to `peer`'s process at `addr` if this peer sends to it (every peer
    /// reports its epochs to peer 0, neighbour or not) and holds none yet. A peer still
    /// waiting for welcomes says hello on it too: it awaits that peer's welcome as it does
    /// every linked peer's.
    fn link_to(&self, peer: Rank, addr: SocketAddr, out: &mut Vec<Action>) {
        let sends_to = self.gossip.out_peers().contains(&peer) || peer == 0;
        if sends_to && !self.linked.contains(&peer) {
            self.connect(peer, addr, self.pending_hello.clone(), out);
        }
    }

    /// Handles a `Hello`, `Welcome`, `Admit` or `Rejoin` frame from `from`.
    pub(super) fn on_membership_frame(
        &mut self,
        now: Instant,
        from: Rank,
        header: FrameHeader,
        frame: &[u8],
        out: &mut Vec<Action>,
    ) -> anyhow::Result<()> {
        let payload = &frame[FRAME_HEADER_LEN..];
        match header.kind {
            FrameKind::Hello => self.on_hello(now, from, payload, out),
            FrameKind::Welcome if self.first_frames.is_none() => {
                match decode_with_params_sized::<Welcome>(payload, |_| 0) {
                    Ok((mut w, _)) => {
                        self.record_copy.merge(std::mem::take(&mut w.record), now);
                        self.welcomes.insert(from, w);
                    }
                    Err(e) => {
                        self.refuse();
                        warn!(from, "dropped a malformed welcome: {e:#}");
                    }
                }
                Ok(())
            }
            FrameKind::Admit => {
                let verdict = self.membership.on_admit(
                    from,
                    payload,
                    &self.peer_ids,
                    self.admit_signer.as_ref(),
                );
                self.admission(verdict, from, out)
            }
            FrameKind::Rejoin => self.on_rejoin(now, from, payload, out),
            FrameKind::Fetch => self.on_fetch(now, from, payload, out),
            FrameKind::StatePart => {
                self.on_state_part(now, from, payload);
                Ok(())
            }
            other => {
                self.refuse();
                warn!(from, ?other, "dropped an unexpected frame");
                Ok(())
            }
        }
    }

    /// A rejoining peer `from` asks for a slice of x or of the optimizer's state
    /// ([`catch_up`]): answered with this peer's x of that slice as it is now, or from its
    /// copy of the optimizer's state (a request that comes before the copy waits for it:
    /// [`PeerCore::serve_optimizer_state`]). A malformed request, or one beyond the vector
    /// or above the part bound, is refused and counted.
    fn on_fetch(
        &mut self,
        now: Instant,
        from: Rank,
        payload: &[u8],
        out: &mut Vec<Action>,
    ) -> anyhow::Result<()> {
        let d = self.gossip.params().len();
        let refused = |core: &mut Self, what: &str| {
            core.refuse();
            warn!(
                from,
                "refused a request for a part of {what}: malformed, beyond this peer's values \
                 or above {} values",
                catch_up::PART_FLOATS
            );
        };
        let Ok((part, _)) = decode_with_params_sized::<Part>(payload, |_| 0) else {
            refused(self, "x");
            return Ok(());
        };
        let round = self.gossip.round();
        let values = match part.of {
            Vector::X => match part.within(d) {
                Some(range) => &self.gossip.params()[range],
                None => {
                    refused(self, "x");
                    return Ok(());
                }
            },
            Vector::Optimizer => match self.optimizer_copy.ask(now, from, part) {
                Answer::Values(v) => v,
                Answer::Waits => return Ok(()),
                Answer::Refused => {
                    refused(self, "the optimizer's state");
                    return Ok(());
                }
            },
            Vector::Algorithm => {
                // The core holds the algorithm: its copy is made at once, not between rounds.
                if !self.algorithm_copy.holds() {
                    self.algorithm_copy.take(now, self.gossip.catch_up_state());
                }
                match self.algorithm_copy.ask(now, from, part) {
                    Answer::Values(v) => v,
                    Answer::Waits | Answer::Refused => {
                        refused(self, "the algorithm's state");
                        return Ok(());
                    }
                }
            }
        };
        let frame = encode_with_params(FrameKind::StatePart, self.rank, round, &part, values)?;
        debug!(
            from,
            part.start, part.len, "sending a part of {} to a rejoining peer", part.of
        );
        out.push(Action::Send {
            to: from,
            frame: Bytes::from(frame),
        });
        Ok(())
    }

    /// Whether a rejoining peer's requests for parts of the optimizer's state wait for this
    /// peer's copy of it: the shell, which holds the optimizer, then calls
    /// [`PeerCore::serve_optimizer_state`] between two rounds.
    #[cfg(test)]
    pub(crate) fn wants_optimizer_state(&self) -> bool {
        self.optimizer_copy.wanted()
    }

    /// Takes `state` (`[s]`, the inner optimizer's `Optimizer::state` now, between two
    /// rounds) as the copy catch-ups are answered from, and answers the requests that
    /// waited for it; drops a copy idle for [`catch_up::COPY_KEPT`] when nothing waits.
    ///
    /// # Errors
    /// A frame that cannot be encoded.
    pub(crate) fn serve_optimizer_state(
        &mut self,
        now: Instant,
        state: impl FnOnce() -> Vec<f32>,
    ) -> anyhow::Result<Vec<Action>> {
        let mut out = Vec::new();
        self.algorithm_copy.release_idle(now);
        if !self.optimizer_copy.wanted() {
            self.optimizer_copy.release_idle(now);
            return Ok(out);
        }
        let (me, round) = (self.rank, self.gossip.round());
        let mut refused = 0;
        for (to, part, values) in self.optimizer_copy.take(now, state()) {
            let Some(values) = values else {
                refused += 1;
                continue;
            };
            let frame = encode_with_params(FrameKind::StatePart, me, round, &part, values)?;
            out.push(Action::Send {
                to,
                frame: Bytes::from(frame),
            });
        }
        for _ in 0..refused {
            self.refuse();
            warn!("refused a request for a part of the optimizer's state beyond its values");
        }
        Ok(out)
    }

    /// A donor's part of x for this rejoining peer's catch-up. One that is malformed, not
    /// asked for or from a peer that is no donor is refused and counted; one after the
    /// catch-up (a donor that answered late) is dropped.
    fn on_state_part(&mut self, now: Instant, from: Rank, payload: &[u8]) {
        let Some(c) = self.catch_up.as_mut() else {
            debug!(from, "dropped a part that came after the catch-up");
            return;
        };
        // At most the part bound is allocated, whatever the request says.
        let sized = |p: &Part| p.within(usize::MAX).map_or(0, |r| r.len());
        let taken = decode_with_params_sized::<Part>(payload, sized)
            .map_err(|e| format!("{e:#}"))
            .and_then(|(part, values)| {
                (c.on_part(now, from, part, &values)).map_err(|e| e.to_string())
            });
        if let Err(e) = taken {
            self.refuse();
            warn!(from, "refused a part for the catch-up: {e}");
        }
    }

    /// A restarted peer, every welcome in: the peers it fetches its x from
    /// ([`RejoinPlan::donors`]) among those it holds a link to; none for a peer 0 that
    /// came back too late to train again (it only collects the record). Arguments as
    /// [`PeerCore::plan_rejoin`].
    ///
    /// # Errors
    /// As [`PeerCore::plan_rejoin`], and no peer to fetch x from.
    pub(crate) fn catch_up_donors(
        &self,
        unreachable: &BTreeMap<Rank, anyhow::Error>,
        total_rounds: u64,
        margin: u64,
    ) -> anyhow::Result<Vec<Rank>> {
        let Some((plan, mut donors)) = self.donor_plan(unreachable, total_rounds, margin)? else {
            return Ok(Vec::new());
        };
        let helpers = (self.helpers.iter().copied())
            .filter(|r| plan.welcomed.contains(r) && self.linked.contains(r));
        for r in helpers {
            if !donors.contains(&r) {
                donors.push(r);
            }
        }
        donors.sort_unstable();
        if donors.is_empty() {
            bail!(
                "none of the in-neighbours {:?} answered, nor any other peer this peer could \
                 fetch its parameters from",
                self.gossip.in_peers()
            );
        }
        Ok(donors)
    }

    /// The rejoin plan and the donors it gives among the peers this one holds a link to
    /// ([`RejoinPlan::donors`]), helpers not counted; `None` for a peer 0 that only
    /// collects. Arguments and errors as [`PeerCore::plan_rejoin`].
    fn donor_plan(
        &self,
        unreachable: &BTreeMap<Rank, anyhow::Error>,
        total_rounds: u64,
        margin: u64,
    ) -> anyhow::Result<Option<(RejoinPlan, Vec<Rank>)>> {
        let plan = self.rejoin_plan(unreachable, total_rounds, margin)?;
        if plan.collects_only {
            return Ok(None);
        }
        let donors = (plan
            .donors(&self.gossip.in_peers(), &self.hellos)
            .into_iter())
        .filter(|r| self.linked.contains(r))
        .collect();
        Ok(Some((plan, donors)))
    }

    /// A restarted peer, every welcome in, that would fetch x from fewer than
    /// [`catch_up::MIN_DONORS`] peers (its present in-neighbours; an elastic run's joiner
    /// beside empty ranks has one): picks the nearest other present peers (by distance of
    /// rank around the ring of ranks, which on a ring is the distance in hops) to fetch from
    /// as well, and links to each it holds no link to, saying hello on it; the driver then
    /// awaits their welcomes as any. Arguments as [`PeerCore::plan_rejoin`]. Returns the
    /// links to open; none for a peer 0 that only collects or with donors enough.
    ///
    /// # Errors
    /// As [`PeerCore::plan_rejoin`].
    pub(crate) fn link_catch_up_helpers(
        &mut self,
        unreachable: &BTreeMap<Rank, anyhow::Error>,
        total_rounds: u64,
        margin: u64,
    ) -> anyhow::Result<Vec<Action>> {
        let Some((plan, donors)) = self.donor_plan(unreachable, total_rounds, margin)? else {
            return Ok(Vec::new());
        };
        let Some(wanted) = catch_up::MIN_DONORS
            .checked_sub(donors.len())
            .filter(|&k| k > 0)
        else {
            return Ok(Vec::new());
        };
        let (n, me) = (self.peer_ids.len(), self.rank);
        let away = |r: Rank| (r + n - me) % n;
        let mut present: Vec<Rank> = (0..n)
            .filter(|&r| r != me && !donors.contains(&r) && !self.hellos.contains(&r))
            .filter(|r| !plan.departed.contains(r) && !self.membership.has_left(*r))
            .filter(|&r| !unreachable.contains_key(&r) && self.peer_ids[r].is_some())
            .collect();
        present.sort_by_key(|&r| (away(r).min(n - away(r)), r));
        let mut out = Vec::new();
        for r in present.into_iter().take(wanted) {
            self.helpers.insert(r);
            if self.linked.contains(&r) {
                continue;
            }
            let addr = (plan.locations.get(&r).map(|&(_, a)| a)).or(self.addrs[r]);
            if let Some(addr) = addr {
                info!(
                    helper = r,
                    "few present in-neighbours: also fetching x from peer {r}"
                );
                self.connect(r, addr, self.pending_hello.clone(), &mut out);
            }
        }
        Ok(out)
    }

    /// Begins the catch-up of x (`[d]`) and, if `optimizer_len` > 0, of the inner
    /// optimizer's state (`[optimizer_len]`) from `donors` ([`catch_up`]), a part asked of
    /// another donor after `part_timeout` without an answer; returns the first requests.
    /// Then feed events and call [`PeerCore::poll_catch_up`] until
    /// [`PeerCore::caught_up`].
    ///
    /// # Errors
    /// As [`PeerCore::poll_catch_up`].
    pub(crate) fn begin_catch_up(
        &mut self,
        now: Instant,
        donors: &[Rank],
        optimizer_len: usize,
        part_timeout: Duration,
    ) -> anyhow::Result<Vec<Action>> {
        let d = self.gossip.params().len();
        let algorithm_len = self.gossip.catch_up_state().len();
        let mut vectors = vec![(Vector::X, d)];
        if optimizer_len > 0 {
            vectors.push((Vector::Optimizer, optimizer_len));
        }
        if algorithm_len > 0 {
            vectors.push((Vector::Algorithm, algorithm_len));
        }
        info!(
            ?donors,
            d,
            optimizer_len,
            algorithm_len,
            "fetching {} in parts from donors {donors:?}",
            catch_up::listed(&vectors)
        );
        self.catch_up = Some(catch_up::CatchUp::new(&vectors, donors, part_timeout, now));
        self.poll_catch_up(now)
    }

    /// The catch-up's next requests: the parts of donors that left (or whose link is gone)
    /// and of donors silent past the part time-out are asked of the others.
    ///
    /// # Errors
    /// Every donor left before x was whole.
    pub(crate) fn poll_catch_up(&mut self, now: Instant) -> anyhow::Result<Vec<Action>> {
        let Some(c) = self.catch_up.as_mut() else {
            return Ok(Vec::new());
        };
        let gone: Vec<Rank> = (c.live_donors())
            .filter(|&r| self.membership.has_left(r) || !self.linked.contains(&r))
            .collect();
        for r in gone {
            warn!(
                donor = r,
                "donor {r} left during the catch-up: its parts are asked of the others"
            );
            c.donor_gone(r);
        }
        if c.stranded() {
            bail!("every peer this peer fetched its parameters from left before it had them all");
        }
        let mut out = Vec::new();
        for (to, part) in c.poll(now) {
            let frame = encode_with_params(FrameKind::Fetch, self.rank, 0, &part, &[])?;
            out.push(Action::Send {
                to,
                frame: Bytes::from(frame),
            });
        }
        Ok(out)
    }

    /// When the catch-up next needs a [`PeerCore::poll_catch_up`] (a part's time-out).
    pub(crate) fn catch_up_deadline(&self) -> Option<Instant> {
        self.catch_up.as_ref().and_then(|c| c.deadline())
    }

    /// Whether x is whole (or no catch-up is under way).
    pub(crate) fn caught_up(&self) -> bool {
        self.catch_up.as_ref().is_none_or(|c| c.done())
    }

    /// Ends the catch-up: the vectors fetched (x, `[d]`, and the optimizer's state if asked)
    /// and what each donor sent.
    ///
    /// The algorithm's state, if fetched, is taken into the state machine here
    /// (`Gossip::take_catch_up_state`) and not returned.
    ///
    /// # Errors
    /// The algorithm refused the fetched state (a length its own state does not have).
    pub(crate) fn finish_catch_up(
        &mut self,
    ) -> anyhow::Result<Option<(catch_up::Fetched, catch_up::Summary)>> {
        let Some((mut fetched, summary)) = self.catch_up.take().map(|c| c.finish()) else {
            return Ok(None);
        };
        if let Some(state) = fetched.take(Vector::Algorithm) {
            self.gossip
                .take_catch_up_state(&state)
                .context("the algorithm's state fetched from the donors")?;
        }
        Ok(Some((fetched, summary)))
    }

    /// [`Membership::plan_rejoin`] from the welcomes, its errors in words.
    fn rejoin_plan(
        &self,
        unreachable: &BTreeMap<Rank, anyhow::Error>,
        total_rounds: u64,
        margin: u64,
    ) -> anyhow::Result<RejoinPlan> {
        let plan = self.membership.plan_rejoin(
            &self.welcomes,
            unreachable.keys().copied(),
            total_rounds,
            margin,
            |r| self.gossip.rejoin_round(r),
        );
        match plan {
            Ok(p) => Ok(p),
            Err(e @ RejoinError::Unreachable(r)) => bail!("{e}: {:#}", unreachable[&r]),
            Err(e) => Err(e.into()),
        }
    }

    /// A restarted peer's hello (`me`: its new directory entry), to send on every link it
    /// has; sent also on every link it opens until it plans its rejoin
    /// ([`PeerCore::plan_rejoin`]).
    pub(crate) fn hello(&mut self, me: &PeerInfo) -> anyhow::Result<Bytes> {
        let hello = Bytes::from(encode_hello(self.rank, me)?);
        self.pending_hello = Some(hello.clone());
        Ok(hello)
    }

    /// Whether a rejoining peer waits for `peer`'s welcome: not if it came, nor if `peer`'s
    /// new process said hello here (both restarted at once: it is rejoining too, and this
    /// peer welcomed it instead).
    pub(crate) fn awaits_welcome(&self, peer: Rank) -> bool {
        !self.welcomes.contains_key(&peer) && !self.hellos.contains(&peer)
    }

    /// A restarted peer, every welcome in and its x fetched ([`PeerCore::catch_up_donors`]):
    /// agrees the round it mixes again from (the highest round heard plus `margin` rounds,
    /// so that every neighbour learns it before beginning it), forgets the peers the
    /// welcomes name as departed, starts the algorithm at that round and announces it to
    /// all (`my_addr`: its data-plane address). Returns the round and what to send and drop.
    /// Wait then until [`PeerCore::ready_to_mix`]. A peer the welcomes say came back while
    /// this one was away is taken back from that round on (`now`: when, for the record).
    ///
    /// Peer 0, restarted so late that the run ends before the agreed round, still takes up
    /// the record: it announces `at` = `total_rounds` (a round nobody reaches, so nobody
    /// mixes with it again), which makes every peer link to it, send it the reports it kept
    /// and say goodbye to it at the end; it waits for no frame and trains no more.
    ///
    /// # Errors
    /// A destination it could not connect to (`unreachable`, with why) that the run still
    /// counts, or the run ending before the agreed round (`total_rounds`; not for peer 0).
    pub(crate) fn plan_rejoin(
        &mut self,
        now: Instant,
        unreachable: &BTreeMap<Rank, anyhow::Error>,
        total_rounds: u64,
        margin: u64,
        my_addr: SocketAddr,
    ) -> anyhow::Result<(Rejoining, Vec<Action>)> {
        let plan = self.rejoin_plan(unreachable, total_rounds, margin)?;
        self.membership.heard_of_rejoins(&plan);
        self.pending_hello = None;
        let collects_only = plan.collects_only;
        if collects_only {
            info!(
                total_rounds,
                "the run ends before this peer could mix again: peer 0 only collects the \
                 record of the last epochs"
            );
        }
        let mut out = Vec::new();
        let at = plan.at;
        let departed: &BTreeSet<Rank> = &plan.departed;
        // This peer's view of the membership: the departed peers are forgotten.
        let (survivors, _) = self.surviving(&departed.iter().copied().collect::<Vec<_>>())?;
        for &g in departed {
            self.gossip.peer_left(g, &survivors)?;
            // Only the links of its processes known to have exited close: a departed peer
            // may have a new process already, linked to this one (restarted at the same
            // time, it welcomed this peer or will say hello), whose rejoin notice brings it
            // back. A link to a process that died unseen fails by itself.
            let before = self.membership.exited_incarnation(g).saturating_add(1);
            self.drop_links(g, before, &mut out);
            self.membership.gone_before_rejoin(g, at);
        }
        self.gossip.start_at_round(at)?;
        // Every peer that welcomed us opened a link to us and says goodbye on it at the end
        // (perhaps already).
        for &w in &plan.welcomed {
            self.goodbyes.owed_by(w);
        }
        let in_peers: Vec<Rank> = self
            .gossip
            .in_peers()
            .into_iter()
            .filter(|r| !departed.contains(r))
            .collect();
        let flood = self
            .membership
            .rejoining(self.membership.incarnation(self.rank), at, my_addr);
        // Peer 0 collecting only waits for no frame: nobody reaches round `at`.
        self.first_frames = (!collects_only).then(|| (at, HashSet::new()));
        // A peer that came back before this one (both restarted at once) while this one was
        // away, as the welcomes tell: taken back as its rejoin notice would have (this peer
        // may have taken it for departed from its supervisor's notice), from this peer's
        // first round on, and linked to where it listens (this peer's directory may predate
        // its rejoin) if this peer sends to it.
        for (&r, &(incarnation, addr)) in &plan.locations {
            let round = plan.rejoined[&r];
            if self.membership.has_left(r) {
                if let Some(notice) =
                    self.membership
                        .rejoin_notice((r, incarnation), round, addr, self.rank)
                {
                    self.take_back(now, notice, &mut out)?;
                }
                continue;
            }
            if incarnation >= self.membership.incarnation(r) {
                self.membership.learn_incarnation(r, incarnation);
                self.link_to(r, addr, &mut out);
            }
        }
        out.push(broadcast(flood));
        info!(at, neighbours = ?in_peers, "rejoining: mixing again from round {at}");
        Ok((Rejoining { at }, out))
    }

    /// The peer this one waits for before it begins its next round, if any: one it
    /// welcomed (at round `r`) whose rejoin notice has not come, once the next round could
    /// be the one that peer mixes again from (`r` + [`crate::peer::REJOIN_MARGIN_ROUNDS`]
    /// at the earliest). A rejoining peer may wait for another restarted peer's hello before
    /// it announces its round; a welcomer that went on meanwhile would have begun that
    /// round already and could not take it back, and the rejoining peer would wait for its
    /// frame of that round until its timeout.
    pub(crate) fn held_by(&self) -> Option<Rank> {
        let next = self.gossip.round() + 1;
        (self.awaiting_rejoin.iter())
            .find(|(_, &r)| next >= r + crate::peer::REJOIN_MARGIN_ROUNDS)
            .map(|(&p, _)| p)
    }

    /// Gives up waiting for `peer`'s rejoin notice ([`PeerCore::held_by`]): this peer goes
    /// on without it.
    pub(crate) fn stop_awaiting_rejoin(&mut self, peer: Rank) {
        self.awaiting_rejoin.remove(&peer);
    }

    /// A rejoining peer: whether every in-neighbour of its first round is at it (its frame
    /// for that round is here, or it left, or it (re)joins after that round). `true` once
    /// not rejoining.
    pub(crate) fn ready_to_mix(&self) -> bool {
        let Some((at, arrived)) = &self.first_frames else {
            return true;
        };
        let in_peers = self.gossip.in_peers_at(*at);
        self.membership.ready_to_mix(*at, &in_peers, arrived)
    }

    /// The rejoin is over: welcomes are taken no more.
    pub(crate) fn end_rejoin(&mut self) {
        self.first_frames = None;
    }
}
