//! The peer's shell around its sans-I/O core ([`super::core::PeerCore`]): owns the tokio
//! runtime, the data plane, the links, the relay client and the collector of the record's
//! keeper (peer 0, or the lowest live rank while it is away);
//! turns network events into the core's inputs and carries out the actions it returns.
//! Decisions are the core's; this file only moves bytes and waits.

use super::core::catch_up::Fetched;
use super::core::{bad_frames, Action, Input, PeerCore, RoundEnd};
use super::*;

/// Everything the training loop owns besides the model.
pub(super) struct Driver {
    pub(super) rt: tokio::runtime::Runtime,
    pub(super) events: mpsc::Receiver<NetEvent>,
    pub(super) links: Links,
    /// The decisions: the algorithm's and the membership's state machines, the goodbyes.
    pub(super) core: PeerCore,
    /// The record's keeper only: peer 0, or the peer standing in for it.
    pub(super) collector: Option<Collector>,
    /// The record's keeper this peer reports to ([`PeerCore::record_keeper`], as last
    /// followed).
    pub(super) record_to: Rank,
    /// What a collector is made of, for a peer that stands in for a departed peer 0.
    pub(super) record: RecordSetup,
    /// Reports sent here while this peer kept no record (as (sender, frame), the latest
    /// [`EARLY_REPORTS`]): a sender that takes this peer for the keeper just before this
    /// peer learns it; they go to its collector once it stands in.
    pub(super) early_reports: std::collections::VecDeque<(Rank, Bytes)>,
    /// Our QUIC endpoint: links to restarted peers are opened during the run.
    pub(super) plane: DataPlane,
    /// How this peer gets a relayed link when the direct path does not open.
    pub(super) relay: crate::control::discovery::RelayClient,
    /// The identities the data plane accepts, each as its rank.
    pub(super) admitted: Admitted,
    /// Where its discovery learns that a new peer (one it may have admitted) mixes with the
    /// run.
    pub(super) settle: tokio::sync::mpsc::UnboundedSender<Rank>,
    /// Where its discovery learns the lowest rank this peer counts in the run: a member
    /// admits new peers while that is its own rank.
    pub(super) lowest_live: tokio::sync::watch::Sender<Rank>,
    /// Where discovery learns where the peers that came back are (the directory it serves
    /// to restarted peers; [`crate::control::discovery::Relocations`]).
    pub(super) relocated: tokio::sync::mpsc::UnboundedSender<PeerInfo>,
    /// Peers other than 0: the report frames of the latest epochs ([`KEPT_REPORTS`]), sent
    /// again to a new record keeper (a stand-in, a restarted peer 0) once linked to it: the
    /// reports sent to the previous keeper shortly before it died or handed the record on,
    /// and those made meanwhile, may not have been recorded.
    pub(super) kept_reports: std::collections::VecDeque<Bytes>,
}

/// What a [`Collector`] is made of: a run of `n` peers writing to `dir`, `rounds_per_epoch`,
/// x̄ (`d` parameters of model `kind`) evaluated on `test`.
pub(super) struct RecordSetup {
    pub(super) n: usize,
    pub(super) dir: std::path::PathBuf,
    pub(super) rounds_per_epoch: u64,
    pub(super) test: std::sync::Arc<crate::train::data::Dataset>,
    pub(super) d: usize,
    pub(super) kind: crate::train::model::ModelKind,
}

impl RecordSetup {
    /// A new, empty collector.
    pub(super) fn collector(&self) -> Collector {
        Collector::new(
            self.n,
            self.dir.clone(),
            self.rounds_per_epoch,
            self.test.clone(),
            self.d,
            self.kind,
        )
    }
}

/// How many report frames a peer that keeps no record holds for when it stands in
/// ([`Driver::early_reports`]).
const EARLY_REPORTS: usize = 64;

