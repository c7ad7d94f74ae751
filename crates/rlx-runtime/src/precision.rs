//! [`Precision`]: the arithmetic a backend uses for a model's float tensors.

/// The arithmetic of a compiled model's float tensors.
///
/// Graph inputs, outputs and params keep their declared dtype (f32) at the
/// API; a backend that supports a lower precision converts weights once at
/// upload and keeps intermediate activations in that precision between ops.
/// Reductions (norms, softmax, attention, pooling sums) always accumulate
/// in f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum Precision {
    /// IEEE f32 storage and arithmetic (the reference; every backend).
    #[default]
    F32,
    /// f32 storage; matmuls round their inputs to TF32 on tensor cores
    /// (CUDA only).
    Tf32,
    /// bfloat16 weights and activations, f32 accumulation (CUDA only).
    Bf16,
    /// IEEE half weights and activations, f32 accumulation (CUDA only).
    F16,
}

impl Precision {
    /// The lower-case name (`f32`, `tf32`, `bf16`, `f16`).
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Tf32 => "tf32",
            Precision::Bf16 => "bf16",
            Precision::F16 => "f16",
        }
    }

    /// Whether activations and matmul weights are stored in 16 bits.
    pub fn is_half(self) -> bool {
        matches!(self, Precision::Bf16 | Precision::F16)
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Precision {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "fp32" | "float32" => Ok(Precision::F32),
            "tf32" => Ok(Precision::Tf32),
            "bf16" | "bfloat16" => Ok(Precision::Bf16),
            "f16" | "fp16" | "float16" | "half" => Ok(Precision::F16),
            other => Err(format!(
                "unknown precision '{other}': expected f32, tf32, bf16 or f16"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Precision;

    #[test]
    fn names_round_trip() {
        for p in [
            Precision::F32,
            Precision::Tf32,
            Precision::Bf16,
            Precision::F16,
        ] {
            assert_eq!(p.name().parse::<Precision>().unwrap(), p);
        }
        assert!("f8".parse::<Precision>().unwrap_err().contains("f8"));
        assert!(Precision::Bf16.is_half() && !Precision::Tf32.is_half());
    }
}
