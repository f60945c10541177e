//! The membership state machine's decisions.

use super::*;
use murmur_gossip::frame::{FrameHeader, FrameKind, FRAME_HEADER_LEN};

use crate::control::discovery::PeerInfo;

const N: usize = 8;

fn now(round: u64) -> Now {
    Now {
        round,
        epoch: 2,
        wall_seconds: 12.5,
    }
}

fn addr() -> SocketAddr {
    "127.0.0.1:5001".parse().unwrap()
}

/// The payload of a frame, after checking its header's kind and sender.
fn payload(frame: &[u8], kind: FrameKind, sender: Rank) -> (u64, &[u8]) {
    let (h, payload) = FrameHeader::parse(frame, 1 << 20).unwrap();
    assert_eq!((h.kind, h.sender), (kind, sender));
    (h.round, payload)
}

#[test]
fn a_departure_is_recorded_once_and_its_notice_is_not_flooded_again() {
    let mut m = Membership::new(2, N);
    let reason = "connection lost: timed out".to_string();
    let d = m.depart((5, 1), reason.clone(), 3, 40, now(42)).unwrap();
    assert_eq!((d.gone, d.noticed_by, d.round, d.before), (5, 3, 42, 1));
    assert_eq!(d.all_gone, vec![5]);
    assert_eq!(
        (
            d.record.event.as_str(),
            d.record.peer,
            d.record.round,
            d.record.epoch
        ),
        ("left", 5, 42, 2)
    );
    assert_eq!(
        (d.record.noticed_by, d.record.reason.as_str()),
        (3, reason.as_str())
    );
    // The notice keeps the round at which it was first noticed, and goes to every link.
    assert!(d.flood.except.is_empty());
    let (round, notice) = payload(&d.flood.frame, FrameKind::Leave, 2);
    assert_eq!(round, 40);
    assert_eq!(decode_leave(notice), Some((5, 1, reason.clone())));
    // The same notice flooded back by a neighbour, or a second lost connection: nothing.
    assert!(matches!(
        m.on_leave(4, 40, notice, now(43)),
        Verdict::Ignore
    ));
    assert!(m.depart((5, 1), reason, 2, 43, now(43)).is_none());
    assert!(m.has_left(5));
    // Another peer's departure counts both.
    let d = m.depart((6, 1), "gone".into(), 2, 50, now(50)).unwrap();
    assert_eq!(d.all_gone, vec![5, 6]);
    assert_eq!(m.departed().len(), 2);
}

#[test]
fn a_notice_about_oneself_is_ignored_and_peer_0_leaves_like_any_peer() {
    let mut m = Membership::new(2, N);
    let about_me = encode_leave(4, 10, (2, 1), "timed out");
    let (_, notice) = payload(&about_me, FrameKind::Leave, 4);
    assert!(matches!(
        m.on_leave(4, 10, notice, now(10)),
        Verdict::Ignore
    ));
    assert_eq!(m.rejoin_notice((2, 9), 30, addr(), 4), None);
    assert!(m.departed().is_empty() && m.rejoined().is_empty());
    // Peer 0 is no exception: its departure is recorded and passed on as any other.
    let d = m
        .depart((0, 1), "timed out".into(), 3, 10, now(11))
        .expect("peer 0 leaves");
    assert_eq!((d.gone, d.all_gone), (0, vec![0]));
    assert!(m.has_left(0));
}

#[test]
fn malformed_leave_and_rejoin_notices_are_refused() {
    let mut m = Membership::new(2, N);
    let outside = encode_leave(4, 10, (N, 1), "?");
    let (_, outside) = payload(&outside, FrameKind::Leave, 4);
    for bad in [outside, &[1, 2, 3]] {
        assert!(matches!(
            m.on_leave(4, 10, bad, now(10)),
            Verdict::Refuse(Refusal::MalformedLeave)
        ));
    }
    assert_eq!(
        m.on_rejoin(4, &[0; 23]),
        Verdict::Refuse(Refusal::MalformedRejoin)
    );
    let outside = encode_rejoin(4, (N, 1), 30, addr());
    let (_, outside) = payload(&outside, FrameKind::Rejoin, 4);
    assert_eq!(
        m.on_rejoin(4, outside),
        Verdict::Refuse(Refusal::MalformedRejoin)
    );
    assert_eq!(
        Refusal::MalformedLeave.to_string(),
        "dropped a malformed departure notice"
    );
    assert!(m.departed().is_empty() && m.rejoined().is_empty());
}

