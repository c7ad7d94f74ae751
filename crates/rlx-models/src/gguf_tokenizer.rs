//! Byte-level BPE tokenization from GGUF metadata (`tokenizer.ggml.model =
//! gpt2`), as used by SmolLM2, GPT-2, StarCoder and other Llama-family GGUFs.
//!
//! [`GgufTokenizer::from_gguf`] rebuilds the tokenizer from the vocabulary
//! (`tokenizer.ggml.tokens`), the merge list (`tokenizer.ggml.merges`) and the
//! token types (`tokenizer.ggml.token_type`) stored in the file:
//!
//! - **Encoding** runs a `tokenizers` BPE model behind the pre-tokenizer that
//!   llama.cpp selects for `tokenizer.ggml.pre`. For `smollm` (and the other
//!   StarCoder-style pre-types) that is every digit isolated (`\p{N}`), then
//!   the GPT-2 split regex `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+|
//!   ?[^\s\p{L}\p{N}]+|\s+(?!\S)` with the byte-to-unicode mapping; this is the
//!   `Digits(individual_digits) + ByteLevel` pipeline of SmolLM's
//!   `tokenizer.json`. Control and user-defined tokens (e.g. `<|im_start|>`)
//!   written literally in the text are matched as single tokens, as in
//!   HuggingFace `tokenizers` (needed for chat templates).
//! - **Decoding** maps each token back to its bytes (byte-level alphabet for
//!   normal tokens, the raw text for control/user-defined tokens) and joins
//!   them, so [`GgufTokenizer::decode`] and [`StreamDecoder`] agree byte for
//!   byte; invalid UTF-8 becomes U+FFFD exactly as `String::from_utf8_lossy`
//!   does.

use std::collections::HashMap;

use rlx_formats::{FormatError, GgufFile};
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

/// llama.cpp's `qwen2` pre-tokenizer regex (Qwen2/Qwen2.5 `tokenizer.json`):
/// contractions, letter runs with one leading non-letter, single digits,
/// punctuation runs, newlines, spaces.
pub const QWEN2_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GGUF metadata keys read by [`GgufTokenizer::from_gguf`].
pub mod keys {
    /// Tokenizer model name (`gpt2` for byte-level BPE).
    pub const MODEL: &str = "tokenizer.ggml.model";
    /// Pre-tokenizer type (`smollm`, `gpt2`, ...).
    pub const PRE: &str = "tokenizer.ggml.pre";
    /// Token strings, indexed by id.
    pub const TOKENS: &str = "tokenizer.ggml.tokens";
    /// Token types, indexed by id (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte).
    pub const TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
    /// BPE merges as `"left right"` strings, highest priority first.
    pub const MERGES: &str = "tokenizer.ggml.merges";
    /// Beginning-of-sequence token id.
    pub const BOS: &str = "tokenizer.ggml.bos_token_id";
    /// End-of-sequence token id.
    pub const EOS: &str = "tokenizer.ggml.eos_token_id";
    /// Padding token id.
    pub const PAD: &str = "tokenizer.ggml.padding_token_id";
    /// Unknown token id.
    pub const UNK: &str = "tokenizer.ggml.unknown_token_id";
    /// Whether a BOS token is prepended by default.
    pub const ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
}

