//! Spec (placeholder).
/// Spec.
#[derive(Debug)]
pub struct CompressorSpec;
/// Spec error.
#[derive(Debug)]
pub struct SpecError;
