//! The wire format of the multi-process transports: a payload of blocks as one f32 message.

use super::Payload;
use crate::block::{Block, BlockKind};
use crate::error::TransportError;
use std::sync::Arc;

const KINDS: [BlockKind; 12] = [
    BlockKind::K,
    BlockKind::V,
    BlockKind::Q,
    BlockKind::DOut,
    BlockKind::Lse,
    BlockKind::Delta,
    BlockKind::DK,
    BlockKind::DV,
    BlockKind::DQ,
    BlockKind::Reduce,
    BlockKind::Sinks,
    BlockKind::DSinks,
];

/// One message: `[blocks, (kind, ndim, dims…)…, data…]`, every count exact in f32 below 2^24.
pub(crate) fn encode(payload: &Payload) -> Vec<f32> {
    let mut header = vec![payload.len() as f32];
    for b in payload {
        header.push(KINDS.iter().position(|c| *c == b.kind).unwrap_or(0) as f32);
        header.push(b.shape.len() as f32);
        header.extend(b.shape.iter().map(|&d| d as f32));
    }
    let data_len: usize = payload.iter().map(|b| b.len()).sum();
    let mut out = Vec::with_capacity(header.len() + data_len);
    out.extend(header);
    for b in payload {
        out.extend_from_slice(&b.host_values());
    }
    out
}

pub(crate) fn decode(message: &[f32], rank: usize, peer: usize) -> Result<Payload, TransportError> {
    let bad = || TransportError::RankFailed {
        rank: peer,
        message: format!("malformed message received by rank {rank}"),
    };
    let mut at = 0;
    let mut next = || -> Result<usize, TransportError> {
        let x = *message.get(at).ok_or_else(bad)?;
        at += 1;
        Ok(x as usize)
    };
    let blocks = next()?;
    let mut heads = Vec::with_capacity(blocks);
    for _ in 0..blocks {
        let kind = *KINDS.get(next()?).ok_or_else(bad)?;
        let ndim = next()?;
        let shape = (0..ndim).map(|_| next()).collect::<Result<Vec<_>, _>>()?;
        heads.push((kind, shape));
    }
    let mut offset = at;
    heads
        .into_iter()
        .map(|(kind, shape)| {
            let len: usize = shape.iter().product();
            let data = message.get(offset..offset + len).ok_or_else(bad)?.to_vec();
            offset += len;
            Ok(Arc::new(Block::host(kind, shape, data)))
        })
        .collect()
}
