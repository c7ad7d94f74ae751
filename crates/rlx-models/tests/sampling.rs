//! Sampler properties: greedy is arg-max, top-k = 1 is arg-max at any
//! temperature, seeding is reproducible, empirical frequencies match softmax
//! probabilities, top-p keeps the smallest prefix reaching p, repetition
//! penalty lowers repeated tokens, and bad input gives typed errors.

use rlx_models::sampling::{argmax, Sampler, SamplerConfig, SamplingError, SplitMix64};

fn cfg(temperature: f32, top_k: usize, top_p: f32, penalty: f32, seed: u64) -> SamplerConfig {
    SamplerConfig {
        temperature,
        top_k,
        top_p,
        repetition_penalty: penalty,
        seed,
    }
}

/// Random logits in [-scale, scale).
fn random_logits(rng: &mut SplitMix64, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| (rng.next_f64() as f32 * 2.0 - 1.0) * scale)
        .collect()
}

/// First index of the maximum, computed naively.
fn naive_argmax(v: &[f32]) -> u32 {
    let max = v.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    v.iter().position(|&x| x == max).unwrap() as u32
}

fn softmax(logits: &[f64]) -> Vec<f64> {
    let m = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = logits.iter().map(|l| (l - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|x| x / s).collect()
}

#[test]
fn greedy_is_argmax() {
    let mut rng = SplitMix64::new(7);
    let mut s = Sampler::new(SamplerConfig::greedy()).unwrap();
    for n in [1, 2, 5, 100, 49152] {
        for _ in 0..20 {
            let logits = random_logits(&mut rng, n, 10.0);
            assert_eq!(s.sample(&logits, &[]).unwrap(), naive_argmax(&logits));
        }
    }
    // Ties go to the lowest id.
    assert_eq!(s.sample(&[1.0, 3.0, 3.0, -2.0], &[]).unwrap(), 1);
    assert_eq!(argmax(&[f32::NEG_INFINITY, -5.0, -5.0]), 1);
}

#[test]
fn top_k_one_is_argmax_at_any_temperature() {
    let mut rng = SplitMix64::new(11);
    for (seed, temperature) in [(1, 0.05f32), (2, 0.7), (3, 1.0), (4, 5.0), (5, 1000.0)] {
        let mut s = Sampler::new(cfg(temperature, 1, 1.0, 1.0, seed)).unwrap();
        for _ in 0..50 {
            let logits = random_logits(&mut rng, 300, 3.0);
            assert_eq!(s.sample(&logits, &[]).unwrap(), naive_argmax(&logits));
        }
    }
}

#[test]
fn same_seed_same_sequence_different_seed_different() {
    let mut rng = SplitMix64::new(3);
    let logits = random_logits(&mut rng, 1000, 2.0);
    let draw = |seed| {
        let mut s = Sampler::new(cfg(1.0, 0, 1.0, 1.0, seed)).unwrap();
        (0..200)
            .map(|_| s.sample(&logits, &[]).unwrap())
            .collect::<Vec<u32>>()
    };
    let a = draw(42);
    assert_eq!(a, draw(42));
    let b = draw(43);
    assert_ne!(a, b);
    // The draws are not degenerate: many distinct tokens out of 1000.
    let mut distinct = a.clone();
    distinct.sort();
    distinct.dedup();
    assert!(
        distinct.len() > 100,
        "only {} distinct tokens",
        distinct.len()
    );
}

/// Draws `n` samples and compares frequencies with `expected` (|diff| < tol).
fn check_frequencies(s: &mut Sampler, logits: &[f32], expected: &[f64], n: usize, tol: f64) {
    let mut counts = vec![0usize; logits.len()];
    for _ in 0..n {
        counts[s.sample(logits, &[]).unwrap() as usize] += 1;
    }
    for (i, (&c, &p)) in counts.iter().zip(expected).enumerate() {
        let f = c as f64 / n as f64;
        assert!(
            (f - p).abs() < tol,
            "token {i}: frequency {f:.4}, expected probability {p:.4} (counts {counts:?})"
        );
    }
}

#[test]
fn empirical_frequencies_match_softmax() {
    let logits = [1.0f32, 2.0, 0.5, -1.0, 3.0, 2.5];
    let l64: Vec<f64> = logits.iter().map(|&x| f64::from(x)).collect();
    // Temperature 1.
    let mut s = Sampler::new(cfg(1.0, 0, 1.0, 1.0, 2024)).unwrap();
    check_frequencies(&mut s, &logits, &softmax(&l64), 20_000, 0.02);
    // The exact distribution the sampler reports.
    let dist = s.distribution(&logits, &[]).unwrap();
    for ((id, p), q) in dist.iter().zip(softmax(&l64)) {
        assert!((p - q).abs() < 1e-12, "id {id}: {p} vs {q}");
    }
    // Temperature 2 flattens: softmax(l / 2).
    let mut s = Sampler::new(cfg(2.0, 0, 1.0, 1.0, 99)).unwrap();
    let halved: Vec<f64> = l64.iter().map(|x| x / 2.0).collect();
    check_frequencies(&mut s, &logits, &softmax(&halved), 20_000, 0.02);
    // Top-k = 3 renormalizes over the three largest (ids 4, 5, 1).
    let mut s = Sampler::new(cfg(1.0, 3, 1.0, 1.0, 5)).unwrap();
    let top3 = softmax(&[3.0, 2.5, 2.0]);
    let expected = [0.0, top3[2], 0.0, 0.0, top3[0], top3[1]];
    check_frequencies(&mut s, &logits, &expected, 20_000, 0.02);
}

#[test]
fn top_p_keeps_smallest_prefix_reaching_p() {
    // Probabilities 0.5, 0.3, 0.15, 0.05 placed at shuffled ids.
    let probs = [0.15f64, 0.5, 0.05, 0.3];
    let logits: Vec<f32> = probs.iter().map(|p| p.ln() as f32).collect();
    let dist = |p: f32| {
        Sampler::new(cfg(1.0, 0, p, 1.0, 0))
            .unwrap()
            .distribution(&logits, &[])
            .unwrap()
    };
    let ids = |d: &[(u32, f64)]| d.iter().map(|x| x.0).collect::<Vec<_>>();
    // 0.5 < 0.75 <= 0.8: ids 1 and 3, renormalized to 0.625 / 0.375.
    let d = dist(0.75);
    assert_eq!(ids(&d), vec![1, 3]);
    assert!((d[0].1 - 0.625).abs() < 1e-6 && (d[1].1 - 0.375).abs() < 1e-6);
    // 0.8 < 0.81 <= 0.95: three tokens.
    assert_eq!(ids(&dist(0.81)), vec![1, 3, 0]);
    // 0.45 <= 0.5: only the top token.
    assert_eq!(ids(&dist(0.45)), vec![1]);
    // A tiny p still keeps one token.
    assert_eq!(ids(&dist(1e-6)), vec![1]);
    // 1.0 keeps everything.
    assert_eq!(dist(1.0).len(), 4);
    // Sampling never leaves the nucleus.
    let mut s = Sampler::new(cfg(1.0, 0, 0.75, 1.0, 8)).unwrap();
    let mut counts = [0usize; 4];
    for _ in 0..20_000 {
        counts[s.sample(&logits, &[]).unwrap() as usize] += 1;
    }
    assert_eq!(counts[0] + counts[2], 0, "counts {counts:?}");
    let f1 = counts[1] as f64 / 20_000.0;
    assert!((f1 - 0.625).abs() < 0.02, "frequency of id 1: {f1}");
}

#[test]
fn repetition_penalty_lowers_repeated_tokens() {
    let logits = [2.0f32, -1.0, 0.5, 1.5];
    let plain = Sampler::new(cfg(1.0, 0, 1.0, 1.0, 0)).unwrap();
    let pen = Sampler::new(cfg(1.0, 0, 1.0, 2.0, 0)).unwrap();
    let history = [0u32, 1, 0];
    let p_plain = plain.distribution(&logits, &history).unwrap();
    let p_pen = pen.distribution(&logits, &history).unwrap();
    // Positive logit divided, negative multiplied, once per distinct token.
    let expected = softmax(&[1.0, -2.0, 0.5, 1.5]);
    for ((id, p), q) in p_pen.iter().zip(&expected) {
        assert!((p - q).abs() < 1e-9, "id {id}: {p} vs {q}");
    }
    assert!(p_pen[0].1 < p_plain[0].1);
    assert!(p_pen[1].1 < p_plain[1].1);
    assert!(p_pen[3].1 > p_plain[3].1);
    // Penalty 1 leaves the history irrelevant.
    assert_eq!(p_plain, plain.distribution(&logits, &[]).unwrap());
    // Greedy with a penalty moves off the repeated arg-max.
    let mut g = Sampler::new(cfg(0.0, 0, 1.0, 1.5, 0)).unwrap();
    assert_eq!(g.sample(&logits, &[]).unwrap(), 0);
    assert_eq!(g.sample(&logits, &[0]).unwrap(), 3);
}

#[test]
fn bad_logits_are_typed_errors() {
    let mut s = Sampler::new(cfg(1.0, 0, 1.0, 1.0, 0)).unwrap();
    match s.sample(&[0.0, f32::NAN, 1.0], &[]).unwrap_err() {
        SamplingError::NonFiniteLogit { index, len, value } => {
            assert_eq!((index, len), (1, 3));
            assert!(value.is_nan());
        }
        other => panic!("expected NonFiniteLogit, got {other:?}"),
    }
    let mut greedy = Sampler::new(SamplerConfig::greedy()).unwrap();
    assert!(matches!(
        greedy.sample(&[f32::NAN], &[]),
        Err(SamplingError::NonFiniteLogit { index: 0, .. })
    ));
    assert!(matches!(
        s.sample(&[0.0, f32::INFINITY], &[]),
        Err(SamplingError::NonFiniteLogit { index: 1, .. })
    ));
    assert_eq!(s.sample(&[], &[]), Err(SamplingError::EmptyLogits));
    assert_eq!(
        s.sample(&[f32::NEG_INFINITY; 4], &[]),
        Err(SamplingError::AllMasked { len: 4 })
    );
    let mut p = Sampler::new(cfg(1.0, 0, 1.0, 1.2, 0)).unwrap();
    assert_eq!(
        p.sample(&[0.0, 1.0], &[5]),
        Err(SamplingError::HistoryOutOfRange { id: 5, len: 2 })
    );
    // Masked tokens are never drawn.
    for _ in 0..1000 {
        let id = s
            .sample(&[f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY, 0.0], &[])
            .unwrap();
        assert!(id == 1 || id == 3);
    }
}

#[test]
fn invalid_configs_are_rejected() {
    let bad = [
        cfg(-0.1, 0, 1.0, 1.0, 0),
        cfg(f32::NAN, 0, 1.0, 1.0, 0),
        cfg(f32::INFINITY, 0, 1.0, 1.0, 0),
        cfg(1.0, 0, 0.0, 1.0, 0),
        cfg(1.0, 0, 1.5, 1.0, 0),
        cfg(1.0, 0, 1.0, 0.0, 0),
        cfg(1.0, 0, 1.0, -1.0, 0),
    ];
    for c in bad {
        assert!(
            matches!(Sampler::new(c), Err(SamplingError::InvalidConfig { .. })),
            "{c:?} accepted"
        );
    }
    assert!(Sampler::new(SamplerConfig::default()).is_ok());
}
