//! Plain f32 blocks: what travels between ranks, detached from any autodiff graph.

use crate::host::HostRead;
use burn::tensor::{Tensor, TensorData, backend::Backend};

/// What a block carries; traffic is counted per kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BlockKind {
    /// Keys.
    K,
    /// Values.
    V,
    /// Queries.
    Q,
    /// The output's gradient.
    DOut,
    /// The forward's log-sum-exp.
    Lse,
    /// δ = rowsum(dO ∘ O).
    Delta,
    /// Keys' gradient.
    DK,
    /// Values' gradient.
    DV,
    /// Queries' gradient.
    DQ,
    /// An all-reduce's vector.
    Reduce,
}

#[derive(Debug, Clone, PartialEq)]
/// A host block of f32 values and its shape.
pub struct Block {
    /// What it carries.
    pub kind: BlockKind,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Its values, row-major.
    pub data: Vec<f32>,
}

impl Block {
    /// A block of zeros.
    pub fn zeros(kind: BlockKind, shape: Vec<usize>) -> Self {
        let len = shape.iter().product();
        Self {
            kind,
            shape,
            data: vec![0.0; len],
        }
    }

    /// The tensor's values on the host, as a block of kind `kind`.
    pub fn from_tensor<B: HostRead, const D: usize>(kind: BlockKind, tensor: Tensor<B, D>) -> Self {
        let shape = tensor.dims().to_vec();
        let data = B::to_host(tensor);
        Self { kind, shape, data }
    }

    /// The block as a tensor, without copying its data.
    pub fn into_tensor<B: Backend, const D: usize>(self, device: &B::Device) -> Tensor<B, D> {
        Tensor::from_data(TensorData::new(self.data, self.shape), device)
    }

    /// Bytes of its values.
    pub fn bytes(&self) -> u64 {
        (self.data.len() * std::mem::size_of::<f32>()) as u64
    }

    /// Elementwise `self += other`; shapes were fixed when the accumulator was created.
    pub fn add_assign(&mut self, other: &Block) {
        debug_assert_eq!(self.shape, other.shape);
        for (a, b) in self.data.iter_mut().zip(&other.data) {
            *a += b;
        }
    }
}
