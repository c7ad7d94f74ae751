//! Qwen3-Next and Qwen3.5 text (GatedDeltaNet hybrids) against transformers.
//!
//! The references in `tests/data/families/{qwen3_next,qwen3_5}` are random-
//! init small configs written by `scripts/gen_model_refs.py` (transformers
//! 5.24.0, its torch path for the gated delta rule and the conv): logits at
//! every prompt position and 24 greedy ids. Every check runs in thunks and
//! in hybrid mode on the CPU.

use rlx_cpu::{CpuModel, CpuOptions};
use rlx_formats::SafeTensorsFile;
use rlx_models::qwen3_next::{
    build_graph, Qwen3NextConfig, Qwen3NextError, Qwen3NextModel, Qwen3NextWeights,
};
use rlx_models::recurrent::gdn_block_graph;
use rlx_runtime::{Executable, TensorRef};
use std::path::{Path, PathBuf};

fn family_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/families")
        .join(name)
}

struct Prompt {
    ids: Vec<u32>,
    logits: Vec<Vec<f32>>,
    greedy: Vec<u32>,
}

fn reference(name: &str) -> Vec<Prompt> {
    let text = std::fs::read_to_string(family_dir(name).join("reference.json")).unwrap();
    let j: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(j["versions"]["transformers"], "5.24.0");
    j["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let ids = |k: &str| -> Vec<u32> {
                p[k].as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_u64().unwrap() as u32)
                    .collect()
            };
            Prompt {
                ids: ids("prompt_ids"),
                greedy: ids("greedy_ids"),
                logits: p["logits"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|row| {
                        row.as_array()
                            .unwrap()
                            .iter()
                            .map(|v| v.as_f64().unwrap() as f32)
                            .collect()
                    })
                    .collect(),
            }
        })
        .collect()
}

fn opts(hybrid: bool) -> CpuOptions {
    CpuOptions {
        hybrid,
        ..CpuOptions::default()
    }
}

/// max |a - b| / max |b|.
fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-12);
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
        / scale
}

fn check_family(name: &str) {
    let refs = reference(name);
    let mut thunk_logits: Vec<Vec<f32>> = Vec::new();
    for hybrid in [false, true] {
        let mut m = Qwen3NextModel::load(family_dir(name), 64, opts(hybrid)).unwrap();
        let vocab = m.config().vocab;
        for (i, p) in refs.iter().enumerate() {
            let logits = m.prefill(&p.ids).unwrap();
            // Hybrid equals thunks to 1e-5 relative (DESIGN.md invariant 3).
            if hybrid {
                let err = rel_err(&logits, &thunk_logits[i]);
                assert!(err < 1e-5, "{name}: hybrid vs thunks rel err {err}");
            } else {
                thunk_logits.push(logits.clone());
            }
            let want: Vec<f32> = p.logits.iter().flatten().copied().collect();
            let err = rel_err(&logits, &want);
            eprintln!(
                "{name} hybrid={hybrid} prompt len {}: prefill logits rel err {err:e}",
                p.ids.len()
            );
            assert!(err < 1e-4, "{name} hybrid={hybrid}: rel err {err}");
            assert_eq!(logits.len(), p.ids.len() * vocab);
            let ids = m.generate_greedy(&p.ids, 24).unwrap();
            assert_eq!(ids, p.greedy, "{name} hybrid={hybrid}: greedy ids");
        }
    }
}

#[test]
fn qwen3_next_matches_transformers_thunks_and_hybrid() {
    check_family("qwen3_next");
}

#[test]
fn qwen3_5_text_matches_transformers_thunks_and_hybrid() {
    check_family("qwen3_5");
}

