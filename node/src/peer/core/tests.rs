//! The core driven by hand, without a socket: inputs in, actions and state out.

use super::*;
use crate::control::discovery::PeerInfo;
use murmur_gossip::{DPsgd, DPsgdConfig};
use murmur_topology::{Graph, MixingMatrix};

const D: usize = 8;

/// Peer `rank` of D-PSGD on a ring of 4 (W Metropolis–Hastings, ⅓ each), linked to its two
/// neighbours (and to peer 0 for the reports), expecting goodbyes from its neighbours
/// (from everyone on peer 0).
fn core(rank: Rank) -> PeerCore {
    core_at(rank, 1.0)
}

/// [`core`] with x = `v` everywhere.
fn core_at(rank: Rank, v: f32) -> PeerCore {
    let w = MixingMatrix::metropolis_hastings(&Graph::ring(4).unwrap()).unwrap();
    let gossip = DPsgd::new(DPsgdConfig::from_matrix(&w, rank, 0.1, D), vec![v; D]);
    let mut linked = w.out_neighbors(rank);
    let mut expected_in: Vec<Rank> = w.in_weights(rank).iter().map(|&(j, _)| j).collect();
    if rank == 0 {
        expected_in = vec![1, 2, 3];
    } else if !linked.contains(&0) {
        linked.push(0);
    }
    let ids = (0..4)
        .map(|_| {
            Some(
                libp2p::identity::Keypair::generate_ed25519()
                    .public()
                    .to_peer_id(),
            )
        })
        .collect();
    let setup = CoreSetup {
        rank,
        w,
        algorithm: "dpsgd".into(),
        peer_ids: ids,
        linked,
        expected_in,
        admit_signer: (rank == 0).then(libp2p::identity::Keypair::generate_ed25519),
        incarnations: vec![10; 4],
        addrs: (0..4)
            .map(|r| Some(SocketAddr::from(([127, 0, 0, 1], 4000 + r as u16))))
            .collect(),
        behind_nat: Vec::new(),
    };
    PeerCore::new(Box::new(gossip), setup, Instant::now())
}

/// The connection to or from `peer`'s process of `incarnation` was lost (`why`).
fn lost(peer: Rank, incarnation: Incarnation, why: &str) -> Input {
    Input::Lost {
        peer,
        incarnation,
        reason: why.into(),
    }
}

/// A frame of `kind` from `from` at `round` with `payload`.
fn frame(kind: FrameKind, from: Rank, round: u64, payload: &[u8]) -> Input {
    let mut bytes = Vec::new();
    FrameHeader {
        kind,
        sender: from,
        round,
        dim: D as u32,
        payload_len: payload.len() as u32,
    }
    .emit(&mut bytes);
    bytes.extend_from_slice(payload);
    let (header, _) = FrameHeader::parse(&bytes, u32::MAX).unwrap();
    Input::Frame {
        from,
        header,
        bytes: Bytes::from(bytes),
        transfer: None,
    }
}

fn kinds(actions: &[Action]) -> Vec<&'static str> {
    actions
        .iter()
        .map(|a| match a {
            Action::Broadcast { .. } => "broadcast",
            Action::Send { .. } => "send",
            Action::Connect { .. } => "connect",
            Action::DropLinks { .. } => "drop",
            Action::ForgetOldConnections { .. } => "forget",
            Action::Admit { .. } => "admit",
            Action::CloseAdmission => "close",
            Action::Record { .. } => "record",
            Action::Collect { .. } => "collect",
            Action::Relocated(_) => "relocated",
            Action::FollowRecord => "follow",
        })
        .collect()
}

#[test]
fn a_lost_neighbour_is_a_departure_told_to_all_and_recorded_by_peer_0() {
    let mut c = core(0);
    let now = Instant::now();
    let out = c.handle(now, lost(1, 10, "closed")).unwrap();
    assert_eq!(kinds(&out), ["drop", "broadcast", "record"]);
    assert!(matches!(
        out[0],
        Action::DropLinks {
            peer: 1,
            before: 11
        }
    ));
    // The link to 1 is dropped before the leave notice goes to every link left.
    let Action::Broadcast { frame: notice, .. } = &out[1] else {
        unreachable!()
    };
    assert_eq!(
        FrameHeader::parse(notice, u32::MAX).unwrap().0.kind,
        FrameKind::Leave
    );
    assert!(c.membership.has_left(1));
    // The algorithm mixes without peer 1: round 0 ends on peer 3's frame alone.
    c.gossip.begin_round(now, &[1.0; D], Some(&[0.0; D]));
    while c.gossip.poll_transmit().is_some() {}
    let mut x3 = Vec::new();
    let mut rng = StdRng::seed_from_u64(0);
    murmur_compress::Identity.compress(&[1.0; D], &mut rng, &mut x3);
    assert!(c
        .handle(now, frame(FrameKind::Gossip, 3, 0, &x3))
        .unwrap()
        .is_empty());
    assert!(matches!(
        c.poll_round_end(Duration::ZERO),
        Some(RoundEnd::Mixed)
    ));
    // Its frames are dropped now, and not counted as refused.
    let late = c
        .handle(now, frame(FrameKind::Gossip, 1, 0, &[0; 4]))
        .unwrap();
    assert!(late.is_empty());
    assert_eq!(c.refused_frames, 0);
    // Told again (a second connection, a neighbour's notice): nothing more to do.
    let again = c.handle(now, lost(1, 10, "again")).unwrap();
    assert_eq!(kinds(&again), ["drop"]);
}

