//! Chat templates and stop strings for `rlx.LlamaModel`: the same code as
//! `rlx serve` (rlx-models' `chat_template` and `stop`), without linking the
//! HTTP server; plus incremental UTF-8 assembly for streams.

pub use rlx::models::chat_template::{ChatTemplate, Message};
pub use rlx::models::stop::{Step, StopText};

/// Incremental UTF-8 assembly of token bytes: text as tokens arrive, never
/// splitting a character (as `GgufTokenizer::stream_decoder`, but owning
/// its state so a Python iterator can hold it).
#[derive(Debug, Default)]
pub struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    /// Add a token's bytes; the newly completed text (invalid sequences
    /// become U+FFFD, an incomplete character at the end waits).
    pub fn push(&mut self, bytes: &[u8]) -> String {
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
                    out.push_str(std::str::from_utf8(&rest[..valid]).unwrap_or_default());
                    match e.error_len() {
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            consumed += valid + bad;
                        }
                        None => {
                            consumed += valid;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..consumed);
        out
    }

    /// The bytes still held back (an incomplete character becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}