/// Prefill of `k` tokens then decode of the rest, one at a time, equals one
/// prefill of the whole prompt at every position: the GDN conv and
/// recurrent states and the KV caches carry over between the step graphs.
#[test]
fn decode_after_prefill_equals_longer_prefill() {
    let refs = reference("qwen3_next");
    let p = &refs[2];
    for hybrid in [false, true] {
        let mut m = Qwen3NextModel::load(family_dir("qwen3_next"), 32, opts(hybrid)).unwrap();
        let vocab = m.config().vocab;
        let full = m.prefill(&p.ids).unwrap();
        for k in [1, 5] {
            let mut got = m.prefill(&p.ids[..k]).unwrap();
            // then a 3-token chunk (extend), then single tokens
            let (chunk_end, rest_start) = (k + 3, k + 3);
            got.extend(m.forward(&p.ids[k..chunk_end]).unwrap());
            for &id in &p.ids[rest_start..] {
                got.extend(m.forward(&[id]).unwrap());
            }
            assert_eq!(m.position(), p.ids.len());
            let err = rel_err(&got, &full);
            eprintln!("hybrid={hybrid} k={k}: decode vs prefill rel err {err:e}");
            assert!(err < 1e-5, "hybrid={hybrid} k={k}: {err}");
            assert_eq!(got.len(), p.ids.len() * vocab);
        }
        // Step models compiled: 12 (prefill), 1, 3 and 5 tokens, each with
        // its plan; hybrid ones have compiled segments.
        let plans = m.plans();
        assert_eq!(plans.len(), 4);
        for p in &plans {
            assert!(p.nodes > 400, "{}: {} nodes", p.name, p.nodes);
            assert_eq!(p.report.compiled_segments > 0, hybrid, "{}", p.name);
        }
    }
}

#[test]
fn hybrid_plan_has_segments_between_gdn_thunk_ranges() {
    let dir = family_dir("qwen3_next");
    let cfg = Qwen3NextConfig::from_dir(&dir).unwrap();
    let w = Qwen3NextWeights::load(&dir, &cfg).unwrap();
    for seq in [1, 8] {
        let g = build_graph(&w, seq, 32).unwrap();
        let n_gdn = g
            .nodes()
            .iter()
            .filter(|n| n.op.name() == "GatedDeltaNet")
            .count();
        assert_eq!(n_gdn, 3);
        let m = CpuModel::compile(g, &opts(true)).unwrap();
        let r = m.report();
        eprintln!(
            "seq {seq}: {} compiled segments, {} thunk ranges, {} dispatches (thunks only {})",
            r.compiled_segments, r.thunk_ranges, r.dispatches, r.dispatches_thunks_only
        );
        assert!(r.compiled_segments > 0);
        assert!(r.dispatches < r.dispatches_thunks_only);
        // Every GDN node sits in a thunk range, and a compiled segment lies
        // between consecutive GDN ranges.
        let gdn_ranges: Vec<(usize, usize)> = r
            .ranges
            .iter()
            .filter(|t| t.ops.iter().any(|o| o.op == "GatedDeltaNet"))
            .map(|t| (t.start, t.end))
            .collect();
        let gdn_in_ranges: usize = r
            .ranges
            .iter()
            .map(|t| t.ops.iter().filter(|o| o.op == "GatedDeltaNet").count())
            .sum();
        assert_eq!(gdn_in_ranges, 3, "every GatedDeltaNet node is on thunks");
        for w in gdn_ranges.windows(2) {
            let between = r
                .segments
                .iter()
                .filter(|s| (s.first.0 as usize) >= w[0].1 && (s.last.0 as usize) < w[1].0)
                .count();
            assert!(between > 0, "a compiled segment between GDN ranges {w:?}");
        }
    }
}