#[test]
fn a_lost_connection_of_an_old_process_closes_its_links_and_departs_no_one() {
    let mut c = core(0);
    let out = c.handle(Instant::now(), lost(1, 7, "timed out")).unwrap();
    assert_eq!(kinds(&out), ["drop"]);
    assert!(matches!(out[0], Action::DropLinks { peer: 1, before: 8 }));
    assert!(!c.membership.has_left(1), "incarnation 10 is the member");
}

#[test]
fn a_failed_send_is_a_departure_recorded_where_the_record_is_kept() {
    let mut c = core(2);
    let out = c
        .handle(
            Instant::now(),
            Input::SendFailed {
                to: 3,
                incarnation: 10,
                reason: "reset".into(),
            },
        )
        .unwrap();
    // The record line goes to the shell, which drops it on a peer that keeps no record.
    assert_eq!(kinds(&out), ["drop", "broadcast", "record"]);
    assert!(c.membership.has_left(3));
}

#[test]
fn a_loss_after_the_goodbyes_is_harmless() {
    let mut c = core(1);
    for p in [0, 2] {
        c.handle(Instant::now(), Input::Finished { from: p })
            .unwrap();
        c.handle(Instant::now(), Input::LinkDone { to: p }).unwrap();
    }
    assert!(c.goodbyes.settled());
    let out = c.handle(Instant::now(), lost(2, 10, "closed")).unwrap();
    assert!(out.is_empty());
    assert!(!c.membership.has_left(2));
}

#[test]
fn peer_0_leaves_like_any_peer_and_every_peer_links_to_its_new_process() {
    // Peer 2 of the ring of 4 is no neighbour of peer 0, but sends it its reports.
    let mut c = core(2);
    let out = c.handle(Instant::now(), lost(0, 10, "killed")).unwrap();
    // Peer 1 keeps the record now.
    assert_eq!(kinds(&out), ["drop", "broadcast", "record", "follow"]);
    assert!(c.membership.has_left(0));
    // Peer 0's new process rejoins: peer 2 opens a link to it, for the reports.
    let addr: SocketAddr = "127.0.0.1:4200".parse().unwrap();
    let notice = crate::control::membership::encode_rejoin(1, (0, 20), 60, addr);
    let out = c
        .handle(
            Instant::now(),
            frame(FrameKind::Rejoin, 1, 60, &notice[FRAME_HEADER_LEN..]),
        )
        .unwrap();
    // Back in the run, peer 0 keeps the record again.
    assert_eq!(
        kinds(&out),
        ["connect", "broadcast", "relocated", "record", "follow"]
    );
    assert_eq!(c.record_keeper(), 0);
    // Discovery learns where peer 0's new process is, for the directory it serves.
    assert!(matches!(
        &out[2],
        Action::Relocated(info) if (info.rank, info.data_addr, info.incarnation) == (0, addr, 20)
    ));
    assert!(matches!(
        out[0],
        Action::Connect {
            to: 0,
            incarnation: 20,
            ..
        }
    ));
    assert!(!c.membership.has_left(0));
}

/// The directory entry of a new process of peer `rank` (a fresh identity) at `addr`.
fn peer_info(rank: Rank, addr: SocketAddr, incarnation: Incarnation) -> PeerInfo {
    PeerInfo {
        rank,
        peer_id: libp2p::identity::Keypair::generate_ed25519()
            .public()
            .to_peer_id()
            .to_string(),
        data_addr: addr,
        nat_published: None,
        incarnation,
        control: Vec::new(),
    }
}

/// Peer `peer`'s process of incarnation 10 exited, as its supervisor saw.
fn exited(peer: Rank) -> Input {
    Input::Exited {
        peer,
        incarnation: 10,
        reason: "SIGKILL".into(),
    }
}

