//! LoRA against PyTorch + peft: the committed fixture (`tests/fixtures/lora/`, written by
//! `make_lora_fixture.py`) is a PEFT adapter on the tiny Llama fixture with peft's float64 logits,
//! loss and gradients. The adapter read onto the base gives peft's logits (as a branch and merged,
//! on 1 and 2 ranks); its gradients on 1, 2 and 4 ranks are peft's; an adapter ringbench writes
//! has PEFT's names and reads back bit for bit; a bad adapter is refused naming what is wrong.

mod common;

use burn::backend::{Autodiff, Flex};
use common::{decoding, temp_dir};
use experiments::npy;
use reference::compare::deviation;
use safetensors::SafeTensors;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use workbench::hf::{load_model, read_adapter, write_adapter};
use workbench::model::{Llama, LoraTarget};
use workbench::train::{Example, Prompt, flat_params, full_logits, global_gradient};

type B = Autodiff<Flex>;

/// The issue's bound, as for every Hugging Face comparison here: f32 against float64 over these
/// sizes accumulates about 1e-5 of the largest logit (`tests/hf.rs`).
const BOUND: f64 = 1e-4;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lora")
}

fn base_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/llama_gqa")
}

/// The base with the fixture's adapter on it, on backend `X`.
fn adapted<X: burn::tensor::backend::Backend>() -> Llama<X> {
    let device = Default::default();
    let (base, config) = load_model::<X>(&base_dir(), &device).unwrap();
    let adapter = read_adapter::<X>(&fixture().join("adapter"), &config.model, &device).unwrap();
    base.with_peft(adapter).unwrap()
}

fn tokens() -> Vec<Vec<u32>> {
    npy::read_ids(&base_dir().join("tokens.npy")).unwrap()
}

#[test]
fn a_peft_adapter_gives_peft_logits_as_a_branch_and_merged() {
    let want = npy::read(&fixture().join("logits.npy")).unwrap();
    let branch = adapted::<Flex>();
    let merged = adapted::<Flex>().merge_lora();
    assert!(merged.lora_layers().is_none());
    for (model, ranks, strategy, label) in [
        (&branch, 1, "contiguous", "branch"),
        (&branch, 2, "zigzag", "branch"),
        (&merged, 1, "contiguous", "merged"),
        (&merged, 2, "striped", "merged"),
    ] {
        let mut got = Vec::new();
        for t in tokens() {
            got.extend(
                full_logits(model, &Prompt::from(t), &decoding(strategy, ranks, &[], 0)).unwrap(),
            );
        }
        let d = deviation(&got, &want.data);
        assert!(d.within(BOUND), "{label} on {ranks} {strategy} ranks: {d}");
    }
}

/// The fixture's float64 gradients, by key.
fn peft_grads() -> BTreeMap<String, (Vec<usize>, Vec<f64>)> {
    let bytes = std::fs::read(fixture().join("grads.safetensors")).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    file.tensors()
        .into_iter()
        .map(|(name, view)| {
            assert_eq!(view.dtype(), safetensors::Dtype::F64, "{name}");
            let values = view
                .data()
                .chunks_exact(8)
                .map(|b| f64::from_le_bytes(b.try_into().unwrap()))
                .collect();
            (name, (view.shape().to_vec(), values))
        })
        .collect()
}

/// `[rows, cols]` row-major as `[cols, rows]`.
fn transposed(values: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut out = vec![0.0; values.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = values[r * cols + c];
        }
    }
    out
}

#[test]
fn lora_gradients_equal_peft_ones_on_one_two_and_four_ranks() {
    let model = adapted::<B>();
    let rows: Vec<Example> = tokens()
        .into_iter()
        .map(|t| Example {
            weights: vec![1.0; t.len() - 1],
            tokens: t,
        })
        .collect();
    let ring = workbench::RingConfig {
        causal: true,
        ..Default::default()
    };
    let gradient = |ranks: usize, strategy: &str| {
        global_gradient(
            &model,
            strategies::by_name(strategy).unwrap(),
            ranks,
            ring,
            &rows,
            Duration::from_secs(60),
        )
        .unwrap()
    };
    // The flat gradient's order is the module's: each layer's two norms, then its adapters (A
    // then B, target by target), then the final norm; PEFT stores A as [r, in] and B as [out, r].
    let grads = peft_grads();
    let layer = |i: usize, what: &str| format!("base_model.model.model.layers.{i}.{what}");
    let mut want = Vec::new();
    for i in 0..2 {
        want.extend(&grads[&layer(i, "input_layernorm.weight")].1);
        want.extend(&grads[&layer(i, "post_attention_layernorm.weight")].1);
        for target in LoraTarget::ALL {
            let module = match target {
                LoraTarget::Gate | LoraTarget::Up | LoraTarget::Down => "mlp",
                _ => "self_attn",
            };
            for half in ["lora_A", "lora_B"] {
                let (shape, values) =
                    &grads[&layer(i, &format!("{module}.{}.{half}.weight", target.name()))];
                want.extend(transposed(values, shape[0], shape[1]));
            }
        }
    }
    want.extend(&grads["base_model.model.model.norm.weight"].1);
    let want: Vec<f32> = want.iter().map(|&g| g as f32).collect();
    let peft_loss: f64 = serde_json::from_str::<serde_json::Value>(
        &std::fs::read_to_string(fixture().join("loss.json")).unwrap(),
    )
    .unwrap()["loss"]
        .as_f64()
        .unwrap();
    let (loss, base) = gradient(1, "contiguous");
    assert!(
        (loss - peft_loss).abs() <= BOUND * peft_loss,
        "loss {loss} vs peft's {peft_loss}"
    );
    assert_eq!(base.len(), want.len(), "the trained tensors, all of them");
    let d = deviation(&base, &want);
    assert!(d.within(BOUND), "1 rank against peft: {d}");
    for (ranks, strategy) in [(2, "zigzag"), (4, "striped")] {
        let (l, g) = gradient(ranks, strategy);
        assert!((l - loss).abs() <= 1e-6 * loss, "N={ranks}: {l} vs {loss}");
        let diff = reference::compare::rel_err(&g, &base);
        assert!(diff <= 1e-5, "N={ranks} {strategy}: {diff:.3e}");
    }
}

