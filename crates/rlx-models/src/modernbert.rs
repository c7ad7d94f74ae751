//! ModernBERT (`model_type` `modernbert`, transformers' `ModernBertModel`)
//! as a variant of the BERT encoder of [`crate::bert`].
//!
//! What differs from BERT, as transformers 5 computes it:
//! - token embeddings only (no position or token-type tables), then a
//!   LayerNorm;
//! - pre-norm layers: `x + Wo(attn(norm(x)))`, then `x + mlp(norm(x))`;
//!   layer 0 has no attention norm (the embedding norm precedes it);
//! - one fused `Wqkv` projection, split into q, k and v (in that order);
//! - rotary positions (NeoX pairing, all of a head's dims) on q and k, with
//!   the global base θ on global layers and the local base on local layers;
//! - global layers attend to every (unpadded) key; local layers only to
//!   keys `j` with `|i - j| <= local_attention / 2` (both directions);
//! - a gated MLP: `Wo(act(a) * g)` where `[a, g] = Wi(x)` (split in halves);
//! - a final LayerNorm;
//! - biases on the attention, the MLP and the norms only when
//!   `attention_bias`, `mlp_bias`, `norm_bias` say so (all off by default).
//!
//! Both config forms are read: transformers 5's (`layer_types`,
//! `rope_parameters`) and the Hub's older one (`global_attn_every_n_layers`,
//! `global_rope_theta`, `local_rope_theta`); where both are present the
//! newer wins, as in transformers.

use crate::bert::BertConfig;
use crate::validate::{positive_finite, ConfigError};
use rlx_ir::{
    op::{Activation, BinaryOp, MaskKind, RopeStyle},
    DType, Graph, IrError, NodeId, Op, Shape, Tensor,
};
use serde_json::Value;
use std::collections::HashMap;

/// How a ModernBERT layer attends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerAttention {
    /// Every unpadded key (`full_attention`), rotary base
    /// [`ModernBertConfig::global_rope_theta`].
    Global,
    /// Keys within `local_attention / 2` positions either side
    /// (`sliding_attention`), rotary base
    /// [`ModernBertConfig::local_rope_theta`].
    Local,
}

/// The layer kinds `layer_types` may name.
pub const LAYER_TYPES: &str = "\"full_attention\" or \"sliding_attention\"";

/// The ModernBERT-only part of a config (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct ModernBertConfig {
    /// The kind of each layer when the config lists them (`layer_types`);
    /// `None` derives them from
    /// [`global_attn_every_n_layers`](Self::global_attn_every_n_layers).
    pub layer_types: Option<Vec<LayerAttention>>,
    /// Layer `l` is global when `l % n == 0` (`global_attn_every_n_layers`,
    /// default 3), if `layer_types` is absent.
    pub global_attn_every_n_layers: usize,
    /// Rotary base of the global layers (`rope_parameters.full_attention
    /// .rope_theta`, else `global_rope_theta`, default 160000).
    pub global_rope_theta: f32,
    /// Rotary base of the local layers (`rope_parameters.sliding_attention
    /// .rope_theta`, else `local_rope_theta`, default 10000).
    pub local_rope_theta: f32,
    /// The local window's total width (`local_attention`, default 128): a
    /// local layer's query `i` sees keys `j` with `|i - j| <= local_attention / 2`.
    pub local_attention: usize,
    /// Biases on `Wqkv` and `Wo` (`attention_bias`).
    pub attention_bias: bool,
    /// Biases on the MLP's `Wi` and `Wo` (`mlp_bias`).
    pub mlp_bias: bool,
    /// Biases (betas) on the LayerNorms (`norm_bias`).
    pub norm_bias: bool,
}

