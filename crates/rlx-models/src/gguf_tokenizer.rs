//! Tokenization from GGUF metadata: byte-level BPE (`tokenizer.ggml.model =
//! gpt2`), as used by SmolLM2, GPT-2, StarCoder, Qwen2 and other Llama-family
//! GGUFs, and SentencePiece-style BPE (`tokenizer.ggml.model = llama`,
//! llama.cpp's "SPM" tokenizer), as used by Gemma 3, Llama 2, Mistral and
//! TinyLlama.
//!
//! [`GgufTokenizer::from_gguf`] rebuilds the tokenizer from the vocabulary
//! (`tokenizer.ggml.tokens`), the merge list (`tokenizer.ggml.merges`, gpt2)
//! or the scores (`tokenizer.ggml.scores`, llama) and the token types
//! (`tokenizer.ggml.token_type`) stored in the file.
//!
//! ## `gpt2` (byte-level BPE)
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
//!
//! ## `llama` (SentencePiece, llama.cpp's `llm_tokenizer_spm`)
//!
//! - **Encoding** first splits out control, user-defined and unknown tokens
//!   written literally in the text (leftmost, longest match first; Gemma's
//!   `<start_of_turn>`, but also its user-defined runs of spaces, newlines
//!   and tabs). Each remaining fragment gets a leading space when
//!   `tokenizer.ggml.add_space_prefix` is set (true when absent; Gemma 3
//!   sets false) and the fragment starts the text or follows a special
//!   token; spaces become U+2581 (`▁`). The fragment is cut into UTF-8
//!   characters and the adjacent pair whose concatenation is a vocabulary
//!   token with the highest `tokenizer.ggml.scores` entry is merged, the
//!   leftmost pair winning ties, until no pair is in the vocabulary. Each
//!   final piece is its token; a piece that is not in the vocabulary
//!   becomes one byte token (`<0x41>`) per UTF-8 byte, or the unknown token
//!   when the vocabulary has no byte tokens.
//! - **Decoding** turns `▁` back into a space and `<0xXX>` tokens into that
//!   byte; control tokens contribute their text as in the `gpt2` path. With
//!   `add_space_prefix`, [`GgufTokenizer::decode`] drops the one leading
//!   space of the first token (as llama.cpp's detokenizer does), while
//!   [`StreamDecoder`] keeps it (it decodes a continuation).

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

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
    /// Tokenizer model name (`gpt2` for byte-level BPE, `llama` for SentencePiece).
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
    /// Whether an EOS token is appended by default.
    pub const ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
    /// SentencePiece token scores (f32, one per token; higher merges first).
    pub const SCORES: &str = "tokenizer.ggml.scores";
    /// Whether SentencePiece encoding prefixes the text with a space.
    pub const ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";
}