/// How many of its latest epoch reports a peer keeps for a restarted peer 0: at most this
/// many, and beyond the latest 2 no more than [`KEPT_REPORT_BYTES`] in all (a report
/// carries the peer's x: 4d bytes).
const KEPT_REPORTS: usize = 8;
/// The memory the kept reports may take beyond the latest 2 (bytes).
const KEPT_REPORT_BYTES: usize = 256 << 20;

/// How long a finishing peer waits, beyond its 30 s, for a live peer 0 to record its last
/// reports (and so acknowledge its goodbye) before it exits anyway.
const RECORD_WAIT: Duration = Duration::from_secs(600);

impl Driver {
    /// Tells discovery of each new peer whose first round this peer has reached, so that it
    /// lets the next new peer in, and of the lowest rank this peer counts in the run.
    pub(super) fn settle_joins(&mut self) {
        for rank in self.core.settled_joins() {
            let _ = self.settle.send(rank);
        }
        self.publish_lowest_live();
    }

    /// Tells discovery of the lowest rank this peer counts in the run, at once (not only at
    /// a round's end): a member whose lower ranks all left admits new peers from the moment
    /// it counts the last of them gone.
    fn publish_lowest_live(&self) {
        let lowest = self.core.lowest_live();
        self.lowest_live
            .send_if_modified(|r| std::mem::replace(r, lowest) != lowest);
    }

    /// Hands `input` to the core and carries out what it decides (and what that causes).
    ///
    /// # Errors
    /// Besides the core's, a lost link that means the others went on without this peer, so
    /// that it stops rather than take every neighbour for departed and train on alone:
    /// - one lost just after this process was itself paused for the peer timeout or longer
    ///   ([`crate::control::pause::PauseWatch::cut_off`]; [`crate::control::pause::Departed`]
    ///   says so);
    /// - one its far end closed as a link to a departed process
    ///   ([`crate::plane::DataPlane::cut_off_by`], [`crate::plane::Link::cut_off`]):
    ///   [`crate::control::pause::CutOff`].
    pub(super) fn handle(&mut self, input: Input) -> anyhow::Result<()> {
        if let Input::Lost { peer, reason, .. }
        | Input::SendFailed {
            to: peer, reason, ..
        } = &input
        {
            let watch = crate::control::pause::PauseWatch::global();
            if watch.cut_off(self.plane.timeouts().peer).is_some() {
                bail!("its neighbours closed its links ({reason})");
            }
            // Not a neighbour that died: one that took this peer for departed.
            if self.plane.cut_off_by(*peer)
                || self
                    .links
                    .get(peer)
                    .is_some_and(crate::plane::Link::cut_off)
            {
                return Err(crate::control::pause::CutOff { by: *peer }.into());
            }
        }
        let actions = self.core.handle(Instant::now(), input)?;
        self.publish_lowest_live();
        self.execute(actions)?;
        self.share_record()
    }

    /// The record's keeper: floods the lines its collector wrote since the last call, for
    /// every peer's copy of the record ([`crate::report::copy`]), and keeps them in its own.
    ///
    /// # Errors
    /// Those of [`Driver::execute`].
    pub(super) fn share_record(&mut self) -> anyhow::Result<()> {
        // Called after every input: nothing to do on most.
        let Some(lines) = (self.collector.as_mut())
            .map(Collector::take_lines)
            .filter(|l| !l.is_empty())
        else {
            return Ok(());
        };
        match self.core.keep_record(Instant::now(), lines, &[])? {
            Some(flood) => self.execute(vec![flood]),
            None => Ok(()),
        }
    }

