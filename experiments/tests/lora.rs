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

/// A change to an adapter's settings.
type Edit = dyn Fn(&mut serde_json::Map<String, serde_json::Value>);

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
    let edit = |dir: &Path, change: &Edit| {
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
    let cases: [(&str, &Edit, &str); 5] = [
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

/// ChatML, as SmolLM2 and Qwen2 write it.
const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// The tiny Llama fixture with a chat template, in a fresh directory.
fn chat_model(name: &str) -> PathBuf {
    let dir = temp_dir(name);
    for entry in std::fs::read_dir(base_dir()).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
    }
    std::fs::write(dir.join("chat_template.jinja"), CHATML).unwrap();
    dir
}

/// A conversation's tokens are its template's text, a message at a time; exactly the assistant's
/// pieces (the reply and its end of turn, after the generation prompt) weigh 1, the rest the
/// prompt's weight.
#[test]
fn only_the_assistants_turns_weigh_one() {
    use datasets::ChatMessage;
    use experiments::line_retrieval::data::conversation_example;
    let dir = chat_model("lora-chat-mask");
    let config = experiments::pretrained::pretrained_config(&dir).unwrap();
    let text = experiments::line_retrieval::start::hf_text(&dir, &config).unwrap();
    let chat = experiments::pretrained::chat_template(&dir, &text.tokenizer, &config).unwrap();
    let turn = |role: &str, content: &str| ChatMessage {
        role: role.into(),
        content: content.into(),
    };
    let messages = [
        turn("system", "be brief"),
        turn("user", "what is in line seven?"),
        turn("assistant", "4231"),
        turn("user", "and line two?"),
        turn("assistant", "77"),
    ];
    let ex = conversation_example(&text, &chat, &messages, 0.0).unwrap();
    assert_eq!(ex.weights.len(), ex.tokens.len() - 1);
    // The tokens decode to the whole conversation as the template renders it.
    let whole = chat.render(&messages, false).unwrap();
    assert_eq!(text.tokenizer.decode(&ex.tokens).unwrap(), whole);
    // The targets weighing 1, run by run: each reply and its end of turn.
    let mut runs: Vec<Vec<u32>> = Vec::new();
    let mut last = false;
    for (w, &next) in ex.weights.iter().zip(&ex.tokens[1..]) {
        match *w {
            1.0 if last => runs.last_mut().unwrap().push(next),
            1.0 => runs.push(vec![next]),
            0.0 => {}
            other => panic!("weight {other}"),
        }
        last = *w == 1.0;
    }
    let replies: Vec<String> = runs
        .iter()
        .map(|r| text.tokenizer.decode(r).unwrap())
        .collect();
    assert_eq!(replies, ["4231<|im_end|>\n", "77<|im_end|>\n"]);
    // A prompt weight is the weight of every other target.
    let ex = conversation_example(&text, &chat, &messages, 0.25).unwrap();
    assert!(ex.weights.iter().all(|&w| w == 1.0 || w == 0.25));
    let _ = std::fs::remove_dir_all(dir);
}

/// The quick LoRA spec with its paths made absolute and `out` in `out`, then `edit`ed.
fn lora_spec(out: &Path, edit: impl Fn(String) -> String) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let text = std::fs::read_to_string(root.join("experiments/finetune_lora_quick.toml"))
        .unwrap()
        .replace(
            "hf = \"experiments/",
            &format!("hf = \"{}/experiments/", root.display()),
        )
        .replace(
            "out = \"runs/finetune_lora_quick\"",
            &format!("out = \"{}\"", out.display()),
        );
    let spec = out.with_extension("toml");
    std::fs::write(&spec, edit(text)).unwrap();
    spec
}

fn train(spec: &Path) -> String {
    let o = common::ringbench(&["train", "--config", spec.to_str().unwrap()]);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "{said}");
    said
}

