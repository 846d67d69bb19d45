//! From generated ids to the text a client sees: incremental detokenisation (the
//! tokenizer's [`StreamDecoder`]) and OpenAI's `stop` sequences.
//!
//! A stop sequence may arrive split over several tokens, so text that could be the start
//! of one is held back until it either completes the sequence (the reply ends before it,
//! `finish_reason: "stop"`) or can no longer do so (it is released). This is what vLLM's
//! and llama.cpp's servers do; the streamed pieces concatenate to the text of the whole
//! response.

use flm_tokenizer::{StreamDecoder, Tokenizer};

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

/// Ids in, visible text out: a stream decoder followed by [`StopText`].
pub struct Detokenizer<'a> {
    decoder: StreamDecoder<'a>,
    stop: StopText,
}

impl<'a> Detokenizer<'a> {
    /// Decodes with `tokenizer` (`at_start`: only the prefix tokens precede, see
    /// [`Tokenizer::stream_decoder`]), ending at the first of `stops`.
    pub fn new(tokenizer: &'a Tokenizer, at_start: bool, stops: Vec<String>) -> Self {
        Detokenizer {
            decoder: tokenizer.stream_decoder(at_start),
            stop: StopText::new(stops),
        }
    }

    /// Feeds one generated id: the text that can be shown now, and whether a stop sequence
    /// ended the reply. Errors on an id outside the vocabulary.
    pub fn push(&mut self, id: u32) -> flm_tokenizer::Result<(String, bool)> {
        let text = self.decoder.push(id)?;
        Ok(self.stop.push(&text))
    }

    /// The rest of the text once generation has ended (incomplete characters flushed).
    pub fn finish(&mut self) -> String {
        let (mut text, stopped) = self.stop.push(&self.decoder.finish());
        if !stopped {
            text.push_str(&self.stop.finish());
        }
        text
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

    #[test]
    fn multibyte_text_is_cut_on_character_boundaries() {
        let (shown, at) = run(&["é!"], &["café", "?é", "!"]);
        assert_eq!(shown, ["caf", "é?", ""]);
        assert_eq!(at, Some(2));
    }
}
