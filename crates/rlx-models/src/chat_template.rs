//! Chat prompts from the model's own template (`tokenizer.chat_template`
//! in the GGUF), rendered with minijinja. When the file has none: Gemma's
//! turn format if the vocabulary has `<start_of_turn>` and `<end_of_turn>`
//! (the Gemma 3 GGUFs carry no template), ChatML otherwise.

use minijinja::{Environment, Error, ErrorKind};
use serde::Serialize;

/// ChatML, used when the GGUF carries no template.
const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Gemma's turn format (as in Gemma 3's `tokenizer_config.json`): BOS, a
/// system message folded into the first user turn, `assistant` written
/// `model`, contents trimmed.
const GEMMA: &str = "{{ bos_token }}{% if messages and messages[0]['role'] == 'system' %}{% set first_user_prefix = messages[0]['content'] + '\n\n' %}{% set loop_messages = messages[1:] %}{% else %}{% set first_user_prefix = '' %}{% set loop_messages = messages %}{% endif %}{% for message in loop_messages %}{% if message['role'] == 'assistant' %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}";

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

    /// The template of a GGUF file (`tokenizer.chat_template`; when absent
    /// Gemma's turn format for a vocabulary with `<start_of_turn>` and
    /// `<end_of_turn>`, else ChatML), with its tokenizer's BOS and EOS texts.
    pub fn from_gguf(
        f: &rlx_formats::GgufFile,
        tok: &crate::gguf_tokenizer::GgufTokenizer,
    ) -> Result<Self, String> {
        let gemma = || {
            (tok.token_id("<start_of_turn>").is_some() && tok.token_id("<end_of_turn>").is_some())
                .then_some(GEMMA)
        };
        let src = f
            .metadata("tokenizer.chat_template")
            .and_then(|v| v.as_str())
            .or_else(gemma);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chatml_fallback_renders_turns_and_the_generation_prompt() {
        let t = ChatTemplate::new(None, "", "").unwrap();
        let p = t
            .render(&[Message {
                role: "user".into(),
                content: "hi".into(),
            }])
            .unwrap();
        assert_eq!(p, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    }

    #[test]
    fn gemma_fallback_folds_the_system_turn_and_names_the_model() {
        let t = ChatTemplate::new(Some(GEMMA), "<bos>", "<eos>").unwrap();
        let msg = |role: &str, content: &str| Message {
            role: role.into(),
            content: content.into(),
        };
        let p = t
            .render(&[
                msg("system", "Be brief."),
                msg("user", " hi "),
                msg("assistant", "Hello!"),
                msg("user", "Bye"),
            ])
            .unwrap();
        assert_eq!(
            p,
            "<bos><start_of_turn>user\nBe brief.\n\nhi<end_of_turn>\n\
             <start_of_turn>model\nHello!<end_of_turn>\n\
             <start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
        );
        let p = t
            .render(&[msg("user", "The capital of France is")])
            .unwrap();
        assert_eq!(
            p,
            "<bos><start_of_turn>user\nThe capital of France is<end_of_turn>\n\
             <start_of_turn>model\n"
        );
    }

    #[test]
    fn raise_exception_is_an_error_not_a_panic() {
        let t = ChatTemplate::new(Some("{{ raise_exception('no system role') }}"), "", "").unwrap();
        let e = t.render(&[]).unwrap_err();
        assert!(e.contains("no system role"), "{e}");
    }
}
