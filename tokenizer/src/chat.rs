//! Chat prompts: a conversation (a list of [`Message`]s) to the token ids the model was
//! trained on.
//!
//! Two sources, in this order of preference:
//!
//! 1. a built-in [`ChatFormat`] (ChatGLM2, ChatGLM3, GLM-4), built token by token exactly
//!    as chatglm.cpp's `apply_chat_template` and THUDM's `build_chat_input` do, with the
//!    role tokens inserted by id;
//! 2. the model's Jinja `chat_template` (Hugging Face `tokenizer_config.json`, GGUF
//!    `tokenizer.chat_template`), rendered with minijinja under transformers'
//!    `apply_chat_template` semantics (`jinja.rs`): then the text is encoded with the
//!    special tokens written in it recognised, as transformers' tokenizers do.

use serde::{Deserialize, Serialize};

use crate::jinja::{Chat, ChatTemplate};
use crate::{Encoder, Error, Result, Tokenizer};

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant` (and `observation` for ChatGLM3/GLM-4 tool results).
    pub role: String,
    /// The text of the turn.
    pub content: String,
}

impl Message {
    /// A message of `role` with `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// Keyword arguments of a Jinja chat template beside the conversation: the variables that
/// transformers' `apply_chat_template(messages, **kwargs)` hands the template, such as
/// Qwen3's `enable_thinking` (`false` closes an empty `<think>` block after the generation
/// prompt). Keys are the template's variable names, values any JSON; the built-in ChatGLM
/// formats have no variables and ignore them.
pub type TemplateArgs = serde_json::Map<String, serde_json::Value>;

/// A built-in prompt format, stored in the tokenizer description.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChatFormat {
    /// ChatGLM2-6B: the text `[Round N]\n\n问：{user}\n\n答：{assistant}\n\n`, round after
    /// round, encoded after the `[gMASK] sop` prefix (no system prompt). A user turn always
    /// ends with `答：`, so `add_generation_prompt` changes nothing.
    ChatGlm2,
    /// ChatGLM3-6B: `[gMASK] sop`, then per message its role token, `encode("\n")` and
    /// `encode(content)`; `<|assistant|>` last as the generation prompt.
    ChatGlm3,
    /// GLM-4: as ChatGLM3, with GLM-4's byte-level BPE and `[gMASK] <sop>`.
    Glm4,
}

/// A rendered chat prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatPrompt {
    /// The token ids to feed the model (prefix tokens included).
    pub ids: Vec<u32>,
    /// The prompt as text, special tokens spelled out (for display and logs).
    pub text: String,
}

impl Tokenizer {
    /// The built-in prompt format, if the tokenizer has one.
    pub fn chat_format(&self) -> Option<ChatFormat> {
        self.chat_format
    }

    /// Whether [`Tokenizer::encode_chat`] can build prompts: a built-in format or a Jinja
    /// chat template is known.
    pub fn can_chat(&self) -> bool {
        self.chat_format.is_some() || self.chat_template.is_some()
    }

