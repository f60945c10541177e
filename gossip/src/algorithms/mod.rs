//! The algorithms, one file each, named by the name `--algorithm` takes (`local-sgd` is
//! `local_sgd.rs`). Each file holds the algorithm's state machine (or builds it from the
//! state machines of others through their public constructors) and its one
//! [`crate::Algorithm`] implementation, which [`crate::registry::ALGORITHMS`] lists.
//! What several algorithms share (the local step, the W-weighted exchange, CHOCO's half
//! step, the symmetric-graph check, the wrappers' outer-round bookkeeping) is in
//! [`crate::mixing`], never borrowed from another algorithm's file.
//!
//! Adding an algorithm: a file here with its state machine and its `impl Algorithm`
//! (a [`crate::Capabilities`] value and the protocol options it takes), a `pub mod` line
//! below and one row in [`crate::registry::ALGORITHMS`].

pub mod allreduce;
pub mod choco;
pub mod choco_auto;
pub mod d2;
pub mod diloco;
pub mod diloco_auto;
pub mod diloco_gossip;
pub mod dpsgd;
pub mod gradient_tracking;
pub mod local_auto;
pub mod local_avg;
pub mod local_sgd;
pub mod phased;
pub mod ps;
pub mod sgp;
pub mod streaming_diloco;
