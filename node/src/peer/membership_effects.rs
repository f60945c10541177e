//! Membership on the driver: carries out what the membership state machine
//! ([`crate::control::membership`]) decides about departures, a restarted peer's hello and
//! rejoin, and the admission of a new peer into a running run — re-weighting and telling
//! the algorithm, sending, linking, dropping links, logging and recording.

use super::*;
use crate::control::membership::{
    encode_hello, surviving, Admission, Departure, Membership, MembershipError, Now, Refusal,
    RejoinError, Restart, Verdict,
};

impl Driver {
    /// The time of an event for the state machine.
    fn now(&self) -> Now {
        Now {
            round: self.gossip.round(),
            epoch: self.epoch,
            wall_seconds: self.started.elapsed().as_secs_f64(),
        }
    }

    /// Counts and logs a refused membership frame from `from`.
    fn refuse(&mut self, from: Rank, refusal: Refusal) {
        self.refused_frames += 1;
        match refusal {
            Refusal::Unsigned { rank } | Refusal::NotEmpty { rank } => {
                warn!(from, rank, "{refusal}")
            }
            _ => warn!(from, "{refusal}"),
        }
    }

    /// Peer `gone` left the run (`reason`, noticed by peer `noticed_by`): re-weights W
    /// without the departed peers (Metropolis–Hastings on the surviving graph), tells the
    /// algorithm, stops sending to and waiting for `gone`, and passes the news on to every
    /// peer this one has a link to, so that every survivor uses the same W'. Known
    /// departures are ignored.
    ///
    /// # Errors
    /// `gone` is peer 0 (the metrics collector), W' cannot be formed (a directed topology)
    /// or the algorithm cannot continue without a peer.
    pub(super) fn on_departure(
        &mut self,
        gone: Rank,
        reason: String,
        noticed_by: Rank,
        noticed_round: u64,
    ) -> anyhow::Result<()> {
        let now = self.now();
        let departure =
            self.membership
                .depart(gone, reason, noticed_by, noticed_round, false, now)?;
        match departure {
            Some(d) => self.departure(d),
            None => Ok(()),
        }
    }

    /// A `Leave` frame of round `noticed_round` from `from` (its `payload`).
    pub(super) fn on_leave_frame(
        &mut self,
        from: Rank,
        noticed_round: u64,
        payload: &[u8],
    ) -> anyhow::Result<()> {
        let now = self.now();
        match self
            .membership
            .on_leave(from, noticed_round, payload, now)?
        {
            Verdict::Accept(d) => self.departure(d),
            Verdict::Ignore => Ok(()),
            Verdict::Refuse(r) => {
                self.refuse(from, r);
                Ok(())
            }
        }
    }

    /// Carries out a departure the state machine recorded (see [`Driver::on_departure`]);
    /// with `keep_newest`, it was noticed through the hello of the peer's new process,
    /// whose connection (the newest from it) stays open.
    fn departure(&mut self, d: Departure) -> anyhow::Result<()> {
        let Departure {
            gone,
            reason,
            noticed_by,
            round,
            record,
            all_gone,
            keep_newest,
            flood,
        } = d;
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
        self.drop_links(gone, keep_newest);
        self.broadcast(&flood.frame, &flood.except);
        if let Some(c) = self.collector.as_mut() {
            c.membership(record, None)?;
        }
        Ok(())
    }

    /// The mixing matrix for the survivors once the peers in `gone` have left, and, if the
    /// surviving graph is not (strongly) connected, a description of its parts (see
    /// [`surviving`]).
    ///
    /// # Errors
    /// A re-weighting algorithm on a directed topology.
    pub(super) fn surviving(
        &self,
        gone: &[Rank],
    ) -> Result<(MixingMatrix, Option<String>), murmur_topology::TopologyError> {
        surviving(&self.w, self.gossip.reweights(), gone)
    }

    /// A restarted peer `from` says hello with its new data-plane address: if it was still
    /// counted as a member it has left (its old process is gone); open a link to it and
    /// answer with this peer's round, the departed peers and x.
    pub(super) fn on_hello(&mut self, from: Rank, payload: &[u8]) -> anyhow::Result<()> {
        let now = self.now();
        let hello = match self.membership.on_hello(from, payload, now)? {
            Verdict::Accept(h) => h,
            Verdict::Ignore => return Ok(()),
            Verdict::Refuse(r) => {
                self.refuse(from, r);
                return Ok(());
            }
        };
        // The old process's connections are closed; the hello came on the newest one.
        match hello.restart {
            Restart::KnownDeparted => self.plane.forget(from, true),
            Restart::Departed(d) => self.departure(*d)?,
            Restart::Unchanged => {}
        }
        if !self.link_to(from, hello.addr) {
            return Ok(());
        }
        let round = self.gossip.round();
        let welcome = self.membership.welcome(from, round);
        let frame = encode_with_params(
            FrameKind::Welcome,
            self.rank,
            welcome.round,
            &welcome,
            self.gossip.params(),
        )?;
        info!(from, round = welcome.round, "welcomed a restarted peer");
        self.send_to(from, frame)
    }

