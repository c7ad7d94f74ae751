//! WordPiece tokenization for BERT-family sentence encoders (all-MiniLM-L6-v2).
//!
//! [`BertTokenizer`] wraps the `tokenizers` crate and reproduces what
//! sentence-transformers feeds the model: `[CLS] tokens [SEP]`, truncated to the
//! model's `max_seq_length` (counting the special tokens), padded on the right
//! to the longest sequence of the batch with the tokenizer's pad id and a zero
//! attention mask on the pads.
//!
//! The `tokenizer.json` shipped with all-MiniLM-L6-v2 carries its own
//! truncation (128) and fixed padding (128) settings; both are replaced here by
//! the sentence-transformers behaviour (truncate at `max_seq_length` from
//! `sentence_bert_config.json`, pad to the batch's longest sequence).

use std::path::{Path, PathBuf};

use tokenizers::{
    PaddingDirection, PaddingParams, PaddingStrategy, Tokenizer, TruncationDirection,
    TruncationParams, TruncationStrategy,
};

/// Sequence length used when neither the caller nor `sentence_bert_config.json`
/// gives one (the all-MiniLM-L6-v2 value).
pub const DEFAULT_MAX_SEQ_LEN: usize = 256;

/// Number of special tokens (`[CLS]`, `[SEP]`) added to a single sentence.
const SPECIAL_TOKENS_SINGLE: usize = 2;

/// Errors from loading a tokenizer or encoding text.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file that failed.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// `tokenizer.json` exists but is not a valid `tokenizers` JSON file.
    #[error("cannot parse tokenizer file {path}: {message} (expected a HuggingFace tokenizers JSON file)")]
    Parse {
        /// The tokenizer file.
        path: PathBuf,
        /// What the parser reported.
        message: String,
    },
    /// `sentence_bert_config.json` exists but is malformed.
    #[error("invalid sentence-transformers config {path}: {message}")]
    Config {
        /// The config file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// The tokenizer has no padding token and none is configured.
    #[error(
        "tokenizer {path} defines no padding token: expected a padding config or a \"[PAD]\" or \"<pad>\" token"
    )]
    MissingPadToken {
        /// The tokenizer file.
        path: PathBuf,
    },
    /// The requested maximum sequence length cannot hold `[CLS]` and `[SEP]`.
    #[error("max_seq_len {got} is too small: expected at least {min} (room for [CLS] and [SEP])")]
    InvalidMaxSeqLen {
        /// The value given.
        got: usize,
        /// The smallest accepted value.
        min: usize,
    },
    /// `encode_batch` was called with no sentences.
    #[error("encode_batch got an empty batch: expected at least one sentence")]
    EmptyBatch,
    /// The underlying tokenizer failed while configuring or encoding.
    #[error("tokenizer {path} failed: {message}")]
    Encode {
        /// The tokenizer file.
        path: PathBuf,
        /// What the tokenizer reported.
        message: String,
    },
}

/// A padded batch of encoded sentences, row-major `[batch, seq]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// Token ids, `batch * seq` values; pads carry the tokenizer's pad id.
    pub ids: Vec<i64>,
    /// 1.0 for real tokens, 0.0 for pads; `batch * seq` values.
    pub attention_mask: Vec<f32>,
    /// Segment ids (all 0 for single sentences); `batch * seq` values.
    pub token_type_ids: Vec<i64>,
    /// Number of sentences.
    pub batch: usize,
    /// Padded sequence length (the longest sentence in the batch, after truncation).
    pub seq: usize,
    /// Unpadded length of each sentence, special tokens included.
    pub lengths: Vec<usize>,
}

impl Batch {
    /// The rows `rows` (indices into this batch, in that order) as a batch
    /// of their own, padded to the longest of them (the padding they had
    /// beyond it dropped).
    pub fn select(&self, rows: &[usize]) -> Batch {
        let seq = rows.iter().map(|&r| self.lengths[r]).max().unwrap_or(0);
        let mut out = Batch {
            ids: Vec::with_capacity(rows.len() * seq),
            attention_mask: Vec::with_capacity(rows.len() * seq),
            token_type_ids: Vec::with_capacity(rows.len() * seq),
            batch: rows.len(),
            seq,
            lengths: rows.iter().map(|&r| self.lengths[r]).collect(),
        };
        for &r in rows {
            let span = r * self.seq..r * self.seq + seq;
            out.ids.extend_from_slice(&self.ids[span.clone()]);
            out.attention_mask
                .extend_from_slice(&self.attention_mask[span.clone()]);
            out.token_type_ids
                .extend_from_slice(&self.token_type_ids[span]);
        }
        out
    }

