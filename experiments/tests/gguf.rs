//! GGUF files against the `gguf` Python package: the committed fixture (`tests/fixtures/gguf/`,
//! written by `make_gguf_fixture.py`) holds one tensor of every ggml type ringbench reads, and the
//! package's own dequantization of each; ringbench's must agree within 1e-6 of each tensor's scale.
//! Then every kind of bad file is refused in one line naming the tensor or what is wrong. Files
//! written by llama.cpp's own converter from the Hugging Face fixtures (`converted/`) give
//! transformers' logits.

mod common;

use common::{decoding, temp_dir};
use experiments::npy;
use reference::compare::deviation;
use std::path::{Path, PathBuf};
use workbench::gguf::{GgmlType, GgufError, GgufFile, read_gguf_model};
use workbench::hf::{Architecture, HfConfig};
use workbench::train::{Prompt, full_logits};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf")
}

/// Each tensor's name, ggml type, and `[rows, columns]`.
const TENSORS: [(&str, GgmlType, [usize; 2]); 10] = [
    ("f32", GgmlType::F32, [2, 512]),
    ("f16", GgmlType::F16, [2, 512]),
    ("bf16", GgmlType::Bf16, [2, 512]),
    ("q8_0", GgmlType::Q8_0, [2, 512]),
    ("q4_0", GgmlType::Q4_0, [2, 512]),
    ("q4_1", GgmlType::Q4_1, [2, 512]),
    ("q4_k", GgmlType::Q4K, [2, 512]),
    ("q5_k", GgmlType::Q5K, [2, 512]),
    ("q6_k", GgmlType::Q6K, [2, 512]),
    ("odd.q4_0", GgmlType::Q4_0, [3, 64]),
];

/// The bound for dequantization against the `gguf` package's: both compute each value with
/// the same two or three f32 operations, so any difference is a wrong formula, not rounding.
const DEQUANT_BOUND: f64 = 1e-6;

#[test]
fn every_type_dequantizes_as_the_gguf_package_does() {
    let file = GgufFile::open(&fixture().join("quants.gguf")).unwrap();
    assert_eq!(file.version(), 3);
    assert_eq!(
        file.get("general.architecture").and_then(|v| v.as_str()),
        Some("llama")
    );
    assert_eq!(file.tensors().len(), TENSORS.len());
    for (name, kind, [rows, cols]) in TENSORS {
        let entry = file.tensor(name).unwrap();
        assert_eq!(GgmlType::of_id(entry.type_id), Some(kind), "{name}");
        // GGUF lists dimensions innermost first.
        assert_eq!(entry.dims, vec![cols as u64, rows as u64], "{name}");
        let got = file.values(name).unwrap();
        let want = npy::read(&fixture().join(format!("expected/{name}.npy"))).unwrap();
        assert_eq!(want.shape, vec![rows, cols], "{name}");
        let moved = deviation(&got, &want.data);
        assert!(moved.within(DEQUANT_BOUND), "{name} ({kind:?}): {moved}");
    }
}

/// The fixture's bytes with `edit` applied, written to a scratch file.
fn edited(name: &str, edit: impl FnOnce(&mut Vec<u8>)) -> PathBuf {
    let mut bytes = std::fs::read(fixture().join("quants.gguf")).unwrap();
    edit(&mut bytes);
    let path = temp_dir(name).join("edited.gguf");
    std::fs::write(&path, bytes).unwrap();
    path
}

/// Where tensor `name`'s type id lies in the directory: after its length-prefixed name, its
/// dimension count (2) and two dimensions.
fn type_offset(bytes: &[u8], name: &str) -> usize {
    let mut entry = (name.len() as u64).to_le_bytes().to_vec();
    entry.extend(name.as_bytes());
    entry.extend(2u32.to_le_bytes());
    let at = bytes
        .windows(entry.len())
        .position(|w| w == entry.as_slice())
        .expect("the tensor's directory entry");
    at + entry.len() + 16
}

