//! A chat model for the CLI and server tests: stories260K has no chat template of its own.

use std::path::{Path, PathBuf};

pub use flm_tests::data;

/// A copy of tests/data/hf-stories260K in `dir/model` whose tokenizer_config.json has
/// `template` as its `chat_template`.
pub fn chat_model(dir: &Path, template: &str) -> PathBuf {
    let to = dir.join("model");
    std::fs::create_dir(&to).unwrap();
    for entry in std::fs::read_dir(data("hf-stories260K")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, to.join(path.file_name().unwrap())).unwrap();
    }
    let config = to.join("tokenizer_config.json");
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
    json["chat_template"] = template.into();
    std::fs::write(&config, json.to_string()).unwrap();
    to
}
