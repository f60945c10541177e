//! The peer's driver: moves events, frames and timers between the algorithm's state
//! machine, the data plane and the training loop.

use super::policy::{self, Route};
use super::*;

/// Everything the training loop owns besides the model.
pub(super) struct Driver {
    pub(super) rank: Rank,
    pub(super) rt: tokio::runtime::Runtime,
    pub(super) events: mpsc::Receiver<NetEvent>,
    pub(super) links: Links,
    pub(super) gossip: Box<dyn Gossip>,
    /// Who owes whom the counted goodbye (pure; [`super::policy::Goodbyes`]).
    pub(super) goodbyes: super::policy::Goodbyes,
    pub(super) refused_frames: u64,
    /// Rank 0 only.
    pub(super) collector: Option<Collector>,
    /// The run's mixing matrix W (n×n), re-weighted without the departed peers.
    pub(super) w: MixingMatrix,
    /// Algorithm name, for messages.
    pub(super) algorithm: String,
    /// The membership state machine: the peers that left the run (and have not rejoined),
    /// as this peer learned of them, and the rejoins it has taken part in.
    pub(super) membership: crate::control::membership::Membership,
    /// The epoch being trained (0 before training).
    pub(super) epoch: usize,
    /// When training started.
    pub(super) started: Instant,
    /// Our QUIC endpoint: links to restarted peers are opened during the run.
    pub(super) plane: DataPlane,
    /// How this peer gets a relayed link when the direct path does not open.
    pub(super) relay: crate::control::discovery::RelayClient,
    /// Each rank's identity (`None`: an empty rank of an elastic run).
    pub(super) peer_ids: Vec<Option<libp2p::PeerId>>,
    /// The identities the data plane accepts, each as its rank.
    pub(super) admitted: Admitted,
    /// A rejoining peer only: the answers to its hellos, by sender.
    pub(super) welcomes: BTreeMap<Rank, (Welcome, Vec<f32>)>,
    /// A rejoining peer only: the round it mixes again from, and the in-neighbours whose
    /// frame for that round has arrived.
    pub(super) first_frames: Option<(u64, HashSet<Rank>)>,
    /// Peer 0 only: its key, to sign the admission of a new peer ([`Driver::on_admit`]).
    pub(super) admit_signer: Option<libp2p::identity::Keypair>,
    /// Peer 0 only: where its bootstrap learns that a new peer mixes with the run, and the
    /// new peers not there yet, as (rank, first round).
    pub(super) settle: Option<tokio::sync::mpsc::UnboundedSender<Rank>>,
    pub(super) settling: Vec<(Rank, u64)>,
}

/// A peer's answer to a restarted peer's hello (the state machine's).
pub(super) use crate::control::membership::Welcome;

impl Driver {
    /// Peer 0: tells the bootstrap of each new peer whose first round this peer has
    /// reached, so that it lets the next new peer in.
    pub(super) fn settle_joins(&mut self) {
        let round = self.gossip.round();
        let Some(tx) = &self.settle else {
            return;
        };
        self.settling.retain(|&(rank, at)| {
            let done = round >= at;
            if done {
                let _ = tx.send(rank);
            }
            !done
        });
    }

    /// Sends every frame the state machine has queued.
    pub(super) fn transmit(&mut self) -> anyhow::Result<()> {
        while let Some(t) = self.gossip.poll_transmit() {
            let link = self
                .links
                .get(&t.to)
                .ok_or_else(|| anyhow!("no link to out-neighbour {}", t.to))?;
            if let Err(e) = self.rt.block_on(link.send(t.frame)) {
                // The link's task ended: its connection was lost.
                let round = self.gossip.round();
                self.on_departure(t.to, format!("{e:#}"), self.rank, round)?;
            }
        }
        Ok(())
    }