/// `c` is told by peer `from` that peer `back`'s process of `incarnation`, listening at
/// `addr`, mixes again from round `at`.
fn rejoin_notice(
    c: &mut PeerCore,
    from: Rank,
    (back, incarnation): (Rank, Incarnation),
    at: u64,
    addr: SocketAddr,
) -> Vec<Action> {
    let notice = crate::control::membership::encode_rejoin(from, (back, incarnation), at, addr);
    let input = frame(FrameKind::Rejoin, from, at, &notice[FRAME_HEADER_LEN..]);
    c.handle(Instant::now(), input).unwrap()
}

/// A D-PSGD frame (x = 1) of peer `from` for round `round`.
fn gossip_frame(from: Rank, round: u64) -> Input {
    let mut x = Vec::new();
    murmur_compress::Identity.compress(&[1.0; D], &mut StdRng::seed_from_u64(0), &mut x);
    frame(FrameKind::Gossip, from, round, &x)
}

/// The rejoining `c` plans its rejoin with the welcomes it has (margin 20 rounds): the
/// round it mixes again from, and the actions.
fn plan(c: &mut PeerCore) -> (u64, Vec<Action>) {
    let addr = "127.0.0.1:4300".parse().unwrap();
    let (rejoining, out) = c
        .plan_rejoin(Instant::now(), &BTreeMap::new(), 1000, 20, addr)
        .unwrap();
    (rejoining.at, out)
}

#[test]
fn a_rejoining_peer_says_hello_on_a_link_it_opens_while_waiting_for_welcomes() {
    // Peers 0 and 1 of the ring were restarted at once: 0's new process learned that 1
    // exited, then hears that 1's new process is back before its own welcomes are in.
    let mut c = core(0);
    c.handle(Instant::now(), exited(1)).unwrap();
    let me = peer_info(0, "127.0.0.1:4300".parse().unwrap(), 11);
    let hello = c.hello(&me).unwrap();
    let addr: SocketAddr = "127.0.0.1:4200".parse().unwrap();
    let out = rejoin_notice(&mut c, 3, (1, 20), 60, addr);
    let Some(Action::Connect {
        to: 1,
        then: Some(sent),
        ..
    }) = out.first()
    else {
        panic!("{out:?}")
    };
    // Peer 1's new process never had the hello: without it, no welcome comes on this link
    // and the wait for one runs into the rejoin timeout.
    assert_eq!(sent, &hello);
    assert!(c.awaits_welcome(1));
    // Once the rejoin is planned, a link opened later carries nothing: peer 1's next
    // process is linked to without a hello.
    let welcome = core(3).membership.welcome(0, 40);
    c.welcomes.insert(3, welcome);
    plan(&mut c);
    c.handle(Instant::now(), lost(1, 20, "killed")).unwrap();
    let out = rejoin_notice(&mut c, 3, (1, 30), 80, addr);
    assert!(
        matches!(
            out.first(),
            Some(Action::Connect {
                to: 1,
                then: None,
                ..
            })
        ),
        "{out:?}"
    );
}

#[test]
fn a_rejoining_peer_takes_in_a_peer_rejoining_from_an_earlier_round_from_its_own_first() {
    // Peers 0 and 1 of the ring restarted at once; 1 planned to mix again from round 45,
    // then hears that 0 mixes again from round 44 (a welcome of a lower round).
    let mut c = core(1);
    c.handle(Instant::now(), lost(0, 10, "killed")).unwrap();
    let welcome = core(2).membership.welcome(1, 25);
    c.welcomes.insert(2, welcome);
    assert_eq!(plan(&mut c).0, 45);
    rejoin_notice(&mut c, 2, (0, 20), 44, "127.0.0.1:4200".parse().unwrap());
    assert!(!c.membership.has_left(0), "taken back, not refused");
    // Peer 0 mixes with this peer from this peer's first round on, as peer 0 does from the
    // notice of this peer's rejoin: its frame of round 45 is awaited besides peer 2's.
    c.handle(Instant::now(), gossip_frame(2, 45)).unwrap();
    assert!(!c.ready_to_mix());
    c.handle(Instant::now(), gossip_frame(0, 45)).unwrap();
    assert!(c.ready_to_mix());
    assert_eq!(c.refused_frames, 0);
}

