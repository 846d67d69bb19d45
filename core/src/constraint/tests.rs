//! The constraint's tests: languages, masks, the fit to a vocabulary, the budgets.

use std::time::Instant;

use super::*;

/// `{"a":` then 1 to 3 digits, then `}`, or `null`.
fn pattern() -> Pattern {
    Pattern::Alt(vec![
        Pattern::Seq(vec![
            Pattern::literal("{\"a\":"),
            Pattern::repeat(Pattern::Class(vec![('0', '9')]), 1, 3),
            Pattern::literal("}"),
        ]),
        Pattern::literal("null"),
    ])
}

fn vocab(texts: &[&[u8]]) -> Arc<Vocabulary> {
    let tokens: Vec<_> = texts
        .iter()
        .map(|t| (!t.is_empty()).then(|| t.to_vec()))
        .collect();
    Arc::new(Vocabulary::new(&tokens))
}

/// A token for each byte.
fn bytes() -> Arc<Vocabulary> {
    let bytes: Vec<Vec<u8>> = (0..=255).map(|b| vec![b]).collect();
    vocab(&bytes.iter().map(Vec::as_slice).collect::<Vec<_>>())
}

/// Generous for a debug build on a loaded machine.
const TIME: Duration = Duration::from_secs(60);

/// `pattern` compiled over `vocab`.
fn compile_for(pattern: &Pattern, vocab: &Arc<Vocabulary>) -> Result<Arc<Grammar>> {
    Grammar::new(pattern, Arc::clone(vocab), TIME).map(Arc::new)
}

/// `pattern` compiled over the bytes.
fn compile(pattern: &Pattern) -> Result<Grammar> {
    Grammar::new(pattern, bytes(), TIME)
}

/// The state after `text`, if it stays in the language, and whether it is a whole word.
fn run(g: &Grammar, text: &str) -> Option<bool> {
    g.run(START, text.as_bytes()).map(|s| g.dfa.accepting(s))
}

#[test]
fn words_and_prefixes_of_the_language() {
    let g = compile(&pattern()).unwrap();
    for word in ["{\"a\":1}", "{\"a\":123}", "null"] {
        assert_eq!(run(&g, word), Some(true), "{word}");
    }
    for prefix in ["{\"a\":12", "nu", ""] {
        assert_eq!(run(&g, prefix), Some(false), "{prefix}");
    }
    for outside in ["{\"a\":}", "{\"a\":1234}", "nil", "null "] {
        assert_eq!(run(&g, outside), None, "{outside}");
    }
    assert!(compile(&Pattern::repeat(Pattern::literal("x"), 2, 1)).is_err());
}

#[test]
fn the_mask_keeps_the_tokens_that_stay_in_the_language() {
    // Token 5 stands for EOS (no bytes, a stop token); token 6 has no bytes.
    let texts: [&[u8]; 7] = [b"{\"a\":", b"1", b"12}", b"null", b"}", b"", b""];
    let g = compile_for(&pattern(), &vocab(&texts)).unwrap();
    let mut c = Constraint::new(Arc::clone(&g));
    let mut logits = [0.0; 7];
    assert_eq!(c.mask(&mut logits, &[5]), 2);
    assert_eq!(
        logits.map(f32::is_finite),
        [true, false, false, true, false, false, false]
    );
    c.advance(0).unwrap();
    assert!(c.advance(4).is_err(), "no digit yet");
    c.advance(1).unwrap();
    let mut logits = [0.0; 7];
    assert_eq!(c.mask(&mut logits, &[5]), 3, "{logits:?}");
    assert!([1, 2, 4].iter().all(|&i| logits[i].is_finite()));
    c.advance(2).unwrap();
    assert!(c.accepting() && c.finished());
    let mut logits = [0.0; 7];
    assert_eq!(c.mask(&mut logits, &[5]), 1);
    assert!(logits[5].is_finite());
    let mut c = Constraint::new(g);
    c.advance(3).unwrap();
    assert!(c.finished());
}

#[test]
fn a_character_spelled_by_byte_tokens_is_allowed() {
    // "ÿ" is C3 BF in UTF-8: a byte-level vocabulary spells it with two tokens.
    let words = vocab(&[b"\xc3", b"\xbf", b"y", "ÿ".as_bytes()]);
    let mut c = Constraint::new(compile_for(&Pattern::literal("ÿ"), &words).unwrap());
    let mut logits = [0.0; 4];
    assert_eq!(c.mask(&mut logits, &[]), 2);
    assert_eq!(logits.map(f32::is_finite), [true, false, false, true]);
    c.advance(0).unwrap();
    assert_eq!(c.mask(&mut [0.0; 4], &[]), 1);
    c.advance(1).unwrap();
    assert!(c.finished());
}

