//! Commands around the peer: the simulator of many virtual peers in one process, and the
//! benchmarks of one peer's local work and of the data plane.
pub mod bench;
pub mod netbench;
pub mod simulate;
