//! LoRA fine-tuning is exact: a new adapter starts as the base model; the adapters' gradient is the
//! chain rule of the merged model's (`dA = s·G·Bᵀ`, `dB = s·Aᵀ·G` for the merged weight's gradient
//! G, computed by a different path: full fine-tuning of `W + s·A·B`); checkpointing and the rank
//! count do not change it; the base weights get no gradient and do not move; training converges to
//! the same losses on 1 and 4 ranks.

use burn::backend::{Autodiff, Flex};
use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::Tensor;
use std::sync::atomic::AtomicBool;
use std::time::Duration;
use workbench::model::{Checkpoint, Llama, LlamaConfig, LoraConfig, LoraInit, LoraTarget};
use workbench::train::{Example, TrainOptions, flat_params, global_gradient, train};
use workbench::{BackwardScheme, Direction, RingConfig};

type B = Autodiff<Flex>;

const VOCAB: usize = 23;

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

fn config(checkpoint: Checkpoint) -> LlamaConfig {
    LlamaConfig::new(VOCAB)
        .with_d_model(32)
        .with_heads(4)
        .with_kv_heads(2)
        .with_ffn_chunk(5)
        .with_qkv_bias(true)
        .with_checkpoint(checkpoint)
}

fn base(checkpoint: Checkpoint) -> Llama<B> {
    let config = config(checkpoint);
    let device = Default::default();
    workbench::model::lazy::seeded::<B, _>(11, &device, || config.init::<B>(&device))
}

fn lora(init: LoraInit, train_norms: bool) -> LoraConfig {
    LoraConfig {
        rank: 4,
        alpha: 8.0,
        dropout: 0.0,
        targets: LoraTarget::ALL.to_vec(),
        rslora: false,
        train_embeddings: false,
        train_norms,
        init,
    }
}

const RING: RingConfig = RingConfig {
    causal: true,
    forward: Direction::Ccw,
    backward: BackwardScheme::Kv,
    scale: None,
    window: None,
    softcap: None,
    kernel: workbench::Kernel::Fused,
    lockstep: false,
    precision: workbench::dtype::Precision::F32,
};

fn gradient(model: &Llama<B>, ranks: usize, strategy: &str) -> (f64, Vec<f32>) {
    let partition = strategies::by_name(strategy).unwrap();
    global_gradient(
        model,
        partition,
        ranks,
        RING,
        &batch_for(0),
        Duration::from_secs(60),
    )
    .unwrap()
}

/// Every parameter trainable again (the merged model, fine-tuned in full).
struct Trainable;

impl ModuleMapper<B> for Trainable {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        param.set_require_grad(true)
    }
}

/// (element count, trainable) of every parameter, in module order.
fn parameters(model: &Llama<B>) -> Vec<(usize, bool)> {
    struct Sizes(Vec<(usize, bool)>);
    impl ModuleVisitor<B> for Sizes {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let v = param.val();
            self.0.push((v.shape().num_elements(), v.is_require_grad()));
        }
    }
    let mut sizes = Sizes(Vec::new());
    model.visit(&mut sizes);
    sizes.0
}

/// max |a − b| / max |b|, NaN-aware.
fn max_rel(a: &[f32], b: &[f32]) -> f64 {
    ringbench_tests::rel_err(a, b)
}

#[test]
fn a_new_adapter_starts_as_the_base_model() {
    let model = base(Checkpoint::None);
    let (loss, _) = gradient(&model, 1, "contiguous");
    let adapted = model.with_lora(&lora(LoraInit::Peft, false), 3).unwrap();
    let (l, g) = gradient(&adapted, 1, "contiguous");
    // B = 0: the branch adds exact zeros.
    assert_eq!(l, loss);
    // The gradient holds the adapters alone: 7 pairs of A [in, 4] and B [4, out] a layer.
    let trained: usize = parameters(&adapted)
        .iter()
        .filter(|(_, t)| *t)
        .map(|(n, _)| n)
        .sum();
    let (d, q, kv, f) = (32, 32, 16, 96);
    let per_layer = 4 * (d + q) + 2 * 4 * (d + kv) + 4 * (q + d) + 2 * 4 * (d + f) + 4 * (f + d);
    assert_eq!(trained, 2 * per_layer);
    assert_eq!(
        g.len(),
        trained,
        "the flat gradient carries the adapters only"
    );
    // With B = 0 only B gets a gradient.
    assert!(g.iter().any(|&x| x != 0.0));
}

