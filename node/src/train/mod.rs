//! Training: the models (Burn), the data sets and their split across peers.
pub mod data;
pub mod inner_optimizer;
pub mod learner;
pub mod model;