/// A LoRA run stopped after every step (a one-step sitting) and resumed until done writes the
/// adapter an uninterrupted run writes, bit for bit; a second stage continues from that adapter
/// with a raised RoPE base, which `--adapter` then applies.
#[test]
fn lora_runs_resume_bit_for_bit_and_stages_continue_their_adapter() {
    let root = temp_dir("lora-resume");
    let whole = root.join("whole");
    train(&lora_spec(&whole, |t| t));
    let pieces = root.join("pieces");
    let spec = lora_spec(&pieces, |t| {
        t.replace("max_minutes = 0.0", "max_minutes = 0.000001")
    });
    let mut sittings = 0;
    while !pieces.join("finished.json").exists() {
        sittings += 1;
        assert!(sittings <= 8, "the run never finished");
        train(&spec);
    }
    assert!(sittings >= 2, "the sitting limit stopped no sitting");
    let weights = |d: &Path| std::fs::read(d.join("adapter_model.safetensors")).unwrap();
    assert_eq!(
        weights(&pieces),
        weights(&whole),
        "resumed after {sittings} sittings"
    );
    // Stage 2: the same adapter continued, RoPE's base raised 4×.
    let stage2 = root.join("stage2");
    let init = whole.display().to_string();
    let spec2 = lora_spec(&stage2, |t| {
        t.replace("ffn_chunk = 64", "ffn_chunk = 64\nrope_theta = 40000.0")
            .replace("seed = 3", &format!("seed = 3\ninit = \"{init}\""))
    });
    let said = train(&spec2);
    assert!(said.contains("LoRA adapters"), "{said}");
    let rope: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(stage2.join("adapter_rope.json")).unwrap())
            .unwrap();
    assert_eq!(rope["rope_theta"], 40000.0);
    assert!(!whole.join("adapter_rope.json").exists());
    // --adapter applies the RoPE it was trained with: the logits are the base with the merged
    // adapter rotated at 40000 (here: not at 10000).
    let device = Default::default();
    let (model, config) =
        experiments::pretrained::load_pretrained::<Flex>(&base_dir(), Some(&stage2), &device)
            .unwrap();
    assert_eq!(config.model.rope_theta, 40000.0);
    let t = tokens().remove(0);
    let d = decoding("zigzag", 1, &[], 0);
    let rotated = full_logits(&model, &Prompt::from(t.clone()), &d).unwrap();
    let plain_config = config.model.clone().with_rope_theta(10000.0);
    let unrotated = full_logits(&model.with_trunk_of(&plain_config), &Prompt::from(t), &d).unwrap();
    assert_ne!(rotated, unrotated);
    // A stage whose adapter does not match the spec's [lora] is refused naming both.
    let spec3 = lora_spec(&root.join("stage3"), |t| {
        t.replace("rank = 4", "rank = 8")
            .replace("seed = 3", &format!("seed = 3\ninit = \"{init}\""))
    });
    let o = common::ringbench(&["train", "--config", spec3.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && said.contains("r = 4") && said.contains("r = 8"),
        "{said}"
    );
    let _ = std::fs::remove_dir_all(root);
}

/// Conversations from a JSONL file train through the chat template; bad files are refused naming
/// the line.
#[test]
fn conversations_train_through_the_chat_template() {
    let root = temp_dir("lora-conversations");
    let model = chat_model("lora-conversations-model");
    let data = root.join("chats.jsonl");
    std::fs::write(
        &data,
        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"hello there\"}]}\n\
         {\"messages\": [{\"role\": \"user\", \"content\": \"2+2?\"}, {\"role\": \"assistant\", \"content\": \"4\"}]}\n",
    )
    .unwrap();
    let out = root.join("out");
    let spec = lora_spec(&out, |t| {
        t.replace(
            &format!("{}", base_dir().display()),
            &format!("{}", model.display()),
        )
        .replace(
            "min_lines = 1\nnum_lines = 2\n",
            &format!("conversations = \"{}\"\n", data.display()),
        )
    });
    let said = train(&spec);
    assert!(said.contains("2 conversations"), "{said}");
    assert!(out.join("adapter_model.safetensors").exists());
    // A line without an assistant turn is refused naming it.
    std::fs::write(
        &data,
        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n",
    )
    .unwrap();
    let o = common::ringbench(&["train", "--config", spec.to_str().unwrap(), "--force"]);
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && said.contains("chats.jsonl line 1"),
        "{said}"
    );
    let _ = std::fs::remove_dir_all(root);
    let _ = std::fs::remove_dir_all(model);
}

/// A spec of two stages trains each in its own directory, the second from the first's adapter with
/// its own lines, RoPE base and data seed; run again, both are found finished.
#[test]
fn stages_run_in_turn_each_from_the_one_before() {
    let root = temp_dir("lora-stages");
    let out = root.join("out");
    let spec = lora_spec(&out, |t| {
        t + "\n[[stages]]\nname = \"short\"\nsteps = 2\n\n[[stages]]\nname = \"long\"\nsteps = 2\n\
             min_lines = 2\nnum_lines = 3\nrope_theta = 20000.0\nseed = 99\n"
    });
    let said = train(&spec);
    assert!(
        said.contains("== stage 1 of 2") && said.contains("== stage 2 of 2"),
        "{said}"
    );
    for stage in ["short", "long"] {
        assert!(
            out.join(stage).join("adapter_model.safetensors").exists(),
            "{stage}"
        );
    }
    let second: toml::Table =
        toml::from_str(&std::fs::read_to_string(out.join("long/train.toml")).unwrap()).unwrap();
    assert_eq!(
        second["train"]["init"].as_str(),
        Some(out.join("short").to_str().unwrap())
    );
    assert_eq!(second["train"]["num_lines"].as_integer(), Some(3));
    assert_eq!(second["train"]["seed"].as_integer(), Some(99));
    let first: toml::Table =
        toml::from_str(&std::fs::read_to_string(out.join("short/train.toml")).unwrap()).unwrap();
    // The first stage keeps train.seed (finetune_lora_quick.toml's 3).
    assert_eq!(first["train"]["seed"].as_integer(), Some(3));
    assert!(out.join("long/adapter_rope.json").exists());
    assert!(!out.join("short/adapter_rope.json").exists());
    let again = train(&spec);
    assert_eq!(again.matches("nothing to do").count(), 2, "{again}");
    let _ = std::fs::remove_dir_all(root);
}