impl ModernBertConfig {
    /// Parse the ModernBERT keys of a `config.json` value (`file` names it
    /// in errors): types, the rotary bases (positive finite) and rotary
    /// kind (only `"default"`, unscaled rotary, is built). The layer count
    /// is checked against `layer_types` by [`ModernBertConfig::validate`].
    pub fn from_json(file: &str, v: &Value) -> Result<ModernBertConfig, ConfigError> {
        let get = |key: &str| v.get(key).filter(|x| !x.is_null());
        let uint = |key: &str, default: usize| -> Result<usize, ConfigError> {
            match get(key) {
                None => Ok(default),
                Some(x) => x
                    .as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| ConfigError::new(file, key, x, "a non-negative integer")),
            }
        };
        let flag = |key: &str| -> Result<bool, ConfigError> {
            match get(key) {
                None => Ok(false),
                Some(x) => x
                    .as_bool()
                    .ok_or_else(|| ConfigError::new(file, key, x, "true or false")),
            }
        };
        let layer_types = match get("layer_types") {
            None => None,
            Some(x) => {
                let kinds = x.as_array().ok_or_else(|| {
                    ConfigError::new(file, "layer_types", x, format!("an array of {LAYER_TYPES}"))
                })?;
                let mut out = Vec::with_capacity(kinds.len());
                for (i, k) in kinds.iter().enumerate() {
                    out.push(match k.as_str() {
                        Some("full_attention") => LayerAttention::Global,
                        Some("sliding_attention") => LayerAttention::Local,
                        _ => {
                            return Err(ConfigError::new(
                                file,
                                format!("layer_types[{i}]"),
                                k,
                                LAYER_TYPES,
                            ))
                        }
                    });
                }
                Some(out)
            }
        };
        // transformers merges a legacy `rope_scaling` into both kinds'
        // `rope_parameters` (its keys win), then falls back to the legacy
        // thetas and the defaults.
        let scaling =
            match get("rope_scaling") {
                None => None,
                Some(x) => Some(x.as_object().ok_or_else(|| {
                    ConfigError::new(file, "rope_scaling", x, "an object or null")
                })?),
            };
        let params = match get("rope_parameters") {
            None => None,
            Some(x) => Some(x.as_object().ok_or_else(|| {
                ConfigError::new(file, "rope_parameters", x, "an object or null")
            })?),
        };
        let theta = |kind: &str, legacy: &str, default: f64| -> Result<f32, ConfigError> {
            let own = match params.and_then(|p| p.get(kind)).filter(|x| !x.is_null()) {
                None => None,
                Some(x) => Some(x.as_object().ok_or_else(|| {
                    ConfigError::new(
                        file,
                        format!("rope_parameters.{kind}"),
                        x,
                        "an object or null",
                    )
                })?),
            };
            let find = |key: &str| -> Option<(String, &Value)> {
                let in_scaling = scaling.and_then(|s| s.get(key)).filter(|x| !x.is_null());
                if let Some(x) = in_scaling {
                    return Some((format!("rope_scaling.{key}"), x));
                }
                let in_own = own.and_then(|o| o.get(key)).filter(|x| !x.is_null());
                in_own.map(|x| (format!("rope_parameters.{kind}.{key}"), x))
            };
            if let Some((key, x)) = find("rope_type").or_else(|| find("type")) {
                if x.as_str() != Some("default") {
                    return Err(ConfigError::new(
                        file,
                        key,
                        x,
                        "\"default\" (rlx builds unscaled rotary embeddings only)",
                    ));
                }
            }
            let (key, x) = match find("rope_theta") {
                Some(found) => found,
                None => match get(legacy) {
                    Some(x) => (legacy.to_string(), x),
                    None => return Ok(default as f32),
                },
            };
            let t = x
                .as_f64()
                .ok_or_else(|| ConfigError::new(file, &key, x, "a positive finite number"))?;
            Ok(positive_finite(file, &key, t)? as f32)
        };
        Ok(ModernBertConfig {
            layer_types,
            global_attn_every_n_layers: uint("global_attn_every_n_layers", 3)?,
            global_rope_theta: theta("full_attention", "global_rope_theta", 160_000.0)?,
            local_rope_theta: theta("sliding_attention", "local_rope_theta", 10_000.0)?,
            local_attention: uint("local_attention", 128)?,
            attention_bias: flag("attention_bias")?,
            mlp_bias: flag("mlp_bias")?,
            norm_bias: flag("norm_bias")?,
        })
    }

    /// Check the ranges [`ModernBertConfig::from_json`] leaves: one
    /// `layer_types` entry per layer (`num_layers`), or a positive
    /// `global_attn_every_n_layers`; positive finite rotary bases.
    pub fn validate(&self, file: &str, num_layers: usize) -> Result<(), ConfigError> {
        match &self.layer_types {
            Some(t) if t.len() != num_layers => {
                return Err(ConfigError::new(
                    file,
                    "layer_types",
                    format!("{} entries", t.len()),
                    format!("one per layer (num_hidden_layers {num_layers})"),
                ))
            }
            Some(_) => {}
            None if self.global_attn_every_n_layers == 0 => {
                return Err(ConfigError::new(
                    file,
                    "global_attn_every_n_layers",
                    0,
                    "a positive integer",
                ))
            }
            None => {}
        }
        positive_finite(file, "global_rope_theta", self.global_rope_theta as f64)?;
        positive_finite(file, "local_rope_theta", self.local_rope_theta as f64)?;
        Ok(())
    }

    /// How layer `l` attends (see [`ModernBertConfig::validate`] for the
    /// layer count; a layer past `layer_types` reads as global).
    pub fn layer(&self, l: usize) -> LayerAttention {
        match &self.layer_types {
            Some(t) => t.get(l).copied().unwrap_or(LayerAttention::Global),
            None if l.is_multiple_of(self.global_attn_every_n_layers.max(1)) => {
                LayerAttention::Global
            }
            None => LayerAttention::Local,
        }
    }

    /// The farthest key a local layer's query sees, either side
    /// (`local_attention / 2`, transformers' `sliding_window`).
    pub fn half_window(&self) -> usize {
        self.local_attention / 2
    }
}

