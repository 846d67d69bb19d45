//! The digit grouping of Cohere's tokenizers (`tiny_aya`, `cohere2moe`):
//! `\d{1,3}(?=(?:\d{3})*\b)` cuts a number into groups of three digits from its end, as
//! thousands are written ("1234567" is "1", "234", "567"). Its look-ahead is outside what
//! `regex-automata` runs, and a backtracking engine checks it by reading to the end of the
//! run of digits from every group, which is quadratic in the run's length (and gives up on
//! long runs). Here the same matches are found in one pass.
//!
//! Why they are the same, for `\d{1,k}(?=(?:\d{k})*\b)` with `\d` and `\b` Unicode's (as
//! fancy-regex runs them, `\b` by regex-automata's [`LookMatcher`]): a digit is a word
//! character, so inside a run of digits there is no word boundary, and the look-ahead holds
//! after a digit exactly when a multiple of `k` digits follow to the end of the run and no
//! word character follows the run. A run that a word character follows therefore has no
//! match anywhere in it; in another run of `n` digits the search from its first digit
//! matches the greedy `\d{1,k}` at the longest length that leaves a multiple of `k`
//! (`n mod k`, or `k` if that is 0), and each later search `k` more digits, to the end of
//! the run. The runs are found by the automaton of `\d+` (maximal, leftmost first), so a
//! search resumed after a run's last group can only start in a later run.

use regex_automata::meta::Regex;
use regex_automata::util::look::LookMatcher;

use crate::{Error, Result};

/// A compiled `\d{1,k}(?=(?:\d{k})*\b)`.
#[derive(Debug)]
pub(crate) struct DigitGroups {
    /// `\d+`.
    runs: Regex,
    /// For the word boundary after a run.
    look: LookMatcher,
    /// `k`, at least 1.
    size: usize,
}

impl DigitGroups {
    /// The grouping if `pattern` is `\d{1,k}(?=(?:\d{k})*\b)` for some `k` from 1 to 99,
    /// written exactly so; `None` for any other pattern.
    pub(crate) fn new(pattern: &str) -> Option<DigitGroups> {
        let (k, rest) = pattern.strip_prefix(r"\d{1,")?.split_once('}')?;
        let size: usize = k.parse().ok().filter(|k| (1..100).contains(k))?;
        if k.starts_with('0') || rest != format!(r"(?=(?:\d{{{size}}})*\b)") {
            return None;
        }
        let look = LookMatcher::new();
        // Fails only where regex-automata lacks its Unicode word tables (a feature that
        // its default features include).
        look.is_word_unicode(b"", 0).ok()?;
        Some(DigitGroups {
            runs: Regex::new(r"\d+").ok()?,
            look,
            size,
        })
    }

    /// Calls `f` with the start and end (byte offsets) of each group in `text`, left to
    /// right, as fancy-regex's `find_iter` reports the pattern's matches (see the module
    /// docs).
    ///
    /// Errors: those of `f`.
    pub(crate) fn for_each_match(
        &self,
        text: &str,
        mut f: impl FnMut(usize, usize) -> Result<()>,
    ) -> Result<()> {
        for run in self.runs.find_iter(text) {
            let (start, end) = (run.start(), run.end());
            let boundary = self
                .look
                .is_word_unicode(text.as_bytes(), end)
                .map_err(|e| Error::Encode(format!("pre-tokenising the text: {e}")))?;
            if !boundary {
                continue;
            }
            let n = text[start..end].chars().count();
            // Characters left in the current group; the first has n mod k (or k).
            let mut left = (n - 1) % self.size + 1;
            let mut group = start;
            for (i, _) in text[start..end].char_indices() {
                if left == 0 {
                    f(group, start + i)?;
                    group = start + i;
                    left = self.size;
                }
                left -= 1;
            }
            f(group, end)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn groups(text: &str) -> Vec<&str> {
        let mut out = Vec::new();
        DigitGroups::new(r"\d{1,3}(?=(?:\d{3})*\b)")
            .unwrap()
            .for_each_match(text, |s, e| {
                out.push(&text[s..e]);
                Ok(())
            })
            .unwrap();
        out
    }

    #[test]
    fn numbers_are_cut_in_thousands_from_their_end() {
        assert_eq!(groups("1234567 89"), ["1", "234", "567", "89"]);
        assert_eq!(groups("123456,7"), ["123", "456", "7"]);
        // A word character after the run: no group in it.
        assert_eq!(groups("1234a 12_ 5\u{301} 6"), ["6"]);
        assert_eq!(groups("x12"), ["12"]);
        assert_eq!(groups("٣٣٣٣ 1"), ["٣", "٣٣٣", "1"]);
        assert!(groups("").is_empty());
    }

    #[test]
    fn only_the_exact_pattern_is_recognised() {
        assert_eq!(
            DigitGroups::new(r"\d{1,4}(?=(?:\d{4})*\b)").map(|g| g.size),
            Some(4)
        );
        for other in [
            r"\d{1,3}(?=(?:\d{4})*\b)",
            r"\d{1,3}(?=(?:\d{3})+\b)",
            r"\d{1,3}(?=(?:\d{3})*)",
            r"\d{1,03}(?=(?:\d{03})*\b)",
            r"\d{1,0}(?=(?:\d{0})*\b)",
            r"\d{1,3}",
        ] {
            assert!(DigitGroups::new(other).is_none(), "{other}");
        }
    }
}