/// The adapters' gradient, on 1 rank and 4, under every checkpointing, is the merged model's
/// gradient carried through `W + s·A·B`.
#[test]
fn adapter_gradients_are_the_merged_models_chain_rule() {
    let spec = lora(LoraInit::Random, false);
    let scale = spec.scale();
    let adapted = base(Checkpoint::None).with_lora(&spec, 5).unwrap();
    let (loss, g) = gradient(&adapted, 1, "contiguous");
    // The merged model, every weight trainable: its gradient G per weight.
    let merged = adapted.clone().merge_lora().map(&mut Trainable);
    let (merged_loss, full) = gradient(&merged, 1, "contiguous");
    // Two f32 evaluations of one loss over ≤ 84 weighted tokens: √84·u each (reordered sums).
    assert!(
        (loss - merged_loss).abs() <= 1e-6 * loss.abs(),
        "{loss} {merged_loss}"
    );
    // Module order of the merged model: embedding, then per layer attn_norm, wq (+ bias), wk (+
    // bias), wv (+ bias), wo, ffn_norm, w1, w3, w2; the adapted model's flat gradient: per layer,
    // the 7 targets' A then B.
    let sizes: Vec<usize> = parameters(&merged).iter().map(|(n, _)| *n).collect();
    let mut offsets = vec![0];
    for n in &sizes {
        offsets.push(offsets.last().unwrap() + n);
    }
    let weight_of = |layer: usize, target: LoraTarget| -> usize {
        // The embedding, then 12 parameters a layer, in the struct's order: attn_norm, wq.w,
        // wq.b, wk.w, wk.b, wv.w, wv.b, wo.w, ffn_norm, w1, w3, w2.
        let within = match target {
            LoraTarget::Q => 1,
            LoraTarget::K => 3,
            LoraTarget::V => 5,
            LoraTarget::O => 7,
            LoraTarget::Gate => 9,
            LoraTarget::Up => 10,
            LoraTarget::Down => 11,
        };
        1 + layer * 12 + within
    };
    let pairs: Vec<Vec<[Vec<f32>; 2]>> = adapted
        .lora_layers()
        .unwrap()
        .iter()
        .map(|l| {
            LoraTarget::ALL
                .iter()
                .map(|&t| {
                    let [a, b] = l.pair(t).unwrap().values();
                    [
                        workbench::host::read(a.inner()),
                        workbench::host::read(b.inner()),
                    ]
                })
                .collect()
        })
        .collect();
    let mut expected = Vec::new();
    for (layer, targets) in pairs.iter().enumerate() {
        for (t, [a, b]) in LoraTarget::ALL.iter().zip(targets) {
            let index = weight_of(layer, *t);
            let gw = &full[offsets[index]..offsets[index + 1]];
            let (inputs, rank) = (a.len() / 4, 4);
            let outputs = b.len() / rank;
            assert_eq!(gw.len(), inputs * outputs, "layer {layer} {t:?}");
            // dA = s·G·Bᵀ [in, r]; dB = s·Aᵀ·G [r, out], in float64.
            for i in 0..inputs {
                for r in 0..rank {
                    let sum: f64 = (0..outputs)
                        .map(|o| f64::from(gw[i * outputs + o]) * f64::from(b[r * outputs + o]))
                        .sum();
                    expected.push((scale * sum) as f32);
                }
            }
            for r in 0..rank {
                for o in 0..outputs {
                    let sum: f64 = (0..inputs)
                        .map(|i| f64::from(a[i * rank + r]) * f64::from(gw[i * outputs + o]))
                        .sum();
                    expected.push((scale * sum) as f32);
                }
            }
        }
    }
    assert_eq!(g.len(), expected.len());
    // Each side is an f32 evaluation of the same gradient within attention's 1e-5 and the model's
    // sums (as tests/training.rs bounds a gradient): their difference within twice that.
    let diff = max_rel(&g, &expected);
    assert!(diff <= 2e-5, "adapter gradient vs chain rule: {diff:.3e}");
    // The same gradient whatever the layer keeps (the feed-forward's and the checkpointed layer's
    // hand-written backwards take W + s·A·B) and on 4 zig-zag ranks.
    for (checkpoint, ranks, strategy) in [
        (Checkpoint::Ffn, 1, "contiguous"),
        (Checkpoint::Block, 1, "contiguous"),
        (Checkpoint::None, 4, "zigzag"),
        (Checkpoint::Block, 4, "zigzag"),
        (Checkpoint::Ffn, 2, "striped"),
    ] {
        let model = base(checkpoint).with_lora(&spec, 5).unwrap();
        let (l, other) = gradient(&model, ranks, strategy);
        assert!(
            (l - loss).abs() <= 1e-6 * loss.abs(),
            "{checkpoint} N={ranks}: loss {l} vs {loss}"
        );
        let diff = max_rel(&other, &g);
        assert!(
            diff <= 1e-5,
            "{checkpoint} N={ranks} {strategy}: gradient differs by {diff:.3e}"
        );
    }
}

