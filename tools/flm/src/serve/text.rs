//! From generated ids to the text a client sees: incremental detokenisation (the
//! tokenizer's [`StreamDecoder`]) and OpenAI's `stop` sequences.
//!
//! A stop sequence may arrive split over several tokens, so text that could be the start
//! of one is held back until it either completes the sequence (the reply ends before it,
//! `finish_reason: "stop"`) or can no longer do so (it is released). This is what vLLM's
//! and llama.cpp's servers do; the streamed pieces concatenate to the text of the whole
//! response.
//!
//! A chat reply of gpt-oss (a vocabulary with the harmony tokens) is split by its channels
//! first ([`HarmonySplitter`]): the analysis channel becomes the reasoning, sent apart as
//! OpenAI's `reasoning_content`, and only the final answer is content, to which the stop
//! sequences apply. Its tool calls (messages addressed to `functions.NAME`) are kept whole,
//! apart from both, and returned at the end.

use flm_tokenizer::{HarmonyCall, HarmonySplitter, HarmonyTokens, StreamDecoder, Tokenizer};

/// Holds back text that may begin a stop sequence.
#[derive(Debug, Clone, Default)]
pub struct StopText {
    stops: Vec<String>,
    held: String,
}

impl StopText {
    /// A filter for the (non-empty) stop sequences `stops`.
    pub fn new(stops: Vec<String>) -> StopText {
        StopText {
            stops,
            held: String::new(),
        }
    }

    /// Appends `text`; returns the text that can be shown now and whether a stop sequence
    /// was completed (then the text is everything before its earliest occurrence, and the
    /// rest is dropped).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        self.held.push_str(text);
        let first_stop = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(at) = first_stop {
            let mut out = std::mem::take(&mut self.held);
            out.truncate(at);
            return (out, true);
        }
        let keep_from = self
            .held
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| {
                let tail = &self.held[i..];
                self.stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(self.held.len());
        let rest = self.held.split_off(keep_from);
        (std::mem::replace(&mut self.held, rest), false)
    }

    /// The text still held back, at the end of generation.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

/// What one generated id (or the end) shows: reasoning (gpt-oss's analysis channel; empty
/// for every other model), content, and whether a stop sequence ended the reply.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Shown {
    /// Reasoning text, sent as OpenAI's `reasoning_content`.
    pub reasoning: String,
    /// The answer's text, sent as `content`.
    pub content: String,
    /// A stop sequence was completed in the content.
    pub stopped: bool,
}

/// How a gpt-oss chat reply is read: the vocabulary's harmony tokens, and the recipient of
/// the call the prompt opened ([`HarmonyCall::json_header`], a forced tool call), if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Harmony {
    /// The harmony special tokens.
    pub tokens: HarmonyTokens,
    /// The prompt ends in this recipient's call header: the reply is its arguments.
    pub open_call: Option<String>,
}

/// How the ids become text.
enum Decode<'a> {
    /// One stream of text (every model but gpt-oss, and every completion request).
    Plain(StreamDecoder<'a>),
    /// gpt-oss's harmony channels, split into reasoning and content (chat requests to a
    /// model whose vocabulary has the harmony tokens); `None` once finished.
    Harmony(Option<Box<HarmonySplitter<'a>>>),
}

/// Ids in, visible text out: a stream decoder (or for harmony replies, the splitter of
/// their channels) followed by [`StopText`] on the content; the reasoning is not cut by
/// stop sequences.
pub struct Detokenizer<'a> {
    decode: Decode<'a>,
    stop: StopText,
}

impl<'a> Detokenizer<'a> {
    /// Decodes with `tokenizer` (`at_start`: only the prefix tokens precede, see
    /// [`Tokenizer::stream_decoder`]), ending at the first of `stops`; with `harmony`, the
    /// reply is split into reasoning and content by its channels ([`HarmonySplitter`]).
    pub fn new(
        tokenizer: &'a Tokenizer,
        at_start: bool,
        stops: Vec<String>,
        harmony: Option<Harmony>,
    ) -> Self {
        let decode = match harmony {
            Some(Harmony { tokens, open_call }) => {
                let splitter = match open_call {
                    Some(recipient) => HarmonySplitter::in_call(tokenizer, tokens, &recipient),
                    None => HarmonySplitter::new(tokenizer, tokens),
                };
                Decode::Harmony(Some(Box::new(splitter)))
            }
            None => Decode::Plain(tokenizer.stream_decoder(at_start)),
        };
        Detokenizer {
            decode,
            stop: StopText::new(stops),
        }
    }

    /// Feeds one generated id: the text that can be shown now, and whether a stop sequence
    /// ended the reply. Errors on an id outside the vocabulary.
    pub fn push(&mut self, id: u32) -> flm_tokenizer::Result<Shown> {
        let (reasoning, content) = match &mut self.decode {
            Decode::Plain(decoder) => (String::new(), decoder.push(id)?),
            Decode::Harmony(Some(splitter)) => {
                let text = splitter.push(id)?;
                (text.reasoning, text.content)
            }
            Decode::Harmony(None) => (String::new(), String::new()),
        };
        let (content, stopped) = self.stop.push(&content);
        Ok(Shown {
            reasoning,
            content,
            stopped,
        })
    }