    /// `--inject-bad-frames`: sends five malformed frames to every destination (see
    /// [`RunArgs::inject_bad_frames`]) for a model of `d` parameters at round `round`.
    pub(super) fn inject_bad_frames(&mut self, round: u64, d: usize) -> anyhow::Result<()> {
        let header = |payload_len: u32, round: u64| {
            let mut f = Vec::new();
            FrameHeader {
                kind: FrameKind::Gossip,
                sender: self.rank,
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
        let frames = [garbage, truncated, oversized, nan, late].map(Bytes::from);
        for link in self.links.values() {
            for f in &frames {
                self.rt.block_on(link.send(f.clone()))?;
            }
        }
        Ok(())
    }

    /// Feeds network events to the state machine until the round has mixed.
    pub(super) fn wait_mixed(&mut self) -> anyhow::Result<()> {
        let start = Instant::now();
        loop {
            // Handling a frame may queue frames (all-reduce steps, server replies).
            self.transmit()?;
            while let Some(ev) = self.gossip.poll_event() {
                match ev {
                    GossipEvent::Mixed { .. } => return Ok(()),
                    GossipEvent::RoundTimedOut { round, missing } => bail!(
                        "round {round} timed out after {:.0} s waiting for peers {missing:?}",
                        start.elapsed().as_secs_f64()
                    ),
                    GossipEvent::Diverged { round, reason } => {
                        bail!("training diverged in round {round}: {reason} (try a smaller --lr or --gamma)")
                    }
                    other => debug!(?other, "gossip event"),
                }
            }
            let deadline = self
                .gossip
                .poll_timeout()
                .unwrap_or_else(|| Instant::now() + Duration::from_secs(60));
            if !self.next_event(deadline)? {
                self.gossip.handle_timeout(Instant::now());
            }
        }
    }

    /// Handles the network events that are already queued, without blocking, and sends
    /// what they caused. Events of the state machine are left for [`Driver::wait_mixed`].
    pub(super) fn serve_ready(&mut self) -> anyhow::Result<()> {
        while let Ok(ev) = self.events.try_recv() {
            self.handle_net_event(ev)?;
            self.transmit()?;
        }
        Ok(())
    }

    /// Waits for one network event until `deadline` and handles it. Returns `false` if
    /// the deadline passed first.
    pub(super) fn next_event(&mut self, deadline: Instant) -> anyhow::Result<bool> {
        let ev = self.rt.block_on(async {
            tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), self.events.recv())
                .await
        });
        let ev = match ev {
            Err(_) => return Ok(false),
            Ok(None) => bail!("the data plane stopped"),
            Ok(Some(ev)) => ev,
        };
        self.handle_net_event(ev)?;
        Ok(true)
    }

    /// Closes the link to `gone` and its connections to us (all, or all but the newest with
    /// `keep_newest`), and stops expecting anything of it.
    pub(super) fn drop_links(&mut self, gone: Rank, keep_newest: bool) {
        if let Some(link) = self.links.remove(&gone) {
            link.abandon();
        }
        self.plane.forget(gone, keep_newest);
        self.goodbyes.forget(gone);
    }

    /// An algorithm frame from `from`: the link's measured transfer time to the algorithm,
    /// the frame to its state machine; a refused frame is counted (a late frame of a round
    /// both ends mixed without is not: it is a straggler's, not a bad one).
    fn on_algorithm_frame(
        &mut self,
        from: Rank,
        header: &murmur_gossip::FrameHeader,
        bytes: &[u8],
        transfer: Option<Duration>,
    ) {
        if let Some(t) = transfer {
            self.gossip.observe_link(from, bytes.len(), t.as_secs_f64());
        }
        if let Some((at, arrived)) = self.first_frames.as_mut() {
            if header.round == *at {
                arrived.insert(from);
            }
        }
        match self.gossip.handle_message(Instant::now(), from, bytes) {
            Ok(()) => {}
            Err(murmur_gossip::GossipError::Skipped { round, .. }) => {
                debug!(from, round, "dropped the frame of a skipped round")
            }
            Err(e) => {
                self.refused_frames += 1;
                warn!(from, "dropped an algorithm frame: {e}");
            }
        }
    }

    /// Sends `frame` on every link except those to `skip` (best effort: a failing link is
    /// reported by the data plane on its own).
    pub(super) fn broadcast(&self, frame: &[u8], skip: &[Rank]) {
        let frame = Bytes::copy_from_slice(frame);
        for (&to, link) in self.links.iter().filter(|(to, _)| !skip.contains(to)) {
            if let Err(e) = self.rt.block_on(link.send(frame.clone())) {
                debug!(to, "could not send a membership notice: {e:#}");
            }
        }
    }

    /// Opens a link to the restarted peer `to` at its new data-plane address `addr` (its
    /// PeerId is checked), relayed through peer 0 if the direct path does not open (a new
    /// process behind a NAT), and counts it as a destination again. `false` (logged) if
    /// the connection failed.
    pub(super) fn link_to(&mut self, to: Rank, addr: SocketAddr) -> bool {
        let Some(id) = self.peer_ids[to] else {
            warn!(
                to,
                "cannot connect to peer {to}: its identity is not known here"
            );
            return false;
        };
        let (plane, relay, rank) = (&self.plane, &self.relay, self.rank);
        // A restarted peer's hello does not say whether it is behind a NAT.
        let nat = super::links::Nat::Unknown;
        let connected = self.rt.block_on(super::links::connect(
            plane,
            relay,
            rank,
            (to, addr, id),
            nat,
        ));
        match connected {
            Ok(link) => {
                self.links.insert(to, link);
                self.goodbyes.linked(to);
                true
            }
            Err(e) => {
                warn!(to, "cannot connect to the restarted peer: {e:#}");
                false
            }
        }
    }