#[test]
fn a_rejoining_peer_closes_only_the_links_of_a_departed_peer_s_exited_processes() {
    // Peers 0 and 1 of the ring restarted at once: 0's new process was told that 1's old
    // one exited; 1's new process welcomed 0, and peer 2's welcome (sent before it heard of
    // 1's rejoin) names 1 departed.
    let mut c = core(0);
    c.handle(Instant::now(), exited(1)).unwrap();
    let from_1 = core(1).membership.welcome(0, 30);
    let mut member = core(2);
    member.handle(Instant::now(), exited(1)).unwrap();
    let from_2 = member.membership.welcome(0, 40);
    assert_eq!(from_2.departed, [1]);
    c.welcomes.insert(1, from_1);
    c.welcomes.insert(2, from_2);
    let (_, out) = plan(&mut c);
    // Only the exited process's connections close: 1's new process sends its frames to this
    // peer on the link it opened with its welcome once its own rejoin notice comes.
    let drops: Vec<_> = out
        .iter()
        .filter_map(|a| match a {
            Action::DropLinks { peer, before } => Some((*peer, *before)),
            _ => None,
        })
        .collect();
    assert_eq!(drops, [(1, 11)]);
}

#[test]
fn a_rejoining_peer_links_to_a_peer_that_came_back_before_it_where_the_welcomes_say() {
    // Peers 0 and 1 of the ring restarted at once; 0 came back first. Peer 1's directory
    // still has 0's exited process, so it has no link to 0's new one; peer 2 heard 0's
    // rejoin notice and welcomes 1.
    let mut c = core(1);
    c.handle(Instant::now(), exited(0)).unwrap();
    let mut member = core(2);
    member.handle(Instant::now(), exited(0)).unwrap();
    let at_0: SocketAddr = "127.0.0.1:4200".parse().unwrap();
    rejoin_notice(&mut member, 3, (0, 20), 44, at_0);
    let welcome = member.membership.welcome(1, 30);
    assert_eq!(welcome.locations, [(0, 20, at_0)]);
    c.welcomes.insert(2, welcome);
    let (at, out) = plan(&mut c);
    // Without that link its frames never reach 0, which waits for them from its first
    // round with this peer on.
    let connects: Vec<_> = out
        .iter()
        .filter_map(|a| match a {
            Action::Connect {
                to,
                incarnation,
                addr,
                ..
            } => Some((*to, *incarnation, *addr)),
            _ => None,
        })
        .collect();
    assert_eq!(connects, [(0, 20, at_0)]);
    // And it mixes with 0 again from its own first round: taken for departed from its
    // supervisor's notice, this peer would neither send to 0 nor wait for it, while 0
    // waits for this peer's frames once it hears this peer's rejoin notice.
    assert!(!c.membership.has_left(0));
    c.handle(Instant::now(), gossip_frame(2, at)).unwrap();
    assert!(!c.ready_to_mix(), "waits for 0's frame of round {at}");
    c.handle(Instant::now(), gossip_frame(0, at)).unwrap();
    assert!(c.ready_to_mix());
}

#[test]
fn reports_go_to_the_shell_on_every_peer_which_collects_them_if_it_keeps_the_record() {
    for rank in [0, 1] {
        let mut c = core(rank);
        let out = c
            .handle(Instant::now(), frame(FrameKind::Report, 2, 0, b"r"))
            .unwrap();
        let [Action::Collect { from: 2, report }] = &out[..] else {
            panic!("{out:?}")
        };
        assert_eq!(&report[..], b"r", "the payload, without the header");
        assert_eq!(c.refused_frames, 0);
    }
}

