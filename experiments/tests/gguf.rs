//! GGUF files against the `gguf` Python package: the committed fixture (`tests/fixtures/gguf/`,
//! written by `make_gguf_fixture.py`) holds one tensor of every ggml type ringbench reads, and the
//! package's own dequantization of each; ringbench's must agree within 1e-6 of each tensor's scale.
//! Then every kind of bad file is refused in one line naming the tensor or what is wrong.

mod common;

use common::temp_dir;
use experiments::npy;
use reference::compare::deviation;
use std::path::{Path, PathBuf};
use workbench::gguf::{GgmlType, GgufError, GgufFile};

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
