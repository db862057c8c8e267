//! The cost model of head × context parallelism: one attention layer's forward and backward on
//! N = U·R ranks, Ulysses all-to-alls inside groups of U consecutive ranks, a zig-zag ring of R
//! outside, on a hardware profile (kind `hybrid` sweeps it).
//!
//! Per rank (t = S/N tokens, a ring shard of L = S/R, hq = H/U query heads and hkv = max(K/U, 1) kv
//! heads after the all-to-all):
//! - all-to-all: forward q, k, v to heads and out (with lse) back; backward dO to heads and dq, dk,
//!   dv back; each sends U − 1 messages of t tokens of the receiver's heads (to heads) or of its own
//!   (to tokens). Not overlapped with compute. Its time: the bytes to peers on the rank's node over
//!   `link_bytes_per_s`, to other nodes over `inter_node_bytes_per_s`, the slower of the two.
//! - the ring: R steps of L × L pairs of hq heads (causal: balanced zig-zag, S(S+1)/2 pairs in all),
//!   K and V (backward: with the dK/dV accumulator) crossing one hop a step, simulated like the
//!   balance kind ([`simulate`]): a hop inside a node at `link_bytes_per_s`, and the whole ring at
//!   the inter-node rate once it spans nodes (every step waits for its slowest hop).
//! - ranks are numbered Ulysses-group first, so a group of U ≤ node_ranks stays inside a node.
//!
//! The byte counts are the engine's own (a test runs the engine on thread ranks and compares them);
//! the times are a model, the profile's peak FLOP/s and link rates.

use crate::hardware::Profile;
use crate::simulator::simulate;
use serde::Deserialize;
use workbench::kernels::flops::{BACKWARD_PER_PAIR_DIM, FORWARD_PER_PAIR_DIM, sequence_pairs};

/// Bytes per element: of operands and outputs (q, k, v, out and their gradients), and of what stays
/// f32 (lse, and the dK/dV accumulators of an f32 merge).
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Bytes {
    /// bf16: 2.
    pub value: u64,
    /// f32: 4.
    pub accumulator: u64,
}

impl Default for Bytes {
    fn default() -> Self {
        Bytes {
            value: 2,
            accumulator: 4,
        }
    }
}

/// An attention shape: query heads, kv heads, head dimension.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    /// Its name in specs and tables.
    pub name: &'static str,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Head dimension.
    pub head_dim: usize,
}

/// LLaMA-7B (multi-head) and LLaMA-3-8B (grouped-query, 8 kv heads), both 32 heads of 128.
pub const MODELS: &[Shape] = &[
    Shape {
        name: "llama-7b",
        heads: 32,
        kv_heads: 32,
        head_dim: 128,
    },
    Shape {
        name: "llama3-8b",
        heads: 32,
        kv_heads: 8,
        head_dim: 128,
    },
];

/// One point: a model on a profile, N ranks as U × R, S tokens.
#[derive(Debug, Clone, Copy)]
pub struct GridPoint {
    /// The attention shape.
    pub model: Shape,
    /// The hardware.
    pub profile: &'static Profile,
    /// All ranks.
    pub ranks: usize,
    /// The Ulysses degree.
    pub ulysses: usize,
    /// Tokens.
    pub seq_len: usize,
    /// Causal attention.
    pub causal: bool,
}

/// Bytes one rank sends in one layer's forward and backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GridBytes {
    /// The all-to-alls' (forward, backward).
    pub all_to_all: (u64, u64),
    /// The ring's (forward, backward).
    pub ring: (u64, u64),
    /// One ring hop's bytes (forward, backward).
    pub hop: (u64, u64),
}

impl GridPoint {
    /// R = N / U.
    pub fn ring_ranks(&self) -> usize {
        self.ranks / self.ulysses
    }

