//! ggml tensor element types, as stored in GGUF tensor infos.

use std::fmt;

use rlx_ir::QuantScheme;

/// A ggml tensor type. The discriminant is the id stored in GGUF files.
///
/// Ids 4, 5 (removed `Q4_2`/`Q4_3`) and 31–33, 36–38 (removed interleaved
/// repacks) are not valid in GGUF files and are rejected as unknown.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum GgmlType {
    /// 32-bit float.
    F32 = 0,
    /// 16-bit IEEE float.
    F16 = 1,
    /// 32 x 4-bit, f16 scale.
    Q4_0 = 2,
    /// 32 x 4-bit, f16 scale and min.
    Q4_1 = 3,
    /// 32 x 5-bit, f16 scale.
    Q5_0 = 6,
    /// 32 x 5-bit, f16 scale and min.
    Q5_1 = 7,
    /// 32 x 8-bit, f16 scale.
    Q8_0 = 8,
    /// 32 x 8-bit, f16 scale and f16 sum (activation-side type).
    Q8_1 = 9,
    /// 256-element super-block, 2-bit.
    Q2_K = 10,
    /// 256-element super-block, 3-bit.
    Q3_K = 11,
    /// 256-element super-block, 4-bit.
    Q4_K = 12,
    /// 256-element super-block, 5-bit.
    Q5_K = 13,
    /// 256-element super-block, 6-bit.
    Q6_K = 14,
    /// 256-element super-block, 8-bit with f32 scale.
    Q8_K = 15,
    /// Importance-matrix 2-bit (xxs).
    IQ2_XXS = 16,
    /// Importance-matrix 2-bit (xs).
    IQ2_XS = 17,
    /// Importance-matrix 3-bit (xxs).
    IQ3_XXS = 18,
    /// Importance-matrix 1-bit (s).
    IQ1_S = 19,
    /// Non-linear 4-bit, 32-element blocks.
    IQ4_NL = 20,
    /// Importance-matrix 3-bit (s).
    IQ3_S = 21,
    /// Importance-matrix 2-bit (s).
    IQ2_S = 22,
    /// Non-linear 4-bit, 256-element blocks.
    IQ4_XS = 23,
    /// 8-bit signed integer.
    I8 = 24,
    /// 16-bit signed integer.
    I16 = 25,
    /// 32-bit signed integer.
    I32 = 26,
    /// 64-bit signed integer.
    I64 = 27,
    /// 64-bit float.
    F64 = 28,
    /// Importance-matrix 1-bit (m).
    IQ1_M = 29,
    /// bfloat16.
    BF16 = 30,
    /// Ternary, 1.6875 bits per weight.
    TQ1_0 = 34,
    /// Ternary, 2.0625 bits per weight.
    TQ2_0 = 35,
    /// Microscaling FP4 (e2m1 with e8m0 block scale).
    MXFP4 = 39,
}