/// Errors from building a [`GgufTokenizer`] or encoding/decoding with it.
#[derive(Debug, thiserror::Error)]
pub enum GgufTokenizerError {
    /// A required metadata key is missing or has the wrong type.
    #[error("tokenizer metadata: {0}")]
    Metadata(#[from] FormatError),
    /// `tokenizer.ggml.model` is not a byte-level BPE model.
    #[error("unsupported tokenizer model `{model}` in {key}: expected `gpt2` (byte-level BPE)")]
    UnsupportedModel {
        /// Metadata key that was read.
        key: &'static str,
        /// The model name found.
        model: String,
    },
    /// `tokenizer.ggml.pre` names a pre-tokenizer that is not implemented.
    #[error(
        "unsupported pre-tokenizer `{pre}` in {key}: expected one of smollm, starcoder, refact, \
         command-r, codeshell, exaone, minerva (digits isolated + GPT-2 regex) or gpt2, default, \
         mpt, olmo, jais (GPT-2 regex) or qwen2, deepseek-r1-qwen (Qwen2 regex)"
    )]
    UnsupportedPreTokenizer {
        /// Metadata key that was read.
        key: &'static str,
        /// The pre-tokenizer name found.
        pre: String,
    },
    /// The vocabulary is empty.
    #[error("{key} is empty: expected at least one token")]
    EmptyVocab {
        /// Metadata key that was read.
        key: &'static str,
    },
    /// `tokenizer.ggml.token_type` does not have one entry per token.
    #[error(
        "{key} has {found} entries, expected {expected} (one per token in tokenizer.ggml.tokens)"
    )]
    TokenTypeCount {
        /// Metadata key that was read.
        key: &'static str,
        /// Entries found.
        found: usize,
        /// Number of tokens.
        expected: usize,
    },
    /// A normal token contains a character outside the byte-level alphabet.
    #[error(
        "token {id} `{token}` (normal) contains {ch:?}, which is not in the GPT-2 byte-level \
         alphabet: expected every character of a normal token to encode one byte"
    )]
    NotByteLevel {
        /// Token id.
        id: u32,
        /// Token text.
        token: String,
        /// Offending character.
        ch: char,
    },
    /// A merge entry is not two space-separated tokens.
    #[error("merge {index} `{merge}` in {key}: expected two tokens separated by one space")]
    BadMerge {
        /// Metadata key that was read.
        key: &'static str,
        /// Index of the merge in the list.
        index: usize,
        /// The merge text.
        merge: String,
    },
    /// A special-token id from the metadata is outside the vocabulary.
    #[error("{key} = {id} is out of range: vocab size is {vocab_size}")]
    SpecialIdOutOfRange {
        /// Metadata key that was read.
        key: &'static str,
        /// The id found.
        id: i64,
        /// Vocabulary size.
        vocab_size: usize,
    },
    /// BOS was requested but the file defines no BOS token.
    #[error("encode with add_bos = true, but the GGUF defines no {key}")]
    NoBos {
        /// Metadata key that was looked up.
        key: &'static str,
    },
    /// A token id passed to decoding is outside the vocabulary.
    #[error("unknown token id {id}: vocab size is {vocab_size} (valid ids 0..{vocab_size})")]
    UnknownTokenId {
        /// The id.
        id: u32,
        /// Vocabulary size.
        vocab_size: usize,
    },
    /// The `tokenizers` library rejected the vocabulary/merges or failed to encode.
    #[error("tokenizers {stage} failed: {message}")]
    Backend {
        /// `build` or `encode`.
        stage: &'static str,
        /// What `tokenizers` reported.
        message: String,
    },
}

/// Token type codes of `tokenizer.ggml.token_type` (llama.cpp's `llama_token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenType {
    /// Ordinary vocabulary entry, stored in the byte-level alphabet.
    Normal,
    /// The unknown token.
    Unknown,
    /// Control token (`<|im_start|>`, `<|endoftext|>`, ...), stored as raw text.
    Control,
    /// User-defined token, stored as raw text.
    UserDefined,
    /// Unused slot.
    Unused,
    /// Raw byte token (`<0x41>`; SentencePiece vocabularies).
    Byte,
}

impl TokenType {
    /// Maps a `tokenizer.ggml.token_type` code; unknown codes count as normal
    /// (llama.cpp's behaviour for undefined types).
    pub fn from_code(code: i32) -> TokenType {
        match code {
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Normal,
        }
    }
}

/// Pre-tokenizer pipelines known to this implementation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizerKind {
    /// Every digit isolated, then the GPT-2 regex (`smollm`, `starcoder`, ...).
    DigitsThenGpt2,
    /// The GPT-2 regex alone (`gpt2`, `default`, ...).
    Gpt2,
    /// [`QWEN2_REGEX`] (`qwen2`, `deepseek-r1-qwen`), then byte-level.
    Qwen2,
}

impl PreTokenizerKind {
    /// The pipeline llama.cpp uses for a `tokenizer.ggml.pre` value, if supported.
    pub fn from_pre(pre: &str) -> Option<PreTokenizerKind> {
        match pre {
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone"
            | "minerva-7b" | "minerva" => Some(PreTokenizerKind::DigitsThenGpt2),
            "gpt2" | "default" | "mpt" | "olmo" | "jais" => Some(PreTokenizerKind::Gpt2),
            "qwen2" | "deepseek-r1-qwen" => Some(PreTokenizerKind::Qwen2),
            _ => None,
        }
    }
}

/// The character GPT-2's byte-level alphabet writes for byte `b` (printable
/// Latin-1 bytes stand for themselves; the others map to U+0100 upwards, e.g.
/// space to `Ġ` and newline to `Ċ`).
pub fn byte_level_char(b: u8) -> char {
    byte_to_char_table()[b as usize]
}

/// The GPT-2 byte-to-unicode table: byte `b` is written as `table[b]`.
fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut extra = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        table[b as usize] = if printable {
            char::from(b)
        } else {
            let c = char::from_u32(256 + extra).unwrap_or('\u{FFFD}');
            extra += 1;
            c
        };
    }
    table
}

