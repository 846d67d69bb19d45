//! `GET /`: a small chat page, as FastLLM's web UI offers: plain HTML and JavaScript
//! compiled into the binary (no build step, no external resources). It keeps the
//! conversation in the browser, sends it to `/v1/chat/completions` with `"stream": true`,
//! reads the server-sent events with `fetch` and a `ReadableStream` reader, appends each
//! `delta.content` as it arrives, and shows the decode speed in tokens/s (from the first
//! token to the last, counted from the usage chunk). A "completion" mode sends the text to
//! `/v1/completions` instead, for models without a chat template.

/// The page.
pub const HTML: &str = include_str!("page.html");
