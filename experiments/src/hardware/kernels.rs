//! The tile-granular cost layer's parameters ([`crate::tile_model`]): what FlashAttention kernels
//! and GPUs were published or measured to do. Every value names where it was read
//! (docs/research/published-gpu-measurements.md gathers them); none is fitted to the measurements
//! the `published` kind compares against (a test checks every parameter has its source).

/// A number and where it was read: a datasheet, a kernel's source, a published benchmark.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sourced {
    /// The value, in the unit its field names.
    pub value: f64,
    /// Where it was read.
    pub source: &'static str,
}

/// A published throughput curve of one attention kernel: TFLOP/s (FlashAttention's convention: a
/// forward is 4·d FLOPs per visible pair and head, a backward 2.5× that) against sequence length,
/// head dim 128, 16K tokens a batch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateCurve {
    /// (sequence length, TFLOP/s), ascending in length.
    pub points: &'static [(usize, f64)],
    /// Where they were read.
    pub source: &'static str,
}

impl RateCurve {
    /// FLOP/s at `length`: the published point at the longest length not above it (the first
    /// point below the shortest). A step function: no interpolation between published points.
    pub fn flops_at(&self, length: usize) -> f64 {
        let point = self
            .points
            .iter()
            .rev()
            .find(|(l, _)| *l <= length)
            .or(self.points.first())
            .expect("a curve has points");
        point.1 * 1e12
    }
}

/// A tile shape (query rows × key columns) and where it was read.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tile {
    /// Query rows a tile.
    pub rows: usize,
    /// Key columns a tile.
    pub cols: usize,
    /// Where it was read.
    pub source: &'static str,
}

/// One GPU running FlashAttention-2 (what ring-flash-attention calls): its published throughput,
/// tile shapes, memory and achieved link rates, and a kernel launch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FlashGpu {
    /// Name in tables.
    pub name: &'static str,
    /// Forward-only throughput, causal.
    pub fwd_causal: RateCurve,
    /// Why the forward curves are another pass's, where no forward curve was published legibly
    /// for this GPU (a prediction of a forward names it in its table); `None`: they are its own.
    pub forward_stand_in: Option<&'static str>,
    /// Forward-only throughput, no mask.
    pub fwd_full: RateCurve,
    /// Forward + backward throughput, causal.
    pub fwd_bwd_causal: RateCurve,
    /// Forward + backward throughput, no mask.
    pub fwd_bwd_full: RateCurve,
    /// The forward kernel's tile at head dim 128.
    pub fwd_tile: Tile,
    /// The backward kernel's tile at head dim 128.
    pub bwd_tile: Tile,
    /// Memory bandwidth, bytes/s (elementwise merges are bound by it).
    pub hbm_bytes_per_s: Sourced,
    /// Achieved one-way GPU-to-GPU bandwidth over NVLink, bytes/s (not the datasheet's).
    pub link_bytes_per_s: Sourced,
    /// Seconds a kernel launch costs.
    pub launch_s: Sourced,
}

const FA2_A100_FWD_BWD_CAUSAL: RateCurve = RateCurve {
    points: &[
        (512, 99.0),
        (1024, 133.0),
        (2048, 155.0),
        (4096, 173.0),
        (8192, 182.0),
        (16384, 189.0),
    ],
    source: "FlashAttention-2 paper (Dao 2023) Fig. 4, A100 80GB SXM4, hdim 128, causal, fwd+bwd; \
             read from assets/flash2_a100_fwd_bwd_benchmark.png (Dao-AILab/flash-attention 4f285b35)",
};

const FA2_A100_FWD_BWD_FULL: RateCurve = RateCurve {
    // 512 and 1K are hidden by the figure's legend: lengths below 2K take the 2K point.
    points: &[(2048, 187.0), (4096, 196.0), (8192, 201.0), (16384, 203.0)],
    source: "FlashAttention-2 paper (Dao 2023) Fig. 4, A100 80GB SXM4, hdim 128, no mask, \
             fwd+bwd; read from assets/flash2_a100_fwd_bwd_benchmark.png (flash-attention 4f285b35)",
};

const FA2_H100_FWD_CAUSAL: RateCurve = RateCurve {
    points: &[
        (512, 191.0),
        (1024, 260.0),
        (2048, 298.0),
        (4096, 319.0),
        (8192, 333.0),
        (16384, 335.0),
    ],
    source: "FlashAttention-3 paper (Shah et al. 2024) Fig. 5d, the FlashAttention-2 row, H100 \
             80GB SXM5, hdim 128, causal, forward",
};

const FA2_H100_FWD_FULL: RateCurve = RateCurve {
    points: &[
        (512, 309.0),
        (1024, 350.0),
        (2048, 362.0),
        (4096, 368.0),
        (8192, 370.0),
        (16384, 370.0),
    ],
    source: "FlashAttention-3 paper (Shah et al. 2024) Fig. 5c, the FlashAttention-2 row, H100 \
             80GB SXM5, hdim 128, no mask, forward",
};