#[test]
fn a_rejoin_notice_restores_a_departed_peer_from_its_round() {
    let mut m = Membership::new(2, N);
    m.depart((5, 1), "timed out".into(), 2, 100, now(100))
        .unwrap();
    m.depart((6, 1), "timed out".into(), 2, 101, now(101))
        .unwrap();
    let frame = encode_rejoin(3, (5, 40), 193, addr());
    let (_, notice) = payload(&frame, FrameKind::Rejoin, 3);
    let Verdict::Accept(n) = m.on_rejoin(3, notice) else {
        panic!("a first rejoin notice is taken");
    };
    assert_eq!(
        (n.back, n.incarnation, n.at, n.addr, n.from),
        (5, 40, 193, addr(), 3)
    );
    assert_eq!(
        n.still_gone,
        vec![6],
        "the algorithm mixes with peer 5 again"
    );
    // Handled once per (peer, round).
    assert_eq!(m.on_rejoin(4, notice), Verdict::Ignore);
    let r = m.readmit(&n);
    assert_eq!((r.new, r.all_taken), (false, false));
    assert!(!m.has_left(5) && m.has_left(6));
    // Passed on, not to the returning peer nor to the notice's sender.
    assert_eq!(r.flood.except, vec![5, 3]);
    let (round, back) = payload(&r.flood.frame, FrameKind::Rejoin, 2);
    assert_eq!(
        (round, decode_rejoin(back)),
        (193, Some((5, 40, 193, addr())))
    );
    let record = Membership::rejoin_record(5, 193, r.new, now(150));
    assert_eq!(
        (
            record.event.as_str(),
            record.peer,
            record.round,
            record.noticed_by
        ),
        ("rejoined", 5, 193, 5)
    );
    assert_eq!(record.reason, "restarted; mixes again from round 193");
    // A departure of its previous processes (incarnations below 40) is old news; one of
    // the process that came back is not.
    assert!(m.depart((5, 40), "late".into(), 4, 150, now(190)).is_none());
    assert!(m
        .depart((5, 41), "again".into(), 4, 200, now(200))
        .is_some());
}

/// A restarted process killed again at once: its rejoin notice still spreads from peers
/// that took it before the launcher's exit notice reached them; a peer that knows the
/// process exited ignores the notice (and does not pass it on), while a newer process's
/// notice is taken.
#[test]
fn a_rejoin_notice_about_a_process_that_exited_is_ignored() {
    let mut m = Membership::new(2, N);
    m.depart((5, 1), "its process exited".into(), 2, 100, now(100))
        .unwrap();
    m.exited(5, 40);
    assert_eq!(m.rejoin_notice((5, 40), 120, addr(), 3), None);
    assert_eq!(m.rejoin_notice((5, 39), 121, addr(), 3), None);
    assert!(m.has_left(5));
    let n = m.rejoin_notice((5, 41), 123, addr(), 3).unwrap();
    assert_eq!((n.back, n.incarnation, n.at), (5, 41, 123));
}

/// The race that made the supervisors wait before restarting a peer: a departure notice
/// caused by the new process's hello reaches a peer before that process's own hello does.
/// The notice names the incarnations that left, so the new process's connections (of its
/// larger incarnation) stay open, and no notice about an old process ever departs the new
/// one.
#[test]
fn a_notice_about_an_old_process_never_departs_the_new_one() {
    let mut m = Membership::new(2, N);
    m.learn_incarnation(4, 100);
    // Peer 3 got the hello of rank 4's new process (incarnation 200) and floods the notice.
    let notice = encode_leave(3, 50, (4, 200), "it restarted: a new process said hello");
    let (_, notice) = payload(&notice, FrameKind::Leave, 3);
    let Verdict::Accept(d) = m.on_leave(3, 50, notice, now(51)) else {
        panic!("the member (incarnation 100) left");
    };
    assert_eq!(
        (d.gone, d.before),
        (4, 200),
        "only links of processes below 200 close"
    );
    // The new process's hello comes after: a known departure, its connections stay.
    let me = PeerInfo {
        rank: 4,
        peer_id: "12D3KooW".into(),
        data_addr: addr(),
        nat_published: None,
        incarnation: 200,
        control: Vec::new(),
    };
    let hello = encode_hello(4, &me).unwrap();
    let (_, hello) = payload(&hello, FrameKind::Hello, 4);
    let Verdict::Accept(h) = m.on_hello(4, hello, now(52)) else {
        panic!("the new process's hello is taken");
    };
    assert!(matches!(h.restart, Restart::KnownDeparted { before: 200 }));
    // It rejoins; a late notice about its old process (a timed-out connection of
    // incarnation 100, or the hello's notice again) is old news.
    let rejoin = encode_rejoin(4, (4, 200), 80, addr());
    let (_, rejoin) = payload(&rejoin, FrameKind::Rejoin, 4);
    let Verdict::Accept(n) = m.on_rejoin(4, rejoin) else {
        panic!("the rejoin is taken");
    };
    m.readmit(&n);
    for before in [101, 200] {
        let late = encode_leave(5, 60, (4, before), "connection from peer 4: timed out");
        let (_, late) = payload(&late, FrameKind::Leave, 5);
        assert!(
            matches!(m.on_leave(5, 60, late, now(90)), Verdict::Ignore),
            "a notice about incarnations below {before} does not depart incarnation 200"
        );
    }
    assert!(!m.has_left(4));
    // The new process dying is noticed as itself.
    assert!(m
        .depart((4, 201), "timed out".into(), 2, 95, now(95))
        .is_some());
}