    /// The unpadded token ids of sentence `i`, or `None` if `i >= batch`.
    pub fn row_ids(&self, i: usize) -> Option<&[i64]> {
        let len = *self.lengths.get(i)?;
        let start = i * self.seq;
        self.ids.get(start..start + len)
    }
}

/// A BERT WordPiece tokenizer configured like sentence-transformers.
#[derive(Debug, Clone)]
pub struct BertTokenizer {
    inner: Tokenizer,
    path: PathBuf,
    max_seq_len: usize,
    pad_id: u32,
    /// `inner.get_vocab_size(true)`, counted once: `tokenizers` counts it
    /// by building the whole vocabulary map, which per request (the
    /// server checks token ids against it) cost a quarter of the server's
    /// CPU.
    vocab_size: usize,
}

/// The subset of `sentence_bert_config.json` that tokenization needs.
#[derive(serde::Deserialize)]
struct SentenceBertConfig {
    max_seq_length: Option<usize>,
}

impl BertTokenizer {
    /// Loads `dir/tokenizer.json` and, if present, `dir/sentence_bert_config.json`.
    ///
    /// The maximum sequence length (special tokens included) is `max_seq_len`
    /// when given, otherwise `max_seq_length` from `sentence_bert_config.json`,
    /// otherwise [`DEFAULT_MAX_SEQ_LEN`].
    pub fn from_dir(
        dir: impl AsRef<Path>,
        max_seq_len: Option<usize>,
    ) -> Result<Self, TokenizerError> {
        let dir = dir.as_ref();
        let max_seq_len = match max_seq_len {
            Some(n) => n,
            None => read_max_seq_len(&dir.join("sentence_bert_config.json"))?,
        };
        Self::from_file(dir.join("tokenizer.json"), max_seq_len)
    }

    /// Loads a `tokenizer.json` file with an explicit maximum sequence length
    /// (special tokens included).
    pub fn from_file(path: impl AsRef<Path>, max_seq_len: usize) -> Result<Self, TokenizerError> {
        let path = path.as_ref().to_path_buf();
        let bytes = std::fs::read(&path).map_err(|source| TokenizerError::Io {
            path: path.clone(),
            source,
        })?;
        let inner = Tokenizer::from_bytes(&bytes).map_err(|e| TokenizerError::Parse {
            path: path.clone(),
            message: e.to_string(),
        })?;
        Self::from_tokenizer(inner, path, max_seq_len)
    }

    fn from_tokenizer(
        mut inner: Tokenizer,
        path: PathBuf,
        max_seq_len: usize,
    ) -> Result<Self, TokenizerError> {
        if max_seq_len < SPECIAL_TOKENS_SINGLE {
            return Err(TokenizerError::InvalidMaxSeqLen {
                got: max_seq_len,
                min: SPECIAL_TOKENS_SINGLE,
            });
        }
        let (pad_id, pad_type_id, pad_token) = match inner.get_padding() {
            Some(p) => (p.pad_id, p.pad_type_id, p.pad_token.clone()),
            None => match ["[PAD]", "<pad>"]
                .iter()
                .find_map(|t| inner.token_to_id(t).map(|id| (id, t)))
            {
                Some((id, t)) => (id, 0, t.to_string()),
                None => return Err(TokenizerError::MissingPadToken { path }),
            },
        };
        inner.with_padding(Some(PaddingParams {
            strategy: PaddingStrategy::BatchLongest,
            direction: PaddingDirection::Right,
            pad_to_multiple_of: None,
            pad_id,
            pad_type_id,
            pad_token,
        }));
        inner
            .with_truncation(Some(TruncationParams {
                direction: TruncationDirection::Right,
                max_length: max_seq_len,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
            }))
            .map_err(|e| TokenizerError::Encode {
                path: path.clone(),
                message: e.to_string(),
            })?;
        let vocab_size = inner.get_vocab_size(true);
        Ok(Self {
            inner,
            path,
            max_seq_len,
            pad_id,
            vocab_size,
        })
    }

    /// Maximum tokens per sentence, `[CLS]` and `[SEP]` included.
    pub fn max_seq_len(&self) -> usize {
        self.max_seq_len
    }

    /// The id used for padding.
    pub fn pad_id(&self) -> u32 {
        self.pad_id
    }

    /// Vocabulary size, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The `tokenizer.json` this tokenizer was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Encodes one sentence: its ids with `[CLS]`/`[SEP]`, truncated, unpadded.
    pub fn encode(&self, text: &str) -> Result<Vec<i64>, TokenizerError> {
        let batch = self.encode_batch(&[text])?;
        Ok(batch.ids[..batch.lengths[0]].to_vec())
    }