    /// Carries out the core's actions in order; what comes of them (a failed send, an
    /// opened link) goes back to the core at once.
    pub(super) fn execute(&mut self, actions: Vec<Action>) -> anyhow::Result<()> {
        for action in actions {
            match action {
                Action::Broadcast { frame, except } => {
                    for (&to, link) in self.links.iter().filter(|(to, _)| !except.contains(to)) {
                        if let Err(e) = self.rt.block_on(link.send(frame.clone())) {
                            debug!(to, "could not send a membership notice: {e:#}");
                        }
                    }
                }
                Action::Send { to, frame } => match self.links.contains_key(&to) {
                    true => self.send(to, frame)?,
                    false => debug!(to, "no link to peer {to} for a frame of the membership"),
                },
                Action::Connect {
                    to,
                    incarnation,
                    addr,
                    id,
                    then,
                } => {
                    // A restarted peer's hello does not say whether it is behind a NAT.
                    let nat = super::links::Nat::Unknown;
                    let (plane, relay, rank) = (&self.plane, &self.relay, self.core.rank);
                    let connected = self.rt.block_on(super::links::connect(
                        plane,
                        relay,
                        rank,
                        ((to, incarnation), addr, id),
                        nat,
                    ));
                    match connected {
                        Ok(link) => {
                            self.links.insert(to, link);
                            self.handle(Input::Connected { to })?;
                            if let Some(frame) = then {
                                self.send(to, frame)?;
                            }
                            if to == 0 {
                                self.send_kept_reports(0)?;
                            }
                        }
                        Err(e) => warn!(to, "cannot connect to peer {to}: {e:#}"),
                    }
                }
                Action::DropLinks { peer, before } => {
                    if self
                        .links
                        .get(&peer)
                        .is_some_and(|l| l.incarnation() < before)
                    {
                        if let Some(link) = self.links.remove(&peer) {
                            link.abandon();
                        }
                    }
                    self.plane.forget(peer, before);
                }
                Action::ForgetOldConnections { peer, before } => self.plane.forget(peer, before),
                Action::Admit { id, rank } => self.admitted.admit_all([(id, rank)]),
                Action::CloseAdmission => self.admitted.set_open(false),
                Action::Relocated(info) => {
                    // Discovery ends only with the process.
                    let _ = self.relocated.send(info);
                }
                Action::Record { event, at } => {
                    if let Some(c) = self.collector.as_mut() {
                        c.membership(event, at)?;
                    }
                }
                Action::Collect { from, report } => self.collect(from, report),
                Action::FollowRecord => self.follow_record()?,
            }
        }
        Ok(())
    }

    /// A report frame's payload from `from`: to the collector, or held in case this peer
    /// stands in soon ([`Driver::early_reports`]).
    fn collect(&mut self, from: Rank, report: Bytes) {
        let Some(c) = self.collector.as_mut() else {
            self.early_reports.push_back((from, report));
            while self.early_reports.len() > EARLY_REPORTS
                || self
                    .early_reports
                    .iter()
                    .map(|(_, r)| r.len())
                    .sum::<usize>()
                    > KEPT_REPORT_BYTES
            {
                self.early_reports.pop_front();
            }
            return;
        };
        if let Err(e) = c.add_frame(from, &report) {
            self.core.refuse();
            warn!(from, "dropped a report: {e:#}");
        }
    }

