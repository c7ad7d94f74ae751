// TEMP_SHIM: minimal evaluator until rlx-ref lands.
use rlx_ir::{contiguous_strides, Activation, BinaryOp, Graph, Op, Tensor, TensorData};
use std::collections::HashMap;

fn bidx(out: &[usize], idx: &[usize], dims: &[usize]) -> usize {
    let r = out.len();
    let st = contiguous_strides(dims);
    let mut o = 0;
    for (i, &d) in dims.iter().enumerate() {
        let oi = i + r - dims.len();
        if d != 1 {
            o += idx[oi] * st[i];
        }
    }
    o
}
fn unravel(mut k: usize, dims: &[usize]) -> Vec<usize> {
    let mut v = vec![0; dims.len()];
    for i in (0..dims.len()).rev() {
        v[i] = k % dims[i].max(1);
        k /= dims[i].max(1);
    }
    v
}
fn erf(x: f64) -> f64 {
    // Abramowitz-Stegun 7.1.26 is too coarse; use series/continued
    let t = 1.0 / (1.0 + 0.5 * x.abs());
    let poly = -1.26551223
        + t * (1.00002368
            + t * (0.37409196
                + t * (0.09678418
                    + t * (-0.18628806
                        + t * (0.27886807
                            + t * (-1.13520398
                                + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))));
    let y = 1.0 - t * (-x * x + poly).exp();
    if x >= 0.0 {
        y
    } else {
        -y
    }
}
fn actf(a: Activation, x: f64) -> f64 {
    match a {
        Activation::Relu => x.max(0.0),
        Activation::Gelu => 0.5 * x * (1.0 + erf(x / 2f64.sqrt())),
        Activation::GeluTanh => {
            0.5 * x
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
        }
        Activation::Silu => x / (1.0 + (-x).exp()),
        Activation::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        Activation::Tanh => x.tanh(),
        Activation::Exp => x.exp(),
        Activation::Neg => -x,
        Activation::Sqrt => x.sqrt(),
        Activation::Rsqrt => 1.0 / x.sqrt(),
        Activation::Abs => x.abs(),
        Activation::Softplus => (1.0 + x.exp()).ln(),
    }
}
fn binf(b: BinaryOp, x: f64, y: f64) -> f64 {
    match b {
        BinaryOp::Add => x + y,
        BinaryOp::Sub => x - y,
        BinaryOp::Mul => x * y,
        BinaryOp::Div => x / y,
        BinaryOp::Max => x.max(y),
        BinaryOp::Min => x.min(y),
        BinaryOp::Pow => x.powf(y),
    }
}
fn matmul(a: &[f64], ad: &[usize], b: &[f64], bd: &[usize], od: &[usize]) -> Vec<f64> {
    let r = od.len();
    let (m, n) = (od[r - 2], od[r - 1]);
    let k = ad[ad.len() - 1];
    let nb: usize = od[..r - 2].iter().product();
    let mut out = vec![0.0; od.iter().product()];
    for bi in 0..nb {
        let bidxv = unravel(bi, &od[..r - 2]);
        let mut full = bidxv.clone();
        full.extend([0, 0]);
        let abase = {
            let mut ad2 = ad.to_vec();
            let l = ad2.len();
            ad2[l - 2] = 1;
            ad2[l - 1] = 1;
            bidx(&full, &full, &ad2)
        };
        let bbase = {
            let mut bd2 = bd.to_vec();
            let l = bd2.len();
            bd2[l - 2] = 1;
            bd2[l - 1] = 1;
            bidx(&full, &full, &bd2)
        };
        let abase = abase * m * k;
        let bbase = bbase * k * n;
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0;
                for kk in 0..k {
                    s += a[abase + i * k + kk] * b[bbase + kk * n + j];
                }
                out[bi * m * n + i * n + j] = s;
            }
        }
    }
    out
}
fn norm(x: &[f64], d: usize, eps: f64, gamma: &[f64], beta: Option<&[f64]>, rms: bool) -> Vec<f64> {
    let mut o = vec![0.0; x.len()];
    for (ri, row) in x.chunks(d).enumerate() {
        let mean = if rms {
            0.0
        } else {
            row.iter().sum::<f64>() / d as f64
        };
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / d as f64;
        for j in 0..d {
            o[ri * d + j] =
                (row[j] - mean) / (var + eps).sqrt() * gamma[j] + beta.map_or(0.0, |b| b[j]);
        }
    }
    o
}
pub fn run(g: &Graph, b: &HashMap<String, Tensor>) -> Result<Vec<Tensor>, String> {
    let mut v: Vec<Vec<f64>> = Vec::new();
    for n in g.nodes() {
        let ins: Vec<&Vec<f64>> = n.inputs.iter().map(|i| &v[i.index()]).collect();
        let sh: Vec<Vec<usize>> = n
            .inputs
            .iter()
            .map(|i| g.node(*i).shape.dims.clone())
            .collect();
        let od = &n.shape.dims;
        let numel = n.shape.numel();
        let out: Vec<f64> = match &n.op {
            Op::Input { name } | Op::Param { name } => {
                b.get(name).ok_or(format!("missing {name}"))?.data.to_f64()
            }
            Op::Constant { value } => value.data.to_f64(),
            Op::MatMul => matmul(ins[0], &sh[0], ins[1], &sh[1], od),
            Op::FusedMatMulBiasAct { activation } => {
                let m = matmul(ins[0], &sh[0], ins[1], &sh[1], od);
                let nn = od[od.len() - 1];
                m.iter()
                    .enumerate()
                    .map(|(i, x)| {
                        let y = x + ins[2][i % nn];
                        activation.map_or(y, |a| actf(a, y))
                    })
                    .collect()
            }
            Op::Activation(a) => ins[0].iter().map(|&x| actf(*a, x)).collect(),
            Op::Binary(op) => (0..numel)
                .map(|k| {
                    let idx = unravel(k, od);
                    binf(
                        *op,
                        ins[0][bidx(od, &idx, &sh[0])],
                        ins[1][bidx(od, &idx, &sh[1])],
                    )
                })
                .collect(),
            Op::LayerNorm { eps, .. } => norm(
                ins[0],
                n.shape.last_dim(),
                *eps as f64,
                ins[1],
                Some(ins[2]),
                false,
            ),
            Op::RmsNorm { eps, .. } => {
                norm(ins[0], n.shape.last_dim(), *eps as f64, ins[1], None, true)
            }
            Op::FusedResidualLN { has_bias, eps } | Op::FusedResidualRmsNorm { has_bias, eps } => {
                let d = n.shape.last_dim();
                let hb = *has_bias as usize;
                let s: Vec<f64> = (0..numel)
                    .map(|i| ins[0][i] + ins[1][i] + if *has_bias { ins[2][i % d] } else { 0.0 })
                    .collect();
                if matches!(n.op, Op::FusedResidualLN { .. }) {
                    norm(&s, d, *eps as f64, ins[2 + hb], Some(ins[3 + hb]), false)
                } else {
                    norm(&s, d, *eps as f64, ins[2 + hb], None, true)
                }
            }
            Op::Reshape { .. } => ins[0].clone(),
            Op::Expand { .. } => (0..numel)
                .map(|k| ins[0][bidx(od, &unravel(k, od), &sh[0])])
                .collect(),
            Op::Narrow { axis, start, .. } => (0..numel)
                .map(|k| {
                    let mut idx = unravel(k, od);
                    idx[*axis] += start;
                    let st = contiguous_strides(&sh[0]);
                    ins[0][idx.iter().zip(&st).map(|(a, b)| a * b).sum::<usize>()]
                })
                .collect(),
            Op::Concat { axis } => (0..numel)
                .map(|k| {
                    let mut idx = unravel(k, od);
                    let mut j = 0;
                    while idx[*axis] >= sh[j][*axis] {
                        idx[*axis] -= sh[j][*axis];
                        j += 1;
                    }
                    let st = contiguous_strides(&sh[j]);
                    ins[j][idx.iter().zip(&st).map(|(a, b)| a * b).sum::<usize>()]
                })
                .collect(),
            Op::Transpose { perm } => (0..numel)
                .map(|k| {
                    let idx = unravel(k, od);
                    let st = contiguous_strides(&sh[0]);
                    let mut o = 0;
                    for (i, &p) in perm.iter().enumerate() {
                        o += idx[i] * st[p];
                    }
                    ins[0][o]
                })
                .collect(),
            Op::FusedSwiGLU { packed } => {
                if *packed {
                    let d = n.shape.last_dim();
                    (0..numel)
                        .map(|k| {
                            let (r, c) = (k / d, k % d);
                            actf(Activation::Silu, ins[0][r * 2 * d + c])
                                * ins[0][r * 2 * d + d + c]
                        })
                        .collect()
                } else {
                    (0..numel)
                        .map(|k| actf(Activation::Silu, ins[0][k]) * ins[1][k])
                        .collect()
                }
            }
            Op::Attention {
                num_heads,
                head_dim,
                ..
            } => {
                let (bb, sq, sk) = (od[0], od[1], sh[1][1]);
                let hd = *head_dim;
                let h = *num_heads;
                let w = h * hd;
                let mut o = vec![0.0; numel];
                for bi in 0..bb {
                    for hi in 0..h {
                        for i in 0..sq {
                            let s: Vec<f64> = (0..sk)
                                .map(|j| {
                                    (0..hd)
                                        .map(|e| {
                                            ins[0][(bi * sq + i) * w + hi * hd + e]
                                                * ins[1][(bi * sk + j) * w + hi * hd + e]
                                        })
                                        .sum::<f64>()
                                        / (hd as f64).sqrt()
                                })
                                .collect();
                            let mx = s.iter().cloned().fold(f64::MIN, f64::max);
                            let ex: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
                            let z: f64 = ex.iter().sum();
                            for e in 0..hd {
                                o[(bi * sq + i) * w + hi * hd + e] = (0..sk)
                                    .map(|j| ex[j] / z * ins[2][(bi * sk + j) * w + hi * hd + e])
                                    .sum();
                            }
                        }
                    }
                }
                o
            }
            other => return Err(format!("shim: {}", other.name())),
        };
        let out: Vec<f64> = out.iter().map(|&x| x as f32 as f64).collect();
        v.push(out);
    }
    Ok(g.outputs
        .iter()
        .map(|o| {
            let n = g.node(*o);
            Tensor {
                shape: n.shape.clone(),
                data: std::sync::Arc::new(TensorData::F32(
                    v[o.index()].iter().map(|&x| x as f32).collect(),
                )),
            }
        })
        .collect())
}