const FA2_H100_FWD_BWD_CAUSAL: RateCurve = RateCurve {
    points: &[
        (512, 163.0),
        (1024, 221.0),
        (2048, 265.0),
        (4096, 294.0),
        (8192, 308.0),
        (16384, 328.0),
    ],
    source: "FlashAttention-2 on H100 80GB SXM5, hdim 128, causal, fwd+bwd; read from \
             assets/flash2_h100_fwd_bwd_benchmark.png (Dao-AILab/flash-attention 4f285b35)",
};

const FA2_H100_FWD_BWD_FULL: RateCurve = RateCurve {
    points: &[
        (512, 248.0),
        (1024, 294.0),
        (2048, 320.0),
        (4096, 326.0),
        (8192, 335.0),
        (16384, 338.0),
    ],
    source: "FlashAttention-2 on H100 80GB SXM5, hdim 128, no mask, fwd+bwd; read from \
             assets/flash2_h100_fwd_bwd_benchmark.png (Dao-AILab/flash-attention 4f285b35)",
};

const FA2_FWD_TILE: Tile = Tile {
    rows: 128,
    cols: 64,
    source: "flash-attention csrc/flash_attn/src/flash_fwd_launch_template.h, run_mha_fwd_hdim128: \
             kBlockM 128 × kBlockN 64, 4 warps on sm80 and sm90 (no dropout)",
};

const FA2_BWD_TILE: Tile = Tile {
    rows: 64,
    cols: 128,
    source: "flash-attention csrc/flash_attn/src/flash_bwd_launch_template.h, run_mha_bwd_hdim128: \
             Flash_bwd_kernel_traits<128, 64, 128, 8, ...> where shared memory ≥ 144 KB (A100, H100)",
};

const LAUNCH: Sourced = Sourced {
    value: 2.7e-6,
    source: "reframe-hpc cscs-checks kernel_latency.py reference, A100: 2.7 µs a null kernel \
             launched asynchronously back to back",
};

/// The GPUs of ring-flash-attention's published benchmark.
pub const FLASH_GPUS: &[FlashGpu] = &[
    FlashGpu {
        name: "8xA100",
        // No forward-only A100 curve is legible in the FA2 paper (its Figs. 5-6 are images we
        // could not read): the fwd+bwd curves stand in; their causal over no-mask ratio at 8K
        // (0.905) is H100 FA2's forward one (0.900).
        fwd_causal: FA2_A100_FWD_BWD_CAUSAL,
        forward_stand_in: Some(
            "the A100 forward costed at FlashAttention-2's A100 fwd+bwd rates (no forward A100 \
             curve is legible in its paper)",
        ),
        fwd_full: FA2_A100_FWD_BWD_FULL,
        fwd_bwd_causal: FA2_A100_FWD_BWD_CAUSAL,
        fwd_bwd_full: FA2_A100_FWD_BWD_FULL,
        fwd_tile: FA2_FWD_TILE,
        bwd_tile: FA2_BWD_TILE,
        hbm_bytes_per_s: Sourced {
            value: 2039e9,
            source: "NVIDIA A100 datasheet: A100 80GB SXM, HBM2e 2,039 GB/s",
        },
        link_bytes_per_s: Sourced {
            value: 274e9,
            source: "stas00/ml-engineering network/README.md: p2pBandwidthLatencyTest on an \
                     8×A100 NVLink node, 274 GB/s one way of the advertised 300",
        },
        launch_s: LAUNCH,
    },
    FlashGpu {
        name: "8xH800",
        // H800 SXM5 is H100 SXM5's chip with NVLink cut (DeepSeek-V3 report §3.2.2): H100's
        // FlashAttention-2 curves.
        fwd_causal: FA2_H100_FWD_CAUSAL,
        forward_stand_in: None,
        fwd_full: FA2_H100_FWD_FULL,
        fwd_bwd_causal: FA2_H100_FWD_BWD_CAUSAL,
        fwd_bwd_full: FA2_H100_FWD_BWD_FULL,
        fwd_tile: FA2_FWD_TILE,
        bwd_tile: FA2_BWD_TILE,
        hbm_bytes_per_s: Sourced {
            value: 3.35e12,
            source: "NVIDIA H100 datasheet: H100 SXM, HBM3 3.35 TB/s (H800 SXM5 keeps H100 SXM5's \
                     memory)",
        },
        link_bytes_per_s: Sourced {
            value: 160e9,
            source: "DeepSeek-V3 technical report (arXiv:2412.19437) §3.2.2: H800 NVLink offers \
                     160 GB/s; DeepEP measures 153-158 GB/s intranode",
        },
        launch_s: LAUNCH,
    },
];

/// The Striped Attention paper's blockwise JAX attention (not FlashAttention): whole tiles are
/// computed or skipped, so a partly visible tile costs a full one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JaxTiles {
    /// Name in tables.
    pub name: &'static str,
    /// The tile.
    pub tile: Tile,
    /// Attention's matmul rate, FLOP/s (only how much communication hides depends on it).
    pub flops: Sourced,
    /// The model's other matmuls' rate, FLOP/s (bf16 peak).
    pub matmul_flops: Sourced,
    /// One-way bandwidth to the ring neighbour, bytes/s.
    pub link_bytes_per_s: Sourced,
}

