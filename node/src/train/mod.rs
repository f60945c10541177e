//! Training: the models (Burn), the data sets and their split across peers.
pub mod data;
pub mod learner;
pub mod model;
pub mod optim;