/// The loader's mapping of transformers' GDN conventions (grouped
/// in_proj_qkvz / in_proj_ba, conv1d taps, A_log, dt_bias, gated norm)
/// checked on layer 0 of the Qwen3-Next reference against a direct f64
/// re-computation of transformers' formulas from the raw HF tensors.
#[test]
fn gdn_mapping_matches_direct_recomputation() {
    let dir = family_dir("qwen3_next");
    let cfg = Qwen3NextConfig::from_dir(&dir).unwrap();
    let w = Qwen3NextWeights::load(&dir, &cfg).unwrap();
    let st = SafeTensorsFile::open(dir.join("model.safetensors")).unwrap();
    let g = &cfg.gdn;
    let (d, hk, hv, n, kk) = (
        g.hidden,
        g.num_k_heads,
        g.num_v_heads,
        g.head_dim,
        g.conv_kernel,
    );
    let r = hv / hk;
    let (kd, vd, cd) = (g.key_dim(), g.value_dim(), g.conv_dim());
    let hf = |s: &str| -> Vec<f64> {
        let name = format!("model.layers.0.linear_attn.{s}");
        let (_, dims) = st.info(&name).unwrap();
        st.tensor_f32(&name, &dims)
            .unwrap()
            .iter()
            .map(|&x| x as f64)
            .collect()
    };
    let (wqkvz, wba, conv, dt, alog, nw, wout) = (
        hf("in_proj_qkvz.weight"),
        hf("in_proj_ba.weight"),
        hf("conv1d.weight"),
        hf("dt_bias"),
        hf("A_log"),
        hf("norm.weight"),
        hf("out_proj.weight"),
    );
    let s = 6;
    let x: Vec<f32> = (0..s * d)
        .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.8)
        .collect();
    let lin = |w: &[f64], out: usize, xr: &[f32]| -> Vec<f64> {
        (0..out)
            .map(|o| (0..d).map(|i| w[o * d + i] * xr[i] as f64).sum())
            .collect()
    };
    let blk = 2 * n + 2 * r * n;
    // Per token: mixed [q all | k all | v all] (transformers' ordering fix),
    // z per value head, b and a per value head.
    let mut mixed = vec![vec![0f64; cd]; s];
    let mut z = vec![vec![0f64; vd]; s];
    let mut bb = vec![vec![0f64; hv]; s];
    let mut aa = vec![vec![0f64; hv]; s];
    for t in 0..s {
        let xr = &x[t * d..(t + 1) * d];
        let p = lin(&wqkvz, hk * blk, xr);
        let pba = lin(&wba, 2 * hv, xr);
        for gi in 0..hk {
            let o = gi * blk;
            for i in 0..n {
                mixed[t][gi * n + i] = p[o + i];
                mixed[t][kd + gi * n + i] = p[o + n + i];
            }
            for i in 0..r * n {
                mixed[t][2 * kd + gi * r * n + i] = p[o + 2 * n + i];
                z[t][gi * r * n + i] = p[o + 2 * n + r * n + i];
            }
            for i in 0..r {
                bb[t][gi * r + i] = pba[gi * 2 * r + i];
                aa[t][gi * r + i] = pba[gi * 2 * r + r + i];
            }
        }
    }
    let silu = |v: f64| v / (1.0 + (-v).exp());
    let softplus = |v: f64| (1.0 + v.exp()).ln();
    // Causal depthwise conv, padding K-1 on the left, then SiLU.
    let conv_out: Vec<Vec<f64>> = (0..s)
        .map(|t| {
            (0..cd)
                .map(|c| {
                    let mut acc = 0.0;
                    for j in 0..kk {
                        let src = t as isize + j as isize - (kk as isize - 1);
                        if src >= 0 {
                            acc += conv[c * kk + j] * mixed[src as usize][c];
                        }
                    }
                    silu(acc)
                })
                .collect()
        })
        .collect();
    let l2 = |v: &[f64]| -> Vec<f64> {
        let inv = 1.0 / (v.iter().map(|x| x * x).sum::<f64>() + 1e-6).sqrt();
        v.iter().map(|x| x * inv).collect()
    };
    let mut state = vec![vec![0f64; n * n]; hv];
    let mut y = vec![0f64; s * d];
    for t in 0..s {
        let mut normed = vec![0f64; vd];
        for h in 0..hv {
            let kh = h / r;
            let q = l2(&conv_out[t][kh * n..(kh + 1) * n]);
            let k = l2(&conv_out[t][kd + kh * n..kd + (kh + 1) * n]);
            let v = &conv_out[t][2 * kd + h * n..2 * kd + (h + 1) * n];
            let beta = 1.0 / (1.0 + (-bb[t][h]).exp());
            let gdecay = -alog[h].exp() * softplus(aa[t][h] + dt[h]);
            let sm = &mut state[h];
            sm.iter_mut().for_each(|e| *e *= gdecay.exp());
            let delta: Vec<f64> = (0..n)
                .map(|j| beta * (v[j] - (0..n).map(|i| sm[i * n + j] * k[i]).sum::<f64>()))
                .collect();
            for i in 0..n {
                for j in 0..n {
                    sm[i * n + j] += k[i] * delta[j];
                }
            }
            let o: Vec<f64> = (0..n)
                .map(|j| (0..n).map(|i| sm[i * n + j] * q[i]).sum::<f64>() / (n as f64).sqrt())
                .collect();
            let ms = o.iter().map(|e| e * e).sum::<f64>() / n as f64;
            let inv = 1.0 / (ms + cfg.eps as f64).sqrt();
            for j in 0..n {
                normed[h * n + j] = o[j] * inv * nw[j] * silu(z[t][h * n + j]);
            }
        }
        for o in 0..d {
            y[t * d + o] = (0..vd).map(|i| wout[o * vd + i] * normed[i]).sum();
        }
    }

    // rlx: the recurrent block on the mapped weights (params `gdn.*`).
    let graph = gdn_block_graph(g, 1, s).unwrap();
    for hybrid in [false, true] {
        let mut m = CpuModel::compile(graph.clone(), &opts(hybrid)).unwrap();
        for (name, t) in &w.tensors {
            if let Some(rest) = name.strip_prefix("layers.0.gdn.") {
                m.set_param_tensor(&format!("gdn.{rest}"), t.clone())
                    .unwrap();
            }
        }
        let cs = vec![0f32; (kk - 1) * cd];
        let ss = vec![0f32; hv * n * n];
        let outs = m
            .run(&[
                ("x", TensorRef::F32(&x)),
                ("conv_state", TensorRef::F32(&cs)),
                ("ssm_state", TensorRef::F32(&ss)),
            ])
            .unwrap();
        let got = outs[0].as_f32().unwrap();
        let want: Vec<f32> = y.iter().map(|&v| v as f32).collect();
        let err = rel_err(got, &want);
        eprintln!("GDN layer 0 mapping hybrid={hybrid}: rel err {err:e}");
        assert!(err < 1e-5, "output rel err {err}");
        // The carried recurrent state has transformers' layout [Hv, dk, dv].
        let st_want: Vec<f32> = state.iter().flatten().map(|&v| v as f32).collect();
        let err = rel_err(outs[2].as_f32().unwrap(), &st_want);
        assert!(err < 1e-5, "state rel err {err}");
        // The conv state is the last K-1 pre-conv rows, time-major.
        let cs_want: Vec<f32> = mixed[s - (kk - 1)..]
            .iter()
            .flatten()
            .map(|&v| v as f32)
            .collect();
        assert!(rel_err(outs[1].as_f32().unwrap(), &cs_want) < 1e-5);
    }
}

