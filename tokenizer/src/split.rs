//! The pre-tokeniser regexes of byte-level BPE, run in linear time with bounded stack.
//!
//! The patterns of GPT-2, Llama 3, Qwen2, tiktoken and most other families are an
//! alternation whose only look-around is `\s+(?!\S)` (or `\s{n}(?!\S)`, ...), which the
//! `regex` crates lack. Backtracking engines (fancy-regex, Oniguruma) run it by trying
//! the alternatives in order at each position, which on long runs of one character
//! exhausts their stack. Here the alternatives become the patterns of one
//! `regex-automata` meta regex, leftmost-first (the alternation's order of preference,
//! found by finite automata in linear time), with each `\s<quantifier>(?!\S)` written as
//! its body `\s<quantifier>`. When such an alternative wins at a position, its
//! look-ahead is applied afterwards, as tiktoken's Rust core describes the emulation:
//! the body's greedy match stands if it reaches the end of the text (it cannot be
//! followed by whitespace, being maximal, unless its quantifier caps it, which is
//! checked too); otherwise a backtracking engine would give back its last character
//! (whitespace, so the look-ahead then holds) if the quantifier still allows that, and
//! else fail this alternative and try the later ones at the same position, which an
//! anchored search of the later alternatives does here.
//!
//! Outside that subset, the patterns flm knows are run in linear time too:
//!
//! - Those with an equivalent inside the subset ([`EQUIVALENTS`]: possessive quantifiers
//!   that never give anything back, a look-ahead that intersects two classes) run as that
//!   equivalent, whether they come from a GGUF name or a `tokenizer.json`.
//! - Cohere's digit grouping `\d{1,3}(?=(?:\d{3})*\b)` (`tiny_aya`, `cohere2moe`) runs
//!   as a one-pass cutting of the runs of digits (`digit_groups.rs`).
//!
//! Any other pattern (another look-around, a back-reference) is run by fancy-regex, with
//! its backtracking limits: such a pattern can make [`Splitter::for_each_match`] fail on
//! long texts, or take quadratic time. No pattern flm ships or maps a GGUF name to is of
//! that kind (`gpt2.rs` tests each).

use regex_automata::meta::Regex;
use regex_automata::{Anchored, Input};

use crate::digit_groups::DigitGroups;
use crate::gpt2::{BAILING_PATTERN, GRANITE_EMBED_PATTERN};
use crate::{Error, Result};

