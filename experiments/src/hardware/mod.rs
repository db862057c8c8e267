//! Hardware profiles for the cluster simulator: peak dense bf16 FLOP/s and the ring link's one-way
//! bandwidth and latency; and, in `kernels.rs`, the tile-granular layer's published kernel rates,
//! tiles, memory and achieved link rates, each with its source.
//!
//! Sources (vendor data sheets; the paper's Table 2 uses the same F and B):
//! - A100: NVIDIA A100 Tensor Core GPU datasheet (2021): 312 TFLOP/s bf16 dense; NVLink 600 GB/s
//!   total, 300 GB/s each way. InfiniBand: 100 Gb/s HDR100 per GPU = 12.5 GB/s.
//! - H100 SXM: NVIDIA H100 datasheet (2023): 989 TFLOP/s bf16 dense; NVLink 4 900 GB/s total,
//!   450 GB/s each way.
//! - H200 SXM: NVIDIA H200 datasheet (2024): 989 TFLOP/s bf16 dense; NVLink 900 GB/s total.
//! - TPU v3 / v4 / v5e: Google Cloud TPU system architecture pages: 123 / 275 / 197 TFLOP/s bf16;
//!   inter-chip interconnect as used by Liu et al. (2023), Table 2: 112 / 268 / 186 GB/s.
//!
//! Latencies are order-of-magnitude figures (NVLink and ICI a few µs, InfiniBand ~5 µs); they matter
//! only for tiny blocks.
//!
//! Nodes (for head × context parallelism, whose all-to-all crosses them or not): a DGX/HGX node holds
//! 8 GPUs behind NVLink, each GPU with its own NIC: 200 Gb/s HDR (25 GB/s) on A100 systems, 400 Gb/s
//! NDR (50 GB/s) on H100/H200 systems. The `-infiniband` profile puts every rank on its own node.
//! A TPU slice's chips all talk over ICI: one node as large as any ring here.

mod kernels;

pub use kernels::*;

/// One accelerator and its ring link.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Profile {
    /// Name in specs and tables.
    pub name: &'static str,
    /// Peak dense bf16 FLOP/s.
    pub flops: f64,
    /// One-way link bandwidth to the ring neighbour, bytes/s.
    pub link_bytes_per_s: f64,
    /// Link latency, seconds.
    pub latency_s: f64,
    /// The paper's minimal block size c_min = F/B (tokens) where it reports one (Table 2).
    pub paper_c_min: Option<f64>,
    /// Ranks that share a node (and `link_bytes_per_s` between them).
    pub node_ranks: usize,
    /// One-way bandwidth of a rank to a rank on another node, bytes/s.
    pub inter_node_bytes_per_s: f64,
}

/// Every profile.
pub const PROFILES: &[Profile] = &[
    Profile {
        name: "a100-nvlink",
        flops: 312e12,
        link_bytes_per_s: 300e9,
        latency_s: 3e-6,
        paper_c_min: Some(1.0e3),
        node_ranks: 8,
        inter_node_bytes_per_s: 25e9,
    },
    Profile {
        name: "a100-infiniband",
        flops: 312e12,
        link_bytes_per_s: 12.5e9,
        latency_s: 5e-6,
        paper_c_min: Some(24.5e3),
        node_ranks: 1,
        inter_node_bytes_per_s: 12.5e9,
    },
    Profile {
        name: "tpu-v3",
        flops: 123e12,
        link_bytes_per_s: 112e9,
        latency_s: 3e-6,
        paper_c_min: Some(1.1e3),
        node_ranks: 4096,
        inter_node_bytes_per_s: 112e9,
    },
    Profile {
        name: "tpu-v4",
        flops: 275e12,
        link_bytes_per_s: 268e9,
        latency_s: 3e-6,
        paper_c_min: Some(1.0e3),
        node_ranks: 4096,
        inter_node_bytes_per_s: 268e9,
    },
    Profile {
        name: "tpu-v5e",
        flops: 197e12,
        link_bytes_per_s: 186e9,
        latency_s: 3e-6,
        paper_c_min: Some(1.1e3),
        node_ranks: 4096,
        inter_node_bytes_per_s: 186e9,
    },
    Profile {
        name: "h100-nvlink",
        flops: 989e12,
        link_bytes_per_s: 450e9,
        latency_s: 3e-6,
        paper_c_min: None,
        node_ranks: 8,
        inter_node_bytes_per_s: 50e9,
    },
    Profile {
        name: "h200-nvlink",
        flops: 989e12,
        link_bytes_per_s: 450e9,
        latency_s: 3e-6,
        paper_c_min: None,
        node_ranks: 8,
        inter_node_bytes_per_s: 50e9,
    },
];

/// The profile called `name`.
pub fn profile(name: &str) -> Option<&'static Profile> {
    PROFILES.iter().find(|p| p.name == name)
}

/// Every profile's name, comma-separated.
pub fn profile_names() -> String {
    PROFILES
        .iter()
        .map(|p| p.name)
        .collect::<Vec<_>>()
        .join(", ")
}

impl Profile {
    /// Minimal block size for compute to hide communication: a block of c tokens costs 4·d·c² FLOPs
    /// (scores and P·V, per head) against sending K and V, 2·c·d values of 2 bytes: c ≥ F/B.
    pub fn c_min(&self) -> f64 {
        self.flops / self.link_bytes_per_s
    }
}
