//! placeholder

pub mod tokenizer;