#[test]
fn nested_repetitions_compile_as_one() {
    // (.{0,64}){0,64} is .{0,4096}; ((a|b){0,64}){0,64}c likewise.
    let any = Pattern::Class(vec![('\0', char::MAX)]);
    let g = compile(&Pattern::repeat(Pattern::repeat(any, 0, 64), 0, 64)).unwrap();
    assert_eq!(run(&g, &"é".repeat(4096)), Some(true));
    assert_eq!(run(&g, &"é".repeat(4097)), None);
    let ab = Pattern::Class(vec![('a', 'b')]);
    let p = Pattern::Seq(vec![
        Pattern::repeat(Pattern::repeat(ab, 0, 64), 0, 64),
        Pattern::literal("c"),
    ]);
    let g = compile(&p).unwrap();
    assert_eq!(run(&g, &format!("{}c", "ab".repeat(2048))), Some(true));
    // x{2,3}{2}: 4, 5 or 6 x's; x{3}{1,2}: 3 or 6, not 4.
    let g = compile(&Pattern::repeat(
        Pattern::repeat(Pattern::literal("x"), 3, 3),
        1,
        2,
    ))
    .unwrap();
    assert_eq!(run(&g, "xxxx"), Some(false));
    assert_eq!(run(&g, "xxxxxx"), Some(true));
    let g = compile(&Pattern::repeat(
        Pattern::repeat(Pattern::literal("x"), 2, 3),
        2,
        2,
    ))
    .unwrap();
    assert_eq!(run(&g, "xxxxx"), Some(true));
    assert_eq!(run(&g, "xxx"), Some(false));
}

#[test]
fn patterns_over_the_budget_are_refused_with_the_limit() {
    let letter = Pattern::Class(vec![('A', 'Z'), ('a', 'z'), ('À', 'ɏ'), ('Ա', 'և')]);
    let e = compile(&Pattern::repeat(letter, 200_000, 200_000)).unwrap_err();
    assert!(e.to_string().contains("limit"), "{e}");
    let many = Pattern::Alt(vec![Pattern::literal("x"); MAX_PATTERN_SIZE]);
    let e = compile(&many).unwrap_err();
    assert!(e.to_string().contains(&MAX_PATTERN_SIZE.to_string()), "{e}");
    let nothing = Pattern::Seq(vec![Pattern::literal("a"), Pattern::Class(Vec::new())]);
    assert!(compile(&nothing).is_err());
    let optional = Pattern::Alt(vec![Pattern::literal("a"), Pattern::Class(Vec::new())]);
    assert_eq!(run(&compile(&optional).unwrap(), "a"), Some(true));
}

/// The tokens `c` allows next, by their texts in `texts`.
fn allowed(c: &Constraint, texts: &[&[u8]]) -> Vec<String> {
    let mut logits = vec![0.0; texts.len()];
    c.mask(&mut logits, &[]);
    (0..texts.len())
        .filter(|&i| logits[i].is_finite())
        .map(|i| String::from_utf8_lossy(texts[i]).into_owned())
        .collect()
}

