//! Chat templates and stop strings for `rlx.LlamaModel`: the same rules
//! as `rlx serve` (crate `rlx-server`, `chat.rs` and `stop.rs`), kept here
//! so the Python package does not link the HTTP server (axum, tokio).

use minijinja::{Environment, Error, ErrorKind};
use serde::Serialize;

/// ChatML, used when the GGUF carries no template.
const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// One chat message.
#[derive(Debug, Clone, Serialize)]
pub struct Message {
    /// `system`, `user`, `assistant`, ...
    pub role: String,
    /// The text.
    pub content: String,
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
}

impl ChatTemplate {
    /// Compile `source` (or ChatML when `None`); `bos`/`eos` are the texts
    /// of the model's special tokens, as templates expect them.
    pub fn new(source: Option<&str>, bos: &str, eos: &str) -> Result<Self, String> {
        let mut env = Environment::new();
        env.add_function("raise_exception", |msg: String| -> Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_template_owned("chat", source.unwrap_or(CHATML).to_string())
            .map_err(|e| format!("the GGUF's tokenizer.chat_template does not compile: {e}"))?;
        Ok(ChatTemplate {
            env,
            bos: bos.to_string(),
            eos: eos.to_string(),
        })
    }

    /// The template of a GGUF file (`tokenizer.chat_template`, ChatML when
    /// absent), with its tokenizer's BOS and EOS texts.
    pub fn from_gguf(
        f: &rlx::formats::GgufFile,
        tok: &rlx::models::gguf_tokenizer::GgufTokenizer,
    ) -> Result<Self, String> {
        let src = f
            .metadata("tokenizer.chat_template")
            .and_then(|v| v.as_str());
        let text_of = |id: Option<u32>| {
            id.and_then(|i| tok.token_text(i).ok())
                .unwrap_or_default()
                .to_string()
        };
        Self::new(src, &text_of(tok.bos_id()), &text_of(tok.eos_id()))
    }

    /// The prompt for `messages`, ending with the assistant's turn.
    pub fn render(&self, messages: &[Message]) -> Result<String, String> {
        let t = self.env.get_template("chat").map_err(|e| e.to_string())?;
        t.render(minijinja::context! {
            messages => messages,
            add_generation_prompt => true,
            bos_token => self.bos,
            eos_token => self.eos,
        })
        .map_err(|e| format!("rendering the chat template: {e}"))
    }
}

/// Tracks generated text against stop strings.
#[derive(Debug, Default)]
pub struct StopText {
    stops: Vec<String>,
    text: String,
    sent: usize,
}

/// What a new piece of text allows.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Text that can be sent now (maybe empty: held back as a possible
    /// start of a stop string).
    Send(String),
    /// A stop string matched: send this last text and stop.
    Stop(String),
}

impl StopText {
    /// Track against `stops` (empty strings are ignored).
    pub fn new(stops: Vec<String>) -> Self {
        StopText {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            ..Default::default()
        }
    }

    /// Add generated text.
    pub fn push(&mut self, piece: &str) -> Step {
        // A stop string may end in `piece` and start in held-back text.
        let from = self.sent;
        self.text.push_str(piece);
        let hit = self
            .stops
            .iter()
            .filter_map(|s| self.text[from..].find(s.as_str()).map(|i| from + i))
            .min();
        if let Some(i) = hit {
            let out = self.text[self.sent..i].to_string();
            self.text.truncate(i);
            self.sent = i;
            return Step::Stop(out);
        }
        // Hold back the longest tail that is a prefix of a stop string.
        let mut safe = self.text.len();
        for (i, _) in self.text[self.sent..].char_indices() {
            let tail = &self.text[self.sent + i..];
            if self.stops.iter().any(|s| s.starts_with(tail)) {
                safe = self.sent + i;
                break;
            }
        }
        let out = self.text[self.sent..safe].to_string();
        self.sent = safe;
        Step::Send(out)
    }

    /// The text held back, sent at the end when no stop string matched.
    pub fn finish(&mut self) -> String {
        let out = self.text[self.sent..].to_string();
        self.sent = self.text.len();
        out
    }
}

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
