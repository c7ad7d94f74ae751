//! Scalar formulas of one variable: the definition of an elementwise
//! activation from which every backend derives its code when it has no
//! hand-written kernel for it (the reference interpreter evaluates it in
//! f64, the CPU in f32, CUDA compiles the C that [`Formula::cuda`] writes).

/// An expression in `x`, built from constants, arithmetic and a few
/// functions, as a `const` tree.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Formula {
    /// The argument.
    X,
    /// A constant.
    C(f64),
    /// `-a`.
    Neg(&'static Formula),
    /// `|a|`.
    Abs(&'static Formula),
    /// `e^a`.
    Exp(&'static Formula),
    /// `ln(1 + a)`.
    Log1p(&'static Formula),
    /// `tanh(a)`.
    Tanh(&'static Formula),
    /// `sqrt(a)`.
    Sqrt(&'static Formula),
    /// `a + b`.
    Add(&'static Formula, &'static Formula),
    /// `a - b`.
    Sub(&'static Formula, &'static Formula),
    /// `a * b`.
    Mul(&'static Formula, &'static Formula),
    /// `a / b`.
    Div(&'static Formula, &'static Formula),
    /// `max(a, b)`, NaN if either is NaN.
    Max(&'static Formula, &'static Formula),
}

impl Formula {
    /// The value at `x`, in f64.
    pub fn eval_f64(&self, x: f64) -> f64 {
        match *self {
            Formula::X => x,
            Formula::C(c) => c,
            Formula::Neg(a) => -a.eval_f64(x),
            Formula::Abs(a) => a.eval_f64(x).abs(),
            Formula::Exp(a) => a.eval_f64(x).exp(),
            Formula::Log1p(a) => a.eval_f64(x).ln_1p(),
            Formula::Tanh(a) => a.eval_f64(x).tanh(),
            Formula::Sqrt(a) => a.eval_f64(x).sqrt(),
            Formula::Add(a, b) => a.eval_f64(x) + b.eval_f64(x),
            Formula::Sub(a, b) => a.eval_f64(x) - b.eval_f64(x),
            Formula::Mul(a, b) => a.eval_f64(x) * b.eval_f64(x),
            Formula::Div(a, b) => a.eval_f64(x) / b.eval_f64(x),
            Formula::Max(a, b) => {
                let (a, b) = (a.eval_f64(x), b.eval_f64(x));
                if a.is_nan() || b.is_nan() {
                    f64::NAN
                } else {
                    a.max(b)
                }
            }
        }
    }

    /// The value at `x`, in f32 (constants rounded to f32).
    pub fn eval_f32(&self, x: f32) -> f32 {
        match *self {
            Formula::X => x,
            Formula::C(c) => c as f32,
            Formula::Neg(a) => -a.eval_f32(x),
            Formula::Abs(a) => a.eval_f32(x).abs(),
            Formula::Exp(a) => a.eval_f32(x).exp(),
            Formula::Log1p(a) => a.eval_f32(x).ln_1p(),
            Formula::Tanh(a) => a.eval_f32(x).tanh(),
            Formula::Sqrt(a) => a.eval_f32(x).sqrt(),
            Formula::Add(a, b) => a.eval_f32(x) + b.eval_f32(x),
            Formula::Sub(a, b) => a.eval_f32(x) - b.eval_f32(x),
            Formula::Mul(a, b) => a.eval_f32(x) * b.eval_f32(x),
            Formula::Div(a, b) => a.eval_f32(x) / b.eval_f32(x),
            Formula::Max(a, b) => {
                let (a, b) = (a.eval_f32(x), b.eval_f32(x));
                if a.is_nan() || b.is_nan() {
                    f32::NAN
                } else {
                    a.max(b)
                }
            }
        }
    }

    /// A CUDA C expression over `float x` (`QNAN` is the quiet NaN that
    /// the kernels' common header defines).
    pub fn cuda(&self) -> String {
        match *self {
            Formula::X => "x".into(),
            Formula::C(c) => {
                let s = format!("{:?}", c as f32);
                if s.contains(['.', 'e', 'E']) {
                    format!("{s}f")
                } else {
                    format!("{s}.0f")
                }
            }
            Formula::Neg(a) => format!("(-{})", a.cuda()),
            Formula::Abs(a) => format!("fabsf({})", a.cuda()),
            Formula::Exp(a) => format!("expf({})", a.cuda()),
            Formula::Log1p(a) => format!("log1pf({})", a.cuda()),
            Formula::Tanh(a) => format!("tanhf({})", a.cuda()),
            Formula::Sqrt(a) => format!("sqrtf({})", a.cuda()),
            Formula::Add(a, b) => format!("({} + {})", a.cuda(), b.cuda()),
            Formula::Sub(a, b) => format!("({} - {})", a.cuda(), b.cuda()),
            Formula::Mul(a, b) => format!("({} * {})", a.cuda(), b.cuda()),
            Formula::Div(a, b) => format!("({} / {})", a.cuda(), b.cuda()),
            Formula::Max(a, b) => {
                let (a, b) = (a.cuda(), b.cuda());
                format!("(({a}) != ({a}) || ({b}) != ({b}) ? QNAN : fmaxf({a}, {b}))")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Formula::{self, *};

    const SOFTPLUS: Formula = Add(&Max(&X, &C(0.0)), &Log1p(&Exp(&Neg(&Abs(&X)))));

    #[test]
    fn evaluates_and_writes_c() {
        let want = |x: f64| x.max(0.0) + (-x.abs()).exp().ln_1p();
        for x in [-30.0, -1.5, 0.0, 0.25, 3.0, 40.0] {
            assert_eq!(SOFTPLUS.eval_f64(x), want(x));
            assert!(
                (SOFTPLUS.eval_f32(x as f32) as f64 - want(x)).abs() <= 1e-6 * want(x).max(1.0)
            );
        }
        assert!(SOFTPLUS.eval_f64(f64::NAN).is_nan());
        assert_eq!(
            SOFTPLUS.cuda(),
            "(((x) != (x) || (0.0f) != (0.0f) ? QNAN : fmaxf(x, 0.0f)) + log1pf(expf((-fabsf(x)))))"
        );
        assert_eq!(C(0.044715).cuda(), "0.044715f");
        assert_eq!(C(1e-30).cuda(), "1e-30f");
    }
}