    /// [`encode`](Self::encode), and whether the sentence was longer than
    /// [`max_seq_len`](Self::max_seq_len) (its ids were truncated).
    pub fn encode_checked(&self, text: &str) -> Result<(Vec<i64>, bool), TokenizerError> {
        let enc = self
            .inner
            .encode(text, true)
            .map_err(|e| TokenizerError::Encode {
                path: self.path.clone(),
                message: e.to_string(),
            })?;
        let n = enc.get_attention_mask().iter().filter(|&&m| m != 0).count();
        let ids = enc.get_ids()[..n].iter().map(|&x| i64::from(x)).collect();
        Ok((ids, !enc.get_overflowing().is_empty()))
    }

    /// The number of leading tokens a prompt takes when prepended to a
    /// text, as sentence-transformers counts them (`prompt_length`): the
    /// prompt's tokens with special tokens, less a trailing special token
    /// (`[SEP]`, `</s>`).
    pub fn prompt_length(&self, prompt: &str) -> Result<usize, TokenizerError> {
        let enc = self
            .inner
            .encode(prompt, true)
            .map_err(|e| TokenizerError::Encode {
                path: self.path.clone(),
                message: e.to_string(),
            })?;
        let n = enc.get_attention_mask().iter().filter(|&&m| m != 0).count();
        let last_special = n > 0 && enc.get_special_tokens_mask().get(n - 1) == Some(&1);
        Ok(n - usize::from(last_special))
    }

    /// Encodes sentences into a right-padded `[batch, seq]` batch where `seq` is
    /// the longest sentence after truncation.
    pub fn encode_batch(&self, texts: &[&str]) -> Result<Batch, TokenizerError> {
        if texts.is_empty() {
            return Err(TokenizerError::EmptyBatch);
        }
        let inputs: Vec<&str> = texts.to_vec();
        self.encode_inputs(inputs)
    }

    /// Encodes (first, second) text pairs as a cross-encoder reads them
    /// (`[CLS] a [SEP] b [SEP]`, token type 1 on the second text),
    /// truncated longest-first to the maximum length, right-padded.
    pub fn encode_pairs(&self, pairs: &[(&str, &str)]) -> Result<Batch, TokenizerError> {
        if pairs.is_empty() {
            return Err(TokenizerError::EmptyBatch);
        }
        let inputs: Vec<tokenizers::EncodeInput> =
            pairs.iter().map(|&(a, b)| (a, b).into()).collect();
        self.encode_inputs(inputs)
    }

    fn encode_inputs<'s, E: Into<tokenizers::EncodeInput<'s>> + Send>(
        &self,
        inputs: Vec<E>,
    ) -> Result<Batch, TokenizerError> {
        let encodings =
            self.inner
                .encode_batch(inputs, true)
                .map_err(|e| TokenizerError::Encode {
                    path: self.path.clone(),
                    message: e.to_string(),
                })?;
        let batch = encodings.len();
        let seq = encodings.iter().map(|e| e.len()).max().unwrap_or(0);
        let mut ids = Vec::with_capacity(batch * seq);
        let mut attention_mask = Vec::with_capacity(batch * seq);
        let mut token_type_ids = Vec::with_capacity(batch * seq);
        let mut lengths = Vec::with_capacity(batch);
        for enc in &encodings {
            let n = enc.len();
            ids.extend(enc.get_ids().iter().map(|&x| i64::from(x)));
            token_type_ids.extend(enc.get_type_ids().iter().map(|&x| i64::from(x)));
            let mask = enc.get_attention_mask();
            attention_mask.extend(mask.iter().map(|&m| if m != 0 { 1.0f32 } else { 0.0 }));
            // Padding already brought every row to `seq`; guard anyway so the
            // batch is always rectangular.
            ids.extend(std::iter::repeat_n(i64::from(self.pad_id), seq - n));
            token_type_ids.extend(std::iter::repeat_n(0i64, seq - n));
            attention_mask.extend(std::iter::repeat_n(0.0f32, seq - n));
            lengths.push(mask.iter().filter(|&&m| m != 0).count());
        }
        Ok(Batch {
            ids,
            attention_mask,
            token_type_ids,
            batch,
            seq,
            lengths,
        })
    }
}

/// Reads `max_seq_length` from a sentence-transformers config; a missing file
/// or missing key gives [`DEFAULT_MAX_SEQ_LEN`].
fn read_max_seq_len(path: &Path) -> Result<usize, TokenizerError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(DEFAULT_MAX_SEQ_LEN),
        Err(source) => {
            return Err(TokenizerError::Io {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let cfg: SentenceBertConfig =
        serde_json::from_str(&text).map_err(|e| TokenizerError::Config {
            path: path.to_path_buf(),
            message: format!("{e} (expected a JSON object with an integer \"max_seq_length\")"),
        })?;
    Ok(cfg.max_seq_length.unwrap_or(DEFAULT_MAX_SEQ_LEN))
}