/// A LayerNorm's params (`{pre}.weight`, and `{pre}.bias` when `norm_bias`).
fn norm_params(p: &mut Vec<(String, Vec<usize>, bool)>, pre: &str, h: usize, bias: bool) {
    p.push((format!("{pre}.weight"), vec![h], false));
    if bias {
        p.push((format!("{pre}.bias"), vec![h], false));
    }
}

/// A linear layer's params: the weight bound `[in, out]` (stored
/// `[out, in]`), and the bias when `bias`.
fn linear_params(
    p: &mut Vec<(String, Vec<usize>, bool)>,
    pre: &str,
    i: usize,
    o: usize,
    bias: bool,
) {
    p.push((format!("{pre}.weight"), vec![i, o], true));
    if bias {
        p.push((format!("{pre}.bias"), vec![o], false));
    }
}

/// Every param of a ModernBERT encoder, as [`BertConfig::params`] lists
/// them (name, shape as bound, stored transposed), under transformers'
/// `ModernBertModel` names.
pub(crate) fn params(cfg: &BertConfig, m: &ModernBertConfig) -> Vec<(String, Vec<usize>, bool)> {
    let (h, f) = (cfg.hidden_size, cfg.intermediate_size);
    let mut p = vec![(
        "embeddings.tok_embeddings.weight".to_string(),
        vec![cfg.vocab_size, h],
        false,
    )];
    norm_params(&mut p, "embeddings.norm", h, m.norm_bias);
    for l in 0..cfg.num_hidden_layers {
        let pre = format!("layers.{l}.");
        if l > 0 {
            norm_params(&mut p, &format!("{pre}attn_norm"), h, m.norm_bias);
        }
        linear_params(
            &mut p,
            &format!("{pre}attn.Wqkv"),
            h,
            3 * h,
            m.attention_bias,
        );
        linear_params(&mut p, &format!("{pre}attn.Wo"), h, h, m.attention_bias);
        norm_params(&mut p, &format!("{pre}mlp_norm"), h, m.norm_bias);
        linear_params(&mut p, &format!("{pre}mlp.Wi"), h, 2 * f, m.mlp_bias);
        linear_params(&mut p, &format!("{pre}mlp.Wo"), f, h, m.mlp_bias);
    }
    norm_params(&mut p, "final_norm", h, m.norm_bias);
    p
}