#[test]
fn a_hello_from_a_member_means_its_old_process_left() {
    let mut m = Membership::new(2, N);
    m.depart((6, 1), "timed out".into(), 2, 10, now(10));
    let me = PeerInfo {
        rank: 4,
        peer_id: "12D3KooW".into(),
        data_addr: addr(),
        nat_published: None,
        incarnation: 30,
        control: Vec::new(),
    };
    m.learn_incarnation(4, 20);
    let hello = encode_hello(4, &me).unwrap();
    let (_, hello) = payload(&hello, FrameKind::Hello, 4);
    let Verdict::Accept(h) = m.on_hello(4, hello, now(77)) else {
        panic!("a well-formed hello is taken");
    };
    assert_eq!((h.from, h.addr), (4, addr()));
    let Restart::Departed(d) = h.restart else {
        panic!("a member's hello is its old process's departure");
    };
    assert_eq!(
        (d.gone, d.noticed_by, d.round, d.before),
        (4, 2, 77, 30),
        "the processes before the new one left"
    );
    assert_eq!(d.reason, "it restarted: a new process said hello");
    // The welcome names the departed peers but the hello's sender.
    let w = m.welcome(4, 78);
    assert_eq!((w.round, w.departed), (78, vec![6]));
    // A second hello of the same process only closes its older connections.
    let Verdict::Accept(h) = m.on_hello(4, hello, now(78)) else {
        panic!("a well-formed hello is taken");
    };
    assert!(matches!(h.restart, Restart::KnownDeparted { before: 30 }));
    // A hello of a process older than the newest known is ignored.
    let old = encode_hello(
        4,
        &PeerInfo {
            incarnation: 25,
            control: Vec::new(),
            ..me
        },
    )
    .unwrap();
    let (_, old) = payload(&old, FrameKind::Hello, 4);
    assert!(matches!(m.on_hello(4, old, now(79)), Verdict::Ignore));
    // Malformed, or claiming another rank than its sender's.
    for (from, bad) in [(3, hello), (4, &b"{"[..])] {
        assert!(matches!(
            m.on_hello(from, bad, now(78)),
            Verdict::Refuse(Refusal::MalformedHello)
        ));
    }
}

/// A joiner fetches x from its present in-neighbours that welcomed it, so that peer 0 (to
/// which every joiner says hello) does not serve every joiner; without any, from every peer
/// that welcomed it; a peer that is rejoining itself only if no other can.
#[test]
fn a_joiner_fetches_x_from_its_in_neighbours_unless_none_is_present() {
    let plan = |welcomed: Vec<Rank>| RejoinPlan {
        at: 30,
        collects_only: false,
        departed: BTreeSet::new(),
        welcomed,
        rejoined: BTreeMap::new(),
        locations: BTreeMap::new(),
    };
    let none = BTreeSet::new();
    // Rank 4 of the ring of 8: its in-neighbours are 3 and 5; peer 0 welcomed it too.
    assert_eq!(plan(vec![0, 3, 5]).donors(&[3, 5], &none), [3, 5]);
    // 5 departed (it sent no welcome): 3 alone.
    assert_eq!(plan(vec![0, 3]).donors(&[3, 5], &none), [3]);
    // With 3 and 5 empty ranks (an elastic run): whoever welcomed it.
    assert_eq!(plan(vec![0, 6]).donors(&[3, 5], &none), [0, 6]);
    // 3 restarted at the same time (its hello came here): its x is not caught up yet.
    let restarting = BTreeSet::from([3]);
    assert_eq!(plan(vec![0, 3, 5]).donors(&[3, 5], &restarting), [5]);
    assert_eq!(
        plan(vec![0, 3]).donors(&[3, 5], &restarting),
        [3],
        "no other"
    );
    assert!(plan(vec![]).donors(&[3, 5], &none).is_empty());
}

