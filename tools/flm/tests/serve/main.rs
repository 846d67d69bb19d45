//! `flm serve` on stories260K, through HTTP: the routes and errors (`api`), continuous
//! batching (`batching`), cancellation by a disconnecting client (`disconnect`), hostile
//! structured output (`hostile`), and the limits that keep one client from holding the
//! server (`limits`).
//! The OpenAI Python client and the chat page in a browser are tested by
//! `tools/flm/tests/python` (run by `.ci/run`).

#[path = "../common/chat_model.rs"]
mod chat_model;
#[path = "../common/mod.rs"]
mod common;

mod api;
mod batching;
mod disconnect;
mod harmony_tools;
mod hostile;
mod limits;
mod server;