/// Errors from building a [`GgufTokenizer`] or encoding/decoding with it.
#[derive(Debug, thiserror::Error)]
pub enum GgufTokenizerError {
    /// A required metadata key is missing or has the wrong type.
    #[error("tokenizer metadata: {0}")]
    Metadata(#[from] FormatError),
    /// `tokenizer.ggml.model` is neither byte-level BPE nor SentencePiece.
    #[error(
        "unsupported tokenizer model `{model}` in {key}: expected `gpt2` (byte-level BPE) or \
         `llama` (SentencePiece)"
    )]
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
    /// `tokenizer.ggml.scores` does not have one entry per token.
    #[error(
        "{key} has {found} entries, expected {expected} (one per token in tokenizer.ggml.tokens)"
    )]
    ScoreCount {
        /// Metadata key that was read.
        key: &'static str,
        /// Entries found.
        found: usize,
        /// Number of tokens.
        expected: usize,
    },
    /// A token of type byte is not written `<0xXX>`.
    #[error("token {id} `{token}` has type byte but is not written <0xXX> (two hex digits)")]
    BadByteToken {
        /// Token id.
        id: u32,
        /// Token text.
        token: String,
    },
    /// A SentencePiece piece is not in the vocabulary and there is neither a
    /// byte token for one of its bytes nor an unknown token.
    #[error(
        "cannot encode {piece:?}: not in the vocabulary, no byte token <0x{byte:02X}> and no \
         unknown token"
    )]
    Unencodable {
        /// The piece that could not be encoded.
        piece: String,
        /// The byte that has no token.
        byte: u8,
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

/// The character SentencePiece writes for a space (U+2581, `▁`).
pub const SPM_SPACE: char = '\u{2581}';

/// The byte a `<0xXX>` byte token stands for, if `text` is one.
pub fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// The encoder behind a [`GgufTokenizer`].
#[derive(Debug, Clone)]
enum Model {
    /// Byte-level BPE (`gpt2`), run by `tokenizers`.
    Bpe(Box<Tokenizer>),
    /// SentencePiece-style score-ordered merges (`llama`).
    Spm(Box<Spm>),
}

/// SentencePiece state: the mergeable vocabulary with scores, byte
/// fallback and the literal special tokens.
#[derive(Debug, Clone)]
struct Spm {
    /// `▁`-escaped text of every normal or user-defined token -> id (first
    /// occurrence wins).
    pieces: HashMap<String, u32>,
    /// Score of every token, by id.
    scores: Vec<f32>,
    /// Token of each byte for byte fallback (`<0xXX>`, else the one-byte
    /// string token).
    byte_ids: [Option<u32>; 256],
    /// Control, user-defined and unknown tokens matched literally in the
    /// text, keyed by their first byte, longest first.
    specials: HashMap<u8, Vec<(String, u32)>>,
    /// Emitted for a piece with a byte that has no byte token.
    unk: Option<u32>,
    add_space_prefix: bool,
}

/// A merge candidate: symbols `left` and `right` (adjacent when pushed)
/// whose joined text (`len` bytes) is a token with `score`.
#[derive(Debug, Clone, Copy)]
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    len: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Bigram {}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Bigram {
    /// Higher score first; on equal scores the leftmost pair first.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// One character run of a fragment being merged (a doubly linked list over
/// the fragment; `len == 0` once merged into its left neighbour).
#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A piece of the input after splitting out literal special tokens.
enum Fragment<'a> {
    Text(&'a str),
    Special(u32),
}

impl Spm {
    /// Splits `text` at literal special tokens: at each position the longest
    /// special token that starts there, scanning left to right.
    fn split_specials<'a>(&self, text: &'a str) -> Vec<Fragment<'a>> {
        let mut out = Vec::new();
        let mut plain_start = 0;
        let mut pos = 0;
        while pos < text.len() {
            let rest = &text[pos..];
            let hit = self
                .specials
                .get(&rest.as_bytes()[0])
                .and_then(|cands| cands.iter().find(|(t, _)| rest.starts_with(t.as_str())));
            if let Some((t, id)) = hit {
                if plain_start < pos {
                    out.push(Fragment::Text(&text[plain_start..pos]));
                }
                out.push(Fragment::Special(*id));
                pos += t.len();
                plain_start = pos;
            } else {
                pos += rest.chars().next().map_or(1, char::len_utf8);
            }
        }
        if plain_start < text.len() {
            out.push(Fragment::Text(&text[plain_start..]));
        }
        out
    }

    /// Encodes `text` (specials split out, the space prefix applied).
    fn encode(&self, text: &str, out: &mut Vec<u32>) -> Result<(), GgufTokenizerError> {
        let mut prev_special = true;
        for frag in self.split_specials(text) {
            match frag {
                Fragment::Special(id) => {
                    out.push(id);
                    prev_special = true;
                }
                Fragment::Text(t) => {
                    let mut s = String::with_capacity(t.len() + 3);
                    if self.add_space_prefix && prev_special {
                        s.push(SPM_SPACE);
                    }
                    s.extend(t.chars().map(|c| if c == ' ' { SPM_SPACE } else { c }));
                    self.encode_fragment(&s, out)?;
                    prev_special = false;
                }
            }
        }
        Ok(())
    }

    /// Pushes a merge candidate for symbols `left` and `right` when their
    /// joined text is a token.
    fn try_bigram(
        &self,
        text: &str,
        syms: &[Symbol],
        left: Option<usize>,
        right: Option<usize>,
        queue: &mut BinaryHeap<Bigram>,
    ) {
        let (Some(l), Some(r)) = (left, right) else {
            return;
        };
        let (a, b) = (syms[l], syms[r]);
        let joined = &text[a.start..b.start + b.len];
        if let Some(&id) = self.pieces.get(joined) {
            queue.push(Bigram {
                score: self.scores[id as usize],
                left: l,
                right: r,
                len: joined.len(),
            });
        }
    }

    /// The score-ordered merge of one `▁`-escaped fragment.
    fn encode_fragment(&self, text: &str, out: &mut Vec<u32>) -> Result<(), GgufTokenizerError> {
        let mut syms: Vec<Symbol> = Vec::with_capacity(text.len());
        for (i, (start, ch)) in text.char_indices().enumerate() {
            syms.push(Symbol {
                start,
                len: ch.len_utf8(),
                prev: i.checked_sub(1),
                next: Some(i + 1),
            });
        }
        let Some(last) = syms.last_mut() else {
            return Ok(());
        };
        last.next = None;
        let mut queue = BinaryHeap::new();
        for i in 1..syms.len() {
            self.try_bigram(text, &syms, Some(i - 1), Some(i), &mut queue);
        }
        while let Some(bg) = queue.pop() {
            let (l, r) = (syms[bg.left], syms[bg.right]);
            // Skip candidates made stale by an earlier merge.
            if l.len == 0 || r.len == 0 || l.len + r.len != bg.len || l.next != Some(bg.right) {
                continue;
            }
            syms[bg.left].len += r.len;
            syms[bg.left].next = r.next;
            syms[bg.right].len = 0;
            if let Some(n) = r.next {
                syms[n].prev = Some(bg.left);
            }
            self.try_bigram(text, &syms, l.prev, Some(bg.left), &mut queue);
            self.try_bigram(text, &syms, Some(bg.left), r.next, &mut queue);
        }
        let mut cur = Some(0);
        while let Some(i) = cur {
            let sym = syms[i];
            let piece = &text[sym.start..sym.start + sym.len];
            match self.pieces.get(piece) {
                Some(&id) => out.push(id),
                None => {
                    let missing = piece.bytes().find(|&b| self.byte_ids[b as usize].is_none());
                    match (missing, self.unk) {
                        (None, _) => {
                            out.extend(piece.bytes().filter_map(|b| self.byte_ids[b as usize]))
                        }
                        (Some(_), Some(unk)) => out.push(unk),
                        (Some(byte), None) => {
                            return Err(GgufTokenizerError::Unencodable {
                                piece: piece.replace(SPM_SPACE, " "),
                                byte,
                            })
                        }
                    }
                }
            }
            cur = sym.next;
        }
        Ok(())
    }
}