    /// The prompt for `messages`; with `add_generation_prompt`, it ends where the
    /// assistant's reply starts.
    ///
    /// Errors: [`Error::Template`] when the tokenizer has no chat format or template, for
    /// a role the format does not know (ChatGLM2: alternating `user`/`assistant` only;
    /// ChatGLM3/GLM-4: `system`, `user`, `assistant`, `observation`), and for a Jinja
    /// template that fails to render or calls `raise_exception`.
    pub fn encode_chat(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<ChatPrompt> {
        self.encode_chat_with_args(messages, add_generation_prompt, &TemplateArgs::new())
    }

    /// [`Tokenizer::encode_chat`] with keyword arguments for the Jinja template (see
    /// [`TemplateArgs`]).
    ///
    /// Errors: as [`Tokenizer::encode_chat`], and [`Error::Template`] for an argument that
    /// names a variable the conversation sets ([`crate::check_template_args`]).
    pub fn encode_chat_with_args(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        args: &TemplateArgs,
    ) -> Result<ChatPrompt> {
        crate::check_template_args(args)?;
        match (self.chat_format, &self.chat_template) {
            (Some(ChatFormat::ChatGlm2), _) => self.chatglm2(messages),
            (Some(ChatFormat::ChatGlm3 | ChatFormat::Glm4), _) => {
                self.role_tokens(messages, add_generation_prompt)
            }
            (None, Some(template)) => {
                self.jinja_prompt(template, &Chat::new(messages, add_generation_prompt, args))
            }
            (None, None) => Err(Error::Template(
                "the model has no chat template (no tokenizer_config.json chat_template, no \
                 built-in format)"
                    .into(),
            )),
        }
    }

    /// The prompt for `messages`, JSON objects as OpenAI's API gives them (`role`,
    /// `content`, and `tool_calls` or `tool_call_id` where present), with the function
    /// list `tools` (OpenAI's `tools` array) and the keyword arguments `args`, rendered by
    /// the Jinja chat template, which sees them as `messages`, `tools` and variables of
    /// their own (transformers' `apply_chat_template(messages, tools=..., **kwargs)`).
    ///
    /// Errors: [`Error::Template`] when the tokenizer has no Jinja template (the built-in
    /// ChatGLM formats take no tool list), and as [`Tokenizer::encode_chat_with_args`].
    pub fn encode_chat_with_tools(
        &self,
        messages: &[serde_json::Value],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        args: &TemplateArgs,
    ) -> Result<ChatPrompt> {
        let (None, Some(template)) = (self.chat_format, &self.chat_template) else {
            return Err(Error::Template(
                "tools and tool messages need a Jinja chat template, and the model has none".into(),
            ));
        };
        let chat = Chat {
            tools,
            ..Chat::new(messages, add_generation_prompt, args)
        };
        self.jinja_prompt(template, &chat)
    }

    /// The prompt the Jinja `template` renders for `chat`: its text, and the ids of the text
    /// with the special tokens it spells out.
    fn jinja_prompt<M: Serialize>(
        &self,
        template: &ChatTemplate,
        chat: &Chat<'_, M>,
    ) -> Result<ChatPrompt> {
        let text = crate::jinja::render(self, &template.text, chat)?;
        let ids = self.encode_with_specials(&text)?;
        Ok(ChatPrompt { ids, text })
    }

    /// The tokens that end an assistant turn: EOS, for ChatGLM3 and GLM-4 also `<|user|>`
    /// and `<|observation|>`, with which the model starts the next turn, and for gpt-oss's
    /// harmony vocabulary ([`Tokenizer::harmony_tokens`]) `<|return|>`, `<|call|>` and
    /// `<|endoftext|>` (their `generation_config.json` `eos_token_id`; harmony's `<|end|>`
    /// only ends one message of the reply).
    pub fn chat_stop_ids(&self) -> Vec<u32> {
        let mut stop: Vec<u32> = self.eos.into_iter().collect();
        if matches!(
            self.chat_format,
            Some(ChatFormat::ChatGlm3 | ChatFormat::Glm4)
        ) {
            stop.extend(self.special_id("<|user|>"));
            stop.extend(self.special_id("<|observation|>"));
        }
        if let Some(h) = self.harmony_tokens() {
            for id in [
                Some(h.return_),
                Some(h.call),
                self.special_id("<|endoftext|>"),
            ] {
                if let Some(id) = id.filter(|id| !stop.contains(id)) {
                    stop.push(id);
                }
            }
        }
        stop
    }

    /// The content of an assistant reply as the history keeps it, from the decoded text of
    /// the generated ids. ChatGLM3 and GLM-4 answer `<|assistant|>` with a metadata line
    /// (a tool name, empty for a plain answer) and the content; like THUDM's
    /// `process_response`, a blank metadata line is dropped and the content trimmed, so
    /// that the next prompt re-encodes the reply as it was generated. Other formats keep
    /// the text as it is.
    pub fn chat_reply_content<'a>(&self, reply: &'a str) -> &'a str {
        if !matches!(
            self.chat_format,
            Some(ChatFormat::ChatGlm3 | ChatFormat::Glm4)
        ) {
            return reply;
        }
        match reply.split_once('\n') {
            Some((metadata, content)) if metadata.trim().is_empty() => content.trim(),
            _ => reply,
        }
    }

    /// The prefix tokens and their text.
    fn prefix_prompt(&self) -> Result<ChatPrompt> {
        let ids = self.encode("", true)?;
        let text = ids.iter().map(|&id| self.piece_text(id)).collect();
        Ok(ChatPrompt { ids, text })
    }

    fn piece_text(&self, id: u32) -> String {
        String::from_utf8_lossy(self.piece(id).unwrap_or_default()).into_owned()
    }

    /// chatglm.cpp `ChatGLM2Tokenizer::apply_chat_template`.
    fn chatglm2(&self, messages: &[Message]) -> Result<ChatPrompt> {
        let mut text = String::new();
        for (i, m) in messages.iter().enumerate() {
            let expected = if i % 2 == 0 { "user" } else { "assistant" };
            if m.role != expected {
                return Err(Error::Template(format!(
                    "ChatGLM2 prompts alternate user and assistant turns, starting with the \
                     user; message {i} is from {:?}",
                    m.role
                )));
            }
            if i % 2 == 0 {
                text += &format!("[Round {}]\n\n问：{}\n\n答：", i / 2 + 1, m.content);
            } else {
                text += &format!("{}\n\n", m.content);
            }
        }
        let mut prompt = self.prefix_prompt()?;
        prompt.ids.extend(self.encode(&text, false)?);
        prompt.text += &text;
        Ok(prompt)
    }

    /// ChatGLM3 / GLM-4: chatglm.cpp `ChatGLM3Tokenizer::apply_chat_template` and
    /// `ChatGLM4Tokenizer::apply_chat_template`.
    fn role_tokens(&self, messages: &[Message], add_generation_prompt: bool) -> Result<ChatPrompt> {
        let role_token = |role: &str| {
            if !matches!(role, "system" | "user" | "assistant" | "observation") {
                return Err(Error::Template(format!("unknown chat role {role:?}")));
            }
            let name = format!("<|{role}|>");
            match self.special_id(&name) {
                Some(id) => Ok((id, name)),
                None => Err(Error::Template(format!(
                    "the tokenizer has no {name} token for its chat format"
                ))),
            }
        };
        let mut prompt = self.prefix_prompt()?;
        for m in messages {
            let (id, name) = role_token(&m.role)?;
            prompt.ids.push(id);
            prompt.ids.extend(self.encode("\n", false)?);
            prompt.ids.extend(self.encode(&m.content, false)?);
            prompt.text += &format!("{name}\n{}", m.content);
        }
        if add_generation_prompt {
            let (id, name) = role_token("assistant")?;
            prompt.ids.push(id);
            prompt.text += &name;
        }
        Ok(prompt)
    }

    /// Encodes text in which special tokens may be written, as transformers does after
    /// rendering a chat template: Hugging Face tokenizers match their added tokens anyway;
    /// for the others, the text is cut at every CONTROL piece written in it (longest
    /// first) and each stretch between is encoded on its own.
    pub fn encode_with_specials(&self, text: &str) -> Result<Vec<u32>> {
        if matches!(self.encoder, Encoder::HuggingFace(_)) {
            return self.encode(text, false);
        }
        let mut specials: Vec<(&str, u32)> = (0u32..)
            .zip(&self.pieces)
            .filter(|(_, p)| p.kind == crate::vocab::PieceKind::Control)
            .filter_map(|(id, p)| Some((std::str::from_utf8(&p.bytes).ok()?, id)))
            .filter(|(s, _)| !s.is_empty())
            .collect();
        specials.sort_by_key(|(s, _)| std::cmp::Reverse(s.len()));
        let mut ids = Vec::new();
        let mut rest = text;
        let mut plain = 0;
        while plain < rest.len() {
            let here = &rest[plain..];
            match specials.iter().find(|(s, _)| here.starts_with(s)) {
                Some(&(s, id)) => {
                    ids.extend(self.encode(&rest[..plain], false)?);
                    ids.push(id);
                    rest = &here[s.len()..];
                    plain = 0;
                }
                None => plain += here.chars().next().map_or(1, char::len_utf8),
            }
        }
        ids.extend(self.encode(rest, false)?);
        Ok(ids)
    }
}