/// The ModernBERT half of [`BertConfig::check_tensors`]: the layer count
/// against the `layers.N.` names, `vocab_size` and `hidden_size` against
/// the token table, `intermediate_size` against layer 0's `mlp.Wi` (which
/// holds `2 * intermediate_size` rows).
pub(crate) fn check_tensors<'a>(
    cfg: &BertConfig,
    file: &str,
    weights: &str,
    names: impl IntoIterator<Item = &'a str>,
    shape: impl Fn(&str) -> Option<Vec<usize>>,
) -> Result<(), ConfigError> {
    let layers = crate::validate::layers_in_names(names, "layers.");
    if layers != cfg.num_hidden_layers {
        return Err(ConfigError::new(
            file,
            "num_hidden_layers",
            cfg.num_hidden_layers,
            format!("the number of encoder layers in {weights} ({layers})"),
        ));
    }
    let table = "embeddings.tok_embeddings.weight";
    if let Some(d) = shape(table) {
        if d.len() == 2 && d[1] != cfg.hidden_size {
            return Err(ConfigError::new(
                file,
                "hidden_size",
                cfg.hidden_size,
                format!("the width of {table} {d:?} in {weights}"),
            ));
        }
        if d.len() == 2 && d[0] != cfg.vocab_size {
            return Err(ConfigError::new(
                file,
                "vocab_size",
                cfg.vocab_size,
                format!("the rows of {table} {d:?} in {weights} ({})", d[0]),
            ));
        }
    }
    let wi = "layers.0.mlp.Wi.weight";
    if let Some(d) = shape(wi) {
        if d.len() == 2 && Some(d[0]) != cfg.intermediate_size.checked_mul(2) {
            return Err(ConfigError::new(
                file,
                "intermediate_size",
                cfg.intermediate_size,
                format!(
                    "half the rows of {wi} {d:?} in {weights} ({} / 2: Wi holds the input and the gate)",
                    d[0]
                ),
            ));
        }
    }
    Ok(())
}

