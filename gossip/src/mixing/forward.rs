//! [`forward_gossip!`](crate::forward_gossip): the [`crate::Gossip`] methods that a wrapping
//! algorithm passes on to the state machine it wraps, written once. A wrapper (local SGD
//! around D-PSGD, a Byzantine attacker around an honest peer, …) writes the methods it
//! changes and names the rest:
//!
//! ```text
//! impl Gossip for LocalSgd {
//!     fn begin_round(&mut self, now: Instant, x: &[f32], grad: Option<&[f32]>) { … }
//!     // …
//!     crate::forward_gossip!(inner: poll_transmit, poll_timeout, stats, out_peers);
//! }
//! ```
//!
//! `inner` is a field whose type dereferences to a `Gossip` (a `Box<dyn Gossip>`). Each name
//! expands to the trait method with its signature, calling the same method of `inner`.

/// Writes the named [`crate::Gossip`] methods as calls of the same method on `self.$inner`
/// (see [`crate::mixing::forward`]).
#[macro_export]
#[doc(hidden)]
macro_rules! forward_gossip {
    ($inner:ident: $($method:ident),+ $(,)?) => {
        $( $crate::forward_gossip!(@one $inner $method); )+
    };
    (@one $i:ident begin_round) => {
        fn begin_round(&mut self, now: std::time::Instant, x: &[f32], grad: Option<&[f32]>) {
            self.$i.begin_round(now, x, grad)
        }
    };
    (@one $i:ident handle_message) => {
        fn handle_message(
            &mut self,
            now: std::time::Instant,
            from: $crate::Rank,
            frame: &[u8],
        ) -> Result<(), $crate::GossipError> {
            self.$i.handle_message(now, from, frame)
        }
    };
    (@one $i:ident handle_timeout) => {
        fn handle_timeout(&mut self, now: std::time::Instant) { self.$i.handle_timeout(now) }
    };
    (@one $i:ident poll_transmit) => {
        fn poll_transmit(&mut self) -> Option<$crate::Transmit> { self.$i.poll_transmit() }
    };
    (@one $i:ident poll_timeout) => {
        fn poll_timeout(&self) -> Option<std::time::Instant> { self.$i.poll_timeout() }
    };
    (@one $i:ident poll_event) => {
        fn poll_event(&mut self) -> Option<$crate::GossipEvent> { self.$i.poll_event() }
    };
    (@one $i:ident params) => {
        fn params(&self) -> &[f32] { self.$i.params() }
    };
    (@one $i:ident round) => {
        fn round(&self) -> u64 { self.$i.round() }
    };
    (@one $i:ident stats) => {
        fn stats(&self) -> $crate::GossipStats { self.$i.stats() }
    };
    (@one $i:ident set_epoch) => {
        fn set_epoch(&mut self, epoch: usize) { self.$i.set_epoch(epoch) }
    };
    (@one $i:ident out_peers) => {
        fn out_peers(&self) -> Vec<$crate::Rank> { self.$i.out_peers() }
    };
    (@one $i:ident in_peers) => {
        fn in_peers(&self) -> Vec<$crate::Rank> { self.$i.in_peers() }
    };
    (@one $i:ident reweights) => {
        fn reweights(&self) -> bool { self.$i.reweights() }
    };
    (@one $i:ident in_peers_at) => {
        fn in_peers_at(&self, round: u64) -> Vec<$crate::Rank> { self.$i.in_peers_at(round) }
    };
    (@one $i:ident catch_up_state) => {
        fn catch_up_state(&self) -> Vec<f32> { self.$i.catch_up_state() }
    };
    (@one $i:ident take_catch_up_state) => {
        fn take_catch_up_state(&mut self, state: &[f32]) -> Result<(), $crate::StateError> {
            self.$i.take_catch_up_state(state)
        }
    };
    (@one $i:ident rejoin_round) => {
        fn rejoin_round(&self, earliest: u64) -> u64 { self.$i.rejoin_round(earliest) }
    };
    (@one $i:ident frame_round) => {
        fn frame_round(&self, round: u64) -> u64 { self.$i.frame_round(round) }
    };
    (@one $i:ident start_at_round) => {
        fn start_at_round(&mut self, round: u64) -> Result<(), $crate::MembershipError> {
            self.$i.start_at_round(round)
        }
    };
    (@one $i:ident state) => {
        fn state(&self) -> $crate::AlgorithmState { self.$i.state() }
    };
    (@one $i:ident restore_state) => {
        fn restore_state(
            &mut self,
            state: &$crate::AlgorithmState,
        ) -> Result<(), $crate::StateError> {
            self.$i.restore_state(state)
        }
    };
    (@one $i:ident observe_link) => {
        fn observe_link(&mut self, from: $crate::Rank, bytes: usize, secs: f64) {
            self.$i.observe_link(from, bytes, secs)
        }
    };
    (@one $i:ident link_choices) => {
        fn link_choices(&self) -> Vec<$crate::LinkChoice> { self.$i.link_choices() }
    };
    (@one $i:ident communicates_in_background) => {
        fn communicates_in_background(&self) -> bool { self.$i.communicates_in_background() }
    };
    (@one $i:ident overlaps_gradient) => {
        fn overlaps_gradient(&self) -> bool { self.$i.overlaps_gradient() }
    };
    (@one $i:ident apply_gradient) => {
        fn apply_gradient(&mut self, grad: &[f32]) { self.$i.apply_gradient(grad) }
    };
}