/// Every tensor of a safetensors file: name → (shape, bytes).
fn tensors_of(path: &Path) -> BTreeMap<String, (Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap();
    SafeTensors::deserialize(&bytes)
        .unwrap()
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, (v.shape().to_vec(), v.data().to_vec())))
        .collect()
}

#[test]
fn an_adapter_written_has_peft_names_and_reads_back_bit_for_bit() {
    let model = adapted::<Flex>();
    let config = read_adapter::<Flex>(
        &fixture().join("adapter"),
        &load_model::<Flex>(&base_dir(), &Default::default())
            .unwrap()
            .1
            .model,
        &Default::default(),
    )
    .unwrap()
    .config;
    let out = temp_dir("lora-written");
    write_adapter(&model, &config, "llama_gqa", &out).unwrap();
    // PEFT's own file, tensor for tensor: the same names, shapes and f32 bytes.
    let theirs = tensors_of(&fixture().join("adapter/adapter_model.safetensors"));
    let ours = tensors_of(&out.join("adapter_model.safetensors"));
    assert_eq!(
        ours.keys().collect::<Vec<_>>(),
        theirs.keys().collect::<Vec<_>>()
    );
    for (name, value) in &theirs {
        assert_eq!(&ours[name], value, "{name}");
    }
    let settings: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("adapter_config.json")).unwrap())
            .unwrap();
    assert_eq!(settings["r"], 4);
    assert_eq!(settings["lora_alpha"], 8.0);
    assert_eq!(settings["peft_type"], "LORA");
    // Read back: the same parameters.
    let device = Default::default();
    let (base, hf) = load_model::<Flex>(&base_dir(), &device).unwrap();
    let again = base
        .with_peft(read_adapter::<Flex>(&out, &hf.model, &device).unwrap())
        .unwrap();
    assert_eq!(flat_params(&again), flat_params(&model));
    let _ = std::fs::remove_dir_all(out);
}

/// What an adapter holds that is not computed here, or that does not fit the base, is refused in
/// one line naming it.
#[test]
fn bad_adapters_are_refused_by_name() {
    let device = Default::default();
    let model = load_model::<Flex>(&base_dir(), &device).unwrap().1.model;
    let copy = |name: &str| {
        let dir = temp_dir(name);
        for f in ["adapter_config.json", "adapter_model.safetensors"] {
            std::fs::copy(fixture().join("adapter").join(f), dir.join(f)).unwrap();
        }
        dir
    };
    let edit = |dir: &Path, change: &dyn Fn(&mut serde_json::Map<String, serde_json::Value>)| {
        let path = dir.join("adapter_config.json");
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        change(v.as_object_mut().unwrap());
        std::fs::write(&path, v.to_string()).unwrap();
    };
    let refusal = |dir: &Path| {
        let text = match read_adapter::<Flex>(dir, &model, &device) {
            Ok(_) => panic!("{} was read", dir.display()),
            Err(e) => e.to_string(),
        };
        println!("{text}");
        assert_eq!(text.lines().count(), 1, "{text}");
        text
    };
    let cases: [(
        &str,
        &dyn Fn(&mut serde_json::Map<String, serde_json::Value>),
        &str,
    ); 5] = [
        (
            "lora-dora",
            &|m| {
                m.insert("use_dora".into(), true.into());
            },
            "use_dora: true: not computed here",
        ),
        (
            "lora-bias",
            &|m| {
                m.insert("bias".into(), "all".into());
            },
            "bias: \"all\"",
        ),
        (
            "lora-type",
            &|m| {
                m.insert("peft_type".into(), "IA3".into());
            },
            "peft_type",
        ),
        (
            "lora-target",
            &|m| {
                m.insert(
                    "target_modules".into(),
                    serde_json::json!(["q_proj", "lm_head"]),
                );
            },
            "\"lm_head\"",
        ),
        (
            "lora-rank",
            &|m| {
                m.insert("r".into(), 8.into());
            },
            "r = 8 and the base model give [8, 64]",
        ),
    ];
    for (name, change, want) in cases {
        let dir = copy(name);
        edit(&dir, change);
        let text = refusal(&dir);
        assert!(text.contains(want), "{name}: {text}");
        let _ = std::fs::remove_dir_all(dir);
    }
    // Fewer targets than the file holds: the rest would be left unread.
    let dir = copy("lora-extra");
    edit(&dir, &|m| {
        m.insert("target_modules".into(), serde_json::json!(["q_proj"]));
    });
    let text = refusal(&dir);
    assert!(text.contains("refused rather than left unread"), "{text}");
    let _ = std::fs::remove_dir_all(dir);
}