    /// Bytes per rank, as the engine sends them (kv backward scheme, a whole causal ring).
    pub fn bytes(&self, bytes: Bytes) -> GridBytes {
        let (u, r) = (self.ulysses as u64, self.ring_ranks() as u64);
        let s = self.seq_len as u64;
        let (t, shard) = (s / self.ranks as u64, s / r);
        let m = self.model;
        let d = m.head_dim as u64;
        let hq = (m.heads / self.ulysses) as u64;
        let hkv = (m.kv_heads / self.ulysses).max(1) as u64;
        // Each of U − 1 messages: t tokens of hq or hkv heads.
        let exchange = |heads: u64, width: u64, per: u64| (u - 1) * t * heads * width * per;
        let forward = exchange(2 * hq + 2 * hkv, d, bytes.value) + exchange(hq, 1, 4);
        let backward = exchange(2 * hq + 2 * hkv, d, bytes.value);
        let kv_block = shard * hkv * d;
        let hop = (
            2 * kv_block * bytes.value,
            2 * kv_block * (bytes.value + bytes.accumulator),
        );
        let hops = r - 1;
        // The dK/dV accumulator goes home: one hop more than K and V (none on one rank).
        let home = if r > 1 { r } else { 0 };
        let ring = (
            hops * hop.0,
            2 * kv_block * (hops * bytes.value + home * bytes.accumulator),
        );
        GridBytes {
            all_to_all: (forward, backward),
            ring,
            hop,
        }
    }

    /// Why the point cannot run (the engine's rule), or `None`.
    pub fn unsupported(&self) -> Option<String> {
        let m = self.model;
        workbench::ring::ulysses::check_heads(self.ulysses, self.ranks, m.heads, m.kv_heads)
            .err()
            .map(|e| e.to_string())
            .or_else(|| {
                (!self.seq_len.is_multiple_of(2 * self.ranks)).then(|| {
                    format!(
                        "{} tokens do not split into 2·{} chunks",
                        self.seq_len, self.ranks
                    )
                })
            })
    }

    /// The predicted seconds of one layer's forward and backward.
    pub fn predict(&self, bytes: Bytes) -> Prediction {
        let p = self.profile;
        let b = self.bytes(bytes);
        let (u, r) = (self.ulysses, self.ring_ranks());
        // All-to-all: the group's ranks are consecutive; peers on this rank's node at the node's
        // rate, the others over the NIC. A group is aligned to U, so with U ≤ node_ranks (both
        // powers of two here) it lies inside one node.
        let on_node = u.min(p.node_ranks);
        let exchange_seconds = |total: u64| {
            if u == 1 {
                return 0.0;
            }
            let per_peer = total as f64 / (u - 1) as f64;
            let near = per_peer * (on_node - 1) as f64 / p.link_bytes_per_s;
            let far = per_peer * (u - on_node) as f64 / p.inter_node_bytes_per_s;
            p.latency_s + near.max(far)
        };
        let all_to_all = exchange_seconds(b.all_to_all.0) + exchange_seconds(b.all_to_all.1);
        // The ring: its members are U apart; it spans nodes once N exceeds a node.
        let link = if self.ranks <= p.node_ranks {
            p.link_bytes_per_s
        } else {
            p.inter_node_bytes_per_s
        };
        let m = self.model;
        let pairs = sequence_pairs(self.seq_len, self.causal) as f64;
        // Every rank's share of the pairs of its hq heads, spread evenly over R steps (zig-zag).
        let per_step = pairs / (self.ranks * r) as f64 * (m.heads * m.head_dim) as f64;
        let pass = |per_pair: u64, hop: u64| {
            let step = per_step * per_pair as f64 / p.flops;
            let compute = vec![vec![step; r]; r];
            simulate(&compute, p.latency_s + hop as f64 / link)
        };
        let forward = pass(FORWARD_PER_PAIR_DIM, b.hop.0);
        let backward = pass(BACKWARD_PER_PAIR_DIM, b.hop.1);
        let ring = forward.makespan + backward.makespan;
        let compute = forward.compute[0] + backward.compute[0];
        Prediction {
            all_to_all,
            ring,
            compute,
            total: all_to_all + ring,
        }
    }
}