#[test]
fn bad_files_are_refused_naming_what_is_wrong() {
    let message = |path: &Path| -> (GgufError, String) {
        let err = GgufFile::open(path)
            .and_then(|f| {
                for t in f.tensors() {
                    f.values(&t.name)?;
                }
                Ok(f)
            })
            .expect_err("a bad file");
        let text = err.to_string();
        // The lines docs/hugging-face.md quotes (`cargo test --test gguf -- --nocapture`).
        println!("{text}");
        (err, text)
    };
    // Not a GGUF file.
    let path = edited("gguf_magic", |b| b[..4].copy_from_slice(b"GGML"));
    let (err, text) = message(&path);
    assert!(matches!(err, GgufError::NotGguf { .. }), "{text}");
    assert!(text.contains("not \"GGUF\""), "{text}");
    // Cut inside the last tensor's data (108 bytes, padded to 128 by the writer): it is named.
    let path = edited("gguf_truncated", |b| b.truncate(b.len() - 30));
    let (err, text) = message(&path);
    assert!(matches!(err, GgufError::Truncated { .. }), "{text}");
    assert!(text.contains("tensor odd.q4_0"), "{text}");
    // Cut inside the header: the metadata or entry being read is named.
    let path = edited("gguf_header", |b| b.truncate(40));
    let (err, text) = message(&path);
    assert!(matches!(err, GgufError::Truncated { .. }), "{text}");
    // A type this reader does not dequantize (Q2_K, id 10): named with the tensor.
    let path = edited("gguf_type", |b| {
        let at = type_offset(b, "q4_1");
        b[at..at + 4].copy_from_slice(&10u32.to_le_bytes());
    });
    let (err, text) = message(&path);
    assert!(
        matches!(err, GgufError::UnknownType { id: 10, .. }),
        "{text}"
    );
    assert!(
        text.contains("tensor q4_1") && text.contains("Q2_K"),
        "{text}"
    );
    // A tensor that asks for data past the end of the file.
    let path = edited("gguf_offset", |b| {
        let at = type_offset(b, "f32") + 4;
        b[at..at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    });
    let (err, text) = message(&path);
    assert!(matches!(err, GgufError::Truncated { .. }), "{text}");
    assert!(text.contains("tensor f32"), "{text}");
    // A name that is not there.
    let file = GgufFile::open(&fixture().join("quants.gguf")).unwrap();
    let err = file.values("blk.0.attn_q.weight").unwrap_err().to_string();
    assert!(
        err.contains("blk.0.attn_q.weight") && err.contains("no such tensor"),
        "{err}"
    );
}

/// The tokenizer a GGUF vocabulary describes gives transformers' ids (its own GGUF tokenizer, the
/// ids `make_tokenizer_fixture.py` recorded) on texts with digits, runs of spaces, newlines, bytes the
/// vocabulary lacks, a control token and the empty text: byte-level BPE with two split regexes and
/// SentencePiece with merges from scores, BOS added or not as the file says.
#[test]
fn gguf_tokenizers_give_transformers_ids() {
    for name in ["gpt2_llama3", "gpt2_default", "llama_spm"] {
        let gguf = fixture().join(format!("tokenizer_{name}.gguf"));
        let tokenizer = experiments::pretrained::pretrained_tokenizer(&gguf)
            .unwrap()
            .expect("a GGUF file's tokenizer");
        let expected: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(fixture().join(format!("tokenizer_{name}.json"))).unwrap(),
        )
        .unwrap();
        let cases = expected["cases"].as_array().unwrap();
        assert_eq!(cases.len(), 7, "{name}");
        for case in cases {
            let text = case["text"].as_str().unwrap();
            let want: Vec<u32> = serde_json::from_value(case["ids"].clone()).unwrap();
            let ids = tokenizer.encode(text, true).unwrap();
            assert_eq!(ids, want, "{name}: {text:?}");
            // Decoding gives the text back when every byte is in the vocabulary or its fallback.
            if name != "llama_spm" || !text.starts_with(' ') {
                let plain = tokenizer.encode(text, false).unwrap();
                assert_eq!(tokenizer.decode(&plain).unwrap(), text, "{name}: {text:?}");
            }
        }
    }
}

/// A vocabulary this cannot rebuild is refused naming the key and value.
#[test]
fn unknown_tokenizer_kinds_are_refused_by_name() {
    use datasets::{GgufVocabulary, HfTokenizer};
    let base = GgufVocabulary {
        model: "gpt2".into(),
        tokens: vec!["a".into(), "b".into(), "ab".into()],
        merges: Some(vec!["a b".into()]),
        ..Default::default()
    };
    let origin = Path::new("x.gguf");
    assert!(HfTokenizer::from_gguf(&base, origin).is_ok());
    let cases: [(GgufVocabulary, &str); 5] = [
        (
            GgufVocabulary {
                model: "rwkv".into(),
                ..base.clone()
            },
            "tokenizer.ggml.model = \"rwkv\"",
        ),
        (
            GgufVocabulary {
                pre: Some("exotic".into()),
                ..base.clone()
            },
            "tokenizer.ggml.pre = \"exotic\"",
        ),
        (
            GgufVocabulary {
                merges: Some(vec!["ab".into()]),
                ..base.clone()
            },
            "merges[0] = \"ab\"",
        ),
        (
            GgufVocabulary {
                bos: Some(7),
                ..base.clone()
            },
            "bos_token_id = 7 is past the 3 tokens",
        ),
        (
            GgufVocabulary {
                model: "llama".into(),
                merges: None,
                scores: Some(vec![0.0, f32::NAN, 1.0]),
                ..base.clone()
            },
            "tokenizer.ggml.scores[1] is NaN",
        ),
    ];
    for (vocabulary, want) in cases {
        let error = HfTokenizer::from_gguf(&vocabulary, origin)
            .unwrap_err()
            .to_string();
        assert!(error.contains(want) && error.contains("x.gguf"), "{error}");
    }
}

