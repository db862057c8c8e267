//! Kernel-only timing of the fused tile: one rank, whole sequence, no ring and no Burn.
//!
//! `cargo run --release -p workbench --example tile_profile -- SEQ HEADS HEAD_DIM CAUSAL(0|1) [REPEATS]`
//! separates the kernel's rate from the pipeline's overhead in `ringbench bench attn`.

use datasets::rng::SplitMix64;
use std::time::Instant;
use workbench::kernels::Scores;
use workbench::kernels::fused::{BackwardTile, OnlineSoftmax, TileDims, backward, softmax_delta};
use workbench::kernels::mask::windows;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Seeded uniform values in [−0.5, 0.5).
fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = SplitMix64::new(seed);
    (0..n).map(|_| rng.uniform_in(-0.5, 0.5) as f32).collect()
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("arguments are integers"))
        .collect();
    let [t, h, d, causal] = args[..4] else {
        panic!("usage: tile_profile SEQ HEADS HEAD_DIM CAUSAL(0|1) [REPEATS]");
    };
    let causal = causal == 1;
    let repeats = args.get(4).copied().unwrap_or(3);
    let dims = TileDims {
        batch: 1,
        heads: h,
        kv_heads: h,
        tq: t,
        tk: t,
        head_dim: d,
    };
    let n = h * t * d;
    let (q, k, v, d_out) = (random(n, 1), random(n, 2), random(n, 3), random(n, 4));
    let pos: Vec<usize> = (0..t).collect();
    let win = windows(&pos, t, &[], strategies::Mask::causal(causal));
    let pairs = if causal { t * (t + 1) / 2 } else { t * t } as f64 * (h * d) as f64;
    let how = Scores {
        scale: 1.0 / (d as f32).sqrt(),
        softcap: None,
        precision: workbench::dtype::Precision::F32,
    };
    for _ in 0..repeats {
        let start = Instant::now();
        let mut softmax = OnlineSoftmax::new(dims, &win, how);
        softmax.attend(&q, &k, &v, &pos);
        let (out, lse) = softmax.finish(None);
        let fwd = start.elapsed().as_secs_f64();
        let delta = softmax_delta(&d_out, &out, d);
        let (mut dq, mut dk, mut dv) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
        let tile = BackwardTile {
            dims,
            q: &q,
            k: &k,
            v: &v,
            d_out: &d_out,
            lse: &lse,
            delta: &delta,
            win_q: &win,
            pos_k: &pos,
            how,
            parallel: true,
        };
        let start = Instant::now();
        backward(&tile, &mut dq, &mut dk, &mut dv);
        let bwd = start.elapsed().as_secs_f64();
        println!(
            "fwd {fwd:.4}s {:.1} GFLOP/s  bwd {bwd:.4}s {:.1} GFLOP/s  fwd+bwd {:.1} GFLOP/s",
            4.0 * pairs / fwd / 1e9,
            10.0 * pairs / bwd / 1e9,
            14.0 * pairs / (fwd + bwd) / 1e9
        );
    }
}
