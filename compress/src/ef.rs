//! Error feedback (placeholder).
/// EF.
#[derive(Debug)]
pub struct ErrorFeedback;
/// DGC.
#[derive(Debug)]
pub struct Dgc;
/// DGC config.
#[derive(Debug)]
pub struct DgcConfig;