/// The Hugging Face fixtures converted by llama.cpp's own `convert_hf_to_gguf.py`
/// (`make_converted_fixture.py`): each case, what `general.architecture` the converter wrote, and
/// how it stores the RoPE scaling.
const CONVERTED: [(&str, Architecture, &str); 6] = [
    ("llama_gqa", Architecture::Llama, "default"),
    ("llama3", Architecture::Llama, "frequency_factors"),
    ("llama_linear_tied", Architecture::Llama, "linear"),
    ("yarn", Architecture::Llama, "yarn"),
    ("mistral_nowindow", Architecture::Llama, "default"),
    ("qwen2_bias", Architecture::Qwen2, "default"),
];

/// The bound, the Hugging Face tests' own (`tests/hf.rs`): transformers' float64 logits
/// within 1e-4 of the largest; f32 over these sizes accumulates about 1e-5.
const LOGITS_BOUND: f64 = 1e-4;

fn converted(case: &str) -> PathBuf {
    fixture().join("converted").join(format!("{case}.gguf"))
}

fn hf_case(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf")
        .join(case)
}

/// Each converted file gives transformers' logits of the directory it came from, on 1 rank and on 2
/// (zig-zag and striped); LLaMA 3's scaling is read from `rope_freqs.weight`, not dropped.
#[test]
fn converted_files_give_transformers_logits_on_one_and_two_ranks() {
    type B = burn::backend::Flex;
    for (case, architecture, rope) in CONVERTED {
        let (model, config) = experiments::pretrained::load_pretrained::<B>(
            &converted(case),
            None,
            &Default::default(),
        )
        .unwrap_or_else(|e| panic!("{case}: {e:#}"));
        assert_eq!(config.architecture, architecture, "{case}");
        assert_eq!(config.model.rope_scaling.name(), rope, "{case}");
        let dir = hf_case(case);
        let tokens = npy::read_ids(&dir.join("tokens.npy")).unwrap();
        let want = npy::read(&dir.join("logits.npy")).unwrap();
        for (ranks, strategy) in [(1, "contiguous"), (2, "zigzag"), (2, "striped")] {
            let mut got = Vec::new();
            for t in &tokens {
                let d = decoding(strategy, ranks, &[], 0);
                got.extend(full_logits(&model, &Prompt::from(t.clone()), &d).unwrap());
            }
            // `deviation` fails on a length that differs from the fixture's.
            let d = deviation(&got, &want.data);
            assert!(
                d.within(LOGITS_BOUND),
                "{case} on {ranks} {strategy} ranks: {d}"
            );
        }
    }
    // The divisors are the llama3 scaling's: the frequencies equal the directory's within the f32
    // rounding of the stored factors (2^-24 relative).
    let from_gguf = read_gguf_model(&converted("llama3")).unwrap().config.rope();
    let from_hf = HfConfig::read(&hf_case("llama3").join("config.json"))
        .unwrap()
        .model
        .rope();
    let (got, _) = from_gguf.inverse_frequencies(16, 24);
    let (want, _) = from_hf.inverse_frequencies(16, 24);
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= 2f64.powi(-23) * w,
            "frequency {i}: {g} against {w}"
        );
    }
    assert!(got.iter().zip(&want).any(|(g, _)| *g < 0.9 * got[0]));
}

/// The converter's tokenizer (its `tokenizer.ggml.pre` "gpt-2") encodes as the directory's
/// tokenizer.json does.
#[test]
fn the_converted_tokenizer_gives_the_directorys_ids() {
    let tokenizer = experiments::pretrained::pretrained_tokenizer(&converted("llama_gqa"))
        .unwrap()
        .expect("a GGUF file's tokenizer");
    let dir = hf_case("llama_gqa");
    let text = std::fs::read_to_string(dir.join("text.txt")).unwrap();
    let want: Vec<u32> =
        serde_json::from_str(&std::fs::read_to_string(dir.join("text_ids.json")).unwrap()).unwrap();
    assert_eq!(tokenizer.encode(&text, false).unwrap(), want);
}

/// `bytes` with the first `from` replaced by `to` (of the same length, so every offset holds).
fn replaced(bytes: &mut [u8], from: &[u8], to: &[u8]) {
    assert_eq!(from.len(), to.len());
    let at = bytes
        .windows(from.len())
        .position(|w| w == from)
        .unwrap_or_else(|| panic!("{:?} in the file", String::from_utf8_lossy(from)));
    bytes[at..at + to.len()].copy_from_slice(to);
}