/// Pre-tokeniser patterns outside the linear-time subset, each with an equivalent inside
/// it: (the pattern as the family's files write it, the equivalent it runs as). The test
/// `rewritten_patterns_equal_their_originals` checks that fancy-regex cuts random texts
/// alike with both.
pub(crate) const EQUIVALENTS: [(&str, &str); 2] = [
    // Its possessive `?+` and `++` as plain `?` and `+`: giving back the optional
    // non-letter cannot let `\p{L}+` match, and `[\r\n]*` matches after any run, so
    // backtracking never takes them back anyway.
    (
        BAILING_PATTERN,
        r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
    ),
    // Its `((?=[\p{L}\p{M}])([^a-z]))` is one character of both classes, written as their
    // intersection.
    (
        GRANITE_EMBED_PATTERN,
        r"[^\r\n\p{L}\p{N}]?[[\p{L}\p{M}]&&[^a-z]]*[[\p{L}\p{M}]&&[^A-Z]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[[\p{L}\p{M}]&&[^a-z]]+[[\p{L}\p{M}]&&[^A-Z]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
];

/// One alternative of the top-level alternation.
#[derive(Debug)]
struct Alternative {
    /// For `\s<quantifier>(?!\S)`: the least number of characters the quantifier allows
    /// (0 for `*`, 1 for `+`, n for `{n}`, `{n,}` and `{n,m}`). `None`: no look-ahead.
    look_ahead_min: Option<usize>,
    /// For a look-ahead alternative: index into [`Automata::later`] of the regex of the
    /// alternatives after it (`None` if it is the last one).
    later: Option<usize>,
}

/// A pattern run by `regex-automata`.
#[derive(Debug)]
struct Automata {
    /// All alternatives as the patterns of one regex, in order.
    all: Regex,
    alternatives: Vec<Alternative>,
    /// For each look-ahead alternative that is not the last: the index of its first later
    /// alternative and the regex of the alternatives from there on.
    later: Vec<(usize, Regex)>,
}

#[derive(Debug)]
enum Engine {
    Automata(Automata),
    Digits(DigitGroups),
    Fancy(Box<fancy_regex::Regex>),
}

/// A compiled pre-tokeniser regex.
#[derive(Debug)]
pub(crate) struct Splitter(Engine);

impl Splitter {
    /// Compiles `pattern` (fancy-regex syntax, as tiktoken's `pat_str` and the `Split`
    /// pre-tokenizer of `tokenizers` write it): on the automata if it is in their subset or
    /// has an equivalent there ([`EQUIVALENTS`]), as the digit grouping if it is that, else
    /// on fancy-regex.
    ///
    /// Errors: [`Error::Invalid`] if the pattern compiles in neither engine.
    pub(crate) fn new(pattern: &str) -> Result<Splitter> {
        let linear = EQUIVALENTS
            .iter()
            .find(|(original, _)| *original == pattern)
            .map_or(pattern, |(_, equivalent)| *equivalent);
        if let Some(automata) = Automata::new(linear) {
            return Ok(Splitter(Engine::Automata(automata)));
        }
        if let Some(digits) = DigitGroups::new(pattern) {
            return Ok(Splitter(Engine::Digits(digits)));
        }
        fancy_regex::Regex::new(pattern)
            .map(|re| Splitter(Engine::Fancy(Box::new(re))))
            .map_err(|e| Error::Invalid(format!("pre-tokenizer pattern {pattern:?}: {e}")))
    }

    /// Whether the pattern runs in linear time (not on fancy-regex).
    #[cfg(test)]
    pub(crate) fn is_linear(&self) -> bool {
        !matches!(self.0, Engine::Fancy(_))
    }

    /// Calls `f` with the start and end (byte offsets) of each match in `text`, left to
    /// right, as fancy-regex's `find_iter` reports them: after a match the search
    /// resumes at its end, after an empty match one character later, and an empty match
    /// right at the end of the previous match is skipped.
    ///
    /// Errors: those of `f`, and [`Error::Encode`] if fancy-regex gives up (the
    /// fallback engine's backtracking limits).
    pub(crate) fn for_each_match(
        &self,
        text: &str,
        mut f: impl FnMut(usize, usize) -> Result<()>,
    ) -> Result<()> {
        match &self.0 {
            Engine::Automata(a) => {
                let mut pos = 0;
                let mut last_end = None;
                while pos <= text.len() {
                    let Some((s, e)) = a.find(text, pos) else {
                        break;
                    };
                    if s == e {
                        pos = next_char(text, e);
                        if last_end == Some(e) {
                            continue;
                        }
                    } else {
                        pos = e;
                    }
                    last_end = Some(e);
                    f(s, e)?;
                }
                Ok(())
            }
            Engine::Digits(digits) => digits.for_each_match(text, f),
            Engine::Fancy(re) => {
                for m in re.find_iter(text) {
                    let m =
                        m.map_err(|e| Error::Encode(format!("pre-tokenising the text: {e}")))?;
                    f(m.start(), m.end())?;
                }
                Ok(())
            }
        }
    }
}

/// The offset after the character at `i` (`i + 1` at the end of `text`).
fn next_char(text: &str, i: usize) -> usize {
    i + text[i..].chars().next().map_or(1, char::len_utf8)
}

impl Automata {
    /// `None` if `pattern` has a look-around other than a final `(?!\S)` on a `\s`
    /// repetition, a possessive quantifier, or does not compile in `regex-automata`
    /// (back-references, ...).
    fn new(pattern: &str) -> Option<Automata> {
        let (backtracking, flags) = special_syntax(pattern)?;
        if !backtracking {
            return Some(Automata {
                all: Regex::new(pattern).ok()?,
                alternatives: vec![Alternative {
                    look_ahead_min: None,
                    later: None,
                }],
                later: Vec::new(),
            });
        }
        if flags {
            return None;
        }
        let mut bodies = Vec::new();
        let mut alternatives = Vec::new();
        for alt in top_level_alternatives(pattern)? {
            let (body, look_ahead_min) = match alt.strip_suffix(r"(?!\S)") {
                Some(body) => (body, Some(whitespace_repetition_min(body)?)),
                None => (alt, None),
            };
            if special_syntax(body)?.0 {
                return None;
            }
            bodies.push(body);
            alternatives.push(Alternative {
                look_ahead_min,
                later: None,
            });
        }
        let all = Regex::new_many(&bodies).ok()?;
        let mut later = Vec::new();
        for i in 0..alternatives.len() {
            if alternatives[i].look_ahead_min.is_some() && i + 1 < alternatives.len() {
                alternatives[i].later = Some(later.len());
                later.push((i + 1, Regex::new_many(&bodies[i + 1..]).ok()?));
            }
        }
        Some(Automata {
            all,
            alternatives,
            later,
        })
    }

    /// The leftmost match at or after `from`, with the alternation's preference.
    ///
    /// A match at `pos` itself is sought first, anchored: it is the leftmost if it exists
    /// (as it does at nearly every position of a text for these patterns, which leave few
    /// gaps), and an anchored search runs the forward automaton alone, where an unanchored
    /// one also runs the reverse automaton to find where the match starts.
    fn find(&self, text: &str, from: usize) -> Option<(usize, usize)> {
        let mut pos = from;
        loop {
            let input = Input::new(text).range(pos..);
            let m = match self.all.search(&input.clone().anchored(Anchored::Yes)) {
                Some(m) => m,
                None => self.all.search(&input)?,
            };
            let start = m.start();
            let (mut first, mut m) = (0, Some(m));
            // Try the alternatives that match at `start`, in order, until one's look-ahead
            // holds or none is left.
            while let Some(found) = m {
                let index = first + found.pattern().as_usize();
                let alt = &self.alternatives[index];
                let Some(min) = alt.look_ahead_min else {
                    return Some((start, found.end()));
                };
                if let Some(end) = look_ahead_end(text, start, found.end(), min) {
                    return Some((start, end));
                }
                m = alt.later.and_then(|l| {
                    let (i, re) = &self.later[l];
                    first = *i;
                    re.search(&Input::new(text).range(start..).anchored(Anchored::Yes))
                });
            }
            // No alternative matches at `start`: look further on.
            if start >= text.len() {
                return None;
            }
            pos = next_char(text, start);
        }
    }
}

/// Where `\s<quantifier>(?!\S)` matches from `start`, given that `\s<quantifier>` matches
/// `start..end` greedily: `end` if the end of the text or whitespace follows, else one
/// character less if that leaves at least `min` characters, else nowhere.
fn look_ahead_end(text: &str, start: usize, end: usize, min: usize) -> Option<usize> {
    if text[end..].chars().next().is_none_or(char::is_whitespace) {
        return Some(end);
    }
    let shorter = end - text[start..end].chars().next_back()?.len_utf8();
    let enough = min == 0 || text[start..shorter].chars().nth(min - 1).is_some();
    enough.then_some(shorter)
}

/// The least repetition count of `\s+`, `\s*`, `\s{n}`, `\s{n,}` or `\s{n,m}` (greedy);
/// `None` for any other `body`.
fn whitespace_repetition_min(body: &str) -> Option<usize> {
    let quantifier = body.strip_prefix(r"\s")?;
    match quantifier {
        "+" => Some(1),
        "*" => Some(0),
        _ => {
            let counts = quantifier.strip_prefix('{')?.strip_suffix('}')?;
            let (min, max) = counts.split_once(',').unwrap_or((counts, counts));
            let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
            (digits(min) && (max.is_empty() || digits(max))).then(|| min.parse().ok())?
        }
    }
}

/// The alternatives of `pattern`'s top-level alternation (`pattern` itself if it has
/// none); `None` if its brackets do not balance.
fn top_level_alternatives(pattern: &str) -> Option<Vec<&str>> {
    let mut alternatives = Vec::new();
    let mut start = 0;
    scan(pattern, |i, c, depth| {
        if c == '|' && depth == 0 {
            alternatives.push(&pattern[start..i]);
            start = i + 1;
        }
    })?;
    alternatives.push(&pattern[start..]);
    Some(alternatives)
}

/// What of `pattern` the cutting into alternatives must know: (it opens a look-around or
/// atomic group or has a possessive quantifier, which the `regex` syntax lacks or reads
/// otherwise; it opens a group that sets flags for the rest of the pattern, which
/// cutting it would lose). `None` if its brackets do not balance.
fn special_syntax(pattern: &str) -> Option<(bool, bool)> {
    let (mut backtracking, mut flags) = (false, false);
    let mut prev = None;
    scan(pattern, |i, c, _| {
        // `+` right after a quantifier: possessive (`a++`, `a?+`, `a{2}+`).
        backtracking |= c == '+' && prev.is_some_and(|(j, q)| j + 1 == i && "?*+}".contains(q));
        prev = Some((i, c));
        let Some(rest) = pattern[i..].strip_prefix("(?").filter(|_| c == '(') else {
            return;
        };
        backtracking |= ["=", "!", "<=", "<!", ">"]
            .iter()
            .any(|p| rest.starts_with(p));
        flags |= rest
            .trim_start_matches(|c: char| c.is_ascii_alphabetic() || c == '-')
            .starts_with(')');
    })?;
    Some((backtracking, flags))
}

/// Calls `f(offset, char, group depth)` for each character of `pattern` outside
/// character classes and escapes (a class may nest classes and start with a literal
/// `]`); `None` if a class or group is left open or closes unopened.
fn scan(pattern: &str, mut f: impl FnMut(usize, char, usize)) -> Option<()> {
    let mut chars = pattern.char_indices().peekable();
    let (mut groups, mut classes) = (0usize, 0usize);
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => {
                // `\p{..}`, `\x{..}` and the like whole.
                if let (_, 'p' | 'P' | 'x' | 'u') = chars.next()? {
                    if chars.next_if(|&(_, c)| c == '{').is_some() {
                        chars.find(|&(_, c)| c == '}')?;
                    }
                }
            }
            '[' => {
                if classes == 0 {
                    chars.next_if(|&(_, c)| c == '^');
                    chars.next_if(|&(_, c)| c == ']');
                }
                classes += 1;
            }
            ']' if classes > 0 => classes -= 1,
            _ if classes > 0 => {}
            '(' => {
                f(i, c, groups);
                groups += 1;
            }
            ')' => {
                groups = groups.checked_sub(1)?;
                f(i, c, groups);
            }
            _ => f(i, c, groups),
        }
    }
    (groups == 0 && classes == 0).then_some(())
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::gpt2::{
        gguf_pre_tokenizer, GPT2_PATTERN, LLAMA3_PATTERN, QWEN2_PATTERN, TEKKEN_PATTERN,
    };

    fn matches(splitter: &Splitter, text: &str) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        splitter
            .for_each_match(text, |s, e| {
                out.push((s, e));
                Ok(())
            })
            .unwrap();
        out
    }

    fn fancy_matches(re: &fancy_regex::Regex, text: &str) -> Vec<(usize, usize)> {
        re.find_iter(text)
            .map(|m| m.map(|m| (m.start(), m.end())).unwrap())
            .collect()
    }

    /// Fewer than `max_runs` runs of characters of `alphabet`, each repeated a length drawn
    /// from `long` with probability `p_long`, else once.
    fn random_runs(
        rng: &mut rand::rngs::StdRng,
        alphabet: &[char],
        max_runs: usize,
        p_long: f64,
        long: std::ops::Range<usize>,
    ) -> String {
        let mut text = String::new();
        for _ in 0..rng.random_range(0..max_runs) {
            let c = alphabet[rng.random_range(0..alphabet.len())];
            let run = if rng.random_bool(p_long) {
                rng.random_range(long.clone())
            } else {
                1
            };
            text.extend(std::iter::repeat_n(c, run));
        }
        text
    }

    /// Random texts over characters each pattern treats differently (whitespace of every
    /// kind, letters of each case and script, marks, digits of several scripts,
    /// apostrophes, punctuation), often in runs, plus adversarial fixed ones.
    fn texts() -> Vec<String> {
        let alphabet: Vec<char> = " \t\n\r\u{A0}\u{85}\u{2028}\u{3000}\u{1680}aZsStTdlLmvreé\
            ßΣ中ひカ가\u{301}1٣½'’!./_$<|😀\u{0}"
            .chars()
            .collect();
        let mut rng = rand::rngs::StdRng::seed_from_u64(48);
        let mut out: Vec<String> = [
            "",
            " ",
            "  ",
            "a  b",
            "a \n b",
            "  \n\n  x",
            "'s 'S 'll 're'VE",
            "1234567 12345678x 123,456",
            "\u{A0}\u{A0}a",
            "   ",
            "x   ",
            "\t\ta",
            "don't stop 'em",
            "IMGIMGABCDZ <sentinel:12>",
            "deepseek 中文 テスト ＡＢＣ",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        out.extend((0..400).map(|_| random_runs(&mut rng, &alphabet, 14, 0.3, 2..8)));
        out
    }

    fn check(pattern: &str, reference: &str, texts: &[String]) {
        let splitter = Splitter::new(pattern).unwrap();
        let reference = fancy_regex::Regex::new(reference).unwrap();
        for text in texts {
            assert_eq!(
                matches(&splitter, text),
                fancy_matches(&reference, text),
                "{pattern:?} on {text:?}"
            );
        }
    }

    #[test]
    fn matches_equal_fancy_regexs_on_every_shipped_pattern() {
        let texts = texts();
        let mut patterns = vec![GPT2_PATTERN, LLAMA3_PATTERN, QWEN2_PATTERN, TEKKEN_PATTERN];
        for name in [
            "default",
            "starcoder",
            "gpt-4o",
            "deepseek-coder",
            "deepseek-v3",
        ]
        .into_iter()
        .chain([
            "deepseek-llm",
            "spark2_5",
            "youtu",
            "minicpm5",
            "jais-2",
            "qwen35",
        ])
        .chain([
            "exaone-moe",
            "tiny_aya",
            "ufakzeka",
            "laguna",
            "falcon",
            "bloom",
        ])
        .chain(["chameleon", "seed-coder"])
        {
            patterns.extend(gguf_pre_tokenizer(name).unwrap().regexes);
        }
        for pattern in patterns {
            check(pattern, pattern, &texts);
        }
    }

    #[test]
    fn rewritten_patterns_equal_their_originals() {
        let texts = texts();
        for (original, equivalent) in EQUIVALENTS {
            assert!(
                Splitter::new(equivalent).unwrap().is_linear(),
                "{equivalent}"
            );
            assert!(Splitter::new(original).unwrap().is_linear(), "{original}");
            // `Splitter::new(original)` runs the equivalent; fancy-regex the original.
            check(original, original, &texts);
        }
    }

    /// Digits in runs of every length, with each kind of neighbour: word characters
    /// (letters, marks, `_`, digits of other scripts), spaces, punctuation, the ends.
    #[test]
    fn digit_grouping_equals_fancy_regexs() {
        let alphabet: Vec<char> = "0123٣٤ a_\u{301}.,-\n½é".chars().collect();
        let mut rng = rand::rngs::StdRng::seed_from_u64(48);
        let mut texts = texts();
        texts.extend((0..1000).map(|_| random_runs(&mut rng, &alphabet, 6, 0.5, 1..14)));
        for pattern in [r"\d{1,3}(?=(?:\d{3})*\b)", r"\d{1,2}(?=(?:\d{2})*\b)"] {
            assert!(Splitter::new(pattern).unwrap().is_linear(), "{pattern}");
            check(pattern, pattern, &texts);
        }
    }

    #[test]
    fn look_ahead_quantifiers_and_fallbacks() {
        let texts = texts();
        // Each quantifier form, with and without later alternatives, and empty matches.
        for pattern in [
            r"\s+(?!\S)",
            r"a|\s*(?!\S)|\s",
            r"\s{2}(?!\S)|\s{1,3}(?!\S)|x",
            r"\s{2,}(?!\S)|\S+",
            r"b*",
            r"(?i)s|\S",
            r"\p{L}+|[+]+|\++",
        ] {
            assert!(Splitter::new(pattern).unwrap().is_linear(), "{pattern}");
            check(pattern, pattern, &texts);
        }
        // Other look-arounds, possessive quantifiers and back-references need fancy-regex.
        for pattern in [
            r"a(?=b)",
            r"(?<=a)b",
            r"\s+(?!x)",
            r"a++",
            r"\p{L}?+",
            r"a{2}+",
            r"(a)\1",
            r"x(?!\S)",
            r"(?i)a|\s+(?!\S)",
        ] {
            assert!(!Splitter::new(pattern).unwrap().is_linear(), "{pattern}");
        }
        assert!(Splitter::new(r"(a").is_err());
    }

    #[test]
    fn alternatives_split_at_the_top_level_only() {
        assert_eq!(
            top_level_alternatives(r"a|(b|c)|[|\]]|\||[]|]").unwrap(),
            ["a", "(b|c)", r"[|\]]", r"\|", "[]|]"]
        );
        assert_eq!(top_level_alternatives("(a"), None);
        assert_eq!(top_level_alternatives("[a"), None);
        assert_eq!(whitespace_repetition_min(r"\s{3,}"), Some(3));
        assert_eq!(whitespace_repetition_min(r"\s{,3}"), None);
        assert_eq!(whitespace_repetition_min(r"\S+"), None);
    }
}