impl GgmlType {
    /// Every known type, in id order.
    pub const ALL: [GgmlType; 32] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_K,
        GgmlType::IQ2_XXS,
        GgmlType::IQ2_XS,
        GgmlType::IQ3_XXS,
        GgmlType::IQ1_S,
        GgmlType::IQ4_NL,
        GgmlType::IQ3_S,
        GgmlType::IQ2_S,
        GgmlType::IQ4_XS,
        GgmlType::I8,
        GgmlType::I16,
        GgmlType::I32,
        GgmlType::I64,
        GgmlType::F64,
        GgmlType::IQ1_M,
        GgmlType::BF16,
        GgmlType::TQ1_0,
        GgmlType::TQ2_0,
        GgmlType::MXFP4,
    ];

    /// The type with GGUF id `id`, or `None` if unknown.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        GgmlType::ALL.iter().copied().find(|t| t.id() == id)
    }

    /// The id stored in GGUF files.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// Elements per block (1 for plain scalar types).
    pub fn block_elems(self) -> usize {
        use GgmlType::*;
        match self {
            F32 | F16 | I8 | I16 | I32 | I64 | F64 | BF16 => 1,
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 | IQ4_NL | MXFP4 => 32,
            Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | Q8_K | IQ2_XXS | IQ2_XS | IQ3_XXS | IQ1_S
            | IQ3_S | IQ2_S | IQ4_XS | IQ1_M | TQ1_0 | TQ2_0 => 256,
        }
    }

    /// Bytes per block (ggml's `type_size`).
    pub fn block_bytes(self) -> usize {
        use GgmlType::*;
        match self {
            F32 => 4,
            F16 => 2,
            Q4_0 => 18,
            Q4_1 => 20,
            Q5_0 => 22,
            Q5_1 => 24,
            Q8_0 => 34,
            Q8_1 => 36,
            Q2_K => 84,
            Q3_K => 110,
            Q4_K => 144,
            Q5_K => 176,
            Q6_K => 210,
            Q8_K => 292,
            IQ2_XXS => 66,
            IQ2_XS => 74,
            IQ3_XXS => 98,
            IQ1_S => 50,
            IQ4_NL => 18,
            IQ3_S => 110,
            IQ2_S => 82,
            IQ4_XS => 136,
            I8 => 1,
            I16 => 2,
            I32 => 4,
            I64 => 8,
            F64 => 8,
            IQ1_M => 56,
            BF16 => 2,
            TQ1_0 => 54,
            TQ2_0 => 66,
            MXFP4 => 17,
        }
    }

    /// Bytes of a row of `k` elements, or `None` if `k` is not a whole number
    /// of blocks or the size overflows.
    pub fn row_bytes(self, k: usize) -> Option<usize> {
        if k % self.block_elems() != 0 {
            return None;
        }
        (k / self.block_elems()).checked_mul(self.block_bytes())
    }

    /// The ggml name (e.g. `Q4_K`).
    pub fn name(self) -> &'static str {
        use GgmlType::*;
        match self {
            F32 => "F32",
            F16 => "F16",
            Q4_0 => "Q4_0",
            Q4_1 => "Q4_1",
            Q5_0 => "Q5_0",
            Q5_1 => "Q5_1",
            Q8_0 => "Q8_0",
            Q8_1 => "Q8_1",
            Q2_K => "Q2_K",
            Q3_K => "Q3_K",
            Q4_K => "Q4_K",
            Q5_K => "Q5_K",
            Q6_K => "Q6_K",
            Q8_K => "Q8_K",
            IQ2_XXS => "IQ2_XXS",
            IQ2_XS => "IQ2_XS",
            IQ3_XXS => "IQ3_XXS",
            IQ1_S => "IQ1_S",
            IQ4_NL => "IQ4_NL",
            IQ3_S => "IQ3_S",
            IQ2_S => "IQ2_S",
            IQ4_XS => "IQ4_XS",
            I8 => "I8",
            I16 => "I16",
            I32 => "I32",
            I64 => "I64",
            F64 => "F64",
            IQ1_M => "IQ1_M",
            BF16 => "BF16",
            TQ1_0 => "TQ1_0",
            TQ2_0 => "TQ2_0",
            MXFP4 => "MXFP4",
        }
    }

    /// The `DequantMatMul` scheme for this type, if it is one of the block
    /// formats rlx executes quantized.
    pub fn quant_scheme(self) -> Option<QuantScheme> {
        use GgmlType::*;
        Some(match self {
            Q4_0 => QuantScheme::Q4_0,
            Q4_1 => QuantScheme::Q4_1,
            Q5_0 => QuantScheme::Q5_0,
            Q5_1 => QuantScheme::Q5_1,
            Q8_0 => QuantScheme::Q8_0,
            Q2_K => QuantScheme::Q2K,
            Q3_K => QuantScheme::Q3K,
            Q4_K => QuantScheme::Q4K,
            Q5_K => QuantScheme::Q5K,
            Q6_K => QuantScheme::Q6K,
            Q8_K => QuantScheme::Q8K,
            _ => return None,
        })
    }

    /// Whether [`crate::quant::dequantize`] supports this type.
    pub fn can_dequantize(self) -> bool {
        use GgmlType::*;
        matches!(
            self,
            F32 | F16
                | BF16
                | Q4_0
                | Q4_1
                | Q5_0
                | Q5_1
                | Q8_0
                | Q2_K
                | Q3_K
                | Q4_K
                | Q5_K
                | Q6_K
                | Q8_K
        )
    }
}

impl From<QuantScheme> for GgmlType {
    fn from(s: QuantScheme) -> GgmlType {
        match s {
            QuantScheme::Q4_0 => GgmlType::Q4_0,
            QuantScheme::Q4_1 => GgmlType::Q4_1,
            QuantScheme::Q5_0 => GgmlType::Q5_0,
            QuantScheme::Q5_1 => GgmlType::Q5_1,
            QuantScheme::Q8_0 => GgmlType::Q8_0,
            QuantScheme::Q2K => GgmlType::Q2_K,
            QuantScheme::Q3K => GgmlType::Q3_K,
            QuantScheme::Q4K => GgmlType::Q4_K,
            QuantScheme::Q5K => GgmlType::Q5_K,
            QuantScheme::Q6K => GgmlType::Q6_K,
            QuantScheme::Q8K => GgmlType::Q8_K,
        }
    }
}

impl TryFrom<GgmlType> for QuantScheme {
    /// The type itself, when it has no `QuantScheme`.
    type Error = GgmlType;

    fn try_from(t: GgmlType) -> Result<QuantScheme, GgmlType> {
        t.quant_scheme().ok_or(t)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_unknown_ids_are_none() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
        }
        for id in [4, 5, 31, 32, 33, 36, 37, 38, 99, u32::MAX] {
            assert_eq!(GgmlType::from_id(id), None, "id {id}");
        }
    }

    #[test]
    fn block_layout_agrees_with_rlx_ir() {
        for s in QuantScheme::ALL {
            let t = GgmlType::from(s);
            assert_eq!(t.quant_scheme(), Some(s));
            assert_eq!(t.block_elems(), s.block_elems(), "{t}");
            assert_eq!(t.block_bytes(), s.block_bytes(), "{t}");
            assert_eq!(t.name(), s.name());
            assert_eq!(t.row_bytes(512), s.row_bytes(512));
        }
        assert_eq!(GgmlType::F32.quant_scheme(), None);
        assert_eq!(QuantScheme::try_from(GgmlType::Q6_K), Ok(QuantScheme::Q6K));
        assert_eq!(QuantScheme::try_from(GgmlType::BF16), Err(GgmlType::BF16));
        assert_eq!(GgmlType::Q4_K.row_bytes(100), None);
        assert_eq!(GgmlType::F32.row_bytes(usize::MAX), None);
    }
}
