//! gpt-oss's harmony output format, split into its reasoning and its answer as the tokens
//! arrive.
//!
//! A harmony reply (OpenAI's "harmony response format"; the prompt ends with
//! `<|start|>assistant`, which the model continues) is a sequence of messages
//!
//! ```text
//! <|channel|>analysis<|message|>…reasoning…<|end|>
//! <|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{…}<|call|>
//! <|start|>assistant<|channel|>final<|message|>…answer…<|return|>
//! ```
//!
//! each a header (the role after `<|start|>`, then after `<|channel|>` the channel and any
//! ` to=RECIPIENT` and `<|constrain|>TYPE`) and a body after `<|message|>`, ended by `<|end|>`
//! (more messages follow), `<|return|>` (the reply is done) or `<|call|>` (a tool call,
//! the reply is done). [`HarmonySplitter`] reads the generated ids one at a time and
//! routes each body's text, as soon as it is whole characters, to the reasoning (the
//! `analysis` channel) or to the content (the `final` channel, and `commentary` without a
//! recipient, the preamble a model may show before calling tools, as llama.cpp's parser
//! does); a `commentary` (or `analysis`) message with a recipient is a tool call, kept
//! whole in [`HarmonyCall`]. Text outside any message (a model that writes no channel at
//! all) is content, so nothing is lost. Headers never reach either.
//!
//! Sources: OpenAI's harmony format guide (cookbook "openai-harmony") and the parser of
//! llama.cpp's `common/chat.cpp` (`common_chat_params_init_gpt_oss`), which read the same
//! channels this way.

use crate::{Result, StreamDecoder, Tokenizer};

/// The ids of the harmony special tokens in a vocabulary (o200k_harmony: `<|start|>`
/// 200006, `<|end|>` 200007, `<|message|>` 200008, `<|channel|>` 200005, `<|return|>`
/// 200002, `<|call|>` 200012, `<|constrain|>` 200003).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HarmonyTokens {
    /// `<|start|>`: a message's role follows.
    pub start: u32,
    /// `<|end|>`: a message ends, another may follow.
    pub end: u32,
    /// `<|message|>`: the header ends, the body follows.
    pub message: u32,
    /// `<|channel|>`: the channel name follows.
    pub channel: u32,
    /// `<|return|>`: the reply is done.
    pub return_: u32,
    /// `<|call|>`: a tool call's arguments end, and the reply with them.
    pub call: u32,
    /// `<|constrain|>`: the type of a tool call's arguments follows (`json`), if present.
    pub constrain: Option<u32>,
}

impl Tokenizer {
    /// The harmony special tokens, if this vocabulary has all of `<|start|>`, `<|end|>`,
    /// `<|message|>`, `<|channel|>`, `<|return|>` and `<|call|>` as special (control)
    /// tokens: gpt-oss's o200k_harmony, from a `tokenizer.json` or a GGUF file. `None` for
    /// every other tokenizer, whose replies are plain text.
    pub fn harmony_tokens(&self) -> Option<HarmonyTokens> {
        Some(HarmonyTokens {
            start: self.special_id("<|start|>")?,
            end: self.special_id("<|end|>")?,
            message: self.special_id("<|message|>")?,
            channel: self.special_id("<|channel|>")?,
            return_: self.special_id("<|return|>")?,
            call: self.special_id("<|call|>")?,
            constrain: self.special_id("<|constrain|>"),
        })
    }
}

/// A tool call of a harmony reply: a message addressed to a recipient.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HarmonyCall {
    /// The recipient after `to=`, such as `functions.get_weather`.
    pub recipient: String,
    /// The channel it was written in (`commentary`, sometimes `analysis`).
    pub channel: String,
    /// The type after `<|constrain|>` (`json`), empty if none.
    pub constrain: String,
    /// The body: the call's arguments as the model wrote them (JSON for `json`).
    pub arguments: String,
}