/// The ModernBERT encoder for `b x s` tokens: the final-normed token states
/// `[B, S, H]`, the `attention_mask` input and the params by name (the
/// inputs of [`crate::bert::build_graph`]; `token_type_ids` is read by
/// nothing).
pub(crate) fn encoder(
    g: &mut Graph,
    cfg: &BertConfig,
    m: &ModernBertConfig,
    b: usize,
    s: usize,
) -> Result<(NodeId, NodeId, HashMap<String, NodeId>), IrError> {
    let h = cfg.hidden_size;
    let f = cfg.intermediate_size;
    let heads = cfg.num_attention_heads;
    let head_dim = h / heads;
    let act = cfg.activation().unwrap_or(Activation::Gelu);
    let eps = cfg.layer_norm_eps;
    let ids = g.input("input_ids", Shape::new(&[b, s], DType::I64));
    g.input("token_type_ids", Shape::new(&[b, s], DType::I64));
    let mask = g.input("attention_mask", Shape::new(&[b, s], DType::F32));
    let mut bound = HashMap::new();
    for (name, dims, _) in params(cfg, m) {
        let id = g.param(&name, Shape::new(&dims, DType::F32));
        bound.insert(name, id);
    }
    let p = |n: &str| bound[n];
    // LayerNorm without a bias: beta is zero.
    let zeros = (!m.norm_bias).then(|| g.constant(Tensor::f32(&[h], vec![0.0; h])));
    let ln = |g: &mut Graph, x: NodeId, pre: &str| {
        let beta = match zeros {
            Some(z) => z,
            None => p(&format!("{pre}.bias")),
        };
        g.push(
            Op::LayerNorm { axis: -1, eps },
            vec![x, p(&format!("{pre}.weight")), beta],
        )
    };
    let linear = |g: &mut Graph, x: NodeId, pre: &str, bias: bool| -> Result<NodeId, IrError> {
        let y = g.push(Op::MatMul, vec![x, p(&format!("{pre}.weight"))])?;
        if bias {
            g.push(
                Op::Binary(BinaryOp::Add),
                vec![y, p(&format!("{pre}.bias"))],
            )
        } else {
            Ok(y)
        }
    };
    let narrow = |g: &mut Graph, x: NodeId, start: usize, len: usize| {
        g.push(
            Op::Narrow {
                axis: 2,
                start,
                len,
            },
            vec![x],
        )
    };
    let word = g.push(
        Op::Gather { axis: 0 },
        vec![p("embeddings.tok_embeddings.weight"), ids],
    )?;
    let mut x = ln(g, word, "embeddings.norm")?;
    let pos = g.constant(Tensor::i64(&[s], (0..s as i64).collect()));
    // Local layers see the window plus the padding mask (built once, at
    // the first local layer); when the window covers the whole sequence
    // that is the padding mask alone.
    let mut local_mask = None;
    for l in 0..cfg.num_hidden_layers {
        let pre = format!("layers.{l}.");
        let (theta, (mask_kind, mask_in)) = match m.layer(l) {
            LayerAttention::Global => (m.global_rope_theta, (MaskKind::Custom, mask)),
            LayerAttention::Local => {
                let lm = match local_mask {
                    Some(lm) => lm,
                    None if s.saturating_sub(1) <= m.half_window() => (MaskKind::Custom, mask),
                    None => (MaskKind::Bias, window_bias(g, mask, b, s, m.half_window())?),
                };
                local_mask = Some(lm);
                (m.local_rope_theta, lm)
            }
        };
        let hn = if l == 0 {
            x
        } else {
            ln(g, x, &format!("{pre}attn_norm"))?
        };
        let qkv = linear(g, hn, &format!("{pre}attn.Wqkv"), m.attention_bias)?;
        let rope = Op::Rope {
            head_dim,
            n_rot: head_dim,
            theta,
            style: RopeStyle::NeoX,
        };
        let q = narrow(g, qkv, 0, h)?;
        let q = g.push(rope.clone(), vec![q, pos])?;
        let k = narrow(g, qkv, h, h)?;
        let k = g.push(rope, vec![k, pos])?;
        let v = narrow(g, qkv, 2 * h, h)?;
        let a = g.push(
            Op::Attention {
                num_heads: heads,
                head_dim,
                mask_kind,
                score_scale: None,
                attn_logit_softcap: None,
            },
            vec![q, k, v, mask_in],
        )?;
        let o = linear(g, a, &format!("{pre}attn.Wo"), m.attention_bias)?;
        x = g.push(Op::Binary(BinaryOp::Add), vec![x, o])?;
        let hn = ln(g, x, &format!("{pre}mlp_norm"))?;
        let wi = linear(g, hn, &format!("{pre}mlp.Wi"), m.mlp_bias)?;
        let input = narrow(g, wi, 0, f)?;
        let gate = narrow(g, wi, f, f)?;
        let input = g.push(Op::Activation(act), vec![input])?;
        let y = g.push(Op::Binary(BinaryOp::Mul), vec![input, gate])?;
        let o = linear(g, y, &format!("{pre}mlp.Wo"), m.mlp_bias)?;
        x = g.push(Op::Binary(BinaryOp::Add), vec![x, o])?;
    }
    let x = ln(g, x, "final_norm")?;
    Ok((x, mask, bound))
}

