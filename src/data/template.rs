//! Chat templates: a model's own Jinja template, rendered with MiniJinja.
//!
//! Owns turning a list of messages into the exact text the model was
//! trained on. The environment matches Hugging Face's `apply_chat_template`:
//! `trim_blocks` and `lstrip_blocks` on, Python string methods
//! (`startswith`, `split`, `strip`, …) through `minijinja-contrib`'s
//! pycompat, `raise_exception`, and the special tokens (`bos_token`,
//! `eos_token`, `pad_token`) as variables.
//!
//! Thinking: every render passes `enable_thinking` (false unless changed).
//! Qwen3's template then ends a generation prompt with an empty
//! `<think>\n\n</think>\n\n` block, and renders the same block before a
//! final assistant answer, so the training text after the prompt is exactly
//! what the model must generate at eval. Templates that do not know the
//! variable ignore it.
//!
//! There is no built-in ChatML fallback: a tokenizer without a template is
//! usually a base model whose vocabulary may lack `<|im_start|>`; guessing a
//! format would train on text the model's tooling will not produce. The
//! error says how to supply one (`chat_template.jinja` in the folder).

use minijinja::syntax::SyntaxConfig;
use minijinja::{Environment, ErrorKind, Value, context};
use serde::{Deserialize, Serialize};

use super::{DataError, Result};

/// Who speaks a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

/// One chat message, as the template sees it (`message.role`,
/// `message.content`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    pub content: String,
}

impl Message {
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Message {
            role,
            content: content.into(),
        }
    }
}

const NAME: &str = "chat_template";

/// A compiled chat template with the tokenizer's special tokens bound.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
    pad_token: String,
    enable_thinking: bool,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_len", &self.source.len())
            .field("enable_thinking", &self.enable_thinking)
            .finish()
    }
}

impl ChatTemplate {
    /// Compiles `source`; special tokens are the strings the template may
    /// print (`""` where the tokenizer has none).
    pub fn new(source: &str, bos_token: &str, eos_token: &str, pad_token: &str) -> Result<Self> {
        let mut env = Environment::new();
        // Hugging Face's settings for chat templates.
        env.set_syntax(
            SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .keep_trailing_newline(false)
                .build()
                .expect("default delimiters"),
        );
        env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<Value, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_template_owned(NAME, source.to_owned())
            .map_err(|e| DataError::Template {
                message: format!("does not compile: {}", describe(&e)),
                hint: "the template must be valid Jinja; check `chat_template` in `tokenizer_config.json`".into(),
            })?;
        Ok(ChatTemplate {
            env,
            source: source.to_owned(),
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
            pad_token: pad_token.to_owned(),
            enable_thinking: false,
        })
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether renders ask for thinking (Qwen3's `enable_thinking`);
    /// false by default, so train and eval prompts carry the empty think
    /// block.
    pub fn enable_thinking(&self) -> bool {
        self.enable_thinking
    }

    pub fn set_enable_thinking(&mut self, on: bool) {
        self.enable_thinking = on;
    }

    /// Renders `messages`; with `add_generation_prompt` the text ends where
    /// the assistant's answer starts.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let tmpl = self.env.get_template(NAME).expect("added in new");
        let messages: Vec<Value> = messages
            .iter()
            .map(|m| {
                Value::from_pairs([
                    ("role", Value::from(m.role.as_str())),
                    ("content", Value::from(m.content.as_str())),
                ])
            })
            .collect();
        tmpl.render(context! {
            messages => Value::from(messages),
            add_generation_prompt => add_generation_prompt,
            enable_thinking => self.enable_thinking,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
            pad_token => &self.pad_token,
        })
        .map_err(|e| DataError::Template {
            message: format!("render failed: {}", describe(&e)),
            hint: "the template may expect messages this chat does not have (a system prompt, tools); check the record's `messages`".into(),
        })
    }
}

/// MiniJinja's error with its source chain and line.
fn describe(e: &minijinja::Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s.push_str(&format!(": {inner}"));
        src = inner.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat() -> Vec<Message> {
        vec![
            Message::new(Role::User, "Hi"),
            Message::new(Role::Assistant, "1\n2"),
        ]
    }

    #[test]
    fn renders_prompt_and_full_chat() {
        let t = ChatTemplate::new(crate::data::testing::TEMPLATE, "", "<|im_end|>", "").unwrap();
        let c = chat();
        let prompt = t.render(&c[..1], true).unwrap();
        assert_eq!(
            prompt,
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
        );
        let full = t.render(&c, false).unwrap();
        assert_eq!(full, format!("{prompt}1\n2<|im_end|>\n"));
    }

    #[test]
    fn thinking_switch_reaches_the_template() {
        let mut t =
            ChatTemplate::new(crate::data::testing::TEMPLATE, "", "<|im_end|>", "").unwrap();
        t.set_enable_thinking(true);
        let prompt = t.render(&chat()[..1], true).unwrap();
        assert!(prompt.ends_with("<|im_start|>assistant\n"), "{prompt:?}");
    }

    #[test]
    fn hf_environment_features() {
        // trim_blocks/lstrip_blocks, Python string methods, negative
        // indexes, reversed slices, namespace, special-token variables.
        let src = "  {% for m in messages[::-1] %}\n{{ m.content.split('/')[-1].strip() }}|{% endfor %}\n\
{% set ns = namespace(n=0) %}{% set ns.n = ns.n + 1 %}{{ ns.n }}{{ bos_token }}{{ eos_token }}\
{% if 'x'.startswith('x') %}!{% endif %}";
        let t = ChatTemplate::new(src, "<s>", "</s>", "").unwrap();
        let out = t
            .render(
                &[
                    Message::new(Role::User, "a/ b "),
                    Message::new(Role::Assistant, "c/d"),
                ],
                false,
            )
            .unwrap();
        assert_eq!(out, "d|b|1<s></s>!");
    }

    #[test]
    fn raise_exception_is_a_clear_error() {
        let t =
            ChatTemplate::new("{{ raise_exception('roles must alternate') }}", "", "", "").unwrap();
        let e = t.render(&chat(), false).unwrap_err().to_string();
        assert!(e.contains("roles must alternate"), "{e}");
        assert!(e.contains("hint:"), "{e}");
    }

    #[test]
    fn bad_syntax_is_a_clear_error() {
        let e = ChatTemplate::new("{% for %}", "", "", "")
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not compile"), "{e}");
    }
}
