//! gpt-oss's harmony replies split into reasoning, answer and tool calls by
//! `HarmonySplitter`, token by token, with o200k_harmony (tests/data/tokenizer/o200k-harmony):
//! the expected splits are those of the format (OpenAI's harmony guide; llama.cpp's
//! `common_chat_params_init_gpt_oss` parser reads the same channels).

use flm_tests::tokenizer::xz;
use flm_tokenizer::{HarmonyCall, HarmonySplitter, HarmonyText, Tokenizer};

/// o200k_harmony, loaded once for all the tests of this file.
fn o200k_harmony() -> &'static Tokenizer {
    static TOK: std::sync::OnceLock<Tokenizer> = std::sync::OnceLock::new();
    TOK.get_or_init(|| {
        Tokenizer::from_bytes(&xz("tokenizer/o200k-harmony/tokenizer.json.xz")).unwrap()
    })
}

/// The reply `text` (special tokens spelled out, as the model writes them after the
/// prompt's `<|start|>assistant`) fed id by id: the texts of each step, and the end's.
fn split(tok: &Tokenizer, text: &str) -> (Vec<HarmonyText>, HarmonyText, Vec<HarmonyCall>) {
    let ids = tok.encode_with_specials(text).unwrap();
    let mut splitter = HarmonySplitter::new(tok, tok.harmony_tokens().unwrap());
    let steps = ids.iter().map(|&id| splitter.push(id).unwrap()).collect();
    let (rest, calls) = splitter.finish();
    (steps, rest, calls)
}

/// The whole reasoning and content of `text`.
fn whole(tok: &Tokenizer, text: &str) -> (String, String, Vec<HarmonyCall>) {
    let (steps, rest, calls) = split(tok, text);
    let (mut reasoning, mut content) = (String::new(), String::new());
    for s in steps.iter().chain([&rest]) {
        reasoning += &s.reasoning;
        content += &s.content;
    }
    (reasoning, content, calls)
}

#[test]
fn harmony_tokens_are_found_by_name() {
    let tok = o200k_harmony();
    let h = tok.harmony_tokens().unwrap();
    assert_eq!(
        (
            h.return_,
            h.constrain,
            h.channel,
            h.start,
            h.end,
            h.message,
            h.call
        ),
        (200002, Some(200003), 200005, 200006, 200007, 200008, 200012)
    );
    // gpt-oss's turn ends at <|return|> and <|call|> (and <|endoftext|>), not at <|end|>.
    let mut stop = tok.chat_stop_ids();
    stop.sort_unstable();
    assert_eq!(stop, [199999, 200002, 200012]);
    // A vocabulary without them has none (GPT-2's).
    let gpt2 = flm_tests::tokenizer::gpt2_variant("gpt2").tok;
    assert!(gpt2.harmony_tokens().is_none());
    assert_eq!(gpt2.chat_stop_ids(), [50256]);
}

#[test]
fn analysis_and_final_channels_are_kept_apart() {
    let tok = o200k_harmony();
    let reply = "<|channel|>analysis<|message|>The user says hi. Greet back — politely 🦙.<|end|>\
                 <|start|>assistant<|channel|>final<|message|>Hello! How can I help? 你好<|return|>";
    let (steps, rest, calls) = split(tok, reply);
    let (reasoning, content, _) = whole(tok, reply);
    assert_eq!(reasoning, "The user says hi. Greet back — politely 🦙.");
    assert_eq!(content, "Hello! How can I help? 你好");
    assert!(calls.is_empty() && rest.is_empty());
    // Streaming: no step carries header text or both kinds; the reasoning comes first.
    assert!(steps
        .iter()
        .all(|s| s.reasoning.is_empty() || s.content.is_empty()));
    let first_content = steps.iter().position(|s| !s.content.is_empty()).unwrap();
    let last_reasoning = steps.iter().rposition(|s| !s.reasoning.is_empty()).unwrap();
    assert!(last_reasoning < first_content);
    for s in &steps {
        for word in ["analysis", "final", "assistant", "<|"] {
            assert!(!s.reasoning.contains(word), "{s:?}");
            assert!(!s.content.contains(word), "{s:?}");
        }
    }
}

/// A character cut over several byte tokens is held until whole, in either channel.
#[test]
fn characters_split_over_tokens_stream_whole() {
    let tok = o200k_harmony();
    let rare = "𝔘𓀀";
    let ids = tok.encode(rare, false).unwrap();
    assert!(ids.len() > 2, "{ids:?}");
    let reply = format!(
        "<|channel|>analysis<|message|>{rare}<|end|><|start|>assistant<|channel|>final<|message|>{rare}<|return|>"
    );
    let (steps, _, _) = split(tok, &reply);
    let pieces: Vec<&str> = steps
        .iter()
        .flat_map(|s| [s.reasoning.as_str(), s.content.as_str()])
        .filter(|s| !s.is_empty())
        .collect();
    assert_eq!(pieces, ["𝔘", "𓀀", "𝔘", "𓀀"]);
}