impl HarmonyCall {
    /// The header of a call to `recipient` (`functions.get_weather`) with JSON arguments,
    /// as gpt-oss writes it after the prompt's `<|start|>assistant` (OpenAI's harmony
    /// guide, "Function calling"): `<|channel|>commentary to=RECIPIENT <|constrain|>json<|message|>`.
    /// A prompt that ends with it makes the reply that call's arguments
    /// ([`HarmonySplitter::in_call`]).
    pub fn json_header(recipient: &str) -> String {
        format!("<|channel|>commentary to={recipient} <|constrain|>json<|message|>")
    }
}

/// Text a step of [`HarmonySplitter`] produced, by destination.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HarmonyText {
    /// Reasoning: text of the `analysis` channel.
    pub reasoning: String,
    /// The answer: text of the `final` channel, of a `commentary` preamble, or outside any
    /// message.
    pub content: String,
}

impl HarmonyText {
    /// Whether both are empty.
    pub fn is_empty(&self) -> bool {
        self.reasoning.is_empty() && self.content.is_empty()
    }

    fn append(&mut self, other: HarmonyText) {
        self.reasoning += &other.reasoning;
        self.content += &other.content;
    }
}

/// Where a body's text goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Reasoning,
    Content,
    Call,
}

/// Where the splitter is in the reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Between messages (and at the start, after the prompt's `<|start|>assistant`): a
    /// header, `<|start|>`, or text outside any message may come.
    Between,
    /// In a header: after `<|start|>` (the role) or `<|channel|>`, until `<|message|>`.
    Header,
    /// In a message's body.
    Body(Target),
}

/// Splits a harmony reply, id by id, into reasoning, content and tool calls (see the
/// module docs). Feed every generated id to [`HarmonySplitter::push`] and call
/// [`HarmonySplitter::finish`] at the end; the texts returned concatenate to the whole
/// reply's reasoning and content, whatever the ids' grouping.
pub struct HarmonySplitter<'a> {
    tokenizer: &'a Tokenizer,
    tokens: HarmonyTokens,
    state: State,
    /// The current header, special tokens spelled out (`assistant<|channel|>final`).
    header: String,
    /// Decodes the text tokens of the current header.
    header_decoder: StreamDecoder<'a>,
    /// Decodes the current body (or text outside any message).
    body: StreamDecoder<'a>,
    /// The tool call being written, and those done.
    call: Option<HarmonyCall>,
    calls: Vec<HarmonyCall>,
}

impl<'a> HarmonySplitter<'a> {
    /// A splitter for a reply of `tokenizer`'s model, whose harmony tokens are `tokens`
    /// ([`Tokenizer::harmony_tokens`]); the prompt ended with `<|start|>assistant` (the
    /// harmony template's generation prompt), so the reply starts between messages.
    pub fn new(tokenizer: &'a Tokenizer, tokens: HarmonyTokens) -> Self {
        HarmonySplitter {
            tokenizer,
            tokens,
            state: State::Between,
            header: String::new(),
            header_decoder: tokenizer.stream_decoder(false),
            body: tokenizer.stream_decoder(false),
            call: None,
            calls: Vec::new(),
        }
    }

    /// A splitter for a reply whose prompt ends with [`HarmonyCall::json_header`] of
    /// `recipient`: the reply starts in that call's arguments, which end at `<|call|>`.
    pub fn in_call(tokenizer: &'a Tokenizer, tokens: HarmonyTokens, recipient: &str) -> Self {
        HarmonySplitter {
            state: State::Body(Target::Call),
            call: Some(HarmonyCall {
                recipient: recipient.to_owned(),
                channel: "commentary".into(),
                constrain: "json".into(),
                arguments: String::new(),
            }),
            ..HarmonySplitter::new(tokenizer, tokens)
        }
    }