/// An admission signed by `key` as the member of rank `signer`.
fn signed_by(
    key: &libp2p::identity::Keypair,
    signer: Rank,
    rank: Rank,
    id: &libp2p::PeerId,
) -> Signed {
    Signed {
        signer,
        signature: key.sign(&admit_message(rank, signer, id)).unwrap(),
    }
}

#[test]
fn an_admission_holds_only_for_an_empty_rank_with_its_signer_s_signature() {
    let peer0 = libp2p::identity::Keypair::generate_ed25519();
    let member = libp2p::identity::Keypair::generate_ed25519();
    let new = libp2p::PeerId::random();
    let mut peer_ids: Vec<Option<libp2p::PeerId>> =
        (0..N).map(|_| Some(libp2p::PeerId::random())).collect();
    peer_ids[0] = Some(peer0.public().to_peer_id());
    peer_ids[1] = Some(member.public().to_peer_id());
    peer_ids[3] = None;
    let mut m = Membership::new(2, N);
    let records = m.start_empty(&[3]);
    assert_eq!(records.len(), 1);
    assert_eq!(
        (
            records[0].event.as_str(),
            records[0].peer,
            records[0].round,
            records[0].noticed_by
        ),
        ("empty", 3, 0, 2)
    );
    // Peer 0's admission, and that of member 1 (which admits while peer 0 is away).
    for (key, signer) in [(&peer0, 0), (&member, 1)] {
        let signed = signed_by(key, signer, 3, &new);
        let frame = encode_admit(4, 3, new, &signed);
        let (_, notice) = payload(&frame, FrameKind::Admit, 4);
        let Verdict::Accept(a) = m.on_admit(4, notice, &peer_ids, None).unwrap() else {
            panic!("member {signer}'s admission to an empty rank holds");
        };
        assert_eq!(
            (a.rank, a.id, a.flood.except.as_slice()),
            (3, new, &[4][..])
        );
        let (_, passed) = payload(&a.flood.frame, FrameKind::Admit, 2);
        assert_eq!(decode_admit(passed), Some((3, new, signed)));
    }
    // Forged: member 1's signature in peer 0's name, a stranger's in member 1's, a
    // signature of another rank's admission, none, a signer without an identity here, the
    // admitted rank as its own signer, a signer outside the run.
    let stranger = libp2p::identity::Keypair::generate_ed25519();
    let mut as_peer0 = signed_by(&member, 1, 3, &new);
    as_peer0.signer = 0;
    let unknown_signer = {
        let mut ids = peer_ids.clone();
        ids[1] = None;
        ids
    };
    let forged = [
        (as_peer0, &peer_ids),
        (signed_by(&stranger, 1, 3, &new), &peer_ids),
        (
            Signed {
                signer: 0,
                signature: peer0.sign(&admit_message(4, 0, &new)).unwrap(),
            },
            &peer_ids,
        ),
        (
            Signed {
                signer: 0,
                signature: Vec::new(),
            },
            &peer_ids,
        ),
        (signed_by(&member, 1, 3, &new), &unknown_signer),
        (signed_by(&member, 3, 3, &new), &peer_ids),
        (signed_by(&member, N, 3, &new), &peer_ids),
    ];
    for (signed, ids) in forged {
        assert_eq!(
            m.admit(3, new, Some(signed.clone()), 4, ids, None).unwrap(),
            Verdict::Refuse(Refusal::Unsigned { rank: 3 }),
            "{signed:?}"
        );
    }
    // A rank that is taken, or the peer's own.
    for rank in [5, 2] {
        let signed = signed_by(&peer0, 0, rank, &new);
        assert_eq!(
            m.admit(rank, new, Some(signed), 4, &peer_ids, None)
                .unwrap(),
            Verdict::Refuse(Refusal::NotEmpty { rank })
        );
    }
    assert_eq!(
        Refusal::NotEmpty { rank: 5 }.to_string(),
        "dropped an admission for rank 5, which is not an empty rank here"
    );
    // Already known with that identity: nothing to do. Known with another (two members
    // admitted at once): the first heard of holds.
    let mut known = peer_ids.clone();
    known[3] = Some(new);
    let signed = signed_by(&peer0, 0, 3, &new);
    assert_eq!(
        m.admit(3, new, Some(signed), 4, &known, None).unwrap(),
        Verdict::Ignore
    );
    let other = libp2p::PeerId::random();
    assert_eq!(
        m.admit(
            3,
            other,
            Some(signed_by(&member, 1, 3, &other)),
            4,
            &known,
            None
        )
        .unwrap(),
        Verdict::Refuse(Refusal::Conflict { rank: 3 })
    );
    // Malformed, or for a rank outside the run.
    let frame = encode_admit(4, 3, new, &signed_by(&peer0, 0, 3, &new));
    let (_, notice) = payload(&frame, FrameKind::Admit, 4);
    assert_eq!(
        m.on_admit(4, &notice[..17], &peer_ids, None).unwrap(),
        Verdict::Refuse(Refusal::MalformedAdmit)
    );
    let outside = encode_admit(4, N, new, &signed_by(&peer0, 0, N, &new));
    assert_eq!(
        m.on_admit(4, &outside[FRAME_HEADER_LEN..], &peer_ids, None)
            .unwrap(),
        Verdict::Refuse(Refusal::MalformedAdmit)
    );
}