/// The record's lines flood: a peer keeps those new to it and passes them on to every link
/// but the sender's, once; the same lines again, from anyone, go no further; a frame that
/// is not record lines is refused. A restarted peer's welcome carries the copy, and the
/// restarted peer keeps what its welcomes carry.
#[test]
fn the_record_s_lines_flood_once_and_a_welcome_carries_the_copy() {
    use crate::report::copy::{self, RecordLine};
    let line = |epoch| RecordLine::Epoch {
        row: crate::report::EpochRow {
            epoch,
            ..Default::default()
        },
        distances: None,
    };
    let mut c = core(2);
    let flood = copy::encode(1, &[line(0), line(1)]).unwrap();
    let out = c
        .handle(
            Instant::now(),
            frame(FrameKind::Record, 1, 1, &flood[FRAME_HEADER_LEN..]),
        )
        .unwrap();
    let [Action::Broadcast {
        frame: passed,
        except,
    }] = &out[..]
    else {
        panic!("{out:?}")
    };
    assert_eq!(except, &[1]);
    let (header, payload) = FrameHeader::parse(passed, u32::MAX).unwrap();
    assert_eq!((header.kind, header.sender), (FrameKind::Record, 2));
    assert_eq!(copy::decode(payload).unwrap().len(), 2);
    // Back from its other neighbour: nothing new.
    let out = c
        .handle(
            Instant::now(),
            frame(FrameKind::Record, 3, 1, &flood[FRAME_HEADER_LEN..]),
        )
        .unwrap();
    assert!(out.is_empty(), "{out:?}");
    // Only the new line goes on.
    let more = copy::encode(1, &[line(1), line(2)]).unwrap();
    let out = c
        .handle(
            Instant::now(),
            frame(FrameKind::Record, 1, 2, &more[FRAME_HEADER_LEN..]),
        )
        .unwrap();
    let [Action::Broadcast { frame: passed, .. }] = &out[..] else {
        panic!("{out:?}")
    };
    let (_, payload) = FrameHeader::parse(passed, u32::MAX).unwrap();
    assert_eq!(copy::decode(payload).unwrap().len(), 1);
    assert_eq!(c.refused_frames, 0);
    let out = c
        .handle(
            Instant::now(),
            frame(FrameKind::Record, 1, 2, b"[{\"Epoch\": 3}]"),
        )
        .unwrap();
    assert!(out.is_empty());
    assert_eq!(c.refused_frames, 1);

    // Peer 1's new process says hello: the welcome carries epochs 0, 1 and 2.
    let me = peer_info(1, "127.0.0.1:4100".parse().unwrap(), 20);
    let hello = crate::control::membership::encode_hello(1, &me).unwrap();
    let out = c
        .handle(
            Instant::now(),
            frame(FrameKind::Hello, 1, 0, &hello[FRAME_HEADER_LEN..]),
        )
        .unwrap();
    let Some(Action::Connect {
        then: Some(welcome),
        ..
    }) = out.last()
    else {
        panic!("{out:?}")
    };
    let (_, payload) = FrameHeader::parse(welcome, u32::MAX).unwrap();
    let (w, _): (Welcome, Vec<f32>) =
        crate::report::frames::decode_with_params_sized(payload, |_| 0).unwrap();
    assert_eq!(w.record.len(), 3);
    // A peer that takes it keeps the lines.
    let mut back = core(1);
    let out = back
        .handle(Instant::now(), frame(FrameKind::Welcome, 2, 0, payload))
        .unwrap();
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(back.record_copy.lines().len(), 3);
}

/// Peer 0 keeps the record while it counts in the run; once it has left, the lowest live
/// rank stands in (every survivor derives the same one), and peer 0's new process takes
/// the record back as soon as this peer holds a link to it.
#[test]
fn a_stand_in_keeper_is_the_lowest_live_peer_behind_no_nat_where_there_is_one() {
    // Peers 1 and 2 behind NATs: with peer 0 away, every survivor takes 3, which both
    // reach by dialling out, not 1, which 3 could reach only through a relay.
    for me in [1, 2, 3] {
        let mut c = core(me);
        c.behind_nat = vec![1, 2];
        c.handle(Instant::now(), exited(0)).unwrap();
        assert_eq!(c.record_keeper(), 3, "peer {me}'s view");
        if me == 2 {
            // 3 is its neighbour on the ring.
            c.handle(Instant::now(), exited(3)).unwrap();
            assert_eq!(
                c.record_keeper(),
                1,
                "every one left is behind a NAT: the lowest"
            );
        }
    }
}

#[test]
fn the_lowest_live_peer_keeps_the_record_while_peer_0_is_away() {
    let mut c = core(2);
    assert_eq!(c.record_keeper(), 0);
    let out = c.handle(Instant::now(), exited(0)).unwrap();
    assert_eq!(kinds(&out).last(), Some(&"follow"), "{:?}", kinds(&out));
    assert_eq!(c.record_keeper(), 1);
    let out = c.handle(Instant::now(), exited(1)).unwrap();
    assert_eq!(kinds(&out).last(), Some(&"follow"));
    assert_eq!(c.record_keeper(), 2, "itself: 0 and 1 are away");
    assert!(c.connect_to_keeper().is_none());
    let mut c3 = core(3);
    c3.handle(Instant::now(), exited(0)).unwrap();
    assert_eq!(c3.record_keeper(), 1, "the same keeper on every survivor");
    let Some(Action::Connect { to: 1, addr, .. }) = c3.connect_to_keeper() else {
        panic!("peer 3 does not send to 1 on the ring: the shell links to it")
    };
    assert_eq!(addr.port(), 4001);
    // Peer 0's new process says hello: linked to it, peer 3 sends its reports there.
    let me = peer_info(0, "127.0.0.1:4500".parse().unwrap(), 11);
    let hello = crate::control::membership::encode_hello(0, &me).unwrap();
    let out = c3
        .handle(
            Instant::now(),
            frame(FrameKind::Hello, 0, 0, &hello[FRAME_HEADER_LEN..]),
        )
        .unwrap();
    assert!(kinds(&out).contains(&"connect"), "{:?}", kinds(&out));
    assert_eq!(c3.record_keeper(), 1, "not before the link is open");
    let out = c3
        .handle(Instant::now(), Input::Connected { to: 0 })
        .unwrap();
    assert_eq!(kinds(&out), ["follow"]);
    assert_eq!(c3.record_keeper(), 0);
}