#[test]
fn a_reply_cut_before_its_final_channel_is_all_reasoning() {
    let tok = o200k_harmony();
    let (reasoning, content, calls) =
        whole(tok, "<|channel|>analysis<|message|>Let me think about th");
    assert_eq!(
        (reasoning.as_str(), content.as_str()),
        ("Let me think about th", "")
    );
    assert!(calls.is_empty());
    // Cut inside the next header: nothing of the header shows.
    let (reasoning, content, _) = whole(
        tok,
        "<|channel|>analysis<|message|>Done.<|end|><|start|>assistant<|channel|>fin",
    );
    assert_eq!((reasoning.as_str(), content.as_str()), ("Done.", ""));
}

#[test]
fn text_outside_channels_is_content() {
    let tok = o200k_harmony();
    // A model that writes no channel at all: everything is the answer.
    let (reasoning, content, _) = whole(tok, "Just an answer, no channels.");
    assert_eq!(
        (reasoning.as_str(), content.as_str()),
        ("", "Just an answer, no channels.")
    );
    // gpt-oss sometimes skips the analysis: final straight away.
    let (reasoning, content, _) = whole(tok, "<|channel|>final<|message|>42<|return|>");
    assert_eq!((reasoning.as_str(), content.as_str()), ("", "42"));
    // Several analysis messages in a row, and llama.cpp's stray `commentary` prefix.
    let (reasoning, content, _) = whole(
        tok,
        "<|channel|>analysis<|message|>A.<|end|><|start|>assistant<|channel|>analysis<|message|> B.<|end|>\
         <|start|>assistant<|channel|>commentary<|message|>Checking. <|end|>\
         <|start|>assistant<|channel|>final<|message|>C<|return|>",
    );
    assert_eq!(
        (reasoning.as_str(), content.as_str()),
        ("A. B.", "Checking. C")
    );
}

#[test]
fn tool_calls_are_taken_out_whole() {
    let tok = o200k_harmony();
    // The recipient in the role (as the template writes history) or after the channel.
    for reply in [
        "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant to=functions.get_weather\
         <|channel|>commentary <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>",
        "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary \
         to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>",
        "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant to=functions.get_weather\
         <|channel|>commentary json<|message|>{\"city\": \"Paris\"}<|call|>",
    ] {
        let (reasoning, content, calls) = whole(tok, reply);
        assert_eq!((reasoning.as_str(), content.as_str()), ("Need the weather.", ""), "{reply}");
        assert_eq!(
            calls,
            [HarmonyCall {
                recipient: "functions.get_weather".into(),
                channel: "commentary".into(),
                constrain: "json".into(),
                arguments: "{\"city\": \"Paris\"}".into(),
            }],
            "{reply}"
        );
    }
}

/// The steps of a reply fed id by id join to its whole reasoning and content.
#[test]
fn id_by_id_equals_the_whole() {
    let tok = o200k_harmony();
    let reply = "<|channel|>analysis<|message|>x²+1 — 🦙<|end|><|start|>assistant<|channel|>final<|message|>Done: 𝔘!<|return|>";
    let (steps, rest, _) = split(tok, reply);
    let joined: (String, String) = steps
        .iter()
        .chain([&rest])
        .fold((String::new(), String::new()), |(r, c), s| {
            (r + &s.reasoning, c + &s.content)
        });
    assert_eq!(joined, ("x²+1 — 🦙".to_owned(), "Done: 𝔘!".to_owned()));
}

/// A prompt that ends with a call's header (a forced tool call): the reply is that call's
/// arguments, read as when the model writes the header itself, and the header's ids are
/// the ones gpt-oss writes (`<|channel|>`, `<|constrain|>`, `<|message|>` as single ids).
#[test]
fn a_call_opened_by_the_prompt_is_the_reply() {
    let tok = o200k_harmony();
    let tokens = tok.harmony_tokens().unwrap();
    let header = HarmonyCall::json_header("functions.get_weather");
    let ids = tok.encode_with_specials(&header).unwrap();
    assert_eq!(ids[0], tokens.channel);
    assert!(ids.contains(&tokens.constrain.unwrap()));
    assert_eq!(ids.last(), Some(&tokens.message));
    let reply = "{\"city\": \"Paris\"}<|call|>";
    let mut splitter = HarmonySplitter::in_call(tok, tokens, "functions.get_weather");
    for id in tok.encode_with_specials(reply).unwrap() {
        assert!(splitter.push(id).unwrap().is_empty());
    }
    let (rest, calls) = splitter.finish();
    assert!(rest.is_empty());
    let written = whole(tok, &format!("{header}{reply}")).2;
    assert_eq!(calls, written);
    assert_eq!(calls[0].arguments, "{\"city\": \"Paris\"}");
}
