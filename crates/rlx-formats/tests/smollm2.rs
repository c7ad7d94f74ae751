//! Checks against the real SmolLM2-135M-Instruct Q4_1 GGUF (see
//! /work/shared/reference/README.md for provenance), if it has been fetched to
//! `$RLX_MODELS_DIR/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf`
//! (`RLX_MODELS_DIR` defaults to `~/.cache/rlx/models`).

use std::collections::HashMap;
use std::path::PathBuf;

use rlx_formats::{GgmlType, GgufFile};

fn model_path() -> Option<PathBuf> {
    let dir = match std::env::var_os("RLX_MODELS_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".cache/rlx/models"),
    };
    let p = dir.join("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
    p.exists().then_some(p)
}

#[test]
fn smollm2_gguf_structure_and_token_embd() {
    let Some(path) = model_path() else {
        println!("skipped: model not fetched");
        return;
    };
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(f.get_usize("llama.block_count").unwrap(), 30);
    assert_eq!(f.get_usize("llama.embedding_length").unwrap(), 576);
    assert_eq!(f.get_usize("llama.feed_forward_length").unwrap(), 1536);
    assert_eq!(f.get_usize("llama.attention.head_count").unwrap(), 9);
    assert_eq!(f.get_usize("llama.attention.head_count_kv").unwrap(), 3);
    assert_eq!(f.get_float("llama.rope.freq_base").unwrap(), 100000.0);
    let eps = f
        .get_float("llama.attention.layer_norm_rms_epsilon")
        .unwrap();
    assert!((eps - 1e-5).abs() < 1e-9, "rms eps {eps}");
    assert_eq!(f.get_str("tokenizer.ggml.model").unwrap(), "gpt2");
    assert_eq!(f.get_str("tokenizer.ggml.pre").unwrap(), "smollm");
    assert_eq!(f.get_usize("tokenizer.ggml.bos_token_id").unwrap(), 1);
    assert_eq!(f.get_usize("tokenizer.ggml.eos_token_id").unwrap(), 2);

    let tokens = f.get_str_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.len(), 49152);
    assert_eq!(tokens[0], "<|endoftext|>");
    let merges = f.get_str_array("tokenizer.ggml.merges").unwrap();
    assert!(merges.len() > 40000, "{} merges", merges.len());
    assert!(merges.iter().all(|m| m.contains(' ')));
    assert_eq!(
        f.get_i32_array("tokenizer.ggml.token_type").unwrap().len(),
        49152
    );

    let mut by_type: HashMap<GgmlType, usize> = HashMap::new();
    for t in f.tensors() {
        *by_type.entry(t.ggml_type).or_default() += 1;
    }
    assert_eq!(f.tensors().len(), 272);
    assert_eq!(by_type.get(&GgmlType::Q4_1), Some(&210));
    assert_eq!(by_type.get(&GgmlType::Q8_0), Some(&1));
    assert_eq!(by_type.get(&GgmlType::F32), Some(&61));

    let emb = f.tensor_info("token_embd.weight").unwrap();
    assert_eq!(emb.ggml_type, GgmlType::Q8_0);
    assert_eq!(emb.dims, vec![576, 49152]);
    assert_eq!(emb.shape(), vec![49152, 576]);
    let row0 = f.tensor_row_f32("token_embd.weight", 0).unwrap();
    assert_eq!(row0.len(), 576);
    assert!(row0.iter().all(|x| x.is_finite()));
    assert!(row0.iter().any(|&x| x != 0.0));
    let last = f.tensor_row_f32("token_embd.weight", 49151).unwrap();
    assert!(last.iter().all(|x| x.is_finite()));

    let q = f.tensor_info("blk.0.attn_q.weight").unwrap();
    assert_eq!(q.ggml_type, GgmlType::Q4_1);
    assert_eq!(q.shape(), vec![576, 576]);
    let k = f.tensor_info("blk.0.attn_k.weight").unwrap();
    assert_eq!(k.shape(), vec![192, 576]);
    let wq = f.tensor_f32("blk.0.attn_q.weight").unwrap();
    assert_eq!(wq.len(), 576 * 576);
    assert!(wq.iter().all(|x| x.is_finite()));
    let norm = f.tensor_f32("blk.0.attn_norm.weight").unwrap();
    assert_eq!(norm.len(), 576);
    assert!(norm.iter().all(|x| x.is_finite()));
    assert_eq!(f.data_offset(), 1_785_664);

    // Reference values from gguf-py 0.19.0 (`GGUFReader` + `gguf.quants.dequantize`)
    // on the same file: bits of the first 4 values (row 0) and the f64 sum of
    // the whole dequantized tensor.
    let refs: [(&str, [u32; 4], f64); 4] = [
        (
            "token_embd.weight",
            [0xbdda3400, 0x3d071400, 0x3d456c00, 0xbcbb0800],
            -15353.04449415207,
        ),
        (
            "blk.0.attn_q.weight",
            [0xbdc54000, 0x3e212000, 0xbdc54000, 0xbf3b0000],
            59.22322082519531,
        ),
        (
            "blk.29.ffn_down.weight",
            [0xbe8bf000, 0x3e3ec000, 0x3e3ec000, 0x3d464000],
            49.83570861816406,
        ),
        (
            "output_norm.weight",
            [0x3fe10000, 0x3fe90000, 0x3fe40000, 0x3fcd0000],
            1038.33203125,
        ),
    ];
    for (name, head, sum) in refs {
        let v = f.tensor_f32(name).unwrap();
        let bits: Vec<u32> = v[..4].iter().map(|x| x.to_bits()).collect();
        assert_eq!(bits, head, "{name}");
        let s: f64 = v.iter().map(|&x| x as f64).sum();
        assert!(
            (s - sum).abs() <= 1e-9 * sum.abs().max(1.0),
            "{name}: sum {s} vs {sum}"
        );
    }

    // Every tensor's data lies inside the file.
    for t in f.tensors() {
        assert!(f.tensor_bytes(&t.name).unwrap().len() as u64 == t.n_bytes);
    }
}