/// A tokenizer rebuilt from GGUF metadata: byte-level BPE (`gpt2`) or
/// SentencePiece (`llama`).
#[derive(Debug, Clone)]
pub struct GgufTokenizer {
    model: Model,
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
    add_eos: bool,
}

impl GgufTokenizer {
    /// Builds the tokenizer from a GGUF file's `tokenizer.ggml.*` metadata.
    ///
    /// `tokenizer.ggml.model = gpt2` requires a supported
    /// `tokenizer.ggml.pre` (absent means `default`), `tokens` and `merges`;
    /// `tokenizer.ggml.model = llama` requires `tokens` and `scores` and
    /// reads `add_space_prefix` (true when absent). `token_type`, the
    /// special-token ids and the `add_bos`/`add_eos` flags are optional.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self, GgufTokenizerError> {
        let model = gguf.get_str(keys::MODEL)?;
        if model != "gpt2" && model != "llama" {
            return Err(GgufTokenizerError::UnsupportedModel {
                key: keys::MODEL,
                model: model.to_string(),
            });
        }
        let flag = |key: &str, default: bool| -> Result<bool, GgufTokenizerError> {
            match gguf.metadata(key) {
                Some(_) => Ok(gguf.get_bool(key)?),
                None => Ok(default),
            }
        };
        let tokens = gguf.get_str_array(keys::TOKENS)?;
        let types = match gguf.metadata(keys::TOKEN_TYPE) {
            Some(_) => Some(gguf.get_i32_array(keys::TOKEN_TYPE)?),
            None => None,
        };
        let tokens: Vec<&str> = tokens.iter().map(|t| t.as_ref()).collect();
        let mut tok = if model == "llama" {
            let scores = gguf.get_f32_array(keys::SCORES)?;
            let prefix = flag(keys::ADD_SPACE_PREFIX, true)?;
            Self::from_spm_parts(&tokens, &scores, types.as_deref(), prefix)?
        } else {
            let pre = match gguf.metadata(keys::PRE) {
                Some(_) => gguf.get_str(keys::PRE)?.to_string(),
                None => "default".to_string(),
            };
            let merges = gguf.get_str_array(keys::MERGES)?;
            let merges: Vec<&str> = merges.iter().map(|m| m.as_ref()).collect();
            Self::from_parts(&tokens, types.as_deref(), &merges, &pre)?
        };
        if let Some(pre) = gguf.metadata(keys::PRE).and_then(|v| v.as_str()) {
            tok.pre = pre.to_string();
        }
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
        if let Some(unk) = special(keys::UNK)? {
            tok.set_unk(unk);
        }
        // llama.cpp adds BOS by default for SentencePiece vocabularies.
        let spm = matches!(tok.model, Model::Spm(_));
        tok.add_bos = flag(keys::ADD_BOS, spm)?;
        tok.add_eos = flag(keys::ADD_EOS, false)?;
        Ok(tok)
    }

    /// Sets the unknown-token id (SentencePiece also emits it for a piece
    /// with a byte that has no `<0xXX>` token).
    fn set_unk(&mut self, unk: u32) {
        self.unk = Some(unk);
        if let Model::Spm(spm) = &mut self.model {
            spm.unk = Some(unk);
        }
    }

    /// Builds a SentencePiece (`tokenizer.ggml.model = llama`) tokenizer
    /// from token strings by id (spaces written `▁`), their scores (higher
    /// merges first), optional `token_type` codes and the
    /// `add_space_prefix` flag. BOS/EOS/padding ids are left unset; the
    /// unknown id is the first token of type unknown, if any.
    ///
    /// Normal and user-defined tokens take part in merges; control,
    /// user-defined and unknown tokens are matched literally in the text;
    /// byte tokens must be written `<0xXX>`.
    pub fn from_spm_parts(
        tokens: &[&str],
        scores: &[f32],
        token_types: Option<&[i32]>,
        add_space_prefix: bool,
    ) -> Result<Self, GgufTokenizerError> {
        if tokens.is_empty() {
            return Err(GgufTokenizerError::EmptyVocab { key: keys::TOKENS });
        }
        if scores.len() != tokens.len() {
            return Err(GgufTokenizerError::ScoreCount {
                key: keys::SCORES,
                found: scores.len(),
                expected: tokens.len(),
            });
        }
        let token_types = Self::types(tokens.len(), token_types)?;
        let mut token_bytes = Vec::with_capacity(tokens.len());
        let mut pieces = HashMap::with_capacity(tokens.len());
        let mut by_text: HashMap<&str, u32> = HashMap::with_capacity(tokens.len());
        let mut specials: HashMap<u8, Vec<(String, u32)>> = HashMap::new();
        for (id, (&text, &ty)) in tokens.iter().zip(&token_types).enumerate() {
            let id = id as u32;
            by_text.entry(text).or_insert(id);
            let bytes = match ty {
                TokenType::Byte => vec![parse_byte_token(text).ok_or_else(|| {
                    GgufTokenizerError::BadByteToken {
                        id,
                        token: text.to_string(),
                    }
                })?],
                TokenType::Normal | TokenType::UserDefined | TokenType::Unused => {
                    text.replace(SPM_SPACE, " ").into_bytes()
                }
                TokenType::Control | TokenType::Unknown => text.as_bytes().to_vec(),
            };
            token_bytes.push(bytes);
            if matches!(ty, TokenType::Normal | TokenType::UserDefined) {
                pieces.entry(text.to_string()).or_insert(id);
            }
            if matches!(
                ty,
                TokenType::Control | TokenType::UserDefined | TokenType::Unknown
            ) {
                if let Some(&first) = text.as_bytes().first() {
                    specials
                        .entry(first)
                        .or_default()
                        .push((text.to_string(), id));
                }
            }
        }
        for cands in specials.values_mut() {
            // Longest first; among equal texts the lowest id.
            cands.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
            cands.dedup_by(|a, b| a.0 == b.0);
        }
        let mut byte_ids = [None; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            *slot = by_text.get(format!("<0x{b:02X}>").as_str()).copied();
            if slot.is_none() && b < 0x80 {
                let s = char::from(b as u8).to_string();
                *slot = pieces.get(&s).copied();
            }
        }
        let unk = token_types
            .iter()
            .position(|&t| t == TokenType::Unknown)
            .map(|i| i as u32);
        Ok(GgufTokenizer {
            model: Model::Spm(Box::new(Spm {
                pieces,
                scores: scores.to_vec(),
                byte_ids,
                specials,
                unk,
                add_space_prefix,
            })),
            token_bytes,
            token_types,
            tokens: tokens.iter().map(|t| t.to_string()).collect(),
            pre: "default".to_string(),
            bos: None,
            eos: None,
            pad: None,
            unk,
            add_bos: false,
            add_eos: false,
        })
    }

    /// Token types from optional `token_type` codes (all normal when absent).
    fn types(n: usize, codes: Option<&[i32]>) -> Result<Vec<TokenType>, GgufTokenizerError> {
        match codes {
            Some(t) if t.len() != n => Err(GgufTokenizerError::TokenTypeCount {
                key: keys::TOKEN_TYPE,
                found: t.len(),
                expected: n,
            }),
            Some(t) => Ok(t.iter().map(|&c| TokenType::from_code(c)).collect()),
            None => Ok(vec![TokenType::Normal; n]),
        }
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
        let token_types = Self::types(tokens.len(), token_types)?;

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
            model: Model::Bpe(Box::new(inner)),
            token_bytes,
            token_types,
            tokens: tokens.iter().map(|t| t.to_string()).collect(),
            pre: pre.to_string(),
            bos: None,
            eos: None,
            pad: None,
            unk: None,
            add_bos: false,
            add_eos: false,
        })
    }

    /// Encodes `text` to token ids, prepending the BOS token when `add_bos`.
    ///
    /// Control and user-defined tokens written literally in `text` (e.g.
    /// `<|im_start|>`, `<start_of_turn>`) become their single ids. No chat
    /// template is applied and no EOS is appended (see
    /// [`GgufTokenizer::add_eos_default`]).
    pub fn encode(&self, text: &str, add_bos: bool) -> Result<Vec<u32>, GgufTokenizerError> {
        let mut ids = Vec::with_capacity(text.len() / 3 + 2);
        if add_bos {
            ids.push(
                self.bos
                    .ok_or(GgufTokenizerError::NoBos { key: keys::BOS })?,
            );
        }
        match &self.model {
            Model::Bpe(inner) => {
                let enc =
                    inner
                        .encode_fast(text, false)
                        .map_err(|e| GgufTokenizerError::Backend {
                            stage: "encode",
                            message: e.to_string(),
                        })?;
                ids.extend_from_slice(enc.get_ids());
            }
            Model::Spm(spm) => spm.encode(text, &mut ids)?,
        }
        Ok(ids)
    }

    /// Whether this is a SentencePiece (`llama`) tokenizer.
    pub fn is_sentencepiece(&self) -> bool {
        matches!(self.model, Model::Spm(_))
    }

    /// Whether SentencePiece encoding prefixes fragments with a space
    /// (`tokenizer.ggml.add_space_prefix`); false for byte-level BPE.
    pub fn add_space_prefix(&self) -> bool {
        matches!(&self.model, Model::Spm(s) if s.add_space_prefix)
    }

    /// The raw bytes token `id` stands for (control tokens: their text;
    /// SentencePiece: `▁` as a space, `<0xXX>` as that byte).
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
    /// With SentencePiece's `add_space_prefix`, one leading space of the
    /// first token is dropped (the space encoding added).
    pub fn decode(&self, ids: &[u32]) -> Result<String, GgufTokenizerError> {
        let mut bytes = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            let b = self.token_bytes(id)?;
            let b = match b.split_first() {
                Some((b' ', rest)) if i == 0 && self.add_space_prefix() => rest,
                _ => b,
            };
            bytes.extend_from_slice(b);
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

    /// Whether the model expects a BOS token (`tokenizer.ggml.add_bos_token`;
    /// when absent false for `gpt2`, true for `llama`). Pass it as `add_bos`
    /// to [`GgufTokenizer::encode`].
    pub fn add_bos_default(&self) -> bool {
        self.add_bos
    }

    /// Whether the file asks for an EOS token after encoded text
    /// (`tokenizer.ggml.add_eos_token`, false when absent).
    /// [`GgufTokenizer::encode`] never appends it; callers that want it push
    /// [`GgufTokenizer::eos_id`].
    pub fn add_eos_default(&self) -> bool {
        self.add_eos
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
/// [`StreamDecoder::finish`] equals [`GgufTokenizer::decode`] of the same ids,
/// except that a SentencePiece tokenizer with `add_space_prefix` keeps the
/// first token's leading space here (the stream continues a prompt).
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
