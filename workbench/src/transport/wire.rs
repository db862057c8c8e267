//! The wire format of the multi-process transports: a payload of blocks as one message of 32-bit
//! words (MPI and NCCL move them as f32 without looking at them): f32 values one a word, bf16
//! values two a word.

use super::Payload;
use crate::block::{Block, BlockKind};
use crate::dtype::Dtype;
use crate::error::TransportError;
use half::bf16;
use std::sync::Arc;

/// Words a block's values take: one an f32, one a pair of bf16 (the last one half empty when the
/// count is odd).
fn words(dtype: Dtype, len: usize) -> usize {
    match dtype {
        Dtype::F32 => len,
        Dtype::Bf16 => len.div_ceil(2),
    }
}

/// What the header says of one block: its kind, element type and shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Head {
    pub(crate) kind: BlockKind,
    pub(crate) dtype: Dtype,
    pub(crate) shape: Vec<usize>,
}

impl Head {
    /// The head of `block` (what an in-place NCCL receive expects).
    #[cfg(any(test, all(feature = "nccl", feature = "cuda")))]
    pub(crate) fn of(block: &Block) -> Self {
        Self {
            kind: block.kind,
            dtype: block.dtype(),
            shape: block.shape.clone(),
        }
    }
}

/// A message's header: `[blocks, (kind, dtype, ndim, dims…)…]`, every count exact in f32 below 2^24.
/// A transport that moves the values apart (NCCL from device memory) sends it alone.
pub(crate) fn header(payload: &Payload) -> Vec<f32> {
    let mut header = vec![payload.len() as f32];
    for b in payload {
        header.push(b.kind.code() as f32);
        header.push(Dtype::ALL.iter().position(|d| *d == b.dtype()).unwrap_or(0) as f32);
        header.push(b.shape.len() as f32);
        header.extend(b.shape.iter().map(|&d| d as f32));
    }
    header
}

/// One message: the [`header`], then every block's values.
pub(crate) fn encode(payload: &Payload) -> Vec<f32> {
    let header = header(payload);
    let data_len: usize = payload.iter().map(|b| words(b.dtype(), b.len())).sum();
    let mut out = Vec::with_capacity(header.len() + data_len);
    out.extend(header);
    for b in payload {
        match b.dtype() {
            Dtype::F32 => out.extend_from_slice(&b.host_values()),
            Dtype::Bf16 => out.extend(b.host_bf16_values().chunks(2).map(|pair| {
                let high = pair.get(1).map_or(0, |x| u32::from(x.to_bits()));
                f32::from_bits(u32::from(pair[0].to_bits()) | high << 16)
            })),
        }
    }
    out
}

/// The error of a malformed message from `peer`.
fn malformed(rank: usize, peer: usize) -> TransportError {
    TransportError::RankFailed {
        rank: peer,
        message: format!("malformed message received by rank {rank}"),
    }
}

/// The heads a message's header lists, and where its values begin.
pub(crate) fn read_header(
    message: &[f32],
    rank: usize,
    peer: usize,
) -> Result<(Vec<Head>, usize), TransportError> {
    let bad = || malformed(rank, peer);
    let mut at = 0;
    let mut next = || -> Result<usize, TransportError> {
        let x = *message.get(at).ok_or_else(bad)?;
        at += 1;
        Ok(x as usize)
    };
    let blocks = next()?;
    let mut heads = Vec::with_capacity(blocks.min(message.len()));
    for _ in 0..blocks {
        let kind = BlockKind::from_code(next()?).ok_or_else(bad)?;
        let dtype = *Dtype::ALL.get(next()?).ok_or_else(bad)?;
        let ndim = next()?;
        let shape = (0..ndim).map(|_| next()).collect::<Result<Vec<_>, _>>()?;
        heads.push(Head { kind, dtype, shape });
    }
    Ok((heads, at))
}

pub(crate) fn decode(message: &[f32], rank: usize, peer: usize) -> Result<Payload, TransportError> {
    let (heads, mut offset) = read_header(message, rank, peer)?;
    heads
        .into_iter()
        .map(|Head { kind, dtype, shape }| {
            let len: usize = shape.iter().product();
            let n = words(dtype, len);
            let data = message
                .get(offset..offset + n)
                .ok_or_else(|| malformed(rank, peer))?;
            offset += n;
            Ok(Arc::new(match dtype {
                Dtype::F32 => Block::host(kind, shape, data.to_vec()),
                Dtype::Bf16 => {
                    let values = data
                        .iter()
                        .flat_map(|w| {
                            let bits = w.to_bits();
                            [bits as u16, (bits >> 16) as u16]
                        })
                        .take(len)
                        .map(bf16::from_bits)
                        .collect();
                    Block::host_bf16(kind, shape, values)
                }
            }))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_of_either_type_cross_the_wire_unchanged_bf16_at_half_the_words() {
        let values: Vec<f32> = (0..7).map(|i| i as f32 * 0.3 - 1.0).collect();
        let bf = values.iter().map(|&x| bf16::from_f32(x)).collect();
        let payload: Payload = vec![
            Arc::new(Block::host(BlockKind::Lse, vec![7], values.clone())),
            Arc::new(Block::host_bf16(BlockKind::K, vec![1, 7], bf)),
        ];
        let message = encode(&payload);
        // Header: count, then (kind, dtype, ndim, dims) twice; then 7 words and 4 (7 bf16).
        assert_eq!(message.len(), 1 + 4 + 5 + 7 + 4);
        let back = decode(&message, 0, 1).unwrap();
        assert_eq!(back, payload);
        assert_eq!(back[1].dtype(), Dtype::Bf16);
        assert_eq!(back[1].bytes(), 14);
        // The header alone says the same of every block.
        let (heads, values_at) = read_header(&header(&payload), 0, 1).unwrap();
        assert_eq!(
            heads,
            payload.iter().map(|b| Head::of(b)).collect::<Vec<_>>()
        );
        assert_eq!(values_at, 1 + 4 + 5);
        // A message cut short is an error naming the peer, not a panic.
        assert!(decode(&message[..message.len() - 1], 0, 1).is_err());
        assert!(read_header(&message[..7], 0, 1).is_err());
    }

    #[test]
    fn every_kind_has_its_own_code() {
        for (at, &kind) in BlockKind::ALL.iter().enumerate() {
            assert_eq!(kind.code(), at, "{kind:?}");
            assert_eq!(BlockKind::from_code(at), Some(kind));
        }
    }
}