/// LoRA training (with the norms, LongLoRA's "+") gives the same losses on 1 rank and 4, leaves
/// every base weight as it was, bit for bit, and moves the adapters and norms.
#[test]
fn lora_training_is_the_same_on_one_and_four_ranks_and_leaves_the_base() {
    let spec = lora(LoraInit::Peft, true);
    let start = base(Checkpoint::None).with_lora(&spec, 7).unwrap();
    let before = parameters(&start);
    let values_before = flat_params(&start);
    let run = |ranks: usize, strategy: &str| {
        let options = TrainOptions {
            ranks,
            ring: RING,
            steps: 12,
            lr: 3e-3,
            warmup_steps: 2,
            grad_clip: Some(1.0),
            timeout: Duration::from_secs(60),
            ..Default::default()
        };
        let trained = train(
            start.clone(),
            strategies::by_name(strategy).unwrap(),
            &options,
            batch_for,
            |_| {},
            &AtomicBool::new(false),
        )
        .unwrap();
        (trained.losses, flat_params(&trained.model))
    };
    let (losses, params) = run(1, "contiguous");
    assert!(losses[11] < losses[0], "it learns: {losses:?}");
    // As tests/training.rs bounds it: a step's gradient moves by ~1e-6 relative across rank
    // counts, AdamW passes that on, 12 steps add it up.
    let (four, params4) = run(4, "zigzag");
    for (step, (a, b)) in losses.iter().zip(&four).enumerate() {
        assert!((a - b).abs() <= 1e-4 * a.abs(), "step {step}: {a} vs {b}");
    }
    assert!(max_rel(&params4, &params) <= 1e-4);
    // Frozen weights are bit for bit what they were; the trainable ones moved.
    let mut at = 0;
    let (mut frozen, mut moved) = (0, 0);
    for (n, trainable) in before {
        let (old, new) = (&values_before[at..at + n], &params[at..at + n]);
        if trainable {
            moved += usize::from(old != new);
        } else {
            assert_eq!(old, new, "a frozen parameter of {n} values moved");
            frozen += 1;
        }
        at += n;
    }
    // 2 layers × (7 weights + 3 biases) + embedding + head frozen; 2 × 2 + 1 norms and 2 × 14
    // adapter matrices trained (each moved).
    assert_eq!(frozen, 2 * 10 + 2);
    assert_eq!(moved, 2 * 2 + 1 + 2 * 14);
}