    /// Sends one frame on the link to `to`.
    pub(super) fn send_to(&self, to: Rank, frame: Vec<u8>) -> anyhow::Result<()> {
        let link = self
            .links
            .get(&to)
            .ok_or_else(|| anyhow!("no link to peer {to}"))?;
        self.rt.block_on(link.send(Bytes::from(frame)))
    }

    /// Handles one network event.
    pub(super) fn handle_net_event(&mut self, ev: NetEvent) -> anyhow::Result<()> {
        match ev {
            NetEvent::Joined {
                rank,
                peer_id,
                data_addr: _,
            } => self.on_admit(rank, peer_id, Vec::new(), self.rank)?,
            NetEvent::Frame {
                from,
                header,
                bytes,
                transfer,
            } => {
                let departed = self.membership.departed().contains_key(&from);
                match policy::route(header.kind, departed, self.collector.is_some()) {
                    Route::Membership => self.on_membership_frame(from, header, &bytes)?,
                    Route::Departed => debug!(from, "dropped a frame of a peer that has left"),
                    Route::Algorithm => self.on_algorithm_frame(from, &header, &bytes, transfer),
                    Route::Report => {
                        // `route` sends reports here only where a collector is (peer 0).
                        let added = self
                            .collector
                            .as_mut()
                            .map_or(Ok(()), |c| c.add_frame(from, &bytes[FRAME_HEADER_LEN..]));
                        if let Err(e) = added {
                            self.refused_frames += 1;
                            warn!(from, "dropped a report: {e:#}");
                        }
                    }
                    Route::Leave => {
                        self.on_leave_frame(from, header.round, &bytes[FRAME_HEADER_LEN..])?;
                    }
                    Route::Refuse => {
                        self.refused_frames += 1;
                        warn!(from, kind = ?header.kind, "dropped a frame no one here takes (a report goes to peer 0)");
                    }
                }
            }
            NetEvent::Finished { from } => self.goodbyes.finished(from),
            NetEvent::LinkDone { to } => self.goodbyes.link_done(to),
            NetEvent::Lost { peer, reason } if self.membership.departed().contains_key(&peer) => {
                // The new process of a peer that was restarting is gone as well.
                debug!(
                    peer,
                    "lost the connection to a departed peer's new process: {reason}"
                );
                self.drop_links(peer, false);
            }
            NetEvent::Lost { peer, reason } => {
                // Harmless once nothing more is owed either way on that peer's links.
                if self.goodbyes.loss_matters(peer) {
                    let round = self.gossip.round();
                    self.on_departure(peer, reason, self.rank, round)?;
                }
            }
            NetEvent::Refused { peer, reason } => {
                self.refused_frames += 1;
                // The data plane logged it when it refused it.
                debug!(?peer, "refused a frame: {reason}");
            }
        }
        Ok(())
    }

    /// Sends this epoch's report (metrics and x) to rank 0, or records it on rank 0.
    pub(super) fn report(&mut self, report: PeerEpoch, x: &[f32]) -> anyhow::Result<()> {
        if let Some(c) = self.collector.as_mut() {
            return c.add(report, x.to_vec());
        }
        let frame = encode_report(self.rank, &report, x)?;
        let link = self
            .links
            .get(&0)
            .ok_or_else(|| anyhow!("no link to peer 0"))?;
        self.rt.block_on(link.send(Bytes::from(frame)))
    }

    /// Says goodbye on every link and waits until every expected peer said goodbye to us
    /// and every link was closed by its receiver.
    pub(super) fn finish(&mut self) -> anyhow::Result<()> {
        self.links.clear(); // each sender task now sends its goodbye
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.goodbyes.settled() {
            if !self.next_event(deadline)? {
                let (missing, unacknowledged) = self.goodbyes.outstanding();
                warn!(
                    ?missing,
                    ?unacknowledged,
                    "shutdown timed out; exiting anyway"
                );
                break;
            }
        }
        self.rt
            .block_on(self.plane.shutdown(Duration::from_secs(2)));
        Ok(())
    }
}
