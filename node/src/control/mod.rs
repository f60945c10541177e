//! The control plane: who is in the run. Discovery and admission over libp2p, identities
//! and the run's secrets, the membership protocol (departures, rejoins, admissions) as a
//! state machine, and the detection of a paused process.
pub mod auth;
pub mod discovery;
pub mod membership;
pub mod pause;
