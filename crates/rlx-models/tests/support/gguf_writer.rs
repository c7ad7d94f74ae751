//! A minimal GGUF v3 writer and random weight blocks, for tests that need a
//! model file without a download (`llama_tiny.rs`, and the CUDA tests of
//! crate `rlx`, which include this file by path). Not every item is used
//! by every includer.
#![allow(dead_code)]

use std::path::PathBuf;

/// GGML type ids.
pub const F32: u32 = 0;
pub const Q4_1: u32 = 3;
pub const Q5_0: u32 = 6;
pub const Q8_0: u32 = 8;
pub const Q4_K: u32 = 12;
pub const Q5_K: u32 = 13;
pub const Q6_K: u32 = 14;
pub const IQ4_NL: u32 = 20;

/// A small LCG (the tests need repeatable bytes, not good randomness).
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }
}

/// A GGUF v3 file being built: metadata, tensor infos and data.
#[derive(Default)]
pub struct Gguf {
    kv: Vec<u8>,
    n_kv: u64,
    infos: Vec<u8>,
    n_t: u64,
    data: Vec<u8>,
}

fn put_str(b: &mut Vec<u8>, s: &str) {
    b.extend((s.len() as u64).to_le_bytes());
    b.extend(s.as_bytes());
}

impl Gguf {
    pub fn kv_str(&mut self, k: &str, v: &str) {
        put_str(&mut self.kv, k);
        self.kv.extend(8u32.to_le_bytes());
        put_str(&mut self.kv, v);
        self.n_kv += 1;
    }
    pub fn kv_u32(&mut self, k: &str, v: u32) {
        put_str(&mut self.kv, k);
        self.kv.extend(4u32.to_le_bytes());
        self.kv.extend(v.to_le_bytes());
        self.n_kv += 1;
    }
    pub fn kv_f32(&mut self, k: &str, v: f32) {
        put_str(&mut self.kv, k);
        self.kv.extend(6u32.to_le_bytes());
        self.kv.extend(v.to_le_bytes());
        self.n_kv += 1;
    }
    /// `shape` is row-major `[rows, k]` or `[k]`.
    pub fn tensor(&mut self, name: &str, shape: &[usize], ty: u32, bytes: Vec<u8>) {
        while !self.data.len().is_multiple_of(32) {
            self.data.push(0);
        }
        put_str(&mut self.infos, name);
        self.infos.extend((shape.len() as u32).to_le_bytes());
        for &d in shape.iter().rev() {
            self.infos.extend((d as u64).to_le_bytes());
        }
        self.infos.extend(ty.to_le_bytes());
        self.infos.extend((self.data.len() as u64).to_le_bytes());
        self.data.extend(bytes);
        self.n_t += 1;
    }
    /// Write the file as `name` in a per-process temporary directory.
    pub fn write(&self, name: &str) -> PathBuf {
        let mut f = b"GGUF".to_vec();
        f.extend(3u32.to_le_bytes());
        f.extend(self.n_t.to_le_bytes());
        f.extend(self.n_kv.to_le_bytes());
        f.extend(&self.kv);
        f.extend(&self.infos);
        while !f.len().is_multiple_of(32) {
            f.push(0);
        }
        f.extend(&self.data);
        let dir = std::env::temp_dir().join(format!("rlx-llama-tiny-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, f).unwrap();
        p
    }
}

/// Random blocks of `n` rows of `k` weights in format `ty`, with small f16
/// scales so the weights are the size a model's are (|w| of order 1: the
/// K-quants multiply their super-block scale by 6- or 8-bit sub-block
/// scales, so theirs are smaller still).
pub fn blocks(ty: u32, n: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    // Block bytes, elements, and the f16 fields (the second of a pair is a
    // minimum or dmin).
    let (bb, elems, fields, base): (usize, usize, &[usize], f32) = match ty {
        Q4_1 => (20, 32, &[0, 2], 0.004),
        Q8_0 => (34, 32, &[0], 0.004),
        IQ4_NL => (18, 32, &[0], 0.004),
        Q5_0 => (22, 32, &[0], 0.004),
        Q4_K => (144, 256, &[0, 2], 0.0004),
        Q5_K => (176, 256, &[0, 2], 0.0002),
        Q6_K => (210, 256, &[208], 0.0002),
        _ => unreachable!("no block generator for type {ty}"),
    };
    assert!(
        k.is_multiple_of(elems),
        "k = {k} is no whole block of type {ty}"
    );
    let mut out: Vec<u8> = (0..n * k / elems * bb).map(|_| rng.next() as u8).collect();
    for blk in out.chunks_exact_mut(bb) {
        for (i, &o) in fields.iter().enumerate() {
            let v = base + (rng.next() % 100) as f32 * base / 10.0;
            let v = if i == 1 && elems == 32 { -8.0 * v } else { v };
            blk[o..o + 2].copy_from_slice(&f16_bits(v).to_le_bytes());
        }
    }
    out
}

/// f32 -> f16 bits for normal, in-range values (round to nearest even).
pub fn f16_bits(v: f32) -> u16 {
    let b = v.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xFF) as i32 - 127 + 15;
    assert!((1..31).contains(&exp), "{v} not a normal f16");
    let mant = b & 0x7F_FFFF;
    let mut h = ((exp as u32) << 10) | (mant >> 13);
    let rest = mant & 0x1FFF;
    if rest > 0x1000 || (rest == 0x1000 && h & 1 == 1) {
        h += 1;
    }
    sign | h as u16
}

/// Little-endian bytes of f32 values.
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A tiny random Llama (2 layers, d = 256, FFN 512, 4 query and 2 KV heads,
/// vocabulary 40) whose projections are K-quants and Q5_0, the formats of
/// a `Q4_K_M` file: q, o and gate in Q4_K, k in Q5_K, v and down in Q6_K,
/// up in Q5_0; the embedding in Q8_0.
pub fn kquant_llama(name: &str) -> PathBuf {
    const D: usize = 256;
    const FF: usize = 512;
    const KV: usize = 128;
    let mut rng = Rng(7);
    let mut g = Gguf::default();
    g.kv_str("general.architecture", "llama");
    g.kv_u32("llama.block_count", 2);
    g.kv_u32("llama.embedding_length", D as u32);
    g.kv_u32("llama.feed_forward_length", FF as u32);
    g.kv_u32("llama.attention.head_count", 4);
    g.kv_u32("llama.attention.head_count_kv", 2);
    g.kv_u32("llama.rope.dimension_count", 64);
    g.kv_u32("llama.context_length", 256);
    g.kv_f32("llama.rope.freq_base", 10000.0);
    g.kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5);
    g.tensor(
        "token_embd.weight",
        &[40, D],
        Q8_0,
        blocks(Q8_0, 40, D, &mut rng),
    );
    let norm = |rng: &mut Rng, n: usize| -> Vec<u8> {
        f32_bytes(
            &(0..n)
                .map(|_| 0.5 + (rng.next() % 100) as f32 / 100.0)
                .collect::<Vec<_>>(),
        )
    };
    for l in 0..2 {
        let p = |s: &str| format!("blk.{l}.{s}.weight");
        let b = norm(&mut rng, D);
        g.tensor(&p("attn_norm"), &[D], F32, b);
        let b = norm(&mut rng, D);
        g.tensor(&p("ffn_norm"), &[D], F32, b);
        for (t, rows, k, ty) in [
            ("attn_q", D, D, Q4_K),
            ("attn_k", KV, D, Q5_K),
            ("attn_v", KV, D, Q6_K),
            ("attn_output", D, D, Q4_K),
            ("ffn_gate", FF, D, Q4_K),
            ("ffn_up", FF, D, Q5_0),
            ("ffn_down", D, FF, Q6_K),
        ] {
            let b = blocks(ty, rows, k, &mut rng);
            g.tensor(&p(t), &[rows, k], ty, b);
        }
    }
    let b = norm(&mut rng, D);
    g.tensor("output_norm.weight", &[D], F32, b);
    g.write(name)
}

/// Gemma-3-270M's attention shape in a tiny random `gemma3` GGUF: head_dim
/// 256 with 4 query heads over 1 KV head (q is 1024 wide on a model width
/// of 256), q/k RMSNorms per head, post-attention and post-FFN norms, GELU
/// FFN of 512, tied Q8_0 embedding and head, vocabulary 40. Six layers, so
/// layers 0-4 attend over a sliding window of `window` positions and
/// layer 5 globally (`(l + 1) % 6 == 0`, as the loader reads `gemma3`).
/// Projections in the formats of a `Q4_K_M` file: q, o and gate in Q4_K,
/// k in Q5_K, v and down in Q6_K, up in Q5_0.
pub fn gemma3_wide(name: &str, window: u32) -> PathBuf {
    const D: usize = 256;
    const FF: usize = 512;
    const HD: usize = 256;
    const HQ: usize = 4;
    const LAYERS: usize = 6;
    let mut rng = Rng(11);
    let mut g = Gguf::default();
    g.kv_str("general.architecture", "gemma3");
    g.kv_u32("gemma3.block_count", LAYERS as u32);
    g.kv_u32("gemma3.embedding_length", D as u32);
    g.kv_u32("gemma3.feed_forward_length", FF as u32);
    g.kv_u32("gemma3.attention.head_count", HQ as u32);
    g.kv_u32("gemma3.attention.head_count_kv", 1);
    g.kv_u32("gemma3.attention.key_length", HD as u32);
    g.kv_u32("gemma3.attention.value_length", HD as u32);
    g.kv_u32("gemma3.attention.sliding_window", window);
    g.kv_u32("gemma3.context_length", 128);
    g.kv_f32("gemma3.rope.freq_base", 1_000_000.0);
    g.kv_f32("gemma3.attention.layer_norm_rms_epsilon", 1e-6);
    g.tensor(
        "token_embd.weight",
        &[40, D],
        Q8_0,
        blocks(Q8_0, 40, D, &mut rng),
    );
    let norm = |rng: &mut Rng, n: usize| -> Vec<u8> {
        f32_bytes(
            &(0..n)
                .map(|_| 0.5 + (rng.next() % 100) as f32 / 100.0)
                .collect::<Vec<_>>(),
        )
    };
    for l in 0..LAYERS {
        let p = |s: &str| format!("blk.{l}.{s}.weight");
        for (t, n) in [
            ("attn_norm", D),
            ("ffn_norm", D),
            ("attn_q_norm", HD),
            ("attn_k_norm", HD),
            ("post_attention_norm", D),
            ("post_ffw_norm", D),
        ] {
            let b = norm(&mut rng, n);
            g.tensor(&p(t), &[n], F32, b);
        }
        for (t, rows, k, ty) in [
            ("attn_q", HQ * HD, D, Q4_K),
            ("attn_k", HD, D, Q5_K),
            ("attn_v", HD, D, Q6_K),
            ("attn_output", D, HQ * HD, Q4_K),
            ("ffn_gate", FF, D, Q4_K),
            ("ffn_up", FF, D, Q5_0),
            ("ffn_down", D, FF, Q6_K),
        ] {
            let b = blocks(ty, rows, k, &mut rng);
            g.tensor(&p(t), &[rows, k], ty, b);
        }
    }
    let b = norm(&mut rng, D);
    g.tensor("output_norm.weight", &[D], F32, b);
    g.write(name)
}