#[test]
fn the_admitting_member_signs_the_admissions_it_tells_in_its_own_name() {
    let member = libp2p::identity::Keypair::generate_ed25519();
    let new = libp2p::PeerId::random();
    let mut peer_ids: Vec<Option<libp2p::PeerId>> = vec![None; N];
    peer_ids[2] = Some(member.public().to_peer_id());
    let mut m = Membership::new(2, N);
    m.start_empty(&[6]);
    let Verdict::Accept(a) = m.admit(6, new, None, 2, &peer_ids, Some(&member)).unwrap() else {
        panic!("a member admits to an empty rank");
    };
    let (_, passed) = payload(&a.flood.frame, FrameKind::Admit, 2);
    let (rank, id, signed) = decode_admit(passed).unwrap();
    assert_eq!(signed.signer, 2);
    let key = auth::public_key(&member.public().to_peer_id()).unwrap();
    assert!(key.verify(&admit_message(rank, 2, &id), &signed.signature));
    assert_eq!(a.flood.except, vec![2]);
}

#[test]
fn the_lowest_live_rank_skips_departed_and_empty_ranks() {
    let mut m = Membership::new(3, N);
    assert_eq!(m.lowest_live(), 0);
    m.start_empty(&[1]);
    m.depart((0, 10), "timed out".into(), 2, 5, now(5)).unwrap();
    assert_eq!(m.lowest_live(), 2);
    m.depart((2, 10), "timed out".into(), 4, 6, now(6)).unwrap();
    assert_eq!(
        m.lowest_live(),
        3,
        "this peer, when every lower rank is away"
    );
}

#[test]
fn new_peers_taking_every_empty_rank_close_the_admission() {
    let mut m = Membership::new(0, N);
    m.start_empty(&[6, 7]);
    let n6 = m.rejoin_notice((6, 1), 30, addr(), 6).unwrap();
    assert_eq!(n6.still_gone, vec![7]);
    assert!(m.readmit(&n6).new);
    let n7 = m.rejoin_notice((7, 1), 32, addr(), 6).unwrap();
    let r = m.readmit(&n7);
    assert_eq!((r.new, r.all_taken), (true, true));
    let record = Membership::rejoin_record(7, 32, r.new, now(31));
    assert_eq!(
        (record.event.as_str(), record.reason.as_str()),
        ("joined", "a new peer; mixes from round 32")
    );
}

