//! Commands around the peer: the simulator of many virtual peers in one process, the
//! benchmarks of one peer's local work and of the data plane, the plots of run folders, and
//! the tokenizer that makes token files.
pub mod bench;
pub mod netbench;
pub mod plot;
pub mod simulate;
pub mod tokenize;