    /// The ranks of an elastic run that nobody has taken yet (`empty`) are out of the run
    /// from the start: the algorithm mixes without them, nothing is sent to or awaited from
    /// them, and peer 0 records them in `membership.jsonl` (event `empty`). They come in
    /// later through [`Driver::on_admit`] and a rejoin.
    ///
    /// # Errors
    /// The algorithm cannot go on without a peer, or W cannot be re-weighted.
    pub(super) fn start_without(&mut self, empty: &[Rank]) -> anyhow::Result<()> {
        if empty.is_empty() {
            return Ok(());
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
            if let Some(c) = self.collector.as_mut() {
                c.membership(record, None)?;
            }
        }
        info!(empty = ?empty, "elastic run: starting without the empty ranks");
        Ok(())
    }

    /// A new peer with identity `id` took the empty rank `rank` (told by peer `from`; by
    /// peer 0's bootstrap when `from` is this peer, which then signs the notice): admit its
    /// identity to the data plane and pass the notice on once. Refused (counted) for a rank
    /// that is not empty here, or without peer 0's signature (`signature`, Ed25519 over
    /// [`crate::control::membership::admit_message`]): a member cannot admit an identity on
    /// its own.
    pub(super) fn on_admit(
        &mut self,
        rank: Rank,
        id: libp2p::PeerId,
        signature: Vec<u8>,
        from: Rank,
    ) -> anyhow::Result<()> {
        let verdict = self.membership.admit(
            rank,
            id,
            signature,
            from,
            &self.peer_ids,
            self.admit_signer.as_ref(),
        );
        self.admission(verdict, from)
    }

    /// An `Admit` frame from `from` (its `payload`): see [`Driver::on_admit`].
    fn on_admit_frame(&mut self, from: Rank, payload: &[u8]) -> anyhow::Result<()> {
        let verdict =
            self.membership
                .on_admit(from, payload, &self.peer_ids, self.admit_signer.as_ref());
        self.admission(verdict, from)
    }

    /// Carries out the state machine's verdict on an admission told by `from`.
    fn admission(
        &mut self,
        verdict: Result<Verdict<Admission>, MembershipError>,
        from: Rank,
    ) -> anyhow::Result<()> {
        let admission = match verdict? {
            Verdict::Accept(a) => a,
            Verdict::Ignore => return Ok(()),
            Verdict::Refuse(r) => {
                self.refuse(from, r);
                return Ok(());
            }
        };
        let (rank, id) = (admission.rank, admission.id);
        info!(rank, %id, "a new peer takes rank {rank}");
        self.peer_ids[rank] = Some(id);
        self.admitted.admit_all([(id, rank)]);
        self.broadcast(&admission.flood.frame, &admission.flood.except);
        Ok(())
    }

    /// A `Rejoin` frame from `from` (its `payload`): peer `back` mixes again from round `at`
    /// — re-weight with it, admit it if it is a neighbour (opening a link to its new address
    /// if this peer sends to it and its hello did not come here: a directed graph), and
    /// pass the news on. Handled once per (peer, round).
    pub(super) fn on_rejoin(&mut self, from: Rank, payload: &[u8]) -> anyhow::Result<()> {
        let notice = match self.membership.on_rejoin(from, payload) {
            Verdict::Accept(n) => n,
            Verdict::Ignore => return Ok(()),
            Verdict::Refuse(r) => {
                self.refuse(from, r);
                return Ok(());
            }
        };
        let (back, at) = (notice.back, notice.at);
        let (w, _) = self.surviving(&notice.still_gone)?;
        if let Err(e) = self.gossip.peer_rejoined(back, &w, at) {
            warn!(
                back,
                at, "peer {back} asked to mix again from round {at} and was not admitted: {e}"
            );
            return Ok(());
        }
        info!(back, at, "peer {back} rejoins the run from round {at}");
        let readmitted = self.membership.readmit(&notice);
        if readmitted.new && self.settle.is_some() {
            self.settling.push((back, at));
        }
        if readmitted.all_taken {
            // Every rank is taken: a stranger is refused at once again.
            self.admitted.set_open(false);
        }
        if self.gossip.out_peers().contains(&back) && !self.links.contains_key(&back) {
            self.link_to(back, notice.addr);
        }
        if self.gossip.in_peers().contains(&back) || self.rank == 0 {
            self.goodbyes.expect(back);
        }
        self.broadcast(&readmitted.flood.frame, &readmitted.flood.except);
        if self.collector.is_some() {
            let record = Membership::rejoin_record(back, at, readmitted.new, self.now());
            if let Some(c) = self.collector.as_mut() {
                c.membership(record, Some(at))?;
            }
        }
        Ok(())
    }