/// Predicted seconds of one layer's forward and backward.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prediction {
    /// The all-to-alls, forward and backward.
    pub all_to_all: f64,
    /// The ring's passes, compute and the communication it could not hide.
    pub ring: f64,
    /// The tiles' compute alone.
    pub compute: f64,
    /// All of it.
    pub total: f64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::profile;
    use workbench::block::BlockKind;
    use workbench::ring::jobs::{AttentionJob, HostTensor, run_attention};
    use workbench::transport::Phase;
    use workbench::{BackwardScheme, RingConfig};

    /// The model's bytes are what the engine sends: f32 on thread ranks (value and accumulator 4
    /// bytes), zig-zag, kv scheme, causal, on grids with kv heads split and replicated.
    #[test]
    fn predicted_bytes_are_the_engines() {
        let f32_bytes = Bytes {
            value: 4,
            accumulator: 4,
        };
        for (ranks, ulysses, heads, kv_heads) in
            [(4, 2, 4, 4), (8, 4, 8, 2), (4, 1, 4, 2), (4, 4, 4, 4)]
        {
            let (b, s, d) = (1, 32, 8);
            let model = Shape {
                name: "test",
                heads,
                kv_heads,
                head_dim: d,
            };
            let point = GridPoint {
                model,
                profile: profile("h100-nvlink").unwrap(),
                ranks,
                ulysses,
                seq_len: s,
                causal: true,
            };
            let tensor = |h: usize| HostTensor::new(vec![b, s, h, d], vec![0.5; b * s * h * d]);
            let (q, k, v, d_out) = (
                tensor(heads),
                tensor(kv_heads),
                tensor(kv_heads),
                tensor(heads),
            );
            let job = AttentionJob {
                q: &q,
                k: &k,
                v: &v,
                d_out: Some(&d_out),
                ranks,
                ulysses,
                strategy: &strategies::ZigZag,
                config: RingConfig {
                    causal: true,
                    backward: BackwardScheme::Kv,
                    ..Default::default()
                },
                timeout: std::time::Duration::from_secs(30),
                fault: None,
                link: None,
                doc_lens: &[],
                sinks: None,
            };
            let result = run_attention::<burn::backend::Autodiff<burn::backend::Flex>>(
                &job,
                &Default::default(),
            )
            .unwrap();
            let predicted = point.bytes(f32_bytes);
            for (rank, traffic) in result.traffic.iter().enumerate() {
                let sum = |phase: Phase, kinds: &[BlockKind]| -> u64 {
                    kinds.iter().map(|&k| traffic.count(phase, k).1).sum()
                };
                let all = [
                    BlockKind::Q,
                    BlockKind::K,
                    BlockKind::V,
                    BlockKind::Out,
                    BlockKind::Lse,
                    BlockKind::DOut,
                    BlockKind::DQ,
                    BlockKind::DK,
                    BlockKind::DV,
                ];
                let label = format!("N={ranks} U={ulysses} H={heads} K={kv_heads} rank {rank}");
                assert_eq!(
                    sum(Phase::AllToAll, &all),
                    predicted.all_to_all.0 + predicted.all_to_all.1,
                    "{label}: all-to-all"
                );
                assert_eq!(
                    sum(Phase::Forward, &all),
                    predicted.ring.0,
                    "{label}: ring forward"
                );
                assert_eq!(
                    sum(Phase::Backward, &all),
                    predicted.ring.1,
                    "{label}: ring backward"
                );
            }
        }
    }

    /// Pure Ulysses moves no ring bytes and the ring alone no all-to-all bytes; where the links are
    /// equal and compute dominates, every degree costs about the same.
    #[test]
    fn the_ends_of_the_grid() {
        let p = GridPoint {
            model: MODELS[0],
            profile: profile("h100-nvlink").unwrap(),
            ranks: 8,
            ulysses: 8,
            seq_len: 1 << 20,
            causal: true,
        };
        let b = Bytes::default();
        assert_eq!(p.bytes(b).ring, (0, 0));
        assert_eq!(GridPoint { ulysses: 1, ..p }.bytes(b).all_to_all, (0, 0));
        let (ulysses, ring) = (p.predict(b), GridPoint { ulysses: 1, ..p }.predict(b));
        assert!((ulysses.compute - ring.compute).abs() <= 1e-9 * ring.compute);
        assert!(ulysses.total >= ulysses.compute && ring.total >= ring.compute);
    }
}
