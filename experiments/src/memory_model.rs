//! An analytic per-device memory model at the paper's scale, printed beside the paper's Table 3
//! (maximum context length, in thousands of tokens, for LLaMA-style models trained with FSDP).
//!
//! Per device, in the paper's setting (full precision, full gradient checkpointing, FSDP over all
//! devices): model states `16 · params / devices` bytes (fp32 parameters, gradients, Adam's two
//! moments); each layer's input kept for recomputation, `layers · t · hidden · 4` bytes for the `t`
//! tokens a device holds; the largest activation of the one layer being recomputed, from the paper's
//! Table 1 (bytes per layer in bfloat16, doubled for fp32): vanilla `max(2·heads·s², 8·s·hidden)`,
//! memory-efficient attention `8·s·hidden`, memory-efficient attention and feed-forward (BPT)
//! `2·s·hidden`, Ring Attention `6·c·hidden` with `c = s / devices`; and the output logits
//! `t · vocab · 4`. A baseline device holds a whole sequence (`t = s`); a ring device holds `s / devices`
//! tokens of one sequence. The maximum context is the largest power of two (in units of 1K tokens) that
//! fits the device's memory.

/// A LLaMA configuration (OpenLLaMA's sizes for 3B; LLaMA's for 7B, 13B, 30B).
#[derive(Debug, Clone, Copy)]
pub struct LlamaSize {
    /// Name (3B, 7B, 13B, 30B).
    pub name: &'static str,
    /// Model width.
    pub hidden: usize,
    /// Decoder layers.
    pub layers: usize,
    /// Attention heads.
    pub heads: usize,
    /// Feed-forward width.
    pub ffn: usize,
    /// Vocabulary size.
    pub vocab: usize,
}

impl LlamaSize {
    /// Parameter count.
    pub fn params(&self) -> f64 {
        let (h, f) = (self.hidden as f64, self.ffn as f64);
        let layer = 4.0 * h * h + 3.0 * h * f + 2.0 * h;
        self.layers as f64 * layer + 2.0 * self.vocab as f64 * h + h
    }
}

/// The LLaMA sizes of the paper's Table 3.
pub const SIZES: [LlamaSize; 4] = [
    LlamaSize {
        name: "3B",
        hidden: 3200,
        layers: 26,
        heads: 32,
        ffn: 8640,
        vocab: 32000,
    },
    LlamaSize {
        name: "7B",
        hidden: 4096,
        layers: 32,
        heads: 32,
        ffn: 11008,
        vocab: 32000,
    },
    LlamaSize {
        name: "13B",
        hidden: 5120,
        layers: 40,
        heads: 40,
        ffn: 13824,
        vocab: 32000,
    },
    LlamaSize {
        name: "30B",
        hidden: 6656,
        layers: 60,
        heads: 52,
        ffn: 17920,
        vocab: 32000,
    },
];

/// An accelerator pool: device count and memory per device (GB, 1e9 bytes).
#[derive(Debug, Clone, Copy)]
pub struct Pool {
    /// Name in the table.
    pub name: &'static str,
    /// Devices in the pool.
    pub devices: usize,
    /// A100: 80 GB (the DGX A100 640 GB server); TPU v3: 16 GB per core (TPUv3-512 counts cores);
    /// TPU v4: 32 GB per chip; TPU v5e: 16 GB per chip (Google Cloud TPU system architecture pages).
    pub memory_gb: f64,
}

/// The methods compared, in the paper's column order.
pub const METHODS: [&str; 4] = [
    "vanilla",
    "memory-efficient",
    "memory-efficient+ffn",
    "ring",
];

