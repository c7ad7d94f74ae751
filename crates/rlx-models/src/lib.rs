//! rlx-models: model graph builders and weight mapping.
//!
//! - [`bert`]: BERT encoders from `config.json`.
//! - [`tokenizer`]: BERT WordPiece tokenization via `tokenizers`.

pub mod bert;
pub mod tokenizer;
