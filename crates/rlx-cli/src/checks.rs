//! Range checks of size flags (`--ctx`, `--seq`, `--batch`, `--max-tokens`,
//! `--iters`, ...), run before anything is sized by them.
//!
//! Values that do not parse as integers (`1e9`, `-5`) are refused by clap
//! before these run; these catch values that parse but are out of range.
//! Every message names the flag, its value and the allowed range.

/// `value` if `min <= value <= max`, else an error naming `flag`, the value,
/// the range and, when given, where the bound comes from (`why`).
pub fn in_range(
    flag: &str,
    value: usize,
    min: usize,
    max: usize,
    why: &str,
) -> Result<usize, String> {
    if (min..=max).contains(&value) {
        return Ok(value);
    }
    let range = if max == usize::MAX {
        format!("at least {min}")
    } else {
        format!("{min}..={max}")
    };
    let why = if why.is_empty() {
        String::new()
    } else {
        format!(" ({why})")
    };
    Err(format!("{flag} {value}: expected {range}{why}"))
}

/// `value >= 1`.
pub fn positive(flag: &str, value: usize) -> Result<usize, String> {
    in_range(flag, value, 1, usize::MAX, "")
}

/// A BERT sequence length: `1 ..= max_position_embeddings`.
pub fn bert_seq(flag: &str, seq: usize, max_position_embeddings: usize) -> Result<usize, String> {
    in_range(
        flag,
        seq,
        1,
        max_position_embeddings,
        "max_position_embeddings of the model",
    )
}

/// A KV cache length: `1 ..= context_length` of the model (when the file
/// gives one).
pub fn ctx(
    flag: &str,
    ctx: usize,
    context_length: Option<usize>,
    arch: &str,
) -> Result<usize, String> {
    match context_length {
        Some(max) => in_range(
            flag,
            ctx,
            1,
            max,
            &format!("{arch}.context_length of the model"),
        ),
        None => positive(flag, ctx),
    }
}

/// `--max-tokens`: at least 1, and the prompt plus the new tokens must fit
/// the context (without overflow).
pub fn max_tokens(max_tokens: usize, prompt_len: usize, ctx: usize) -> Result<usize, String> {
    let room = ctx.saturating_sub(prompt_len);
    if max_tokens >= 1 && prompt_len.checked_add(max_tokens).is_some_and(|n| n <= ctx) {
        return Ok(max_tokens);
    }
    Err(format!(
        "--max-tokens {max_tokens}: expected 1..={room} (the prompt is {prompt_len} tokens and --ctx is {ctx})"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_sizes_are_refused_with_flag_and_value() {
        for flag in ["--batch", "--seq", "--iters"] {
            let e = positive(flag, 0).unwrap_err();
            assert!(
                e.contains(flag) && e.contains(" 0") && e.contains("at least 1"),
                "{e}"
            );
        }
        assert_eq!(positive("--batch", 3), Ok(3));
    }

    #[test]
    fn bert_seq_names_max_position_embeddings() {
        let e = bert_seq("--seq", 1000, 512).unwrap_err();
        assert!(e.contains("--seq 1000"), "{e}");
        assert!(e.contains("1..=512"), "{e}");
        assert!(e.contains("max_position_embeddings"), "{e}");
        assert!(bert_seq("--seq", 0, 512).is_err());
        assert_eq!(bert_seq("--seq", 512, 512), Ok(512));
    }

    #[test]
    fn ctx_is_bounded_by_the_context_length() {
        let e = ctx("--ctx", 4611686018427387904, Some(8192), "llama").unwrap_err();
        assert!(e.contains("--ctx 4611686018427387904"), "{e}");
        assert!(e.contains("1..=8192"), "{e}");
        assert!(e.contains("llama.context_length"), "{e}");
        assert!(ctx("--ctx", 0, None, "llama").is_err());
        assert_eq!(ctx("--ctx", 512, Some(8192), "llama"), Ok(512));
        assert_eq!(ctx("--ctx", 1 << 20, None, "llama"), Ok(1 << 20));
    }

    #[test]
    fn max_tokens_cannot_wrap_past_the_context() {
        let e = max_tokens(usize::MAX, 5, 512).unwrap_err();
        assert!(e.contains("--max-tokens 18446744073709551615"), "{e}");
        assert!(e.contains("1..=507"), "{e}");
        assert!(max_tokens(0, 5, 512).is_err());
        assert!(max_tokens(508, 5, 512).is_err());
        assert_eq!(max_tokens(507, 5, 512), Ok(507));
    }
}
