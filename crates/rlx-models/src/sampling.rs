//! Next-token sampling from logits: greedy, temperature, top-k, top-p
//! (nucleus) and repetition penalty, with a small seeded RNG so runs are
//! reproducible.
//!
//! The pipeline applied by [`Sampler::sample`], in this order (HuggingFace
//! `generate` order):
//!
//! 1. **Repetition penalty** (CTRL paper, as in HF and llama.cpp): for every
//!    distinct token in `history`, a positive logit is divided by the penalty
//!    and a negative one multiplied by it.
//! 2. **Greedy** when `temperature == 0`: the arg-max (lowest id on ties).
//! 3. **Temperature**: logits divided by `temperature`.
//! 4. **Top-k**: keep the `top_k` largest logits (`0` disables).
//! 5. **Top-p**: keep the smallest prefix of the tokens sorted by
//!    probability whose cumulative probability reaches `top_p` (`1.0`
//!    disables); at least one token is always kept.
//! 6. Draw from the renormalized softmax of what is left.
//!
//! Logits may be `-inf` (masked tokens); NaN or `+inf` is an error.

/// Sampling settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplerConfig {
    /// Softmax temperature; `0.0` means greedy (arg-max). Must be finite and `>= 0`.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; `0` keeps all.
    pub top_k: usize,
    /// Nucleus threshold in `(0, 1]`; `1.0` keeps all.
    pub top_p: f32,
    /// Repetition penalty `> 0`; `1.0` disables it.
    pub repetition_penalty: f32,
    /// RNG seed.
    pub seed: u64,
}

impl SamplerConfig {
    /// Greedy decoding (temperature 0, no penalty).
    pub fn greedy() -> Self {
        SamplerConfig {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            repetition_penalty: 1.0,
            seed: 0,
        }
    }
}

impl Default for SamplerConfig {
    /// Greedy decoding; see [`SamplerConfig::greedy`].
    fn default() -> Self {
        SamplerConfig::greedy()
    }
}

/// Errors from configuring a [`Sampler`] or sampling.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplingError {
    /// A configuration field is outside its valid range.
    #[error("invalid sampler config: {field} = {value}, expected {expected}")]
    InvalidConfig {
        /// Field name.
        field: &'static str,
        /// Value given.
        value: f32,
        /// Valid range.
        expected: &'static str,
    },
    /// `logits` is empty.
    #[error("empty logits: expected one logit per vocabulary token")]
    EmptyLogits,
    /// A logit is NaN or `+inf`.
    #[error("logit {index} of {len} is {value}: expected a finite value or -inf")]
    NonFiniteLogit {
        /// Token id of the bad logit.
        index: usize,
        /// Number of logits.
        len: usize,
        /// The value.
        value: f32,
    },
    /// Every logit is `-inf`.
    #[error("all {len} logits are -inf: no token can be sampled")]
    AllMasked {
        /// Number of logits.
        len: usize,
    },
    /// A history token id is not a valid index into `logits`.
    #[error("history token {id} is out of range: logits cover ids 0..{len}")]
    HistoryOutOfRange {
        /// The id.
        id: u32,
        /// Number of logits.
        len: usize,
    },
}

/// SplitMix64: a tiny, well-mixed 64-bit generator (Steele, Lea & Flood 2014).
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform `f64` in `[0, 1)` (53 random bits).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// A seeded next-token sampler.
#[derive(Debug, Clone)]
pub struct Sampler {
    cfg: SamplerConfig,
    rng: SplitMix64,
}