/// A local layer's attention bias `[B, 1, S, S]`: `-1e30` where
/// `|i - j| > half` (a constant of the sequence length) plus
/// `(mask[b, j] - 1) * 1e30`, which takes padded keys out of the softmax.
/// Finite, so that a padded query row whose window holds only padding
/// stays finite (it is pooled by nothing).
fn window_bias(
    g: &mut Graph,
    mask: NodeId,
    b: usize,
    s: usize,
    half: usize,
) -> Result<NodeId, IrError> {
    let window: Vec<f32> = (0..s)
        .flat_map(|i| (0..s).map(move |j| if i.abs_diff(j) > half { -1e30 } else { 0.0 }))
        .collect();
    let window = g.constant(Tensor::f32(&[1, 1, s, s], window));
    let one = g.constant(Tensor::f32(&[1], vec![1.0]));
    let big = g.constant(Tensor::f32(&[1], vec![1e30]));
    let off = g.push(Op::Binary(BinaryOp::Sub), vec![mask, one])?;
    let off = g.push(Op::Binary(BinaryOp::Mul), vec![off, big])?;
    let off = g.push(
        Op::Reshape {
            shape: vec![b, 1, 1, s],
        },
        vec![off],
    )?;
    g.push(Op::Binary(BinaryOp::Add), vec![window, off])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use LayerAttention::{Global, Local};

    /// The precedence transformers 5.24's `ModernBertConfig` applies (its
    /// `layer_types` and `rope_parameters` for these two configs were read
    /// back with `AutoConfig.from_pretrained`).
    #[test]
    fn newer_keys_win_over_legacy_ones_as_in_transformers() {
        let base = json!({
            "model_type": "modernbert", "num_hidden_layers": 4,
            "global_attn_every_n_layers": 3,
            "global_rope_theta": 5.0, "local_rope_theta": 7.0,
        });
        let mut v = base.clone();
        v["layer_types"] = json!([
            "sliding_attention",
            "full_attention",
            "full_attention",
            "sliding_attention"
        ]);
        v["rope_parameters"] =
            json!({"full_attention": {"rope_theta": 1000.0, "rope_type": "default"}});
        let m = ModernBertConfig::from_json("c", &v).unwrap();
        m.validate("c", 4).unwrap();
        let kinds: Vec<_> = (0..4).map(|l| m.layer(l)).collect();
        assert_eq!(kinds, [Local, Global, Global, Local]);
        assert_eq!((m.global_rope_theta, m.local_rope_theta), (1000.0, 7.0));

        // A legacy `rope_scaling` overrides both kinds; the layer kinds
        // come from global_attn_every_n_layers.
        let mut v = base;
        v["rope_scaling"] = json!({"rope_theta": 3.0});
        let m = ModernBertConfig::from_json("c", &v).unwrap();
        let kinds: Vec<_> = (0..4).map(|l| m.layer(l)).collect();
        assert_eq!(kinds, [Global, Local, Local, Global]);
        assert_eq!((m.global_rope_theta, m.local_rope_theta), (3.0, 3.0));
        assert_eq!(m.half_window(), 64);
        assert!(!m.attention_bias && !m.mlp_bias && !m.norm_bias);
    }

    #[test]
    fn mistyped_keys_are_named() {
        let bad = |key: &str, value: Value| {
            let mut v = json!({"model_type": "modernbert"});
            v[key] = value;
            ModernBertConfig::from_json("c", &v)
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            bad("norm_bias", json!("yes")),
            "c: norm_bias = \"yes\": expected true or false"
        );
        assert!(bad("layer_types", json!("full_attention")).contains("an array of"));
        assert!(bad("local_attention", json!(-8)).contains("local_attention = -8"));
        assert!(bad("global_rope_theta", json!(0.0)).contains("global_rope_theta = 0"));
        let e = bad(
            "rope_parameters",
            json!({"sliding_attention": {"rope_theta": "big"}}),
        );
        assert!(
            e.contains("rope_parameters.sliding_attention.rope_theta = \"big\""),
            "{e}"
        );
    }
}