    /// Follows the record's keeper ([`PeerCore::record_keeper`]) when it changed: this peer
    /// stands in for a departed peer 0 (it takes up the record from the run folder, with
    /// the reports sent to it and its own kept ones), hands the record back (peer 0's new
    /// process linked to it), or links to the new keeper and sends it its kept reports.
    ///
    /// # Errors
    /// The record in the run folder cannot be read or written.
    fn follow_record(&mut self) -> anyhow::Result<()> {
        let keeper = self.core.record_keeper();
        if keeper == self.record_to {
            return Ok(());
        }
        let rank = self.core.rank;
        self.record_to = keeper;
        if keeper == rank {
            warn!(
                "peer 0 is away: this peer, the lowest live one (behind no NAT, where one \
                 is), keeps the run's record ({}) until peer 0's new process links to it",
                self.record.dir.display()
            );
            let mut c = self.record.collector();
            // The keeper before it (a stand-in that has not yet heard that this peer keeps
            // the record now) lets the record's lock go within a round or so.
            let departed = self.core.membership.departed();
            c.stand_in(departed, self.plane.timeouts().peer, &self.core.record_copy)?;
            self.collector = Some(c);
            self.plane.hold_acknowledgements();
            let mut reports: Vec<(Rank, Bytes)> = self.early_reports.drain(..).collect();
            reports.extend(
                self.kept_reports
                    .iter()
                    .map(|f| (rank, f.slice(murmur_gossip::FRAME_HEADER_LEN..))),
            );
            for (from, report) in reports {
                self.collect(from, report);
            }
            return Ok(());
        }
        if rank != 0 && self.collector.take().is_some() {
            info!(
                keeper,
                "peer {keeper} keeps the run's record again: this peer stops standing in"
            );
            self.plane.stop_holding_acknowledgements();
        }
        self.early_reports.clear();
        if !self.links.contains_key(&keeper) {
            if let Some(connect) = self.core.connect_to_keeper() {
                self.execute(vec![connect])?;
            }
        }
        if self.links.contains_key(&keeper) {
            self.send_kept_reports(keeper)?;
        }
        Ok(())
    }

    /// Sends `frame` on the link to `to`; a link whose task ended (its connection was lost)
    /// goes back to the core as [`Input::SendFailed`]. A frame for a peer that left (its
    /// link dropped, possibly by an earlier send of the same batch: the kept reports to a
    /// keeper that died as it became one, frames queued before a departure) is dropped.
    ///
    /// # Errors
    /// No link to a peer the run still counts (a bug), or the core's on a lost link.
    fn send(&mut self, to: Rank, frame: Bytes) -> anyhow::Result<()> {
        let Some(link) = self.links.get(&to) else {
            if self.core.membership.has_left(to) {
                debug!(to, "a frame for peer {to}, which left, dropped");
                return Ok(());
            }
            bail!("no link to peer {to}");
        };
        if let Err(e) = self.rt.block_on(link.send(frame)) {
            let (reason, incarnation) = (format!("{e:#}"), link.incarnation());
            self.handle(Input::SendFailed {
                to,
                incarnation,
                reason,
            })?;
        }
        Ok(())
    }

    /// Sends every frame the algorithm's state machine has queued.
    pub(super) fn transmit(&mut self) -> anyhow::Result<()> {
        while let Some(t) = self.core.gossip.poll_transmit() {
            self.send(t.to, t.frame)?;
        }
        Ok(())
    }

    /// `--inject-bad-frames`: sends the five malformed frames of [`bad_frames`] to every
    /// destination, for a model of `d` parameters at round `round`.
    pub(super) fn inject_bad_frames(&mut self, round: u64, d: usize) -> anyhow::Result<()> {
        let frames = bad_frames(self.core.rank, round, d);
        for link in self.links.values() {
            for f in &frames {
                self.rt.block_on(link.send(f.clone()))?;
            }
        }
        Ok(())
    }

    /// Feeds network events and timeouts to the core until the round has mixed.
    pub(super) fn wait_mixed(&mut self) -> anyhow::Result<()> {
        let start = Instant::now();
        loop {
            // Handling a frame may queue frames (all-reduce steps, server replies).
            self.transmit()?;
            match self.core.poll_round_end(start.elapsed()) {
                Some(RoundEnd::Mixed) => return Ok(()),
                Some(RoundEnd::Failed(why)) => bail!("{why}"),
                None => {}
            }
            let deadline = self
                .core
                .poll_timeout()
                .unwrap_or_else(|| Instant::now() + Duration::from_secs(60));
            if !self.next_event(deadline)? {
                self.core.handle_timeout(Instant::now());
            }
        }
    }