#[test]
fn a_slow_compilation_stops_at_its_time_limit() {
    // Millions of states within the size limits: seconds in a release build.
    let word = Pattern::Class(vec![('0', '9'), ('A', 'Z'), ('a', 'z'), ('À', 'ɏ')]);
    let slow = Pattern::repeat(
        Pattern::Seq(vec![
            Pattern::repeat(word, 0, 8),
            Pattern::Class(vec![('a', 'z')]),
        ]),
        0,
        40,
    );
    let start = Instant::now();
    let e = Grammar::new(&slow, bytes(), Duration::from_millis(100)).unwrap_err();
    assert!(e.to_string().contains("time limit of 0.1 s"), "{e}");
    // The limit, and the NFA compiled before the clock is read, in a debug build.
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn a_language_the_vocabulary_cannot_write_is_refused() {
    // No token holds C3 BF (ÿ) or its bytes.
    let texts: [&[u8]; 3] = [b"a", b"\xc3", "é".as_bytes()];
    let e = compile_for(&Pattern::literal("ÿ"), &vocab(&texts)).unwrap_err();
    assert!(e.to_string().contains("cannot write"), "{e}");
    let e = compile_for(&Pattern::literal("b"), &vocab(&texts)).unwrap_err();
    assert!(e.to_string().contains("cannot write"), "{e}");
}

#[test]
fn a_branch_the_vocabulary_cannot_finish_is_never_taken() {
    // `a` then ÿ cannot be written (no BF byte): only `b` may start.
    let texts: [&[u8]; 4] = [b"a", b"b", b"\xc3", "é".as_bytes()];
    let p = Pattern::Alt(vec![Pattern::literal("aÿ"), Pattern::literal("b")]);
    let c = Constraint::new(compile_for(&p, &vocab(&texts)).unwrap());
    assert_eq!(allowed(&c, &texts), ["b"]);
    // Without byte tokens: the tokens `ab` and `cd` write `abcd`, never `abx`.
    let texts: [&[u8]; 3] = [b"ab", b"cd", b"x"];
    let p = Pattern::Alt(vec![Pattern::literal("abcd"), Pattern::literal("abx")]);
    let mut c = Constraint::new(compile_for(&p, &vocab(&texts)).unwrap());
    assert_eq!(allowed(&c, &texts), ["ab"]);
    c.advance(0).unwrap();
    assert_eq!(allowed(&c, &texts), ["cd", "x"]);
}

#[test]
fn states_found_dead_ends_late_are_avoided_too() {
    // The start first counts on `x`, whose only way on, `y`, leads where no `z` exists:
    // `x` is given up and `~` remains.
    let texts: [&[u8]; 3] = [b"x", b"y", b"~"];
    let p = Pattern::Alt(vec![Pattern::literal("xyz"), Pattern::literal("~")]);
    let mut c = Constraint::new(compile_for(&p, &vocab(&texts)).unwrap());
    assert_eq!(allowed(&c, &texts), ["~"]);
    assert!(c.advance(0).is_err());
    c.advance(2).unwrap();
    assert!(c.finished());
}

#[test]
fn a_word_no_token_extends_is_finished() {
    // `a` is a whole word; `ab` would extend it, but no token writes `b`.
    let texts: [&[u8]; 2] = [b"a", b"c"];
    let p = Pattern::Alt(vec![Pattern::literal("a"), Pattern::literal("ab")]);
    let mut c = Constraint::new(compile_for(&p, &vocab(&texts)).unwrap());
    assert!(!c.finished());
    c.advance(0).unwrap();
    assert!(c.accepting() && c.finished());
    // The empty language's one word: finished at the start.
    assert!(Constraint::new(Arc::new(compile(&Pattern::literal("")).unwrap())).finished());
}

/// Whether some sequence of `texts` leads from `state` to a whole word of `g` (a grammar
/// over every byte), by a search of the sequences that stay in the language.
fn writes_a_word(g: &Grammar, state: u32, texts: &[&[u8]]) -> bool {
    g.dfa.accepting(state)
        || texts.iter().any(|t| {
            g.run(state, t)
                .is_some_and(|next| writes_a_word(g, next, texts))
        })
}

/// A small generator of random numbers (xorshift64).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

#[test]
fn over_random_vocabularies_every_reachable_state_has_a_token() {
    // Languages and vocabularies over a, b, ÿ (C3 BF) and é (C3 A9), with some of their
    // bytes missing: whatever tokens a reply takes, it either has a token to continue or
    // is a whole word; and a language refused has no word the tokens write (a search
    // over every sequence of tokens says so).
    let pieces: [&[u8]; 9] = [
        b"a",
        b"b",
        b"\xc3",
        b"\xbf",
        b"\xa9",
        b"ab",
        "ÿ".as_bytes(),
        "é".as_bytes(),
        b"ba",
    ];
    let atoms = ["a", "b", "ÿ", "é"];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..300 {
        let texts: Vec<&[u8]> = pieces
            .iter()
            .copied()
            .filter(|_| rng.below(2) == 0)
            .collect();
        let words: Vec<Pattern> = (0..1 + rng.below(3))
            .map(|_| {
                let items = (0..1 + rng.below(3))
                    .map(|_| {
                        Pattern::repeat(
                            Pattern::literal(atoms[rng.below(4)]),
                            rng.below(2),
                            1 + rng.below(2),
                        )
                    })
                    .collect();
                Pattern::Seq(items)
            })
            .collect();
        let p = Pattern::Alt(words);
        let g = match compile_for(&p, &vocab(&texts)) {
            Ok(g) => g,
            Err(e) => {
                assert!(e.to_string().contains("cannot write"), "{e}");
                let full = compile(&p).unwrap();
                assert!(!writes_a_word(&full, START, &texts), "{p:?} over {texts:?}");
                continue;
            }
        };
        for _ in 0..8 {
            let mut c = Constraint::new(Arc::clone(&g));
            for _ in 0..16 {
                let mut logits = vec![0.0; texts.len()];
                let count = c.mask(&mut logits, &[]);
                if count == 0 {
                    assert!(c.accepting(), "{p:?} over {texts:?}");
                    break;
                }
                let next = (0..texts.len())
                    .filter(|&i| logits[i].is_finite())
                    .nth(rng.below(count))
                    .unwrap();
                c.advance(next as u32).unwrap();
            }
        }
    }
}