#[test]
fn the_injected_bad_frames_with_a_header_are_refused_and_counted() {
    let mut c = core(1);
    let mut refused = 0;
    for f in bad_frames(2, 0, D) {
        // The data plane refuses what has no header of its own (garbage, truncated, an
        // oversized length); the rest reach the core.
        let Ok((header, _)) = FrameHeader::parse(&f, 1 << 20) else {
            continue;
        };
        let input = Input::Frame {
            from: 2,
            header,
            bytes: f,
            transfer: None,
        };
        assert!(c.handle(Instant::now(), input).unwrap().is_empty());
        refused += 1;
    }
    assert_eq!(refused, 2, "NaN parameters and a frame 1000 rounds ahead");
    assert_eq!(c.refused_frames, 2);
}

#[test]
fn a_restarted_peer_s_hello_opens_a_link_that_carries_the_welcome() {
    let mut c = core(0);
    let addr: SocketAddr = "127.0.0.1:4100".parse().unwrap();
    let me = peer_info(1, addr, 20);
    let hello = crate::control::membership::encode_hello(1, &me).unwrap();
    let input = frame(FrameKind::Hello, 1, 0, &hello[FRAME_HEADER_LEN..]);
    let out = c.handle(Instant::now(), input).unwrap();
    // Its old process has left (re-weighted, told, recorded), then the new one is linked.
    assert_eq!(kinds(&out), ["drop", "broadcast", "record", "connect"]);
    assert!(
        matches!(
            out[0],
            Action::DropLinks {
                peer: 1,
                before: 20
            }
        ),
        "only the old process's links close"
    );
    let Action::Connect {
        to: 1,
        incarnation: 20,
        addr: a,
        then: Some(welcome),
        ..
    } = &out[3]
    else {
        panic!("{out:?}")
    };
    assert_eq!(*a, addr);
    assert_eq!(
        FrameHeader::parse(welcome, u32::MAX).unwrap().0.kind,
        FrameKind::Welcome
    );
    assert!(
        !c.goodbyes.loss_matters(1),
        "nothing owed to the old process"
    );
    c.handle(Instant::now(), Input::Connected { to: 1 })
        .unwrap();
    assert!(c.goodbyes.loss_matters(1), "the new link owes a goodbye");
    // A malformed hello is refused and counted.
    let out = c
        .handle(Instant::now(), frame(FrameKind::Hello, 2, 0, b"{"))
        .unwrap();
    assert!(out.is_empty());
    assert_eq!(c.refused_frames, 1);
}

#[test]
fn a_member_holds_the_round_a_welcomed_peer_could_mix_again_from_until_it_says_which() {
    let (now, margin) = (Instant::now(), crate::peer::REJOIN_MARGIN_ROUNDS);
    let mut c = core(2);
    let addr: SocketAddr = "127.0.0.1:4201".parse().unwrap();
    for p in [1, 3] {
        let hello = crate::control::membership::encode_hello(p, &peer_info(p, addr, 20)).unwrap();
        c.handle(
            now,
            frame(FrameKind::Hello, p, 0, &hello[FRAME_HEADER_LEN..]),
        )
        .unwrap();
    }
    // Welcomed at round 0: the rounds before 0 + margin are begun without waiting.
    assert_eq!(c.held_by(), None);
    c.gossip.start_at_round(margin - 1).unwrap();
    assert_eq!(c.held_by(), Some(1));
    // Peer 1 says it mixes again from round `margin`: only peer 3 holds this one now.
    let notice = crate::control::membership::encode_rejoin(1, (1, 20), margin, addr);
    c.handle(
        now,
        frame(FrameKind::Rejoin, 1, margin, &notice[FRAME_HEADER_LEN..]),
    )
    .unwrap();
    assert_eq!(c.held_by(), Some(3));
    // Peer 3's new process dies before it says: nothing holds the round any more.
    c.handle(now, lost(3, 20, "killed")).unwrap();
    assert!(c.membership.has_left(3));
    assert_eq!(c.held_by(), None);
    // A peer waited for too long is given up.
    let hello = crate::control::membership::encode_hello(1, &peer_info(1, addr, 30)).unwrap();
    c.handle(
        now,
        frame(FrameKind::Hello, 1, 0, &hello[FRAME_HEADER_LEN..]),
    )
    .unwrap();
    assert_eq!(c.held_by(), None, "welcomed at round {}", margin - 1);
    c.gossip.start_at_round(2 * margin).unwrap();
    assert_eq!(c.held_by(), Some(1));
    c.stop_awaiting_rejoin(1);
    assert_eq!(c.held_by(), None);
}