/// What changes the computation and is not understood is refused in one line naming it: an
/// architecture, a key under its prefix, a tensor the model would leave unread.
#[test]
fn what_the_reader_does_not_compute_is_refused_by_name() {
    let refusal = |name: &str, edit: &dyn Fn(&mut Vec<u8>)| -> String {
        let mut bytes = std::fs::read(converted("llama_gqa")).unwrap();
        edit(&mut bytes);
        let path = temp_dir(name).join("edited.gguf");
        std::fs::write(&path, bytes).unwrap();
        let text = format!("{:#}", read_gguf_model(&path).unwrap_err());
        // The lines docs/hugging-face.md quotes (`cargo test --test gguf -- --nocapture`).
        println!("{text}");
        assert_eq!(text.lines().count(), 1, "{text}");
        text
    };
    // An architecture (the key's value "llama" becomes "mamba").
    let text = refusal("gguf_arch", &|b| {
        let mut key = b"general.architecture".to_vec();
        key.extend(8u32.to_le_bytes());
        key.extend(5u64.to_le_bytes());
        let mut to = key.clone();
        key.extend(b"llama");
        to.extend(b"mamba");
        replaced(b, &key, &to)
    });
    assert!(
        text.contains("general.architecture") && text.contains("\"mamba\""),
        "{text}"
    );
    // A key under the prefix that changes the computation (Gemma 2's soft-cap, here in place of
    // the value width, a key of the same length).
    let text = refusal("gguf_key", &|b| {
        replaced(
            b,
            b"llama.attention.value_length",
            b"llama.attn_logit_softcapping",
        )
    });
    assert!(
        text.contains("llama.attn_logit_softcapping") && text.contains("does not compute"),
        "{text}"
    );
    // One block fewer than the file holds: layer 1's tensors would be left unread.
    let text = refusal("gguf_tensor", &|b| {
        let mut key = b"llama.block_count".to_vec();
        key.extend(4u32.to_le_bytes());
        let mut to = key.clone();
        key.extend(2u32.to_le_bytes());
        to.extend(1u32.to_le_bytes());
        replaced(b, &key, &to)
    });
    assert!(
        text.contains("tensor blk.1.") && text.contains("would be left unread"),
        "{text}"
    );
}

/// A GGUF file of one metadata value, written here byte by byte.
fn one_value_file(name: &str, key: &str, value: &[u8]) -> PathBuf {
    let mut bytes = b"GGUF".to_vec();
    bytes.extend(3u32.to_le_bytes());
    bytes.extend(0u64.to_le_bytes());
    bytes.extend(1u64.to_le_bytes());
    bytes.extend((key.len() as u64).to_le_bytes());
    bytes.extend(key.as_bytes());
    bytes.extend(value);
    let path = temp_dir(name).join("one.gguf");
    std::fs::write(&path, bytes).unwrap();
    path
}

/// Arrays nested past the bound are refused (not recursed into until the stack runs out), and
/// nesting within it reads.
#[test]
fn deeply_nested_arrays_are_refused() {
    // The value's type (an array), then `depth` arrays each holding one array (item type, count),
    // then the innermost: an array of one u32.
    let nested = |depth: usize| {
        let mut value = 9u32.to_le_bytes().to_vec();
        for _ in 0..depth {
            value.extend(9u32.to_le_bytes());
            value.extend(1u64.to_le_bytes());
        }
        value.extend(4u32.to_le_bytes());
        value.extend(1u64.to_le_bytes());
        value.extend(7u32.to_le_bytes());
        value
    };
    let fine = one_value_file("gguf_nest_ok", "deep", &nested(2));
    GgufFile::open(&fine).unwrap();
    let deep = one_value_file("gguf_nest_deep", "deep", &nested(100_000));
    let text = GgufFile::open(&deep).unwrap_err().to_string();
    assert!(
        text.contains("metadata deep") && text.contains("nested deeper than"),
        "{text}"
    );
}

/// Dimensions whose product overflows 64 bits are named, not wrapped into a small size.
#[test]
fn dimensions_that_overflow_are_refused() {
    let path = edited("gguf_dims", |b| {
        // q8_0's two dimensions sit just before its type id.
        let at = type_offset(b, "q8_0") - 16;
        b[at..at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
        b[at + 8..at + 16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    });
    let file = GgufFile::open(&path).unwrap();
    assert_eq!(file.tensor("q8_0").unwrap().elements(), None);
    let text = file.values("q8_0").unwrap_err().to_string();
    assert!(
        text.contains("tensor q8_0") && text.contains("more than 2^64 values"),
        "{text}"
    );
}
