//! Quantisers (placeholder until the quantiser module lands).
use rand::Rng;

use crate::{Compressor, DecodeError, OperatorId};

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
#[derive(Debug, Clone, Default)]
pub struct Natural;

impl Qsgd {
    /// Placeholder constructor.
    pub fn new(levels: u16, bucket: usize) -> Self {
        let _ = (levels, bucket);
        Self
    }
}

impl Sign {
    /// Placeholder constructor.
    pub fn new(bucket: Option<usize>) -> Self {
        let _ = bucket;
        Self
    }
}

impl TernGrad {
    /// Placeholder constructor.
    pub fn new(bucket: Option<usize>) -> Self {
        let _ = bucket;
        Self
    }
}

impl Natural {
    /// Placeholder constructor.
    pub fn new() -> Self {
        Self
    }
}

macro_rules! placeholder_compressor {
    ($($t:ty),*) => {$(
        impl Compressor for $t {
            fn id(&self) -> OperatorId {
                unimplemented!("placeholder")
            }
            fn compress(&mut self, _x: &[f32], _rng: &mut dyn Rng, _out: &mut Vec<u8>) -> usize {
                unimplemented!("placeholder")
            }
            fn encoded_len(&self, _d: usize) -> Option<usize> {
                unimplemented!("placeholder")
            }
            fn max_encoded_len(&self, _d: usize) -> usize {
                unimplemented!("placeholder")
            }
            fn unbiased(&self) -> bool {
                unimplemented!("placeholder")
            }
        }
    )*};
}

placeholder_compressor!(Qsgd, Sign, TernGrad, Natural);

pub(crate) fn validate(op: OperatorId, _payload: &[u8], _d: usize) -> Result<usize, DecodeError> {
    Err(DecodeError::UnknownOperator(op as u8))
}

pub(crate) fn add(_op: OperatorId, _payload: &[u8], _scale: f32, _acc: &mut [f32]) {}