// ---- bad input ----

/// Writes a safetensors file holding `tensors` (name, dims, f32 data).
fn write_safetensors(path: &Path, tensors: &[(String, Vec<usize>, Vec<f32>)]) {
    let mut header = serde_json::Map::new();
    let mut off = 0usize;
    for (name, dims, data) in tensors {
        let len = data.len() * 4;
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": "F32", "shape": dims, "data_offsets": [off, off + len]}),
        );
        off += len;
    }
    let mut h = serde_json::to_vec(&serde_json::Value::Object(header)).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
    bytes.extend(h);
    for (_, _, data) in tensors {
        for v in data {
            bytes.extend(v.to_le_bytes());
        }
    }
    std::fs::write(path, bytes).unwrap();
}

/// A copy of the Qwen3-Next reference dir in a temp dir with `edit` applied
/// to its tensors and `cfg_edit` to its config.
fn edited_copy(
    tag: &str,
    edit: impl Fn(&mut Vec<(String, Vec<usize>, Vec<f32>)>),
    cfg_edit: impl Fn(&mut serde_json::Value),
) -> PathBuf {
    let src = family_dir("qwen3_next");
    let dst = std::env::temp_dir().join(format!("rlx_qwen3_next_{tag}_{}", std::process::id()));
    std::fs::create_dir_all(&dst).unwrap();
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    cfg_edit(&mut cfg);
    std::fs::write(dst.join("config.json"), cfg.to_string()).unwrap();
    let st = SafeTensorsFile::open(src.join("model.safetensors")).unwrap();
    let mut names: Vec<&str> = st.names();
    names.sort();
    let mut ts: Vec<(String, Vec<usize>, Vec<f32>)> = names
        .iter()
        .map(|&n| {
            let (_, dims) = st.info(n).unwrap();
            let data = st.tensor_f32(n, &dims).unwrap().into_owned();
            (n.to_string(), dims, data)
        })
        .collect();
    edit(&mut ts);
    write_safetensors(&dst.join("model.safetensors"), &ts);
    dst
}