/// A byte-level BPE tokenizer rebuilt from GGUF metadata.
#[derive(Debug, Clone)]
pub struct GgufTokenizer {
    inner: Tokenizer,
    /// Decoded bytes of every token, indexed by id.
    token_bytes: Vec<Vec<u8>>,
    token_types: Vec<TokenType>,
    tokens: Vec<String>,
    pre: String,
    bos: Option<u32>,
    eos: Option<u32>,
    pad: Option<u32>,
    unk: Option<u32>,
    add_bos: bool,
}

impl GgufTokenizer {
    /// Builds the tokenizer from a GGUF file's `tokenizer.ggml.*` metadata.
    ///
    /// Requires `tokenizer.ggml.model = gpt2`, a supported
    /// `tokenizer.ggml.pre` (absent means `default`), `tokens` and `merges`;
    /// `token_type` and the special-token ids are optional.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self, GgufTokenizerError> {
        let model = gguf.get_str(keys::MODEL)?;
        if model != "gpt2" {
            return Err(GgufTokenizerError::UnsupportedModel {
                key: keys::MODEL,
                model: model.to_string(),
            });
        }
        let pre = match gguf.metadata(keys::PRE) {
            Some(_) => gguf.get_str(keys::PRE)?.to_string(),
            None => "default".to_string(),
        };
        let tokens = gguf.get_str_array(keys::TOKENS)?;
        let types = match gguf.metadata(keys::TOKEN_TYPE) {
            Some(_) => Some(gguf.get_i32_array(keys::TOKEN_TYPE)?),
            None => None,
        };
        let merges = gguf.get_str_array(keys::MERGES)?;
        let tokens: Vec<&str> = tokens.iter().map(|t| t.as_ref()).collect();
        let merges: Vec<&str> = merges.iter().map(|m| m.as_ref()).collect();
        let mut tok = Self::from_parts(&tokens, types.as_deref(), &merges, &pre)?;
        let vocab_size = tok.vocab_size();
        let special = |key: &'static str| -> Result<Option<u32>, GgufTokenizerError> {
            let Some(v) = gguf.metadata(key) else {
                return Ok(None);
            };
            let id = v.as_i64().ok_or_else(|| {
                GgufTokenizerError::Metadata(FormatError::WrongValueType {
                    path: gguf.path().to_path_buf(),
                    key: key.to_string(),
                    expected: "integer token id".to_string(),
                    found: v.type_description(),
                })
            })?;
            match u32::try_from(id) {
                Ok(id) if (id as usize) < vocab_size => Ok(Some(id)),
                _ => Err(GgufTokenizerError::SpecialIdOutOfRange {
                    key,
                    id,
                    vocab_size,
                }),
            }
        };
        tok.bos = special(keys::BOS)?;
        tok.eos = special(keys::EOS)?;
        tok.pad = special(keys::PAD)?;
        tok.unk = special(keys::UNK)?;
        tok.add_bos = match gguf.metadata(keys::ADD_BOS) {
            Some(_) => gguf.get_bool(keys::ADD_BOS)?,
            None => false,
        };
        Ok(tok)
    }

    /// Builds the tokenizer from its parts: token strings by id, optional
    /// `token_type` codes, merges (`"left right"`) and the
    /// `tokenizer.ggml.pre` name. Special-token ids are left unset.
    pub fn from_parts(
        tokens: &[&str],
        token_types: Option<&[i32]>,
        merges: &[&str],
        pre: &str,
    ) -> Result<Self, GgufTokenizerError> {
        let kind = PreTokenizerKind::from_pre(pre).ok_or_else(|| {
            GgufTokenizerError::UnsupportedPreTokenizer {
                key: keys::PRE,
                pre: pre.to_string(),
            }
        })?;
        if tokens.is_empty() {
            return Err(GgufTokenizerError::EmptyVocab { key: keys::TOKENS });
        }
        let token_types: Vec<TokenType> = match token_types {
            Some(t) if t.len() != tokens.len() => {
                return Err(GgufTokenizerError::TokenTypeCount {
                    key: keys::TOKEN_TYPE,
                    found: t.len(),
                    expected: tokens.len(),
                })
            }
            Some(t) => t.iter().map(|&c| TokenType::from_code(c)).collect(),
            None => vec![TokenType::Normal; tokens.len()],
        };

        let table = byte_to_char_table();
        let char_to_byte: HashMap<char, u8> = table
            .iter()
            .enumerate()
            .map(|(b, &c)| (c, b as u8))
            .collect();
        let mut token_bytes = Vec::with_capacity(tokens.len());
        for (id, (&text, &ty)) in tokens.iter().zip(&token_types).enumerate() {
            let bytes = match ty {
                TokenType::Normal | TokenType::Unknown | TokenType::Unused => {
                    let mut bytes = Vec::with_capacity(text.len());
                    for ch in text.chars() {
                        match char_to_byte.get(&ch) {
                            Some(&b) => bytes.push(b),
                            None if ty == TokenType::Normal => {
                                return Err(GgufTokenizerError::NotByteLevel {
                                    id: id as u32,
                                    token: text.to_string(),
                                    ch,
                                })
                            }
                            // Unknown/unused slots may hold arbitrary
                            // placeholder text; keep it verbatim.
                            None => {
                                bytes.clear();
                                bytes.extend_from_slice(text.as_bytes());
                                break;
                            }
                        }
                    }
                    bytes
                }
                TokenType::Control | TokenType::UserDefined | TokenType::Byte => {
                    text.as_bytes().to_vec()
                }
            };
            token_bytes.push(bytes);
        }

        // First occurrence wins when a token string repeats.
        let mut vocab = Vocab::default();
        for (id, &text) in tokens.iter().enumerate() {
            vocab.entry(text.to_string()).or_insert(id as u32);
        }
        let mut merge_pairs = Vec::with_capacity(merges.len());
        for (index, &m) in merges.iter().enumerate() {
            let mut parts = m.split(' ');
            match (parts.next(), parts.next(), parts.next()) {
                (Some(a), Some(b), None) if !a.is_empty() && !b.is_empty() => {
                    merge_pairs.push((a.to_string(), b.to_string()))
                }
                _ => {
                    return Err(GgufTokenizerError::BadMerge {
                        key: keys::MERGES,
                        index,
                        merge: m.to_string(),
                    })
                }
            }
        }
        let backend = |message: String| GgufTokenizerError::Backend {
            stage: "build",
            message,
        };
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merge_pairs)
            .build()
            .map_err(|e| backend(e.to_string()))?;
        let mut inner = Tokenizer::new(bpe);
        let byte_level = ByteLevel::new(false, false, true);
        let pre_tok: PreTokenizerWrapper = match kind {
            PreTokenizerKind::DigitsThenGpt2 => {
                Sequence::new(vec![Digits::new(true).into(), byte_level.into()]).into()
            }
            PreTokenizerKind::Gpt2 => byte_level.into(),
            PreTokenizerKind::Qwen2 => {
                let split = Split::new(
                    SplitPattern::Regex(QWEN2_REGEX.into()),
                    SplitDelimiterBehavior::Isolated,
                    false,
                )
                .map_err(|e| backend(e.to_string()))?;
                let bytes = ByteLevel::new(false, false, false);
                Sequence::new(vec![split.into(), bytes.into()]).into()
            }
        };
        inner.with_pre_tokenizer(Some(pre_tok));
        let specials: Vec<AddedToken> = tokens
            .iter()
            .zip(&token_types)
            .filter(|(_, ty)| matches!(ty, TokenType::Control | TokenType::UserDefined))
            .map(|(&t, ty)| {
                AddedToken::from(t.to_string(), *ty == TokenType::Control).normalized(false)
            })
            .collect();
        inner.add_special_tokens(&specials);

        Ok(GgufTokenizer {
            inner,
            token_bytes,
            token_types,
            tokens: tokens.iter().map(|t| t.to_string()).collect(),
            pre: pre.to_string(),
            bos: None,
            eos: None,
            pad: None,
            unk: None,
            add_bos: false,
        })
    }

    /// Encodes `text` to token ids, prepending the BOS token when `add_bos`.
    ///
    /// Control and user-defined tokens written literally in `text` (e.g.
    /// `<|im_start|>`) become their single ids. No chat template is applied.
    pub fn encode(&self, text: &str, add_bos: bool) -> Result<Vec<u32>, GgufTokenizerError> {
        let enc = self
            .inner
            .encode_fast(text, false)
            .map_err(|e| GgufTokenizerError::Backend {
                stage: "encode",
                message: e.to_string(),
            })?;
        let mut ids = Vec::with_capacity(enc.get_ids().len() + 1);
        if add_bos {
            ids.push(
                self.bos
                    .ok_or(GgufTokenizerError::NoBos { key: keys::BOS })?,
            );
        }
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    /// The raw bytes token `id` stands for (control tokens: their text).
    pub fn token_bytes(&self, id: u32) -> Result<&[u8], GgufTokenizerError> {
        self.token_bytes.get(id as usize).map(Vec::as_slice).ok_or(
            GgufTokenizerError::UnknownTokenId {
                id,
                vocab_size: self.vocab_size(),
            },
        )
    }

    /// The vocabulary string of token `id` as stored in the GGUF (byte-level
    /// alphabet for normal tokens, e.g. `Ġthe`).
    pub fn token_text(&self, id: u32) -> Result<&str, GgufTokenizerError> {
        self.tokens
            .get(id as usize)
            .map(String::as_str)
            .ok_or(GgufTokenizerError::UnknownTokenId {
                id,
                vocab_size: self.vocab_size(),
            })
    }

    /// The type of token `id`.
    pub fn token_type(&self, id: u32) -> Result<TokenType, GgufTokenizerError> {
        self.token_types
            .get(id as usize)
            .copied()
            .ok_or(GgufTokenizerError::UnknownTokenId {
                id,
                vocab_size: self.vocab_size(),
            })
    }

    /// Decodes ids to text. Control tokens contribute their text (e.g.
    /// `<|im_end|>`); byte sequences that are not valid UTF-8 become U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String, GgufTokenizerError> {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend_from_slice(self.token_bytes(id)?);
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// A decoder that turns ids into text as they arrive.
    pub fn stream_decoder(&self) -> StreamDecoder<'_> {
        StreamDecoder {
            tokenizer: self,
            pending: Vec::new(),
        }
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.token_bytes.len()
    }

    /// `tokenizer.ggml.pre` (or `default` when absent).
    pub fn pre_tokenizer(&self) -> &str {
        &self.pre
    }

    /// Beginning-of-sequence id (`tokenizer.ggml.bos_token_id`).
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// End-of-sequence id (`tokenizer.ggml.eos_token_id`).
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// Padding id (`tokenizer.ggml.padding_token_id`).
    pub fn pad_id(&self) -> Option<u32> {
        self.pad
    }

    /// Unknown-token id (`tokenizer.ggml.unknown_token_id`).
    pub fn unk_id(&self) -> Option<u32> {
        self.unk
    }

    /// Whether the model expects a BOS token (`tokenizer.ggml.add_bos_token`,
    /// false when absent). Pass it as `add_bos` to [`GgufTokenizer::encode`].
    pub fn add_bos_default(&self) -> bool {
        self.add_bos
    }

    /// The id of the token whose stored text is exactly `text`, if any
    /// (e.g. `"<|im_end|>"`).
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.tokens.iter().position(|t| t == text).map(|i| i as u32)
    }

    /// Whether generation should stop at `id`: the EOS token or any control
    /// token (`<|im_end|>`, `<|endoftext|>`).
    pub fn is_end_of_generation(&self, id: u32) -> bool {
        Some(id) == self.eos
            || matches!(self.token_types.get(id as usize), Some(TokenType::Control))
    }
}

