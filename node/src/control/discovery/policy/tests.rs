//! Unit tests of discovery's policy: real decisions on small directories.

use super::*;
use std::io::Write;

fn fingerprint(peers: usize) -> Fingerprint {
    Fingerprint::example(peers)
}

fn info(rank: Rank, id: PeerId) -> PeerInfo {
    PeerInfo {
        rank,
        peer_id: id.to_string(),
        data_addr: "127.0.0.1:1".parse().unwrap(),
        nat_published: None,
        incarnation: 0,
        control: Vec::new(),
    }
}

/// A restarted peer's request (`rejoin`) for a run of 4 peers.
fn request(rank: Rank, id: PeerId, any_rank: bool) -> JoinRequest {
    JoinRequest {
        info: info(rank, id),
        fingerprint: fingerprint(4),
        rejoin: true,
        checkpoint_rounds: Vec::new(),
        any_rank,
        proof: None,
        wire: murmur_gossip::frame::FRAME_VERSION,
    }
}

/// A request at the start of a run of 4 peers (not a rejoin).
fn fresh(rank: Rank, id: PeerId, any_rank: bool) -> JoinRequest {
    JoinRequest {
        rejoin: false,
        ..request(rank, id, any_rank)
    }
}

/// A run key read from a file, as `--run-key` does.
fn run_key(byte: u8) -> RunKey {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(&[byte; 32]).unwrap();
    RunKey::read(file.path()).unwrap()
}

/// The PeerIds of a directory, by rank.
fn peer_ids(dir: &[Option<PeerInfo>]) -> Vec<Option<String>> {
    dir.iter()
        .map(|p| p.as_ref().map(|p| p.peer_id.clone()))
        .collect()
}

