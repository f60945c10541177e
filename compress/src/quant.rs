//! Quantisers (placeholder until the quantiser module lands).
use crate::{DecodeError, OperatorId};

/// QSGD.
#[derive(Debug, Clone)]
pub struct Qsgd;
/// Sign.
#[derive(Debug, Clone)]
pub struct Sign;
/// TernGrad.
#[derive(Debug, Clone)]
pub struct TernGrad;
/// Natural.
#[derive(Debug, Clone)]
pub struct Natural;

pub(crate) fn validate(op: OperatorId, _payload: &[u8], _d: usize) -> Result<usize, DecodeError> {
    Err(DecodeError::UnknownOperator(op as u8))
}

pub(crate) fn add(_op: OperatorId, _payload: &[u8], _scale: f32, _acc: &mut [f32]) {}
