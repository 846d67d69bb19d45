//! The Llama 2 tokenizer, from its SentencePiece `tokenizer.model` and from llama2.c's
//! `tokenizer.bin` export, against golden ids from llama.cpp and llama2.c's test.c
//! (both produced by sentencepiece / HF, not by this crate).

use flm_tests::data;
use flm_tests::tokenizer::{llama2_c_cases, llama_cpp_cases, load, stream};
use flm_tokenizer::{Error, Tokenizer};

const FILES: [&str; 2] = ["tokenizer/tokenizer.model", "tokenizer/tokenizer.bin"];

/// The tokenizer of each file, with the file's path.
fn tokenizers() -> impl Iterator<Item = (&'static str, Tokenizer)> {
    FILES.into_iter().map(|file| (file, load(file)))
}

#[test]
fn llama_cpp_spm_cases() {
    // All 46 agree for both files: the .bin carries the same pieces and scores, and flm
    // encodes both with the SentencePiece algorithm.
    for (file, tok) in tokenizers() {
        for (i, (text, expected)) in llama_cpp_cases().iter().enumerate() {
            let got = tok.encode(text, false).unwrap();
            assert_eq!(&got, expected, "{file} case {i}: {text:?}");
        }
    }
}

#[test]
fn llama2_c_test_cases_with_bos() {
    for (file, tok) in tokenizers() {
        for (text, expected) in llama2_c_cases() {
            assert_eq!(
                tok.encode(&text, true).unwrap(),
                expected,
                "{file}: {text:?}"
            );
        }
    }
}

#[test]
fn golden_ids_decode_to_their_text() {
    for (file, tok) in tokenizers() {
        for (text, ids) in llama_cpp_cases() {
            assert_eq!(tok.decode(&ids).unwrap(), text, "{file}");
            assert_eq!(stream(&tok, &ids, true).concat(), text, "{file} streamed");
        }
        for (text, ids) in llama2_c_cases() {
            assert_eq!(tok.decode(&ids).unwrap(), text, "{file}");
            assert_eq!(
                stream(&tok, &ids[1..], true).concat(),
                text,
                "{file} streamed"
            );
        }
    }
}

#[test]
fn round_trip() {
    for (file, tok) in tokenizers() {
        let texts = llama_cpp_cases().into_iter().chain(llama2_c_cases());
        for (text, _) in texts {
            let ids = tok.encode(&text, false).unwrap();
            assert_eq!(tok.decode(&ids).unwrap(), text, "{file}");
        }
    }
}

#[test]
fn model_and_bin_have_the_same_vocabulary() {
    let (model, bin) = (load(FILES[0]), load(FILES[1]));
    assert_eq!(model.vocab_size(), 32000);
    assert_eq!(bin.vocab_size(), 32000);
    for id in 0..32000 {
        assert_eq!(model.piece(id), bin.piece(id), "id {id}");
    }
    for tok in [&model, &bin] {
        assert_eq!(tok.bos_id(), Some(1));
        assert_eq!(tok.eos_id(), Some(2));
        assert_eq!(tok.piece(0), Some(&b"<unk>"[..]));
        assert_eq!(tok.piece(1), Some(&b"<s>"[..]));
        assert_eq!(tok.piece(13), Some(&b"<0x0A>"[..]));
        assert_eq!(tok.piece(29871), Some("\u{2581}".as_bytes()));
        assert_eq!(tok.piece(32000), None);
    }
}

#[test]
fn streamed_emoji_waits_for_its_last_byte() {
    // llama.cpp case 18: " this is 🦙.cpp"; 🦙 is the byte pieces F0 9F A6 99.
    let tok = load(FILES[0]);
    let ids = [29871, 445, 338, 29871, 243, 162, 169, 156, 29889, 8223];
    let parts = stream(&tok, &ids, true);
    assert_eq!(
        parts,
        ["", " this", " is", " ", "", "", "", "🦙", ".", "cpp", ""]
    );
}

#[test]
fn invalid_bytes_become_replacement_characters() {
    let tok = load(FILES[0]);
    // <0xE2><0x96> then "A" (<0x41>): sentencepiece 0.2.3 decodes this to "\u{fffd}\u{fffd}A".
    assert_eq!(tok.decode(&[229, 153, 68]).unwrap(), "\u{fffd}\u{fffd}A");
    // An incomplete character at the end is flushed by finish(), one U+FFFD per byte.
    assert_eq!(
        stream(&tok, &[229, 153], true),
        ["", "", "\u{fffd}\u{fffd}"]
    );
    // A piece after it flushes it too.
    assert_eq!(
        stream(&tok, &[229, 22172], true),
        ["", "\u{fffd} hello", ""]
    );
}

#[test]
fn dummy_prefix_space() {
    let tok = load(FILES[0]);
    // "▁hello" (22172): the first piece loses its space unless ids came before.
    assert_eq!(tok.decode(&[1, 22172]).unwrap(), "hello");
    assert_eq!(stream(&tok, &[22172], false).concat(), " hello");
    // Only the first space-prefixed piece: "▁" "▁" "▁hello" is two spaces then hello.
    assert_eq!(tok.decode(&[29871, 29871, 22172]).unwrap(), "  hello");
    // Control and unknown pieces.
    assert_eq!(tok.decode(&[1, 2]).unwrap(), "");
    assert_eq!(tok.decode(&[0]).unwrap(), " \u{2047} ");
}

#[test]
fn id_out_of_range() {
    let tok = load(FILES[0]);
    let err = tok.decode(&[1, 70000]).unwrap_err();
    assert!(matches!(
        err,
        Error::IdOutOfRange {
            id: 70000,
            vocab_size: 32000
        }
    ));
    assert_eq!(
        err.to_string(),
        "token id 70000 out of range for vocabulary of 32000"
    );
    assert!(tok.stream_decoder(true).push(32000).is_err());
}

#[test]
fn long_text_is_fast_and_exact() {
    // O(n log n): 2 MB of text would take hours with a quadratic merge loop.
    let tok = load(FILES[0]);
    let cases = llama_cpp_cases();
    let mut text = String::new();
    while text.len() < 2_000_000 {
        for (t, _) in &cases {
            text.push_str(t);
        }
    }
    let ids = tok.encode(&text, false).unwrap();
    assert_eq!(tok.decode(&ids).unwrap(), text);
    // A single run of one character is the worst case for the merge queue.
    let run = "a".repeat(1_000_000);
    let ids = tok.encode(&run, false).unwrap();
    assert_eq!(tok.decode(&ids).unwrap(), run);
}

#[test]
fn from_bytes_matches_from_file() {
    let bytes = std::fs::read(data(FILES[1])).unwrap();
    let tok = Tokenizer::from_bytes(&bytes).unwrap();
    assert_eq!(tok.encode("Hello world", false).unwrap(), [15043, 3186]);
}