/// The Striped Attention paper's two testbeds.
pub const JAX_TILES: &[JaxTiles] = &[
    JaxTiles {
        name: "8xA100",
        tile: Tile {
            rows: 2048,
            cols: 4096,
            source: "Striped Attention paper (Brandon et al. 2023) §4: for A100 80GB GPUs a tile of \
                     2048 queries × 4096 keys",
        },
        flops: Sourced {
            value: 156e12,
            source: "NVIDIA A100 datasheet: TF32 156 TFLOP/s dense (the paper runs attention's \
                     matmuls in TF32)",
        },
        matmul_flops: Sourced {
            value: 312e12,
            source: "NVIDIA A100 datasheet: bf16 312 TFLOP/s dense",
        },
        link_bytes_per_s: Sourced {
            value: 274e9,
            source: "stas00/ml-engineering network/README.md: p2pBandwidthLatencyTest, 8×A100 \
                     NVLink, 274 GB/s one way",
        },
    },
    JaxTiles {
        name: "16xTPUv4",
        tile: Tile {
            rows: 2048,
            cols: 2048,
            source: "Striped Attention paper (Brandon et al. 2023) §4: on TPUs a tile of 2048 × 2048",
        },
        flops: Sourced {
            value: 275e12,
            source: "Google Cloud TPU v4 documentation (system architecture): 275 TFLOP/s bf16",
        },
        matmul_flops: Sourced {
            value: 275e12,
            source: "Google Cloud TPU v4 documentation (system architecture): 275 TFLOP/s bf16",
        },
        link_bytes_per_s: Sourced {
            value: 268e9,
            source: "Ring Attention paper (Liu et al. 2023) Table 2: TPU v4 inter-chip link 268 GB/s",
        },
    },
];

/// Every parameter of the tile-granular layer with its source: (owner, parameter, value, source).
pub fn tile_layer_parameters() -> Vec<(&'static str, String, f64, &'static str)> {
    let mut all = Vec::new();
    for g in FLASH_GPUS {
        for (what, curve) in [
            ("fwd_causal", g.fwd_causal),
            ("fwd_full", g.fwd_full),
            ("fwd_bwd_causal", g.fwd_bwd_causal),
            ("fwd_bwd_full", g.fwd_bwd_full),
        ] {
            for (len, tflops) in curve.points {
                all.push((g.name, format!("{what}@{len}"), *tflops, curve.source));
            }
        }
        for (what, tile) in [("fwd_tile", g.fwd_tile), ("bwd_tile", g.bwd_tile)] {
            all.push((
                g.name,
                format!("{what}.rows"),
                tile.rows as f64,
                tile.source,
            ));
            all.push((
                g.name,
                format!("{what}.cols"),
                tile.cols as f64,
                tile.source,
            ));
        }
        for (what, p) in [
            ("hbm_bytes_per_s", g.hbm_bytes_per_s),
            ("link_bytes_per_s", g.link_bytes_per_s),
            ("launch_s", g.launch_s),
        ] {
            all.push((g.name, what.to_string(), p.value, p.source));
        }
    }
    for j in JAX_TILES {
        all.push((
            j.name,
            "tile.rows".into(),
            j.tile.rows as f64,
            j.tile.source,
        ));
        all.push((
            j.name,
            "tile.cols".into(),
            j.tile.cols as f64,
            j.tile.source,
        ));
        all.push((j.name, "flops".into(), j.flops.value, j.flops.source));
        all.push((
            j.name,
            "matmul_flops".into(),
            j.matmul_flops.value,
            j.matmul_flops.source,
        ));
        all.push((
            j.name,
            "link_bytes_per_s".into(),
            j.link_bytes_per_s.value,
            j.link_bytes_per_s.source,
        ));
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tile_layer_parameter_names_its_source() {
        let all = tile_layer_parameters();
        assert!(all.len() > 60, "{} parameters", all.len());
        for (owner, name, value, source) in all {
            assert!(
                value.is_finite() && value > 0.0,
                "{owner} {name} = {value}: not a positive number"
            );
            // A source names a document (a paper, datasheet, file or report), not a fit.
            let names_a_document = [
                "paper",
                "datasheet",
                "report",
                "documentation",
                ".h",
                ".py",
                ".md",
                ".png",
            ]
            .iter()
            .any(|d| source.contains(d));
            assert!(
                names_a_document && !source.to_lowercase().contains("fitted"),
                "{owner} {name}: source '{source}'"
            );
        }
    }

    #[test]
    fn a_curve_steps_to_the_longest_published_length_below() {
        let c = FA2_H100_FWD_CAUSAL;
        assert_eq!(c.flops_at(8192), 333e12);
        assert_eq!(c.flops_at(12000), 333e12);
        assert_eq!(c.flops_at(100), 191e12);
        assert_eq!(c.flops_at(1 << 20), 335e12);
    }
}