fn refusal_text(answer: &JoinResponse) -> &str {
    match answer {
        JoinResponse::Refused(why) => why,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn the_allow_list_admits_only_its_peers_and_restarted_ones() {
    let (local, listed, other) = (PeerId::random(), PeerId::random(), PeerId::random());
    let gate = Gate {
        allow: Some([listed].into_iter().collect()),
        key: None,
    };
    assert_eq!(gate.refusal(&local, &listed, None, true), None);
    let why = gate.refusal(&local, &other, None, true).unwrap();
    assert!(
        why.contains("allow-list") && why.contains(&other.to_string()),
        "{why}"
    );
    // A restarted peer was admitted before: the allow-list is not asked again.
    assert_eq!(gate.refusal(&local, &other, None, false), None);
    assert_eq!(Gate::default().refusal(&local, &other, None, true), None);
    assert_eq!(gate.answer(&local, &listed), None, "no key, no tag");
}

#[test]
fn the_run_key_admits_only_a_peer_that_proves_it_to_this_bootstrap() {
    let (local, peer) = (PeerId::random(), PeerId::random());
    let gate = Gate {
        allow: None,
        key: Some(run_key(7)),
    };
    let key = gate.key.as_ref().unwrap();
    let proof = key.tag("join", &peer, &local);
    assert_eq!(gate.refusal(&local, &peer, Some(&proof), true), None);
    // Restarted or new, a peer must prove the key.
    assert_eq!(gate.refusal(&local, &peer, Some(&proof), false), None);
    let why = gate.refusal(&local, &peer, None, false).unwrap();
    assert!(why.contains("did not prove the run key"), "{why}");
    // A tag for another bootstrap, or made with another run's key.
    let elsewhere = key.tag("join", &peer, &PeerId::random());
    assert!(gate
        .refusal(&local, &peer, Some(&elsewhere), true)
        .is_some());
    let foreign = run_key(8).tag("join", &peer, &local);
    assert!(gate.refusal(&local, &peer, Some(&foreign), true).is_some());
    // The bootstrap's own tag proves the key back to this joiner.
    let answer = gate.answer(&local, &peer);
    assert!(key.verify(answer.as_deref(), "answer", &local, &peer));
}

#[test]
fn the_free_rank_is_the_lowest_empty_one_after_0() {
    let ids: Vec<PeerId> = (0..4).map(|_| PeerId::random()).collect();
    let dir = vec![Some(info(0, ids[0])), None, Some(info(2, ids[2])), None];
    assert_eq!(free_rank(&dir), Some(1));
    let dir = vec![None, Some(info(1, ids[1])), None];
    assert_eq!(free_rank(&dir), Some(2), "rank 0 is never free");
    let full: Vec<_> = (0..4).map(|r| Some(info(r, ids[r]))).collect();
    assert_eq!(free_rank(&full), None);
    assert_eq!(free_rank(&[]), None);
}

#[test]
fn only_a_rank_nobody_holds_is_an_empty_rank() {
    let ids: Vec<PeerId> = (0..4).map(|_| PeerId::random()).collect();
    let dir = vec![Some(info(0, ids[0])), None, Some(info(2, ids[2])), None];
    assert!(takes_empty_rank(&dir, &request(1, ids[1], false)));
    assert!(!takes_empty_rank(&dir, &request(2, ids[2], false)));
    assert!(
        !takes_empty_rank(&dir, &request(9, ids[1], false)),
        "out of range"
    );
    assert!(
        takes_empty_rank(&dir, &request(2, ids[1], true)),
        "any rank"
    );
}

#[test]
fn the_common_round_is_the_latest_every_peer_holds() {
    assert_eq!(
        common_round(&[vec![1, 2, 3], vec![2, 3], vec![3, 2, 5]]),
        Some(3)
    );
    assert_eq!(common_round(&[vec![4, 7]]), Some(7));
    assert_eq!(common_round(&[vec![1], vec![2]]), None);
    assert_eq!(common_round(&[vec![1, 2], vec![]]), None);
    assert_eq!(common_round(&[]), None);
}

#[test]
fn an_initial_peer_takes_the_rank_it_asks_or_the_lowest_free_one() {
    let ids: Vec<PeerId> = (0..6).map(|_| PeerId::random()).collect();
    let fp = fingerprint(4);
    let gate = Gate::default();
    let local = ids[0];
    let mut slots = vec![Some(info(0, local)), None, None, None];
    // Its identity is the one libp2p authenticated, not the one it wrote.
    let mut asks = fresh(2, ids[5], false);
    asks.info.peer_id = "whatever".into();
    let taken = admit_initial(&slots, &fp, &gate, (&local, &ids[2]), &asks, false).unwrap();
    assert_eq!((taken.rank, taken.peer_id.clone()), (2, ids[2].to_string()));
    slots[2] = Some(taken);
    let any = fresh(0, ids[1], true);
    let taken = admit_initial(&slots, &fp, &gate, (&local, &ids[1]), &any, false).unwrap();
    assert_eq!(taken.rank, 1);
    slots[1] = Some(taken);
    let why = admit_initial(
        &slots,
        &fp,
        &gate,
        (&local, &ids[3]),
        &fresh(2, ids[3], false),
        false,
    )
    .unwrap_err();
    assert_eq!(why, "rank 2 has already joined");
    let why = admit_initial(
        &slots,
        &fp,
        &gate,
        (&local, &ids[3]),
        &fresh(4, ids[3], false),
        false,
    )
    .unwrap_err();
    assert_eq!(why, "rank 4 out of range for 4 peers");
    slots[3] = Some(info(3, ids[3]));
    let why = admit_initial(
        &slots,
        &fp,
        &gate,
        (&local, &ids[4]),
        &fresh(0, ids[4], true),
        false,
    )
    .unwrap_err();
    assert_eq!(why, "all 4 ranks have joined");
}

#[test]
fn an_initial_peer_is_refused_for_its_options_its_resume_or_the_gate() {
    let ids: Vec<PeerId> = (0..3).map(|_| PeerId::random()).collect();
    let fp = fingerprint(4);
    let local = ids[0];
    let slots = vec![Some(info(0, local)), None, None, None];
    let open = Gate::default();
    let peer = (&local, &ids[1]);
    let mut other = fresh(1, ids[1], false);
    other.fingerprint.model = "cnn".into();
    let why = admit_initial(&slots, &fp, &open, peer, &other, false).unwrap_err();
    assert!(why.starts_with("run options differ: "), "{why}");
    assert!(
        why.contains("model: peer 1 has \"cnn\", peer 0 has \"mlp\""),
        "{why}"
    );
    let why =
        admit_initial(&slots, &fp, &open, peer, &request(1, ids[1], false), false).unwrap_err();
    assert!(why.contains("start this peer without --resume"), "{why}");
    // A build of another frame protocol (0: one from before the field): refused at the
    // door, both versions named.
    let mut old_build = fresh(1, ids[1], false);
    old_build.wire = 0;
    let why = admit_initial(&slots, &fp, &open, peer, &old_build, false).unwrap_err();
    let expected =
        format!("peer 1 speaks frame protocol version 0, this peer version {FRAME_VERSION}");
    assert!(why.starts_with(&expected), "{why}");
    let why = admit_initial(&slots, &fp, &open, peer, &fresh(1, ids[1], false), true).unwrap_err();
    assert!(why.contains("start this peer with --resume"), "{why}");
    assert!(admit_initial(&slots, &fp, &open, peer, &request(1, ids[1], false), true).is_ok());
    // The gate is asked first, of every initial peer.
    let closed = Gate {
        allow: Some([ids[2]].into_iter().collect()),
        key: None,
    };
    let why = admit_initial(&slots, &fp, &closed, peer, &other, false).unwrap_err();
    assert!(why.contains("allow-list"), "{why}");
}

#[test]
fn the_initial_set_is_complete_with_initial_ranks_taken() {
    let ids: Vec<PeerId> = (0..4).map(|_| PeerId::random()).collect();
    let slots = vec![Some(info(0, ids[0])), None, Some(info(2, ids[2])), None];
    assert!(initial_complete(&slots, 1));
    assert!(initial_complete(&slots, 2));
    assert!(!initial_complete(&slots, 3));
    assert!(!initial_complete(&slots, 4));
}

#[test]
fn a_whole_run_resumes_from_the_latest_round_its_initial_peers_share() {
    let ids: Vec<PeerId> = (0..3).map(|_| PeerId::random()).collect();
    let slots = vec![Some(info(0, ids[0])), Some(info(1, ids[1])), None];
    // Rank 2 has not joined: its rounds do not count.
    let rounds = vec![vec![10, 20, 30], vec![20, 30], vec![]];
    assert_eq!(resume_round(false, &rounds, &slots), Ok(None));
    assert_eq!(resume_round(true, &rounds, &slots), Ok(Some(30)));
    let apart = vec![vec![10], vec![5], vec![]];
    let why = resume_round(true, &apart, &slots).unwrap_err();
    assert_eq!(why, no_common_round(&apart));
    assert!(why.contains("no checkpoint of a common round"), "{why}");
    assert!(
        why.contains("peer 0 has [10]") && why.contains("peer 1 has [5]"),
        "{why}"
    );
}

#[test]
fn the_initial_answer_is_the_directory_or_the_resume() {
    let ids: Vec<PeerId> = (0..2).map(|_| PeerId::random()).collect();
    let dir = vec![Some(info(0, ids[0])), Some(info(1, ids[1]))];
    match initial_answer(&dir, None, Some("tag".into())) {
        JoinResponse::Directory { directory, proof } => {
            assert_eq!(peer_ids(&directory), peer_ids(&dir));
            assert_eq!(proof.as_deref(), Some("tag"));
        }
        other => panic!("expected the directory, got {other:?}"),
    }
    match initial_answer(&dir, Some(40), None) {
        JoinResponse::Resume {
            directory,
            round,
            proof,
        } => {
            assert_eq!(
                (peer_ids(&directory), round, proof),
                (peer_ids(&dir), 40, None)
            );
        }
        other => panic!("expected a resume, got {other:?}"),
    }
}

#[test]
fn a_peer_without_a_rank_takes_the_lowest_empty_one_until_none_is_left() {
    let ids: Vec<PeerId> = (0..4).map(|_| PeerId::random()).collect();
    // Ranks 1 and 3 are empty.
    let mut dir = vec![Some(info(0, ids[0])), None, Some(info(2, ids[2])), None];
    let fp = fingerprint(4);
    let gate = Gate::default();
    let local = ids[0];
    let restarted = request(2, ids[2], false);
    assert!(
        !takes_empty_rank(&dir, &restarted),
        "a restart takes no empty rank"
    );
    let new = request(0, ids[1], true);
    assert!(takes_empty_rank(&dir, &new));
    let late = admit_rejoin(&mut dir, &fp, &gate, (&local, &ids[1]), new, 1);
    assert!(matches!(&late, Late::Joined(i) if i.rank == 1 && i.peer_id == ids[1].to_string()));
    let answer = late_answer(&dir, &late, &gate, (&local, &ids[1]));
    assert!(matches!(answer, JoinResponse::Directory { .. }));
    let late = admit_rejoin(
        &mut dir,
        &fp,
        &gate,
        (&local, &ids[3]),
        request(0, ids[3], true),
        1,
    );
    assert!(matches!(&late, Late::Joined(i) if i.rank == 3));
    assert_eq!(free_rank(&dir), None);
    let full = peer_ids(&dir);
    let latecomer = PeerId::random();
    let late = admit_rejoin(
        &mut dir,
        &fp,
        &gate,
        (&local, &latecomer),
        request(0, latecomer, true),
        1,
    );
    let answer = late_answer(&dir, &late, &gate, (&local, &latecomer));
    assert!(refusal_text(&answer).contains("no empty rank"));
    assert_eq!(
        peer_ids(&dir),
        full,
        "a refusal leaves the directory as it was"
    );
    // The restarted peer keeps its rank and is no new peer.
    let late = admit_rejoin(&mut dir, &fp, &gate, (&local, &ids[2]), restarted, 1);
    assert!(matches!(late, Late::Rejoined(2)));
}

#[test]
fn a_restarted_peer_gets_its_rank_back_only_with_its_identity_and_options() {
    let ids: Vec<PeerId> = (0..4).map(|_| PeerId::random()).collect();
    let mut dir: Vec<_> = (0..4).map(|r| Some(info(r, ids[r]))).collect();
    let fp = fingerprint(4);
    let gate = Gate::default();
    let local = ids[0];
    let refused =
        |dir: &mut Vec<Option<PeerInfo>>, peer: PeerId, req: JoinRequest| match admit_rejoin(
            dir,
            &fp,
            &gate,
            (&local, &peer),
            req,
            1,
        ) {
            Late::Refused(why) => why,
            other => panic!("expected a refusal, got {other:?}"),
        };
    let mut old_build = request(1, ids[1], false);
    old_build.wire = FRAME_VERSION + 1;
    let why = refused(&mut dir, ids[1], old_build);
    assert!(
        why.contains("every peer of a run must run the same murmur release"),
        "{why}"
    );
    let mut other = request(1, ids[1], false);
    other.fingerprint.epochs = 3;
    let why = refused(&mut dir, ids[1], other);
    assert!(
        why.contains("run options differ") && why.contains("epochs"),
        "{why}"
    );
    let why = refused(&mut dir, ids[0], request(0, ids[0], false));
    assert_eq!(
        why,
        "rank 0 cannot rejoin through this node (ranks 1..4 can)"
    );
    let why = refused(&mut dir, ids[1], request(7, ids[1], false));
    assert_eq!(
        why,
        "rank 7 cannot rejoin through this node (ranks 1..4 can)"
    );
    let why = refused(&mut dir, ids[1], fresh(1, ids[1], false));
    assert!(
        why.contains("already under way") && why.contains("--join-running"),
        "{why}"
    );
    let impostor = PeerId::random();
    let why = refused(&mut dir, impostor, request(1, impostor, false));
    assert!(
        why.contains(&format!("rank 1 is peer {}, not {impostor}", ids[1])),
        "{why}"
    );
    // The genuine peer, restarted at another data-plane address.
    let mut back = request(1, ids[1], false);
    back.info.data_addr = "10.0.0.9:7000".parse().unwrap();
    let late = admit_rejoin(&mut dir, &fp, &gate, (&local, &ids[1]), back, 1);
    assert!(matches!(late, Late::Rejoined(1)));
    assert_eq!(
        dir[1].as_ref().unwrap().data_addr.to_string(),
        "10.0.0.9:7000"
    );
}

#[test]
fn a_late_new_peer_must_be_on_the_allow_list_a_restarted_one_need_not() {
    let ids: Vec<PeerId> = (0..3).map(|_| PeerId::random()).collect();
    let mut dir = vec![Some(info(0, ids[0])), Some(info(1, ids[1])), None];
    let fp = fingerprint(3);
    let gate = Gate {
        allow: Some([ids[0]].into_iter().collect()),
        key: None,
    };
    let local = ids[0];
    let mut req = request(2, ids[2], false);
    req.fingerprint = fp.clone();
    let late = admit_rejoin(&mut dir, &fp, &gate, (&local, &ids[2]), req, 1);
    assert!(
        matches!(&late, Late::Refused(why) if why.contains("allow-list")),
        "{late:?}"
    );
    assert!(dir[2].is_none());
    let mut req = request(1, ids[1], false);
    req.fingerprint = fp.clone();
    let late = admit_rejoin(&mut dir, &fp, &gate, (&local, &ids[1]), req, 1);
    assert!(matches!(late, Late::Rejoined(1)));
}

#[test]
fn a_late_answer_carries_the_updated_directory_and_the_bootstrap_tag() {
    let ids: Vec<PeerId> = (0..2).map(|_| PeerId::random()).collect();
    let dir = vec![Some(info(0, ids[0])), Some(info(1, ids[1]))];
    let gate = Gate {
        allow: None,
        key: Some(run_key(3)),
    };
    let pair = (&ids[0], &ids[1]);
    let joined = Late::Joined(info(1, ids[1]));
    match late_answer(&dir, &joined, &gate, pair) {
        JoinResponse::Directory { directory, proof } => {
            assert_eq!(peer_ids(&directory), peer_ids(&dir));
            let key = gate.key.as_ref().unwrap();
            assert!(key.verify(proof.as_deref(), "answer", &ids[0], &ids[1]));
        }
        other => panic!("expected the directory, got {other:?}"),
    }
    let refused = Late::Refused("why not".into());
    assert_eq!(
        refusal_text(&late_answer(&dir, &refused, &gate, pair)),
        "why not"
    );
}

#[test]
fn a_member_that_is_not_the_bootstrap_names_it_or_nobody() {
    let boot = PeerId::random();
    assert!(matches!(
        not_bootstrap(Some(boot)),
        JoinResponse::NotBootstrap { bootstrap: Some(b) } if b == boot.to_string()
    ));
    assert!(matches!(
        not_bootstrap(None),
        JoinResponse::NotBootstrap { bootstrap: None }
    ));
}

#[test]
fn a_joining_peer_finds_its_rank_only_in_a_well_formed_directory() {
    let ids: Vec<PeerId> = (0..3).map(|_| PeerId::random()).collect();
    let dir = vec![Some(info(0, ids[0])), None, Some(info(2, ids[2]))];
    assert_eq!(my_rank(&dir, 3, &ids[2]), Ok(2));
    let why = my_rank(&dir, 4, &ids[2]).unwrap_err();
    assert!(
        why.contains("malformed directory (3 entries for 4 peers)"),
        "{why}"
    );
    let misplaced = vec![Some(info(0, ids[0])), Some(info(2, ids[2])), None];
    assert!(my_rank(&misplaced, 3, &ids[2])
        .unwrap_err()
        .contains("malformed"));
    let why = my_rank(&dir, 3, &ids[1]).unwrap_err();
    assert!(why.contains("no entry for this peer") && why.contains(&ids[1].to_string()));
}

#[test]
fn a_joining_peer_reads_each_answer() {
    let (me, boot) = (PeerId::random(), PeerId::random());
    let dir = vec![Some(info(0, boot)), Some(info(1, me))];
    let open = Gate::default();
    let pair = (&me, &boot);
    let directory = |proof: Option<String>| JoinResponse::Directory {
        directory: dir.clone(),
        proof,
    };
    let read = read_answer(directory(None), pair, 2, &open, false);
    assert!(matches!(&read, Reading::Joined(d)
        if d.rank == 1 && d.resume_round.is_none() && d.answered_by.is_none()));
    // Answered by a member (rank 1) of a run of 3: the new peer knows which.
    let (new, member) = (PeerId::random(), PeerId::random());
    let three = JoinResponse::Directory {
        directory: vec![
            Some(info(0, boot)),
            Some(info(1, member)),
            Some(info(2, new)),
        ],
        proof: None,
    };
    let read = read_answer(three, (&new, &member), 3, &open, false);
    assert!(matches!(&read, Reading::Joined(d) if d.rank == 2 && d.answered_by == Some(1)));
    let resume = JoinResponse::Resume {
        directory: dir.clone(),
        round: 12,
        proof: None,
    };
    let read = read_answer(resume, pair, 2, &open, false);
    assert!(matches!(&read, Reading::Joined(d) if d.resume_round == Some(12)));
    let read = read_answer(not_bootstrap(Some(boot)), pair, 2, &open, false);
    assert!(matches!(read, Reading::Member(b) if b == boot));
    let read = read_answer(not_bootstrap(None), pair, 2, &open, false);
    assert!(matches!(read, Reading::Stranger));
    let garbled = JoinResponse::NotBootstrap {
        bootstrap: Some("not a PeerId".into()),
    };
    assert!(matches!(
        read_answer(garbled, pair, 2, &open, false),
        Reading::Stranger
    ));
    let no = || JoinResponse::Refused("rank 1 has already joined".into());
    let read = read_answer(no(), pair, 2, &open, true);
    assert!(matches!(&read, Reading::Refused(why) if why == "rank 1 has already joined"));
    let read = read_answer(no(), pair, 2, &open, false);
    assert!(matches!(&read, Reading::Failed(why)
        if why == "the bootstrap refused this peer: rank 1 has already joined"));
    let read = read_answer(directory(None), pair, 3, &open, false);
    assert!(matches!(&read, Reading::Failed(why) if why.contains("malformed")));
}

#[test]
fn with_a_run_key_a_joining_peer_takes_only_a_proven_directory() {
    let (me, boot) = (PeerId::random(), PeerId::random());
    let dir = vec![Some(info(0, boot)), Some(info(1, me))];
    let gate = Gate {
        allow: None,
        key: Some(run_key(5)),
    };
    let pair = (&me, &boot);
    let directory = |proof: Option<String>| JoinResponse::Directory {
        directory: dir.clone(),
        proof,
    };
    let tag = gate.key.as_ref().unwrap().tag("answer", &boot, &me);
    let read = read_answer(directory(Some(tag)), pair, 2, &gate, false);
    assert!(matches!(read, Reading::Joined(d) if d.rank == 1));
    let read = read_answer(directory(None), pair, 2, &gate, true);
    assert!(matches!(&read, Reading::Unproven(why) if why.contains("did not prove the run key")));
    let foreign = run_key(6).tag("answer", &boot, &me);
    let read = read_answer(directory(Some(foreign)), pair, 2, &gate, false);
    assert!(matches!(&read, Reading::Failed(why)
        if why.starts_with("the bootstrap") && why.contains("did not prove the run key")));
}

#[test]
fn any_member_takes_a_restarted_peer_back_with_the_bootstraps_checks_and_points_new_ones_at_it() {
    let ids: Vec<PeerId> = (0..4).map(|_| PeerId::random()).collect();
    // Rank 3 is empty (an elastic run); the member asked is rank 1.
    let mut dir: Vec<_> = (0..4).map(|r| (r < 3).then(|| info(r, ids[r]))).collect();
    let fp = fingerprint(4);
    let gate = Gate {
        allow: None,
        key: Some(run_key(7)),
    };
    let (member, boot) = (ids[1], ids[0]);
    let ask = |dir: &mut Vec<Option<PeerInfo>>, peer: PeerId, mut req: JoinRequest| {
        req.proof = Some(run_key(7).tag("join", &peer, &member));
        member_answer(dir, &fp, &gate, (&member, &peer), req, (1, Some(boot)))
    };
    // Peer 2 restarted, at a new address: its entry is updated and it gets the directory,
    // with the member's run-key tag.
    let mut back = request(2, ids[2], false);
    back.info.data_addr = "10.0.0.2:9000".parse().unwrap();
    back.info.incarnation = 5;
    let (answer, late) = ask(&mut dir, ids[2], back);
    assert!(matches!(late, Some(Late::Rejoined(2))), "{late:?}");
    match answer {
        JoinResponse::Directory { directory, proof } => {
            assert_eq!(
                directory[2].as_ref().unwrap().data_addr.to_string(),
                "10.0.0.2:9000"
            );
            assert!(run_key(7).verify(proof.as_deref(), "answer", &member, &ids[2]));
        }
        other => panic!("expected the directory, got {other:?}"),
    }
    assert_eq!(dir[2].as_ref().unwrap().incarnation, 5);
    // Peer 0 restarted fetches the directory from a member too.
    let (answer, late) = ask(&mut dir, ids[0], request(0, ids[0], false));
    assert!(matches!(late, Some(Late::Rejoined(0))), "{late:?}");
    assert!(matches!(answer, JoinResponse::Directory { .. }));
    // Another identity claiming rank 2: refused, the entry kept.
    let impostor = PeerId::random();
    let (answer, late) = ask(&mut dir, impostor, request(2, impostor, false));
    assert!(matches!(late, Some(Late::Refused(_))));
    assert!(
        refusal_text(&answer).contains("keeps its identity"),
        "{answer:?}"
    );
    assert_eq!(dir[2].as_ref().unwrap().peer_id, ids[2].to_string());
    // Without the run key's tag: refused.
    let mut untagged = request(2, ids[2], false);
    untagged.proof = None;
    let (answer, _) = member_answer(
        &mut dir,
        &fp,
        &gate,
        (&member, &ids[2]),
        untagged,
        (1, Some(boot)),
    );
    assert!(refusal_text(&answer).contains("run key"), "{answer:?}");
    // A second process of the member's own rank: refused.
    let (answer, _) = ask(&mut dir, ids[1], request(1, ids[1], false));
    assert!(refusal_text(&answer).contains("alive"), "{answer:?}");
    // A new peer (an empty rank, or any rank) and a peer that is not rejoining: to the
    // bootstrap, and the directory is untouched.
    let before = peer_ids(&dir);
    let newcomer = PeerId::random();
    for req in [
        request(3, newcomer, false),
        request(0, newcomer, true),
        fresh(2, ids[2], false),
    ] {
        let (answer, late) = ask(&mut dir, newcomer, req);
        assert!(late.is_none());
        assert!(
            matches!(&answer, JoinResponse::NotBootstrap { bootstrap: Some(b) } if *b == boot.to_string()),
            "{answer:?}"
        );
    }
    assert_eq!(peer_ids(&dir), before);
}

#[test]
fn a_rejoin_the_data_plane_learnt_updates_the_directory_a_node_serves() {
    let ids: Vec<PeerId> = (0..3).map(|_| PeerId::random()).collect();
    let mut dir: Vec<_> = vec![Some(info(0, ids[0])), Some(info(1, ids[1])), None];
    let moved = |rank: Rank, id: PeerId, addr: &str, incarnation| PeerInfo {
        data_addr: addr.parse().unwrap(),
        incarnation,
        control: Vec::new(),
        ..info(rank, id)
    };
    assert!(relocate(&mut dir, moved(1, ids[1], "10.0.0.1:5", 3)));
    assert_eq!(dir[1].as_ref().unwrap().data_addr.to_string(), "10.0.0.1:5");
    // The same again, an older process, another identity, a rank out of range: no change.
    assert!(!relocate(&mut dir, moved(1, ids[1], "10.0.0.1:5", 3)));
    assert!(!relocate(&mut dir, moved(1, ids[1], "10.0.0.1:6", 2)));
    assert!(!relocate(
        &mut dir,
        moved(1, PeerId::random(), "10.0.0.1:7", 9)
    ));
    assert!(!relocate(&mut dir, moved(5, ids[1], "10.0.0.1:7", 9)));
    assert_eq!(dir[1].as_ref().unwrap().data_addr.to_string(), "10.0.0.1:5");
    // A new peer's first entry.
    assert!(relocate(&mut dir, moved(2, ids[2], "10.0.0.3:5", 1)));
    assert_eq!(dir[2].as_ref().unwrap().peer_id, ids[2].to_string());
}

/// New peers waiting to join a running 8-ring whose ranks 0–3 are in: the first to have
/// come with a neighbour in the run goes first, whatever came before it; one without waits
/// for `GATHER`, then the lowest rank goes; a peer without a rank never waits.
#[test]
fn new_peers_are_let_in_next_to_the_run_first() {
    let ring: Vec<Vec<Rank>> = (0..8).map(|r| vec![(r + 7) % 8, (r + 1) % 8]).collect();
    let mut dir: Directory = (0..8)
        .map(|r| (r < 4).then(|| info(r, PeerId::random())))
        .collect();
    let t0 = tokio::time::Instant::now();
    let at = |s: u64| t0 + std::time::Duration::from_millis(s);
    // Arrived in this order: 6 (next to 5 and 7), 5 (next to 4 and 6), 4 (next to 3).
    let waiting = [
        fresh(6, PeerId::random(), false),
        fresh(5, PeerId::random(), false),
    ];
    let mut waiting: Vec<(tokio::time::Instant, JoinRequest)> =
        waiting.into_iter().map(|r| (t0, r)).collect();
    let pick = |w: &[(tokio::time::Instant, JoinRequest)], dir: &Directory, now| {
        pick_next(w.iter().map(|(t, r)| (*t, r)), dir, &ring, now)
    };
    // 6 and 5 have no neighbour in the run: none goes before GATHER, then the lowest rank.
    assert_eq!(pick(&waiting, &dir, at(0)), None);
    assert_eq!(pick(&waiting, &dir, at(999)), None);
    assert_eq!(pick(&waiting, &dir, t0 + GATHER), Some(1), "rank 5");
    // 4 came last but is next to 3: it goes first, at once.
    waiting.push((at(10), fresh(4, PeerId::random(), false)));
    assert_eq!(pick(&waiting, &dir, at(10)), Some(2));
    waiting.remove(2);
    dir[4] = Some(info(4, PeerId::random()));
    // Now 5 is next to 4: it goes before 6, which came first.
    assert_eq!(pick(&waiting, &dir, at(20)), Some(1));
    waiting.remove(1);
    dir[5] = Some(info(5, PeerId::random()));
    assert_eq!(pick(&waiting, &dir, at(30)), Some(0));
    // A peer without a rank takes the lowest empty one: it never waits.
    let mut dir: Directory = (0..8)
        .map(|r| (r < 4).then(|| info(r, PeerId::random())))
        .collect();
    dir[0] = None;
    let lone = [(at(0), fresh(6, PeerId::random(), true))];
    assert_eq!(pick(&lone, &dir, at(0)), Some(0));
    // Neighbours not known (an empty list): in order of arrival, as before.
    let w = [(at(0), fresh(6, PeerId::random(), false))];
    assert_eq!(
        pick_next(w.iter().map(|(t, r)| (*t, r)), &dir, &[], at(0)),
        Some(0)
    );
    assert_eq!(pick(&[], &dir, at(5000)), None);
}