/// The frame of a `Send` action (panics on any other).
fn sent(action: &Action) -> (Rank, Input) {
    let Action::Send { to, frame } = action else {
        panic!("{action:?}")
    };
    let (header, _) = FrameHeader::parse(frame, u32::MAX).unwrap();
    let input = Input::Frame {
        from: header.sender,
        header,
        bytes: frame.clone(),
        transfer: None,
    };
    (*to, input)
}

/// A rejoining peer fetches x in parts from its in-neighbours (each sends half, peer 0
/// none), and a donor serves only slices within its x.
#[test]
fn a_rejoining_peer_fetches_its_x_in_parts_from_its_in_neighbours() {
    let now = Instant::now();
    // Peer 2 of the ring of 4 restarted; its in-neighbours 1 and 3 and peer 0 welcome it.
    let mut c = core(2);
    for from in [0, 1, 3] {
        let welcome = core(from).membership.welcome(2, 30);
        c.welcomes.insert(from, welcome);
    }
    let donors = c.catch_up_donors(&BTreeMap::new(), 1000, 20).unwrap();
    assert_eq!(donors, [1, 3], "peer 0 is no in-neighbour: it serves no x");
    let asks = c
        .begin_catch_up(now, &donors, 0, Duration::from_secs(5))
        .unwrap();
    assert_eq!(kinds(&asks), ["send", "send"]);
    let mut members = [core_at(1, 3.0), core_at(3, 5.0)];
    for ask in &asks {
        let (to, fetch) = sent(ask);
        let donor = &mut members[if to == 1 { 0 } else { 1 }];
        let answer = donor.handle(now, fetch).unwrap();
        assert_eq!(kinds(&answer), ["send"]);
        let (back, part) = sent(&answer[0]);
        assert_eq!(back, 2);
        assert!(c.handle(now, part).unwrap().is_empty());
    }
    assert!(c.caught_up());
    let (mut fetched, summary) = c.finish_catch_up().unwrap().unwrap();
    let x = fetched.take(catch_up::Vector::X).unwrap();
    assert_eq!(x, [3., 3., 3., 3., 5., 5., 5., 5.], "half from each");
    assert_eq!(fetched.take(catch_up::Vector::Optimizer), None);
    let bytes: Vec<u64> = summary.donors.iter().map(|d| d.bytes).collect();
    assert_eq!(bytes, [16, 16]);
    assert_eq!(c.refused_frames, 0);
    // A part that comes after the catch-up is dropped, not refused.
    let (_, fetch) = sent(&asks[0]);
    let late = members[0].handle(now, fetch).unwrap();
    c.handle(now, sent(&late[0]).1).unwrap();
    assert_eq!(c.refused_frames, 0);
    // A request beyond x is refused and counted.
    let beyond = catch_up::Part {
        of: catch_up::Vector::X,
        start: 6,
        len: 4,
    };
    let frame = crate::report::frames::encode_with_params(FrameKind::Fetch, 2, 0, &beyond, &[]);
    let (_, input) = sent(&Action::Send {
        to: 1,
        frame: Bytes::from(frame.unwrap()),
    });
    assert!(members[0].handle(now, input).unwrap().is_empty());
    assert_eq!(members[0].refused_frames, 1);
}