    /// A restarted peer's way back into the run: hello to every peer it has a link to
    /// (`me`: its new directory entry), their welcomes (round, departed peers, x), then the
    /// round it mixes again from — the highest round heard plus [`REJOIN_MARGIN_ROUNDS`],
    /// so that every neighbour learns it before beginning it — announced to all, and a wait
    /// until every in-neighbour has sent its frame for that round. Destinations it could not
    /// connect to (`unreachable`) must be among the departed peers of the welcomes.
    /// Returns that round and the mean x of the in-neighbours that answered.
    ///
    /// # Errors
    /// No welcome within `timeout`, a peer unreachable that the run still counts, the run
    /// ending before the agreed round (`total_rounds`), or no in-neighbour answering.
    pub(super) fn rejoin(
        &mut self,
        me: &PeerInfo,
        unreachable: BTreeMap<Rank, anyhow::Error>,
        total_rounds: u64,
        timeout: Duration,
    ) -> anyhow::Result<(u64, Vec<f32>)> {
        let hello = encode_hello(self.rank, me)?;
        for &to in self.links.keys() {
            self.send_to(to, hello.clone())?;
        }
        let deadline = Instant::now() + timeout;
        loop {
            let waiting: Vec<Rank> = self
                .links
                .keys()
                .copied()
                .filter(|r| !self.welcomes.contains_key(r))
                .collect();
            if waiting.is_empty() {
                break;
            }
            if !self.next_event(deadline)? {
                bail!("--resume: no answer from peers {waiting:?} within {timeout:?}");
            }
        }
        let plan = self.membership.plan_rejoin(
            &self.welcomes,
            unreachable.keys().copied(),
            total_rounds,
            REJOIN_MARGIN_ROUNDS,
        );
        let plan = match plan {
            Ok(p) => p,
            Err(e @ RejoinError::Unreachable(r)) => bail!("{e}: {:#}", unreachable[&r]),
            Err(e) => return Err(e.into()),
        };
        let at = plan.at;
        let departed: &BTreeSet<Rank> = &plan.departed;
        // This peer's view of the membership: the departed peers are forgotten.
        let (survivors, _) = self.surviving(&departed.iter().copied().collect::<Vec<_>>())?;
        for &g in departed {
            self.gossip.peer_left(g, &survivors)?;
            self.drop_links(g, false);
            self.membership.gone_before_rejoin(g, at);
        }
        self.gossip.start_at_round(at)?;
        // Every peer that welcomed us opened a link to us and says goodbye on it at the end.
        for &w in &plan.welcomed {
            self.goodbyes.expect(w);
        }
        let in_peers: Vec<Rank> = self
            .gossip
            .in_peers()
            .into_iter()
            .filter(|r| !departed.contains(r))
            .collect();
        let xs: Vec<&[f32]> = in_peers
            .iter()
            .filter_map(|r| self.welcomes.get(r).map(|(_, x)| x.as_slice()))
            .collect();
        if xs.is_empty() {
            bail!("--resume: none of the in-neighbours {in_peers:?} answered");
        }
        let (_, mean) = consensus_distance(xs.iter().copied());
        let flood = self.membership.rejoining(at, me.data_addr);
        self.first_frames = Some((at, HashSet::new()));
        self.broadcast(&flood.frame, &flood.except);
        info!(at, neighbours = ?in_peers, "rejoining: mixing again from round {at}");
        // Begin only when every in-neighbour of that round is at it: its frame for it is here.
        let in_peers = self.gossip.in_peers_at(at);
        loop {
            let arrived = self
                .first_frames
                .as_ref()
                .map(|(_, f)| f.clone())
                .unwrap_or_default();
            // Not waited for: a departed peer, or one that (re)joins after this round.
            if self.membership.ready_to_mix(at, &in_peers, &arrived) {
                break;
            }
            let deadline = Instant::now() + timeout;
            if !self.next_event(deadline)? {
                bail!("--resume: in-neighbours {in_peers:?} did not reach round {at} within {timeout:?}");
            }
        }
        self.first_frames = None;
        Ok((at, mean))
    }

    /// Handles a `Hello`, `Welcome`, `Admit` or `Rejoin` frame from `from`.
    pub(super) fn on_membership_frame(
        &mut self,
        from: Rank,
        header: FrameHeader,
        frame: &[u8],
    ) -> anyhow::Result<()> {
        let payload = &frame[FRAME_HEADER_LEN..];
        match header.kind {
            FrameKind::Hello => self.on_hello(from, payload),
            FrameKind::Welcome if self.first_frames.is_none() => {
                match decode_with_params::<Welcome>(payload, self.gossip.params().len()) {
                    Ok(w) => {
                        self.welcomes.insert(from, w);
                    }
                    Err(e) => {
                        self.refused_frames += 1;
                        warn!(from, "dropped a malformed welcome: {e:#}");
                    }
                }
                Ok(())
            }
            FrameKind::Admit => self.on_admit_frame(from, payload),
            FrameKind::Rejoin => self.on_rejoin(from, payload),
            other => {
                self.refused_frames += 1;
                warn!(from, ?other, "dropped an unexpected frame");
                Ok(())
            }
        }
    }
}