fn load_err(dir: &Path) -> String {
    match Qwen3NextModel::load(dir, 16, opts(false)) {
        Ok(_) => panic!("expected an error for {}", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn unsupported_model_type_is_named() {
    let dir = edited_copy("arch", |_| {}, |c| c["model_type"] = "mamba2".into());
    let e = load_err(&dir);
    assert!(e.contains("mamba2") && e.contains("qwen3_next"), "{e}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn missing_tensor_is_named() {
    let name = "model.layers.2.linear_attn.A_log";
    let dir = edited_copy("missing", |ts| ts.retain(|t| t.0 != name), |_| {});
    let e = load_err(&dir);
    assert!(e.contains(name) && e.contains("[4]"), "{e}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn wrong_shape_is_named() {
    let name = "model.layers.0.linear_attn.in_proj_ba.weight";
    let dir = edited_copy(
        "shape",
        |ts| {
            let t = ts.iter_mut().find(|t| t.0 == name).unwrap();
            t.1 = vec![4, 128];
        },
        |_| {},
    );
    let e = load_err(&dir);
    assert!(
        e.contains(name) && e.contains("[4, 128]") && e.contains("[8, 64]") && e.contains("F32"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn bad_config_and_bad_ids_are_errors() {
    let dir = edited_copy("heads", |_| {}, |c| c["linear_value_head_dim"] = 32.into());
    let e = load_err(&dir);
    assert!(
        e.contains("linear_value_head_dim") && e.contains("32"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(dir);

    let mut m = Qwen3NextModel::load(family_dir("qwen3_next"), 8, opts(false)).unwrap();
    let e = m.prefill(&[1, 999]).unwrap_err();
    assert!(
        matches!(
            e,
            Qwen3NextError::TokenOutOfRange {
                id: 999,
                position: 1,
                vocab: 256
            }
        ),
        "{e}"
    );
    let e = m.prefill(&[1; 9]).unwrap_err();
    assert!(
        matches!(
            e,
            Qwen3NextError::ContextOverflow {
                needed: 9,
                ctx_len: 8
            }
        ),
        "{e}"
    );
    assert!(matches!(m.prefill(&[]).unwrap_err(), Qwen3NextError::Empty));
    // The model still works after the refusals.
    m.prefill(&[1, 2, 3]).unwrap();
}