/// A rejoining peer fetches its optimizer's state with x: a donor answers the parts of x at
/// once and those of the state once its shell gave it a copy (between two of its rounds),
/// then from that copy at once until it is idle.
#[test]
fn a_rejoining_peer_fetches_the_optimizer_s_state_from_copies_its_donors_make_between_rounds() {
    let now = Instant::now();
    let mut c = core(2);
    for from in [1, 3] {
        c.welcomes
            .insert(from, core(from).membership.welcome(2, 30));
    }
    let donors = c.catch_up_donors(&BTreeMap::new(), 1000, 20).unwrap();
    // Heavy ball: a velocity of d = 8 values.
    let asks = c
        .begin_catch_up(now, &donors, 8, Duration::from_secs(5))
        .unwrap();
    assert_eq!(asks.len(), 4, "half of x and half of the state from each");
    let mut members = [core_at(1, 3.0), core_at(3, 5.0)];
    let member = |to: Rank| if to == 1 { 0 } else { 1 };
    for ask in &asks {
        let (to, fetch) = sent(ask);
        for answer in members[member(to)].handle(now, fetch).unwrap() {
            assert!(c.handle(now, sent(&answer).1).unwrap().is_empty());
        }
    }
    assert!(
        !c.caught_up(),
        "the state's parts wait for the donors' copies"
    );
    for (m, velocity) in members.iter_mut().zip([30.0, 50.0]) {
        assert!(m.wants_optimizer_state());
        let answers = m.serve_optimizer_state(now, || vec![velocity; 8]).unwrap();
        assert_eq!(kinds(&answers), ["send"]);
        assert!(!m.wants_optimizer_state());
        c.handle(now, sent(&answers[0]).1).unwrap();
    }
    assert!(c.caught_up());
    let (mut fetched, summary) = c.finish_catch_up().unwrap().unwrap();
    assert_eq!(
        fetched.take(catch_up::Vector::X).unwrap(),
        [3., 3., 3., 3., 5., 5., 5., 5.]
    );
    assert_eq!(
        fetched.take(catch_up::Vector::Optimizer).unwrap(),
        [30., 30., 30., 30., 50., 50., 50., 50.]
    );
    let bytes: Vec<u64> = summary.donors.iter().map(|d| d.bytes).collect();
    assert_eq!(bytes, [32, 32]);
    // The copy answers the next request at once; idle for COPY_KEPT, it is dropped.
    let (to, fetch) = sent(&asks[3]);
    assert_eq!(to, 3, "the second part of the state");
    let m = &mut members[member(to)];
    assert_eq!(kinds(&m.handle(now, fetch).unwrap()), ["send"]);
    m.serve_optimizer_state(now + catch_up::COPY_KEPT, || unreachable!("nothing waits"))
        .unwrap();
    let (_, fetch) = sent(&asks[3]);
    assert!(m.handle(now, fetch).unwrap().is_empty());
    assert!(m.wants_optimizer_state(), "a new copy is wanted");
    assert_eq!((c.refused_frames, m.refused_frames), (0, 0));
}

/// A rejoining peer with one present in-neighbour also fetches x from the nearest other
/// present peer, and links to it (saying hello) if it holds no link; with both present it
/// asks nobody else.
#[test]
fn a_peer_with_one_present_in_neighbour_also_fetches_from_the_nearest_other_peer() {
    // Peer 2 of the ring of 4 rejoins while its in-neighbour 3 is gone; 1 welcomes it, and
    // it holds no link to peer 0 yet.
    let mut c = core(2);
    let hello = c
        .hello(&peer_info(2, "127.0.0.1:4302".parse().unwrap(), 11))
        .unwrap();
    c.linked.remove(&0);
    let mut welcome = core(1).membership.welcome(2, 30);
    welcome.departed.push(3);
    c.welcomes.insert(1, welcome);
    let none = BTreeMap::new();
    assert_eq!(c.catch_up_donors(&none, 1000, 20).unwrap(), [1]);
    let out = c.link_catch_up_helpers(&none, 1000, 20).unwrap();
    let [Action::Connect {
        to: 0,
        then: Some(said),
        ..
    }] = &out[..]
    else {
        panic!("{out:?}")
    };
    assert_eq!(said, &hello, "it says hello on the new link");
    c.handle(Instant::now(), Input::Connected { to: 0 })
        .unwrap();
    c.welcomes.insert(0, core(0).membership.welcome(2, 31));
    assert_eq!(c.catch_up_donors(&none, 1000, 20).unwrap(), [0, 1]);
    // Both in-neighbours present: no other peer is asked.
    let mut c = core(2);
    for from in [0, 1, 3] {
        c.welcomes
            .insert(from, core(from).membership.welcome(2, 30));
    }
    assert!(c.link_catch_up_helpers(&none, 1000, 20).unwrap().is_empty());
    assert_eq!(c.catch_up_donors(&none, 1000, 20).unwrap(), [1, 3]);
}

/// A donor that leaves during the catch-up has its part asked of the other at once.
#[test]
fn a_donor_that_leaves_during_the_catch_up_is_replaced_at_once() {
    let now = Instant::now();
    let mut c = core(2);
    for from in [1, 3] {
        c.welcomes
            .insert(from, core(from).membership.welcome(2, 30));
    }
    let donors = c.catch_up_donors(&BTreeMap::new(), 1000, 20).unwrap();
    let asks = c
        .begin_catch_up(now, &donors, 0, Duration::from_secs(5))
        .unwrap();
    assert_eq!(asks.len(), 2);
    c.handle(now, exited(3)).unwrap();
    let again = c.poll_catch_up(now).unwrap();
    let [(1, _)] = again.iter().map(sent).collect::<Vec<_>>()[..] else {
        panic!("{again:?}")
    };
    // Both gone: the rejoin fails with one line instead of a silently half-zero x.
    c.handle(now, exited(1)).unwrap();
    let err = c.poll_catch_up(now).unwrap_err();
    assert!(
        err.to_string().contains("left before it had them all"),
        "{err}"
    );
}