    /// Before this peer begins its next round: waits for the rejoin notice of each peer it
    /// welcomed that could mix again from that round ([`PeerCore::held_by`]), handling
    /// events meanwhile and answering their requests for parts of the optimizer's state
    /// (`optimizer_state`: the inner optimizer's `Optimizer::state`, read only if one
    /// waits). One that announces nothing within `timeout` is not waited for.
    pub(super) fn hold_for_rejoins(
        &mut self,
        timeout: Duration,
        optimizer_state: &dyn Fn() -> Vec<f32>,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        self.serve_optimizer_state(optimizer_state)?;
        while let Some(peer) = self.core.held_by() {
            self.serve_optimizer_state(optimizer_state)?;
            self.transmit()?;
            if !self.next_event(deadline)? {
                warn!(
                    peer,
                    "peer {peer} was welcomed but announced no round to mix again from within \
                     {timeout:?}; going on without waiting for it"
                );
                self.core.stop_awaiting_rejoin(peer);
            }
        }
        Ok(())
    }

    /// Between two rounds: answers the requests for parts of the optimizer's state that wait
    /// for a copy of it, from `optimizer_state` (read only then), and drops an idle copy
    /// ([`PeerCore::serve_optimizer_state`]).
    pub(super) fn serve_optimizer_state(
        &mut self,
        optimizer_state: &dyn Fn() -> Vec<f32>,
    ) -> anyhow::Result<()> {
        let actions = self
            .core
            .serve_optimizer_state(Instant::now(), optimizer_state)?;
        self.execute(actions)
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

    /// Handles one network event: the data plane's event as the core's input.
    pub(super) fn handle_net_event(&mut self, ev: NetEvent) -> anyhow::Result<()> {
        let input = match ev {
            NetEvent::Joined { rank, peer_id, .. } => Input::Joined { rank, peer_id },
            NetEvent::Frame {
                from,
                header,
                bytes,
                transfer,
            } => Input::Frame {
                from,
                header,
                bytes,
                transfer,
            },
            NetEvent::Finished { from } => Input::Finished { from },
            NetEvent::LinkDone { to } => Input::LinkDone { to },
            NetEvent::Lost {
                peer,
                incarnation,
                reason,
            } => Input::Lost {
                peer,
                incarnation,
                reason,
            },
            NetEvent::Exited {
                peer,
                incarnation,
                reason,
            } => Input::Exited {
                peer,
                incarnation,
                reason,
            },
            NetEvent::Refused { peer, reason } => Input::Refused { peer, reason },
        };
        self.handle(input)?;
        self.release_acknowledgements();
        Ok(())
    }

    /// The record's keeper: acknowledges the goodbyes of the peers whose reports are all in
    /// the written record (their senders may exit now); see [`crate::plane::DataPlane::hold_acknowledgements`].
    fn release_acknowledgements(&self) {
        if let Some(c) = self.collector.as_ref() {
            let goodbyes = &self.core.goodbyes;
            self.plane
                .release_acknowledgements(|r| goodbyes.heard_from(r) && !c.holds_report_of(r));
        }
    }

    /// Sends this epoch's report (metrics and x) to the record's keeper, or records it
    /// there. A peer other than 0 keeps it ([`Driver::kept_reports`]), also while it stands
    /// in, for the next keeper.
    pub(super) fn report(&mut self, report: PeerEpoch, x: &[f32]) -> anyhow::Result<()> {
        let frame = match self.core.rank {
            0 => None,
            rank => {
                let frame = Bytes::from(encode_report(rank, &report, x)?);
                self.kept_reports.push_back(frame.clone());
                let bytes =
                    |k: &std::collections::VecDeque<Bytes>| k.iter().map(Bytes::len).sum::<usize>();
                while self.kept_reports.len() > KEPT_REPORTS
                    || self.kept_reports.len() > 2 && bytes(&self.kept_reports) > KEPT_REPORT_BYTES
                {
                    self.kept_reports.pop_front();
                }
                Some(frame)
            }
        };
        if let Some(c) = self.collector.as_mut() {
            c.add(report, x.to_vec())?;
            self.release_acknowledgements();
            return self.share_record();
        }
        match (frame, self.links.contains_key(&self.record_to)) {
            (Some(frame), true) => self.send(self.record_to, frame),
            // The keeper left: the report waits for the next one.
            _ => Ok(()),
        }
    }

    /// Sends the kept epoch reports to `keeper`, a new record keeper (its collector takes
    /// those of the epochs it has not recorded and ignores the others). A send that fails
    /// can take the keeper for departed and drop its link (a keeper that died just as it
    /// became one): the rest then wait for the next keeper, which this peer follows.
    fn send_kept_reports(&mut self, keeper: Rank) -> anyhow::Result<()> {
        let kept: Vec<Bytes> = self.kept_reports.iter().cloned().collect();
        for frame in kept {
            self.send(keeper, frame)?;
        }
        Ok(())
    }

    /// A restarted peer's way back into the run: hello to every peer it has a link to
    /// (`me`: its new directory entry), their welcomes (round, departed peers), its x and
    /// its optimizer's state (`optimizer_len` values; 0: none) fetched in parts from its
    /// donors ([`Driver::catch_up`]; a part not answered within `part_timeout` is asked of
    /// another donor), then the round it mixes again from ([`PeerCore::plan_rejoin`])
    /// announced to all, and a wait until every in-neighbour has sent its frame for that
    /// round. Destinations it could not connect to (`unreachable`) must be among the
    /// departed peers of the welcomes. Returns that round and what was fetched (`None` for
    /// a peer 0 that came back too late to train and only collects).
    ///
    /// # Errors
    /// No welcome within `timeout`, a peer unreachable that the run still counts, the run
    /// ending before the agreed round (`total_rounds`), no peer to fetch x from or x not
    /// whole within `timeout`, or the run over while this peer waits for welcomes
    /// (`ended`: its record is complete; a peer that finished and exited answers no hello).
    pub(super) fn rejoin(
        &mut self,
        me: &PeerInfo,
        unreachable: BTreeMap<Rank, anyhow::Error>,
        total_rounds: u64,
        optimizer_len: usize,
        (timeout, part_timeout): (Duration, Duration),
        ended: &dyn Fn() -> bool,
    ) -> anyhow::Result<(u64, Option<Fetched>)> {
        let hello = self.core.hello(me)?;
        for link in self.links.values() {
            self.rt.block_on(link.send(hello.clone()))?;
        }
        let deadline = Instant::now() + timeout;
        self.await_welcomes(deadline, timeout, ended)?;
        // Too few present in-neighbours to share the catch-up: the nearest other peers too.
        let helpers =
            self.core
                .link_catch_up_helpers(&unreachable, total_rounds, REJOIN_MARGIN_ROUNDS)?;
        if !helpers.is_empty() {
            self.execute(helpers)?;
            self.await_welcomes(deadline, timeout, ended)?;
        }
        let donors = self
            .core
            .catch_up_donors(&unreachable, total_rounds, REJOIN_MARGIN_ROUNDS)?;
        let fetched = match donors.is_empty() {
            true => None,
            false => Some(self.catch_up(&donors, optimizer_len, part_timeout, timeout)?),
        };
        let (rejoining, actions) = self.core.plan_rejoin(
            Instant::now(),
            &unreachable,
            total_rounds,
            REJOIN_MARGIN_ROUNDS,
            me.data_addr,
        )?;
        self.execute(actions)?;
        // Begin only when every in-neighbour of that round is at it.
        let at = rejoining.at;
        while !self.core.ready_to_mix() {
            let deadline = Instant::now() + timeout;
            if !self.next_event(deadline)? {
                let in_peers = self.core.gossip.in_peers_at(at);
                bail!("in-neighbours {in_peers:?} did not reach round {at} within {timeout:?}");
            }
        }
        self.core.end_rejoin();
        Ok((at, fetched))
    }

    /// Handles events until every linked peer has welcomed this rejoining peer (or said
    /// hello itself).
    ///
    /// # Errors
    /// Not all by `deadline` (`timeout` after the hello), or the run over meanwhile
    /// (`ended`).
    fn await_welcomes(
        &mut self,
        deadline: Instant,
        timeout: Duration,
        ended: &dyn Fn() -> bool,
    ) -> anyhow::Result<()> {
        loop {
            let waiting: Vec<Rank> = (self.links.keys().copied())
                .filter(|&r| self.core.awaits_welcome(r))
                .collect();
            if waiting.is_empty() {
                return Ok(());
            }
            let look = deadline.min(Instant::now() + Duration::from_millis(250));
            if !self.next_event(look)? {
                if ended() {
                    bail!("the run ended while peers {waiting:?} had not answered");
                }
                if Instant::now() >= deadline {
                    bail!("no answer from peers {waiting:?} within {timeout:?}");
                }
            }
        }
    }

    /// Fetches x (`[d]`) and the optimizer's state (`[optimizer_len]`, if not 0) in parts
    /// from `donors` ([`crate::peer::core::catch_up`]), handling events meanwhile, and logs
    /// what each donor sent.
    ///
    /// # Errors
    /// Every donor left before they were whole, or they were not whole within `timeout`.
    fn catch_up(
        &mut self,
        donors: &[Rank],
        optimizer_len: usize,
        part_timeout: Duration,
        timeout: Duration,
    ) -> anyhow::Result<Fetched> {
        let actions =
            self.core
                .begin_catch_up(Instant::now(), donors, optimizer_len, part_timeout)?;
        self.execute(actions)?;
        let deadline = Instant::now() + timeout;
        while !self.core.caught_up() {
            let look = (self.core.catch_up_deadline())
                .unwrap_or(deadline)
                .min(deadline)
                .min(Instant::now() + Duration::from_millis(250));
            self.next_event(look)?;
            let actions = self.core.poll_catch_up(Instant::now())?;
            self.execute(actions)?;
            if !self.core.caught_up() && Instant::now() >= deadline {
                bail!(
                    "this peer's parameters were not whole within {timeout:?} (donors {donors:?})"
                );
            }
        }
        let (fetched, summary) = self.core.finish_catch_up()?.expect("a catch-up under way");
        let sent: Vec<String> = (summary.donors.iter())
            .map(|d| {
                let late = match d.timeouts {
                    0 => String::new(),
                    n => format!(", {n} not answered in time"),
                };
                let left = if d.gone { ", left" } else { "" };
                format!(
                    "peer {}: {} parts, {} bytes{late}{left}",
                    d.rank, d.parts, d.bytes
                )
            })
            .collect();
        let n = summary.donors.len();
        info!(
            seconds = summary.seconds,
            duplicate_bytes = summary.duplicate_bytes,
            "caught up: {} fetched from {n} donor{} ({})",
            crate::peer::core::catch_up::listed(&summary.vectors),
            if n == 1 { "" } else { "s" },
            sent.join("; ")
        );
        Ok(fetched)
    }

    /// Says goodbye on every link and waits until every expected peer said goodbye to us
    /// and every link was closed by its receiver. A peer other than 0 that finds peer 0 (the
    /// record's collector) departed and no stand-in keeping the record then waits up to
    /// `collector_wait` for it to come back (`launch --restart-failed` and murmur.sbatch
    /// restart it at once): its rejoin links this peer to it again and sends it the reports
    /// this peer kept, and this peer says goodbye on that link too. A peer that took up the
    /// record meanwhile (it stands in for peer 0) waits, up to `record_wait`, until the
    /// record holds epoch `last_epoch`: the others send it their last reports now.
    pub(super) fn finish(
        &mut self,
        collector_wait: Duration,
        (last_epoch, record_wait): (usize, Duration),
    ) -> anyhow::Result<()> {
        let mut deadline = Instant::now() + Duration::from_secs(30);
        let mut waited_for_the_record = false;
        let mut collector_deadline = None;
        // Peer 0's record is written: nothing more to wait for before letting the others go.
        self.plane.release_acknowledgements(|_| true);
        'finishing: loop {
            while !self.core.goodbyes.settled() {
                // Each sender task whose handle is dropped sends its goodbye. Dropped at
                // every turn: a link opened while finishing (to a peer that came back, with
                // a welcome or the kept reports) is owed its goodbye at once, not after the
                // deadline (a new link keeps the goodbyes unsettled until it is closed).
                self.links.clear();
                if !self.next_event(deadline)? {
                    let (missing, unacknowledged) = self.core.goodbyes.outstanding();
                    // Only the record's keeper owes something (never so on the keeper
                    // itself): it says goodbye, and acknowledges ours once our reports are
                    // recorded, after its own last epoch and the evaluation of x̄ (slow for a
                    // large model): wait for it while it lives (its death or silence ends
                    // the wait at once).
                    let keeper = self.record_to;
                    let only_keeper = |v: &[Rank]| v.iter().all(|&r| r == keeper);
                    let only_the_record = only_keeper(&missing)
                        && only_keeper(&unacknowledged)
                        && keeper != self.core.rank
                        && !self.core.membership.has_left(keeper);
                    if only_the_record && !waited_for_the_record {
                        waited_for_the_record = true;
                        info!(
                            "peer {keeper} (the record's keeper) has not yet finished and \
                             recorded this peer's last reports: waiting up to {} s more for it \
                             before exiting",
                            RECORD_WAIT.as_secs()
                        );
                        deadline = Instant::now() + RECORD_WAIT;
                        continue;
                    }
                    warn!(
                        ?missing,
                        ?unacknowledged,
                        "shutdown timed out; exiting anyway"
                    );
                    break 'finishing;
                }
            }
            self.links.clear();
            // Standing in since it finished its own training: the record's last epoch waits
            // for the reports the others send it now.
            let record_until = Instant::now() + record_wait;
            while self.core.rank != 0
                && (self.collector.as_ref())
                    .is_some_and(|c| c.rows.last().is_none_or(|r| r.epoch < last_epoch))
            {
                if !self.next_event(record_until)? {
                    warn!(
                        "the record's last epochs lack peers {:?}: they sent no report within {} s",
                        self.collector.as_ref().map(|c| c.missing_reporters()),
                        record_wait.as_secs()
                    );
                    break;
                }
            }
            // Nothing to wait for: peer 0 is there, a stand-in keeps the record (it has our
            // last reports), or the record is complete (its summary written).
            let done = |d: &Driver| {
                !d.core.membership.has_left(0)
                    || d.record_to != 0
                    || super::run_completed(&d.record.dir)
            };
            if self.core.rank == 0 || done(self) {
                break;
            }
            let until = *collector_deadline.get_or_insert_with(|| {
                info!(
                    "peer 0 (the record's collector) has left: waiting up to {} s for it to \
                     come back for this peer's last reports",
                    collector_wait.as_secs()
                );
                Instant::now() + collector_wait
            });
            while !done(self) {
                let look = until.min(Instant::now() + Duration::from_millis(250));
                if !self.next_event(look)? && Instant::now() >= until {
                    break;
                }
            }
            if !done(self) {
                warn!(
                    "peer 0 did not come back: the run's record lacks this peer's last \
                     reports (its own rows are in peers/peer-{}.jsonl)",
                    self.core.rank
                );
                break;
            }
            // Once more: the goodbyes on links opened meanwhile (to peer 0's new process, to
            // a stand-in).
        }
        self.rt
            .block_on(self.plane.shutdown(Duration::from_secs(2)));
        Ok(())
    }
}