impl Sampler {
    /// A sampler for `cfg`; rejects out-of-range settings.
    pub fn new(cfg: SamplerConfig) -> Result<Self, SamplingError> {
        let bad = |field, value, expected| {
            Err(SamplingError::InvalidConfig {
                field,
                value,
                expected,
            })
        };
        if !(cfg.temperature.is_finite() && cfg.temperature >= 0.0) {
            return bad("temperature", cfg.temperature, "a finite value >= 0");
        }
        if !(cfg.top_p > 0.0 && cfg.top_p <= 1.0) {
            return bad("top_p", cfg.top_p, "a value in (0, 1]");
        }
        if !(cfg.repetition_penalty.is_finite() && cfg.repetition_penalty > 0.0) {
            return bad(
                "repetition_penalty",
                cfg.repetition_penalty,
                "a finite value > 0",
            );
        }
        Ok(Sampler {
            cfg,
            rng: SplitMix64::new(cfg.seed),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Picks the next token from `logits` (one per vocabulary id), penalizing
    /// the tokens in `history`.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> Result<u32, SamplingError> {
        let penalized = self.penalized(logits, history)?;
        if self.cfg.temperature == 0.0 {
            return Ok(argmax(&penalized));
        }
        let dist = self.distribution_of(&penalized);
        let r = self.rng.next_f64();
        let mut acc = 0.0;
        for &(id, p) in &dist {
            acc += p;
            if r < acc {
                return Ok(id);
            }
        }
        // Rounding left the total a hair under 1: take the last candidate.
        Ok(dist.last().map_or(0, |&(id, _)| id))
    }

    /// The distribution [`Sampler::sample`] draws from, as `(id, probability)`
    /// pairs that sum to 1 (most likely first when top-k or top-p is active,
    /// otherwise in id order; zero-probability tokens omitted). For greedy
    /// configs it is the arg-max with probability 1. Does not advance the RNG.
    pub fn distribution(
        &self,
        logits: &[f32],
        history: &[u32],
    ) -> Result<Vec<(u32, f64)>, SamplingError> {
        let penalized = self.penalized(logits, history)?;
        if self.cfg.temperature == 0.0 {
            return Ok(vec![(argmax(&penalized), 1.0)]);
        }
        Ok(self.distribution_of(&penalized))
    }

    /// Validates `logits` and applies the repetition penalty.
    fn penalized(&self, logits: &[f32], history: &[u32]) -> Result<Vec<f32>, SamplingError> {
        let len = logits.len();
        if len == 0 {
            return Err(SamplingError::EmptyLogits);
        }
        if let Some((index, &value)) = logits
            .iter()
            .enumerate()
            .find(|(_, v)| v.is_nan() || **v == f32::INFINITY)
        {
            return Err(SamplingError::NonFiniteLogit { index, len, value });
        }
        if logits.iter().all(|&v| v == f32::NEG_INFINITY) {
            return Err(SamplingError::AllMasked { len });
        }
        let mut out = logits.to_vec();
        let penalty = self.cfg.repetition_penalty;
        if penalty != 1.0 && !history.is_empty() {
            let mut seen = vec![false; len];
            for &id in history {
                let i = id as usize;
                if i >= len {
                    return Err(SamplingError::HistoryOutOfRange { id, len });
                }
                if !seen[i] {
                    seen[i] = true;
                    let v = out[i];
                    out[i] = if v > 0.0 { v / penalty } else { v * penalty };
                }
            }
        }
        Ok(out)
    }

    /// Temperature, top-k, top-p and softmax over penalized, validated logits.
    fn distribution_of(&self, logits: &[f32]) -> Vec<(u32, f64)> {
        let t = f64::from(self.cfg.temperature);
        let mut cands: Vec<(u32, f64)> = logits
            .iter()
            .enumerate()
            .filter(|(_, &v)| v != f32::NEG_INFINITY)
            .map(|(i, &v)| (i as u32, f64::from(v) / t))
            .collect();
        let by_logit_desc =
            |a: &(u32, f64), b: &(u32, f64)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        let k = self.cfg.top_k;
        let top_p = f64::from(self.cfg.top_p);
        if k > 0 && k < cands.len() {
            cands.select_nth_unstable_by(k - 1, by_logit_desc);
            cands.truncate(k);
            cands.sort_unstable_by(by_logit_desc);
        } else if top_p < 1.0 {
            cands.sort_unstable_by(by_logit_desc);
        }
        softmax_in_place(&mut cands);
        if top_p < 1.0 {
            let mut acc = 0.0;
            let mut keep = cands.len();
            for (i, &(_, p)) in cands.iter().enumerate() {
                acc += p;
                if acc >= top_p {
                    keep = i + 1;
                    break;
                }
            }
            cands.truncate(keep.max(1));
            let total: f64 = cands.iter().map(|c| c.1).sum();
            for c in &mut cands {
                c.1 /= total;
            }
        }
        cands.retain(|c| c.1 > 0.0);
        cands
    }
}

/// Replaces the scores of `cands` with their softmax probabilities.
fn softmax_in_place(cands: &mut [(u32, f64)]) {
    let max = cands.iter().map(|c| c.1).fold(f64::NEG_INFINITY, f64::max);
    let mut total = 0.0;
    for c in cands.iter_mut() {
        c.1 = (c.1 - max).exp();
        total += c.1;
    }
    for c in cands.iter_mut() {
        c.1 /= total;
    }
}

/// Index of the largest value (lowest index on ties); `values` is non-empty
/// and NaN-free.
pub fn argmax(values: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = i;
        }
    }
    best as u32
}
