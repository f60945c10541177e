//! Membership on the driver: departures, a restarted peer's hello and rejoin, the
//! admission of a new peer into a running run.

use super::frames::*;
use super::*;

impl Driver {
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
        self.departure(gone, reason, noticed_by, noticed_round, false)
    }

    /// [`Driver::on_departure`]; with `hello`, the departure is noticed through the hello of
    /// the peer's new process, whose connection (the newest from it) stays open.
    pub(super) fn departure(
        &mut self,
        gone: Rank,
        reason: String,
        noticed_by: Rank,
        noticed_round: u64,
        hello: bool,
    ) -> anyhow::Result<()> {
        // A notice older than the peer's latest return is about its previous process.
        let back_at = self
            .rejoined
            .iter()
            .filter(|(r, _)| *r == gone)
            .map(|(_, at)| *at)
            .max();
        if gone == self.rank
            || self.departed.contains_key(&gone)
            || back_at.is_some_and(|at| noticed_round < at)
        {
            return Ok(());
        }
        let round = self.gossip.round();
        if gone == 0 {
            bail!("peer 0 (the bootstrap, which collects the metrics) left the run during round {round}: {reason}");
        }
        warn!(
            gone,
            round, noticed_by, "peer {gone} left the run: {reason}"
        );
        let record = MembershipEvent {
            event: "left".into(),
            peer: gone,
            round,
            epoch: self.epoch,
            wall_seconds: self.started.elapsed().as_secs_f64(),
            noticed_by,
            reason: reason.clone(),
        };
        self.departed.insert(gone, record.clone());
        let all_gone: Vec<Rank> = self.departed.keys().copied().collect();
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
        self.drop_links(gone, hello);
        self.broadcast(&encode_leave(self.rank, noticed_round, gone, &reason), &[]);
        if let Some(c) = self.collector.as_mut() {
            c.membership(record, None)?;
        }
        Ok(())
    }

    /// The mixing matrix for the survivors once the peers in `gone` have left, and, if the
    /// surviving graph is not (strongly) connected, a description of its parts. Algorithms that re-weight get
    /// Metropolis–Hastings on the surviving graph; push-sum keeps W (it only stops pushing
    /// to the departed), and its parts are told by strong connectivity of W's support.
    ///
    /// # Errors
    /// A re-weighting algorithm on a directed topology.
    pub(super) fn surviving(
        &self,
        gone: &[Rank],
    ) -> Result<(MixingMatrix, Option<String>), murmur_topology::TopologyError> {
        if self.gossip.reweights() {
            let s = self.w.without_peers(gone)?;
            let split = (!s.is_connected()).then(|| format!("components {:?}", s.components));
            Ok((s.w, split))
        } else {
            let split = (!self.w.graph().strongly_connected_without(gone)).then(|| {
                let alive: Vec<Rank> = (0..self.w.n()).filter(|r| !gone.contains(r)).collect();
                format!("the survivors {alive:?} are not strongly connected: push-sum shares cannot reach every one of them")
            });
            Ok((self.w.clone(), split))
        }
    }

    /// A restarted peer `from` says hello with its new data-plane address: if it was still
    /// counted as a member it has left (its old process is gone); open a link to it and
    /// answer with this peer's round, the departed peers and x.
    pub(super) fn on_hello(&mut self, from: Rank, payload: &[u8]) -> anyhow::Result<()> {
        let info: PeerInfo = match serde_json::from_slice(payload) {
            Ok(i @ PeerInfo { rank, .. }) if rank == from => i,
            _ => {
                self.refused_frames += 1;
                warn!(from, "dropped a malformed hello");
                return Ok(());
            }
        };
        // The old process's connections are closed; the hello came on the newest one.
        if self.departed.contains_key(&from) {
            self.plane.forget(from, true);
        } else {
            let round = self.gossip.round();
            let reason = "it restarted: a new process said hello".to_string();
            self.departure(from, reason, self.rank, round, true)?;
        }
        if !self.link_to(from, info.data_addr) {
            return Ok(());
        }
        let welcome = Welcome {
            round: self.gossip.round(),
            departed: self
                .departed
                .keys()
                .copied()
                .filter(|&r| r != from)
                .collect(),
        };
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
        for &g in empty {
            self.gossip
                .peer_left(g, &w)
                .map_err(|e| anyhow!("{} cannot start without peer {g}: {e}", self.algorithm))?;
            self.expected_in.remove(&g);
            let record = MembershipEvent {
                event: "empty".into(),
                peer: g,
                round: 0,
                epoch: 0,
                wall_seconds: 0.0,
                noticed_by: self.rank,
                reason: "not taken yet: the run started with --initial-peers".into(),
            };
            self.departed.insert(g, record.clone());
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
    /// [`admit_message`]): a member cannot admit an identity on its own.
    pub(super) fn on_admit(
        &mut self,
        rank: Rank,
        id: libp2p::PeerId,
        signature: Vec<u8>,
        from: Rank,
    ) -> anyhow::Result<()> {
        if self.peer_ids.get(rank).copied().flatten() == Some(id) {
            return Ok(());
        }
        let signature = match &self.admit_signer {
            Some(key) if from == self.rank => key
                .sign(&admit_message(rank, &id))
                .map_err(|e| anyhow!("signing an admission: {e}"))?,
            _ => signature,
        };
        let signed = self.peer_ids[0]
            .as_ref()
            .and_then(auth::public_key)
            .is_some_and(|k| k.verify(&admit_message(rank, &id), &signature));
        if !signed {
            self.refused_frames += 1;
            warn!(
                from,
                rank, "dropped an admission for rank {rank} that peer 0 did not sign"
            );
            return Ok(());
        }
        let empty = self.departed.get(&rank).is_some_and(|e| e.event == "empty");
        if !empty || rank == self.rank {
            self.refused_frames += 1;
            warn!(
                from,
                rank, "dropped an admission for rank {rank}, which is not an empty rank here"
            );
            return Ok(());
        }
        info!(rank, %id, "a new peer takes rank {rank}");
        self.peer_ids[rank] = Some(id);
        self.admitted.admit_all([(id, rank)]);
        self.broadcast(&encode_admit(self.rank, rank, id, &signature), &[from]);
        Ok(())
    }

    /// Peer `back` mixes again from round `at` (told by `from`): re-weight with it, admit
    /// it if it is a neighbour (opening a link to its new address `addr` if this peer sends
    /// to it and its hello did not come here: a directed graph), and pass the news on.
    /// Handled once per (peer, round).
    pub(super) fn on_rejoin(
        &mut self,
        back: Rank,
        at: u64,
        addr: SocketAddr,
        from: Rank,
    ) -> anyhow::Result<()> {
        if back == self.rank || self.rejoined.contains(&(back, at)) {
            return Ok(());
        }
        self.rejoined.push((back, at));
        let still_gone: Vec<Rank> = self
            .departed
            .keys()
            .copied()
            .filter(|&r| r != back)
            .collect();
        let (w, _) = self.surviving(&still_gone)?;
        if let Err(e) = self.gossip.peer_rejoined(back, &w, at) {
            warn!(
                back,
                at, "peer {back} asked to mix again from round {at} and was not admitted: {e}"
            );
            return Ok(());
        }
        info!(back, at, "peer {back} rejoins the run from round {at}");
        let new = self
            .departed
            .remove(&back)
            .is_some_and(|e| e.event == "empty");
        if new && self.settle.is_some() {
            self.settling.push((back, at));
        }
        if new && !self.departed.values().any(|e| e.event == "empty") {
            // Every rank is taken: a stranger is refused at once again.
            self.admitted.set_open(false);
        }
        if self.gossip.out_peers().contains(&back) && !self.links.contains_key(&back) {
            self.link_to(back, addr);
        }
        if self.gossip.in_peers().contains(&back) || self.rank == 0 {
            self.expected_in.insert(back);
            self.finished_in.remove(&back);
        }
        self.broadcast(&encode_rejoin(self.rank, back, at, addr), &[back, from]);
        if let Some(c) = self.collector.as_mut() {
            let record = MembershipEvent {
                event: if new { "joined" } else { "rejoined" }.into(),
                peer: back,
                round: at,
                epoch: self.epoch,
                wall_seconds: self.started.elapsed().as_secs_f64(),
                noticed_by: back,
                reason: if new {
                    format!("a new peer; mixes from round {at}")
                } else {
                    format!("restarted; mixes again from round {at}")
                },
            };
            c.membership(record, Some(at))?;
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
        let departed: BTreeSet<Rank> = self
            .welcomes
            .values()
            .flat_map(|(w, _)| w.departed.iter().copied())
            .filter(|&r| r != self.rank)
            .collect();
        if let Some((r, e)) = unreachable.iter().find(|(r, _)| !departed.contains(r)) {
            bail!("--resume: cannot reach peer {r}, which the run still counts as a member: {e:#}");
        }
        let at = self
            .welcomes
            .values()
            .map(|(w, _)| w.round)
            .max()
            .unwrap_or(0)
            + REJOIN_MARGIN_ROUNDS;
        if at >= total_rounds {
            bail!(
                "--resume: the run ends at round {total_rounds}, too soon to rejoin at round {at}"
            );
        }
        // This peer's view of the membership: the departed peers are forgotten.
        let (survivors, _) = self.surviving(&departed.iter().copied().collect::<Vec<_>>())?;
        for &g in &departed {
            self.gossip.peer_left(g, &survivors)?;
            self.drop_links(g, false);
            // An empty rank stays known as empty (a new peer may still take it).
            self.departed.entry(g).or_insert(MembershipEvent {
                event: "left".into(),
                peer: g,
                round: at,
                epoch: 0,
                wall_seconds: 0.0,
                noticed_by: self.rank,
                reason: "gone when this peer rejoined".into(),
            });
        }
        self.gossip.start_at_round(at)?;
        // Every peer that welcomed us opened a link to us and says goodbye on it at the end.
        let welcomed: Vec<Rank> = self
            .welcomes
            .keys()
            .copied()
            .filter(|r| !departed.contains(r))
            .collect();
        self.expected_in.extend(welcomed);
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
        self.rejoined.push((self.rank, at));
        self.first_frames = Some((at, HashSet::new()));
        self.broadcast(&encode_rejoin(self.rank, self.rank, at, me.data_addr), &[]);
        info!(at, neighbours = ?in_peers, "rejoining: mixing again from round {at}");
        // Begin only when every in-neighbour of that round is at it: its frame for it is here.
        let in_peers = self.gossip.in_peers_at(at);
        loop {
            let arrived = self
                .first_frames
                .as_ref()
                .map(|(_, f)| f.clone())
                .unwrap_or_default();
            if in_peers.iter().all(|r| {
                // Not waited for: a departed peer, or one that (re)joins after this round.
                arrived.contains(r)
                    || self.departed.contains_key(r)
                    || self.rejoined.iter().any(|&(p, a)| p == *r && a > at)
            }) {
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

    /// Handles a `Hello`, `Welcome` or `Rejoin` frame from `from`.
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
            FrameKind::Admit => match decode_admit(payload) {
                Some((rank, id, signature)) if rank < self.w.n() => {
                    self.on_admit(rank, id, signature, from)
                }
                _ => {
                    self.refused_frames += 1;
                    warn!(from, "dropped a malformed admission notice");
                    Ok(())
                }
            },
            FrameKind::Rejoin => match decode_rejoin(payload) {
                Some((back, at, addr)) if back < self.w.n() => self.on_rejoin(back, at, addr, from),
                _ => {
                    self.refused_frames += 1;
                    warn!(from, "dropped a malformed rejoin notice");
                    Ok(())
                }
            },
            other => {
                self.refused_frames += 1;
                warn!(from, ?other, "dropped an unexpected frame");
                Ok(())
            }
        }
    }
}
