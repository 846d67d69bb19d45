//! The fuzz target of the HTTP request bodies (issue 36): bytes parsed as the JSON of a chat
//! or completion request, checked and rendered to token ids as the routes do, with the
//! harness and seed corpus (`tests/fuzz/http/`) of `tests/fuzz.rs`. No input may panic.

use flm_tests::fuzz::{corpus, fuzz};
use flm_tokenizer::Tokenizer;

use super::openai::{ChatRequest, CompletionRequest};
use super::{params, prompt};

#[test]
fn request_bodies() {
    let tokenizer =
        Tokenizer::from_file(&flm_tests::data("hf-stories260K/tokenizer.json")).unwrap();
    let findings = std::env::temp_dir().join("flm-fuzz-findings");
    fuzz("http", &corpus("http"), &findings, |body| {
        if let Ok(request) = serde_json::from_slice::<ChatRequest>(body) {
            let _ = params::check(&request.sampling, "m", 0);
            if let Ok(args) = prompt::template_args(request.chat_template_kwargs.as_ref()) {
                let _ = prompt::chat(&tokenizer, &request.messages, None, &args);
            }
        }
        if let Ok(request) = serde_json::from_slice::<CompletionRequest>(body) {
            let _ = params::check(&request.sampling, "m", 0);
            let _ = params::check_completion(&request);
            let _ = prompt::completion(&tokenizer, &request.prompt);
        }
    });
}
