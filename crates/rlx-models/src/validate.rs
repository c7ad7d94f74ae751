//! Checked hyper-parameters: the error every config check returns.
//!
//! Model configs (`config.json`, `sentence_bert_config.json`, GGUF metadata)
//! are untrusted input. Every value is checked against sane ranges and
//! against the tensors the weight file holds before anything sized by it
//! is allocated; a bad value is a [`ConfigError`] naming the file, the key,
//! the value and what was expected.

/// A hyper-parameter that is out of range or disagrees with the weights.
///
/// Displays as `file: key = value: expected ...`, e.g.
/// `config.json: num_attention_heads = 0: expected a positive divisor of hidden_size 384`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {key} = {value}: expected {expected}")]
pub struct ConfigError {
    /// The file (or source) holding the value, e.g. `.../config.json`.
    pub file: String,
    /// The key, e.g. `num_attention_heads` or `llama.block_count`.
    pub key: String,
    /// The value found, as written (JSON text for JSON configs).
    pub value: String,
    /// What was expected.
    pub expected: String,
}

impl ConfigError {
    /// A config error for `key` in `file`.
    pub fn new(
        file: impl Into<String>,
        key: impl Into<String>,
        value: impl ToString,
        expected: impl Into<String>,
    ) -> Self {
        ConfigError {
            file: file.into(),
            key: key.into(),
            value: value.to_string(),
            expected: expected.into(),
        }
    }
}

/// Most layers a config may declare when no weight file is at hand to
/// count them against.
pub const MAX_LAYERS: usize = 4096;

/// The number of layers the tensor names show: one more than the largest
/// `N` in names `{prefix}N.` (`encoder.layer.` for BERT, `blk.` for GGUF),
/// 0 when none. Reads only the names; nothing is sized by a config value.
pub fn layers_in_names<'a>(names: impl IntoIterator<Item = &'a str>, prefix: &str) -> usize {
    names
        .into_iter()
        .filter_map(|n| {
            let rest = n.strip_prefix(prefix)?;
            let (num, _) = rest.split_once('.')?;
            num.parse::<usize>().ok()
        })
        .map(|l| l.saturating_add(1))
        .max()
        .unwrap_or(0)
}

/// `v` if it is a positive finite number, else a [`ConfigError`].
pub fn positive_finite(file: &str, key: &str, v: f64) -> Result<f64, ConfigError> {
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(ConfigError::new(file, key, v, "a positive finite number"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_counts_come_from_names() {
        let names = [
            "blk.0.attn_q.weight",
            "blk.11.ffn_up.weight",
            "output.weight",
        ];
        assert_eq!(layers_in_names(names, "blk."), 12);
        assert_eq!(layers_in_names(["token_embd.weight"], "blk."), 0);
        assert_eq!(layers_in_names(["blk.x.w"], "blk."), 0);
    }

    #[test]
    fn messages_name_key_value_and_expectation() {
        let e = ConfigError::new(
            "config.json",
            "num_attention_heads",
            0,
            "a positive divisor of hidden_size 384",
        );
        assert_eq!(
            e.to_string(),
            "config.json: num_attention_heads = 0: expected a positive divisor of hidden_size 384"
        );
        assert!(positive_finite("c", "eps", -1.0).is_err());
        assert!(positive_finite("c", "eps", f64::NAN).is_err());
        assert_eq!(positive_finite("c", "eps", 1e-12).unwrap(), 1e-12);
    }
}