    /// The rest of the text once generation has ended (incomplete characters flushed), and
    /// the tool calls of a harmony reply, in order (none for other replies).
    pub fn finish(&mut self) -> (Shown, Vec<HarmonyCall>) {
        let (reasoning, content, calls) = match &mut self.decode {
            Decode::Plain(decoder) => (String::new(), decoder.finish(), Vec::new()),
            Decode::Harmony(splitter) => match splitter.take() {
                Some(s) => {
                    let (text, calls) = s.finish();
                    (text.reasoning, text.content, calls)
                }
                None => (String::new(), String::new(), Vec::new()),
            },
        };
        let (mut content, stopped) = self.stop.push(&content);
        if !stopped {
            content.push_str(&self.stop.finish());
        }
        let shown = Shown {
            reasoning,
            content,
            stopped,
        };
        (shown, calls)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `pieces` and returns the shown text of each push, and where it stopped.
    fn run(stops: &[&str], pieces: &[&str]) -> (Vec<String>, Option<usize>) {
        let mut f = StopText::new(stops.iter().map(|s| s.to_string()).collect());
        let mut shown = Vec::new();
        for (i, piece) in pieces.iter().enumerate() {
            let (text, stopped) = f.push(piece);
            shown.push(text);
            if stopped {
                return (shown, Some(i));
            }
        }
        shown.push(f.finish());
        (shown, None)
    }

    #[test]
    fn without_stops_text_passes_through() {
        assert_eq!(
            run(&[], &["a", "b"]),
            (vec!["a".into(), "b".into(), "".into()], None)
        );
    }

    #[test]
    fn a_stop_split_over_pieces_is_held_then_cut() {
        let (shown, at) = run(&["END"], &["one E", "N", "D two"]);
        assert_eq!(shown, ["one ", "", ""]);
        assert_eq!(at, Some(2));
    }

    #[test]
    fn a_false_start_is_released() {
        let (shown, at) = run(&["END"], &["one E", "Nx", " two E"]);
        assert_eq!(shown, ["one ", "ENx", " two ", "E"]);
        assert_eq!(at, None);
    }

    #[test]
    fn the_earliest_of_several_stops_wins() {
        let (shown, at) = run(&["cd", "b"], &["abcd"]);
        assert_eq!((shown, at), (vec!["a".to_string()], Some(0)));
        let (shown, _) = run(&["xyz", "yz!"], &["a xy", "z!"]);
        assert_eq!(shown, ["a ", ""]);
    }

    /// o200k_harmony (tests/data/tokenizer/o200k-harmony), loaded once.
    fn o200k_harmony() -> &'static Tokenizer {
        static TOK: std::sync::OnceLock<Tokenizer> = std::sync::OnceLock::new();
        TOK.get_or_init(|| {
            let bytes = flm_tests::tokenizer::xz("tokenizer/o200k-harmony/tokenizer.json.xz");
            Tokenizer::from_bytes(&bytes).unwrap()
        })
    }

    /// A gpt-oss reply (special tokens spelled out) through the chat path's detokenizer,
    /// id by id: every step's output, then the end's.
    fn harmony_steps(reply: &str, stops: &[&str], harmony: bool) -> Vec<Shown> {
        let tok = o200k_harmony();
        let ids = tok.encode_with_specials(reply).unwrap();
        let stops = stops.iter().map(|s| s.to_string()).collect();
        let harmony = harmony.then(|| Harmony {
            tokens: tok.harmony_tokens().unwrap(),
            open_call: None,
        });
        let mut d = Detokenizer::new(tok, true, stops, harmony);
        let mut steps = Vec::new();
        for id in ids {
            let shown = d.push(id).unwrap();
            let stopped = shown.stopped;
            steps.push(shown);
            if stopped {
                return steps;
            }
        }
        steps.push(d.finish().0);
        steps
    }

    fn joined(steps: &[Shown]) -> (String, String) {
        steps
            .iter()
            .fold((String::new(), String::new()), |(r, c), s| {
                (r + &s.reasoning, c + &s.content)
            })
    }

    const REPLY: &str = "<|channel|>analysis<|message|>The user wants a greeting. END of thought.<|end|>\
                         <|start|>assistant<|channel|>final<|message|>Hello, world! END here<|return|>";

    #[test]
    fn harmony_replies_split_into_reasoning_and_content() {
        let steps = harmony_steps(REPLY, &[], true);
        assert_eq!(
            joined(&steps),
            (
                "The user wants a greeting. END of thought.".to_owned(),
                "Hello, world! END here".to_owned()
            )
        );
        assert!(steps.iter().all(|s| !s.stopped));
        // The same ids without the splitter (a completion request): the plain text, the
        // special tokens dropped, as before.
        let plain = harmony_steps(REPLY, &[], false);
        let (reasoning, content) = joined(&plain);
        assert_eq!(reasoning, "");
        assert_eq!(
            content,
            "analysisThe user wants a greeting. END of thought.assistantfinalHello, world! END here"
        );
    }

    /// Stop sequences cut the answer only: the reasoning may contain them.
    #[test]
    fn harmony_stop_sequences_apply_to_the_content() {
        let steps = harmony_steps(REPLY, &["END"], true);
        let (reasoning, content) = joined(&steps);
        assert_eq!(reasoning, "The user wants a greeting. END of thought.");
        assert_eq!(content, "Hello, world! ");
        assert!(steps.last().unwrap().stopped);
    }

    #[test]
    fn multibyte_text_is_cut_on_character_boundaries() {
        let (shown, at) = run(&["é!"], &["café", "?é", "!"]);
        assert_eq!(shown, ["caf", "é?", ""]);
        assert_eq!(at, Some(2));
    }
}