#[test]
fn a_restarted_peer_rejoins_from_the_welcomes() {
    let mut m = Membership::new(2, N);
    m.start_empty(&[7]);
    let welcome = |round, departed: Vec<Rank>, rejoined: Vec<(Rank, u64)>| Welcome {
        round,
        departed,
        rejoined,
        locations: Vec::new(),
        record: Vec::new(),
    };
    let welcomes: BTreeMap<Rank, _> = [
        (1, welcome(100, vec![6, 7], vec![(4, 60), (6, 30)])),
        (3, welcome(120, vec![2], vec![(4, 90), (2, 10), (5, 70)])),
        (6, welcome(90, vec![], vec![])),
    ]
    .into_iter()
    .collect();
    let plan = m.plan_rejoin(&welcomes, [6], 1000, 20, |r| r).unwrap();
    assert_eq!(plan.at, 140, "the highest welcome round plus the margin");
    // Moved on to a round that exchanges frames (DiLoCo with H = 16: an outer step).
    let outer_step = |r: u64| (r + 1).div_ceil(16) * 16 - 1;
    let aligned = m.plan_rejoin(&welcomes, [6], 1000, 20, outer_step).unwrap();
    assert_eq!(aligned.at, 143);
    // And the run's end is checked against the aligned round: 140 would fit in 142 rounds.
    assert_eq!(
        m.plan_rejoin(&welcomes, [6], 142, 20, outer_step),
        Err(RejoinError::TooLate {
            total_rounds: 142,
            at: 143
        })
    );
    assert_eq!(
        plan.departed,
        BTreeSet::from([6, 7]),
        "this peer is not among them"
    );
    assert_eq!(plan.welcomed, vec![1, 3]);
    assert_eq!(
        plan.rejoined,
        BTreeMap::from([(4, 90), (5, 70)]),
        "the latest rejoin of each peer, not this one's nor a departed one's"
    );
    assert_eq!(
        m.plan_rejoin(&welcomes, [4, 6], 1000, 20, |r| r),
        Err(RejoinError::Unreachable(4))
    );
    // Unless this peer knows itself that 4's process left (its supervisor saw it exit):
    // restarted at the same moment, 4 comes back through its own rejoin.
    let now = Now {
        round: 0,
        epoch: 0,
        wall_seconds: 0.0,
    };
    assert!(m.depart((4, 1), "exited".into(), 2, 0, now).is_some());
    let plan4 = m.plan_rejoin(&welcomes, [4, 6], 1000, 20, |r| r).unwrap();
    assert_eq!(plan4.at, 140);
    // A peer whose rejoin this one heard while rejoining is back, whatever earlier welcomes
    // said (6 was departed for peer 1's).
    assert!(m.rejoin_notice((6, 9), 130, addr(), 3).is_some());
    let plan6 = m.plan_rejoin(&welcomes, [6], 1000, 20, |r| r).unwrap();
    assert_eq!(plan6.departed, BTreeSet::from([7]));
    assert_eq!(
        m.plan_rejoin(&welcomes, [], 140, 20, |r| r),
        Err(RejoinError::TooLate {
            total_rounds: 140,
            at: 140
        })
    );
    assert!(!plan.collects_only);
    // Peer 0 that late still takes up the record: it only collects, from no round.
    let late = Membership::new(0, N)
        .plan_rejoin(&welcomes, [], 140, 20, |r| r)
        .unwrap();
    assert_eq!((late.at, late.collects_only), (140, true));
    for &g in &plan.departed {
        m.gone_before_rejoin(g, plan.at);
    }
    let flood = m.rejoining(55, plan.at, addr());
    let (round, notice) = payload(&flood.frame, FrameKind::Rejoin, 2);
    assert_eq!(
        (round, decode_rejoin(notice)),
        (140, Some((2, 55, 140, addr())))
    );
    assert!(flood.except.is_empty());
    // Waits for every in-neighbour's frame of round 140 but the departed peers' and those
    // that join later.
    m.rejoin_notice((5, 1), 150, addr(), 1).unwrap();
    let arrived: HashSet<Rank> = [1].into_iter().collect();
    assert!(!m.ready_to_mix(140, &[1, 3, 5, 6], &arrived));
    let arrived: HashSet<Rank> = [1, 3].into_iter().collect();
    assert!(m.ready_to_mix(140, &[1, 3, 5, 6], &arrived));
    // Nor for a neighbour restarted with this peer that mixes again from the same round: it
    // waits for this peer's frame as this peer would for its.
    m.rejoin_notice((3, 2), 140, addr(), 1).unwrap();
    assert!(!m.ready_to_mix(140, &[1, 3], &HashSet::new()));
    let arrived: HashSet<Rank> = [1].into_iter().collect();
    assert!(m.ready_to_mix(140, &[1, 3, 5, 6], &arrived));
    assert_eq!(m.departed()[&6].event, "left");
    assert_eq!(
        (m.departed()[&6].round, m.departed()[&6].reason.as_str()),
        (140, "gone when this peer rejoined")
    );
    assert_eq!(m.departed()[&7].event, "empty", "an empty rank stays empty");
    assert!(m.rejoined().contains(&(2, 140)));
}