/// The paper's Table 3 (×1e3 tokens): pool, model, then vanilla, ME attention, ME attn + FFN, ring.
pub const PAPER_TABLE_3: [(Pool, &str, [f64; 4]); 13] = {
    const A100_8: Pool = Pool {
        name: "8x A100 NVLink",
        devices: 8,
        memory_gb: 80.0,
    };
    const A100_32: Pool = Pool {
        name: "32x A100 InfiniBand",
        devices: 32,
        memory_gb: 80.0,
    };
    const V3: Pool = Pool {
        name: "TPUv3-512",
        devices: 512,
        memory_gb: 16.0,
    };
    const V4: Pool = Pool {
        name: "TPUv4-1024",
        devices: 512,
        memory_gb: 32.0,
    };
    const V5E: Pool = Pool {
        name: "TPUv5e-256",
        devices: 256,
        memory_gb: 16.0,
    };
    [
        (A100_8, "3B", [4.0, 32.0, 64.0, 512.0]),
        (A100_8, "7B", [2.0, 16.0, 32.0, 256.0]),
        (A100_8, "13B", [2.0, 4.0, 16.0, 128.0]),
        (A100_32, "7B", [4.0, 64.0, 128.0, 4096.0]),
        (A100_32, "13B", [4.0, 32.0, 64.0, 2048.0]),
        (V3, "7B", [1.0, 4.0, 8.0, 2048.0]),
        (V3, "13B", [1.0, 2.0, 8.0, 1024.0]),
        (V4, "3B", [8.0, 16.0, 32.0, 16384.0]),
        (V4, "7B", [4.0, 8.0, 16.0, 8192.0]),
        (V4, "13B", [4.0, 8.0, 16.0, 4096.0]),
        (V4, "30B", [2.0, 4.0, 8.0, 2048.0]),
        (V5E, "3B", [4.0, 8.0, 32.0, 4096.0]),
        (V5E, "7B", [2.0, 8.0, 16.0, 2048.0]),
    ]
};

/// Bytes per device of one training step at sequence length `s` (tokens).
pub fn bytes_per_device(m: &LlamaSize, devices: usize, method: &str, s: f64) -> f64 {
    let (h, n) = (m.hidden as f64, devices as f64);
    let tokens = if method == "ring" { s / n } else { s };
    let states = 16.0 * m.params() / n;
    let checkpoints = m.layers as f64 * tokens * h * 4.0;
    // The paper's Table 1 counts bfloat16 bytes; full precision doubles them.
    let layer_peak = 2.0 * table1_layer_bytes(method, s, s / n, h, m.heads as f64, 4.0 * h);
    let logits = tokens * m.vocab as f64 * 4.0;
    states + checkpoints + layer_peak + logits
}

/// The paper's Table 1: the largest activation of one layer, in bfloat16 bytes (batch 1), for a
/// sequence of `s` tokens, blocks of `c` tokens (a ring device's share), width `hidden`, `heads`
/// heads and a feed-forward `ffn_hidden` wide: vanilla `max(2·heads·s², 2·s·ffn_hidden)` (the score
/// matrix or the feed-forward's hidden activation), memory-efficient attention `2·s·ffn_hidden`,
/// memory-efficient attention and feed-forward (BPT) `2·s·hidden`, Ring Attention `6·c·hidden`.
/// The paper's Transformer has `ffn_hidden = 4·hidden`, which makes its `8·s·hidden`. `method` is
/// one of [`METHODS`].
pub fn table1_layer_bytes(
    method: &str,
    s: f64,
    c: f64,
    hidden: f64,
    heads: f64,
    ffn_hidden: f64,
) -> f64 {
    match method {
        "vanilla" => (2.0 * heads * s * s).max(2.0 * s * ffn_hidden),
        "memory-efficient" => 2.0 * s * ffn_hidden,
        "memory-efficient+ffn" => 2.0 * s * hidden,
        _ => 6.0 * c * hidden,
    }
}

/// Largest power-of-two context (in units of 1024 tokens) that fits; `None` if not even 1K does.
pub fn max_context_k(m: &LlamaSize, pool: &Pool, method: &str) -> Option<f64> {
    let budget = pool.memory_gb * 1e9;
    let mut best = None;
    let mut k = 1.0f64;
    while k <= (1u64 << 40) as f64
        && bytes_per_device(m, pool.devices, method, k * 1024.0) <= budget
    {
        best = Some(k);
        k *= 2.0;
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_counts_are_the_named_sizes() {
        let billions: Vec<f64> = SIZES.iter().map(|m| m.params() / 1e9).collect();
        for (got, want) in billions.iter().zip([3.4, 6.7, 13.0, 32.5]) {
            assert!((got / want - 1.0).abs() < 0.03, "{billions:?}");
        }
    }

    #[test]
    fn ring_context_is_device_count_times_its_per_device_share() {
        let m = &SIZES[1];
        let pool = Pool {
            name: "t",
            devices: 8,
            memory_gb: 80.0,
        };
        let ring = max_context_k(m, &pool, "ring").unwrap();
        let bpt = max_context_k(m, &pool, "memory-efficient+ffn").unwrap();
        assert!(ring >= 4.0 * bpt, "ring {ring}K vs BPT {bpt}K");
    }
}