/// Incremental detokenizer: yields text as tokens arrive, never splitting a
/// UTF-8 character across two pieces.
///
/// The concatenation of every [`StreamDecoder::push`] result followed by
/// [`StreamDecoder::finish`] equals [`GgufTokenizer::decode`] of the same ids.
#[derive(Debug, Clone)]
pub struct StreamDecoder<'a> {
    tokenizer: &'a GgufTokenizer,
    pending: Vec<u8>,
}

impl StreamDecoder<'_> {
    /// Adds token `id`; returns the newly completed text, or `None` when the
    /// bytes so far end inside a multi-byte character (held back until the
    /// next token completes it). Invalid byte sequences become U+FFFD.
    pub fn push(&mut self, id: u32) -> Result<Option<String>, GgufTokenizerError> {
        let bytes = self.tokenizer.token_bytes(id)?;
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut consumed = 0;
        loop {
            let rest = &self.pending[consumed..];
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    consumed = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // The first `valid_up_to` bytes are valid UTF-8 by contract.
                    out.push_str(std::str::from_utf8(&rest[..valid]).unwrap_or_default());
                    match e.error_len() {
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            consumed += valid + bad;
                        }
                        None => {
                            // Incomplete character at the end: wait for more bytes.
                            consumed += valid;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..consumed);
        Ok(if out.is_empty() { None } else { Some(out) })
    }

    /// Flushes bytes still held back (an incomplete character at the end of
    /// the stream becomes U+FFFD); `None` when nothing is pending.
    pub fn finish(&mut self) -> Option<String> {
        if self.pending.is_empty() {
            return None;
        }
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        Some(s)
    }

    /// Number of bytes held back waiting for the rest of a character.
    pub fn pending_bytes(&self) -> usize {
        self.pending.len()
    }
}
