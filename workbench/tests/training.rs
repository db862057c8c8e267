//! Training is exact across rank counts: the same seed and data on 1 rank, 4 zig-zag ranks and 8 striped
//! ranks give the same losses and parameters.

use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::Backend;
use std::sync::atomic::AtomicBool;
use std::time::Duration;
use workbench::model::LlamaConfig;
use workbench::train::{Example, TrainOptions, flat_params, train};
use workbench::{BackwardScheme, Direction, RingConfig};

type B = Autodiff<Flex>;

const VOCAB: usize = 23;
const STEPS: usize = 30;

/// A copy task: the second half of each sequence repeats the first; only the second half is trained.
fn batch_for(step: usize) -> Vec<Example> {
    (0..3)
        .map(|row| {
            let half: Vec<u32> = (0..14)
                .map(|i| ((step * 7 + row * 5 + i * 3) % (VOCAB - 1)) as u32 + 1)
                .collect();
            let tokens: Vec<u32> = half.iter().chain(&half).copied().collect();
            let weights = (0..tokens.len() - 1)
                .map(|i| if i + 1 >= half.len() { 1.0 } else { 0.0 })
                .collect();
            Example { tokens, weights }
        })
        .collect()
}

fn run(ranks: usize, strategy: &str, backward: BackwardScheme) -> (Vec<f64>, Vec<f32>) {
    let config = LlamaConfig::new(VOCAB)
        .with_d_model(32)
        .with_heads(4)
        .with_kv_heads(2)
        .with_ffn_chunk(5);
    <B as Backend>::seed(&Default::default(), 11);
    let model = config.init::<B>(&Default::default());
    let options = TrainOptions {
        ranks,
        ring: RingConfig {
            causal: true,
            forward: Direction::Ccw,
            backward,
            ..Default::default()
        },
        steps: STEPS,
        lr: 3e-3,
        warmup_steps: 5,
        min_lr_ratio: 0.1,
        weight_decay: 0.01,
        grad_clip: Some(1.0),
        seed: 0,
        checksum_every: 10,
        pad_token: 0,
        timeout: Duration::from_secs(60),
    };
    let partition = strategies::by_name(strategy).unwrap();
    let trained = train(
        model,
        partition,
        &options,
        batch_for,
        |_| {},
        &AtomicBool::new(false),
    )
    .unwrap();
    (trained.losses, flat_params(&trained.model))
}

fn max_rel(a: &[f32], b: &[f32]) -> f64 {
    let scale = b.iter().fold(0.0f64, |m, &x| m.max(f64::from(x).abs()));
    a.iter()
        .zip(b)
        .fold(0.0f64, |m, (&x, &y)| m.max(f64::from(x - y).abs()))
        / scale
}

#[test]
fn losses_and_parameters_agree_across_rank_counts() {
    let (base_losses, base_params) = run(1, "contiguous", BackwardScheme::Kv);
    assert_eq!(base_losses.len(), STEPS);
    assert!(
        base_losses[STEPS - 1] < base_losses[0] * 0.9,
        "it learns: {base_losses:?}"
    );
    // Every length is padded to a multiple of 16, so all three runs see identical batches.
    for (ranks, strategy, backward) in [
        (4, "zigzag", BackwardScheme::Q),
        (8, "striped", BackwardScheme::KvReverse),
    ] {
        let (losses, params) = run(ranks, strategy, backward);
        for (step, (a, b)) in losses.iter().zip(&base_losses).enumerate() {
            assert!(
                (a - b).abs() <= 1e-4 * b.abs(),
                "N={ranks} {strategy} step {step}: loss {a} vs {b}"
            );
        }
        let diff = max_rel(&params, &base_params);
        assert!(
            diff <= 1e-4,
            "N={ranks} {strategy}: parameters differ by {diff:.3e}"
        );
    }
}