    /// Reads one generated id: the reasoning and content it completes (possibly none: a
    /// header, a special token, the first bytes of a character).
    ///
    /// Errors: an id outside the vocabulary ([`StreamDecoder::push`]).
    pub fn push(&mut self, id: u32) -> Result<HarmonyText> {
        let t = self.tokens;
        let mut out = HarmonyText::default();
        if id == t.start {
            out.append(self.end_message());
            self.header.clear();
            self.state = State::Header;
        } else if id == t.channel || (Some(id) == t.constrain && self.state == State::Header) {
            if self.state != State::Header {
                out.append(self.end_message());
                self.header.clear();
                self.state = State::Header;
            }
            self.header += &self.header_decoder.finish();
            self.header += if id == t.channel {
                "<|channel|>"
            } else {
                "<|constrain|>"
            };
        } else if id == t.message && self.state == State::Header {
            self.header += &self.header_decoder.finish();
            let target = self.open_body();
            self.state = State::Body(target);
        } else if id == t.end || id == t.return_ || id == t.call {
            out.append(self.end_message());
            self.state = State::Between;
        } else if self.state == State::Header {
            self.header += &self.header_decoder.push(id)?;
        } else {
            // Body text, or text between messages (content). A stray `<|message|>` or
            // `<|constrain|>` decodes to nothing.
            let text = self.body.push(id)?;
            match self.state {
                State::Body(target) => self.route(target, text, &mut out),
                _ => out.content = text,
            }
        }
        Ok(out)
    }

    /// The text left at the end of the reply (a character cut off, as U+FFFD), and the tool
    /// calls it made, in order (a call cut off by the token limit included, its arguments
    /// as far as they went).
    pub fn finish(mut self) -> (HarmonyText, Vec<HarmonyCall>) {
        let out = self.end_message();
        (out, self.calls)
    }

    /// The tool calls completed so far.
    pub fn calls(&self) -> &[HarmonyCall] {
        &self.calls
    }

    /// Where the message whose header is complete goes, from its channel and recipient.
    fn open_body(&mut self) -> Target {
        let (role, rest) = self
            .header
            .split_once("<|channel|>")
            .unwrap_or((self.header.as_str(), ""));
        let (channel_part, constrain) = rest.split_once("<|constrain|>").unwrap_or((rest, ""));
        let mut words = channel_part.split_whitespace();
        let channel = words.next().unwrap_or("").to_owned();
        let mut constrain = constrain.trim().to_owned();
        // The recipient may be in the role part or after the channel.
        let recipient = role
            .split_whitespace()
            .chain(channel_part.split_whitespace().skip(1))
            .find_map(|w| w.strip_prefix("to="))
            .map(str::to_owned);
        // `commentary json` without `<|constrain|>`: the type after the channel.
        if constrain.is_empty() {
            if let Some(word) = channel_part
                .split_whitespace()
                .skip(1)
                .find(|w| !w.starts_with("to="))
            {
                constrain = word.to_owned();
            }
        }
        self.body = self.tokenizer.stream_decoder(false);
        match recipient {
            // A reply addressed to the user, and llama.cpp's `to=assistant` stray.
            Some(r) if r != "assistant" && r != "all" => {
                self.call = Some(HarmonyCall {
                    recipient: r,
                    channel,
                    constrain,
                    arguments: String::new(),
                });
                Target::Call
            }
            _ if channel == "analysis" => Target::Reasoning,
            _ => Target::Content,
        }
    }

    fn route(&mut self, target: Target, text: String, out: &mut HarmonyText) {
        match target {
            Target::Reasoning => out.reasoning = text,
            Target::Content => out.content = text,
            Target::Call => {
                if let Some(call) = &mut self.call {
                    call.arguments += &text;
                }
            }
        }
    }

    /// Flushes the body (or the text between messages) and the header being read.
    fn end_message(&mut self) -> HarmonyText {
        let mut out = HarmonyText::default();
        let rest = self.body.finish();
        self.body = self.tokenizer.stream_decoder(false);
        match self.state {
            State::Body(target) => self.route(target, rest, &mut out),
            State::Between => out.content = rest,
            State::Header => {}
        }
        self.header_decoder = self.tokenizer.stream_decoder(false);
        if let Some(call) = self.call.take() {
            self.calls.push(call);
        }
        out
    }
}
