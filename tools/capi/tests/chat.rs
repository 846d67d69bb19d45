//! The chat calls of the C ABI, called from Rust as a host calls them:
//! `flm_apply_chat_template` renders what transformers' `apply_chat_template` renders
//! (tests/data/templates/references.json, written by transformers itself, template
//! keyword arguments included), `flm_tokenize_chat` gives the ids of the Rust chat path
//! (`Tokenizer::encode_chat_with_args`, the prompt of `flm chat` and `flm serve`), and each
//! kind of failure is its documented status with a message. The C host program checks the
//! calls through the header, the reply of `flm_generate_tokens` against `flm chat`, and
//! valgrind (tests/c_program.rs, `chat` and `check` modes).

use std::collections::HashMap;
use std::ffi::{c_char, CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use flm::{
    flm_apply_chat_template, flm_last_error, flm_model_free, flm_model_load, flm_tokenize,
    flm_tokenize_chat, FlmChatMessage, FlmModel, FlmModelOptions, FlmStatus,
};
use flm_tests::data;
use flm_tokenizer::{Message, TemplateArgs, Tokenizer};
use serde_json::Value;

/// A template that writes `bos_token` (that of tools/flm/tests/chat.rs).
const TEMPLATE: &str = "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}\
User: {{ m.content }}\n{% elif m.role == 'system' %}{{ m.content }}\n{% else %}\
Bot: {{ m.content }}\n{% endif %}{% endfor %}{% if add_generation_prompt %}Bot:{% endif %}";

/// A copy of tests/data/hf-stories260K in `dir` whose tokenizer_config.json has `template`
/// as its `chat_template`.
fn chat_model(dir: &Path, template: &str) -> PathBuf {
    for entry in std::fs::read_dir(data("hf-stories260K")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
    }
    let config = dir.join("tokenizer_config.json");
    let mut json: Value = serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
    json["chat_template"] = template.into();
    std::fs::write(&config, json.to_string()).unwrap();
    dir.to_path_buf()
}

/// A model handle loaded by `flm_model_load` (1 thread, CPU), with the tokenizer of the
/// same files loaded by the Rust side.
struct Model {
    handle: *mut FlmModel,
    tokenizer: Tokenizer,
    _dir: Option<tempfile::TempDir>,
}

impl Model {
    fn load(path: &Path) -> Model {
        let c_path = CString::new(path.as_os_str().as_bytes()).unwrap();
        let options = FlmModelOptions {
            threads: 1,
            device: c"cpu".as_ptr(),
            context: 0,
            activation_bits: 0,
            kv_dtype: std::ptr::null(),
            gpu_layers: std::ptr::null(),
        };
        let mut handle = std::ptr::null_mut();
        // SAFETY: a NUL-terminated path, valid options and output pointer.
        let status = unsafe { flm_model_load(c_path.as_ptr(), &options, &mut handle) };
        assert_eq!(status, FlmStatus::Ok, "{}", last_error());
        let (_, tokenizer) = flm_models::session::load_model(path, None, None).unwrap();
        Model {
            handle,
            tokenizer,
            _dir: None,
        }
    }

    /// stories260K in a Hugging Face directory with `template` as its chat template.
    fn with_template(template: &str) -> Model {
        let dir = tempfile::tempdir().unwrap();
        let mut model = Model::load(&chat_model(dir.path(), template));
        model._dir = Some(dir);
        model
    }

    /// `flm_apply_chat_template` with a size query first, the buffer one byte short of
    /// the size second, then a buffer of the size: the text, or the status and message.
    fn apply(&self, turns: &[(&str, &str)], generation: bool, args: &str) -> Outcome<String> {
        let messages = messages(turns);
        let chat = Chat::new(self.handle, &messages, generation, args);
        let call = |text: *mut c_char, capacity: usize, len: &mut usize| {
            // SAFETY: `messages` borrows `turns`, `args` and `text` are valid for their
            // lengths, `len` for a write.
            unsafe { chat.call(flm_apply_chat_template, text, capacity, len) }
        };
        let mut len = usize::MAX;
        match call(std::ptr::null_mut(), 0, &mut len) {
            FlmStatus::BufferTooSmall => assert!(len > 0),
            FlmStatus::Ok => assert_eq!(len, 0),
            status => return Err((status, last_error())),
        }
        let mut text = vec![0xAAu8; len];
        if len > 0 {
            let mut short = usize::MAX;
            let status = call(text.as_mut_ptr().cast(), len - 1, &mut short);
            assert_eq!((status, short), (FlmStatus::BufferTooSmall, len));
            assert!(text.iter().all(|&b| b == 0xAA), "nothing written");
        }
        let mut written = 0;
        let status = call(text.as_mut_ptr().cast(), len, &mut written);
        assert_eq!((status, written), (FlmStatus::Ok, len), "{}", last_error());
        Ok(String::from_utf8(text).unwrap())
    }

    /// `flm_tokenize_chat` with a size query first: the ids, or the status and message.
    fn tokenize_chat(
        &self,
        turns: &[(&str, &str)],
        generation: bool,
        args: &str,
    ) -> Outcome<Vec<u32>> {
        let messages = messages(turns);
        let chat = Chat::new(self.handle, &messages, generation, args);
        let call = |ids: *mut u32, capacity: usize, n: &mut usize| {
            // SAFETY: as in `apply`, for `ids`.
            unsafe { chat.call(flm_tokenize_chat, ids, capacity, n) }
        };
        let mut n = 0;
        match call(std::ptr::null_mut(), 0, &mut n) {
            FlmStatus::BufferTooSmall => {}
            status => return Err((status, last_error())),
        }
        let mut ids = vec![u32::MAX; n];
        let status = call(ids.as_mut_ptr(), n, &mut n);
        assert_eq!((status, n), (FlmStatus::Ok, ids.len()), "{}", last_error());
        Ok(ids)
    }

    /// `flm_tokenize(text, add_bos)`.
    fn tokenize(&self, text: &str, add_bos: bool) -> Vec<u32> {
        let mut ids = vec![0u32; text.len() + 2];
        let mut n = 0;
        // SAFETY: `text` and `ids` are valid for their lengths, `n` for a write.
        let status = unsafe {
            flm_tokenize(
                self.handle,
                text.as_ptr().cast(),
                text.len(),
                add_bos,
                ids.as_mut_ptr(),
                ids.len(),
                &mut n,
            )
        };
        assert_eq!(status, FlmStatus::Ok, "{}", last_error());
        ids.truncate(n);
        ids
    }

    /// The ids of the Rust chat path.
    fn rust_ids(&self, turns: &[(&str, &str)], generation: bool, args: &str) -> Vec<u32> {
        let messages: Vec<Message> = turns.iter().map(|(r, c)| Message::new(*r, *c)).collect();
        let args: TemplateArgs = if args.is_empty() {
            TemplateArgs::new()
        } else {
            serde_json::from_str(args).unwrap()
        };
        self.tokenizer
            .encode_chat_with_args(&messages, generation, &args)
            .unwrap()
            .ids
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        // SAFETY: a live handle from flm_model_load, freed once.
        unsafe { flm_model_free(self.handle) };
    }
}

type Outcome<T> = Result<T, (FlmStatus, String)>;

/// The signature of flm_apply_chat_template (`T = c_char`) and flm_tokenize_chat
/// (`T = u32`), which differ in their output buffer only.
type ChatCall<T> = unsafe extern "C" fn(
    *const FlmModel,
    *const FlmChatMessage,
    usize,
    bool,
    *const c_char,
    usize,
    *mut T,
    usize,
    *mut usize,
) -> FlmStatus;

/// The arguments of a chat call but its output, as raw pointers, so that a case can set
/// one of them to NULL.
#[derive(Clone, Copy)]
struct Chat {
    model: *const FlmModel,
    messages: *const FlmChatMessage,
    n_messages: usize,
    generation: bool,
    args: *const c_char,
    args_len: usize,
}

impl Chat {
    /// The conversation `messages` for `model`, with the JSON text `args` ("" for none).
    fn new(
        model: *const FlmModel,
        messages: &[FlmChatMessage],
        generation: bool,
        args: &str,
    ) -> Chat {
        Chat {
            model,
            messages: messages.as_ptr(),
            n_messages: messages.len(),
            generation,
            args: args.as_ptr().cast(),
            args_len: args.len(),
        }
    }

    /// `call` with these arguments and the output `out` of `capacity` elements, its length
    /// written to `len`.
    ///
    /// # Safety
    /// The pointers satisfy the contract of `call` (those of `self` borrow live values).
    unsafe fn call<T>(
        self,
        call: ChatCall<T>,
        out: *mut T,
        capacity: usize,
        len: *mut usize,
    ) -> FlmStatus {
        // SAFETY: this function's contract.
        unsafe {
            call(
                self.model,
                self.messages,
                self.n_messages,
                self.generation,
                self.args,
                self.args_len,
                out,
                capacity,
                len,
            )
        }
    }
}

fn messages(turns: &[(&str, &str)]) -> Vec<FlmChatMessage> {
    turns
        .iter()
        .map(|(role, content)| FlmChatMessage {
            role: role.as_ptr().cast(),
            role_len: role.len(),
            content: content.as_ptr().cast(),
            content_len: content.len(),
        })
        .collect()
}

fn last_error() -> String {
    // SAFETY: a NUL-terminated string, valid until the next failing call on this thread.
    unsafe { CStr::from_ptr(flm_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// Every case of references.json: the text transformers renders (keyword arguments such as
/// Qwen3's `enable_thinking` included) and the ids of the Rust chat path, or
/// FLM_STATUS_TOKENIZER with the message of the template's `raise_exception`.
#[test]
fn every_rendering_of_transformers_and_the_ids_of_the_rust_chat_path() {
    let refs: Value =
        serde_json::from_slice(&std::fs::read(data("templates/references.json")).unwrap()).unwrap();
    let mut models: HashMap<String, Model> = HashMap::new();
    let cases = refs["cases"].as_array().unwrap();
    assert!(cases.len() >= 10);
    let (mut with_args, mut refusals) = (0, 0);
    for case in cases {
        let name = case["template"].as_str().unwrap();
        let model = models.entry(name.to_string()).or_insert_with(|| {
            let template = std::fs::read_to_string(data(&format!("templates/{name}"))).unwrap();
            Model::with_template(&template)
        });
        let turns: Vec<(&str, &str)> = case["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| (m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
            .collect();
        let generation = case["add_generation_prompt"].as_bool().unwrap();
        let kwargs = case["kwargs"].as_object().unwrap();
        // No arguments as 0 bytes, as in C with NULL.
        let args = if kwargs.is_empty() {
            String::new()
        } else {
            with_args += 1;
            Value::Object(kwargs.clone()).to_string()
        };
        if let Some(error) = case["error"].as_str() {
            // The template refuses the conversation (raise_exception).
            for outcome in [
                model.apply(&turns, generation, &args).map(|_| ()),
                model.tokenize_chat(&turns, generation, &args).map(|_| ()),
            ] {
                let (status, message) = outcome.unwrap_err();
                assert_eq!(status, FlmStatus::Tokenizer, "{case}");
                assert!(message.contains(error), "{case}: {message}");
            }
            refusals += 1;
            continue;
        }
        let text = model.apply(&turns, generation, &args).unwrap();
        assert_eq!(text, case["text"].as_str().unwrap(), "{case}");
        let ids = model.tokenize_chat(&turns, generation, &args).unwrap();
        assert_eq!(ids, model.rust_ids(&turns, generation, &args), "{case}");
    }
    assert!(with_args >= 3, "cases with keyword arguments: {with_args}");
    assert!(refusals >= 2, "cases refused: {refusals}");
}

/// A template that writes `bos_token` gives one BOS, the id; flm_tokenize(text, true), as
/// flm_generate() encodes a text, gives another BOS and then, from this directory's
/// SentencePiece `tokenizer.model`, `<s>` as characters.
#[test]
fn a_template_that_writes_bos_gives_one_bos() {
    let model = Model::with_template(TEMPLATE);
    let turns = [("system", "Be brief."), ("user", "Once upon a time")];
    let text = model.apply(&turns, true, "").unwrap();
    assert_eq!(text, "<s>Be brief.\nUser: Once upon a time\nBot:");
    let ids = model.tokenize_chat(&turns, true, "").unwrap();
    assert_eq!(ids, model.rust_ids(&turns, true, ""));
    assert_eq!(ids[0], 1);
    assert_eq!(ids.iter().filter(|&&id| id == 1).count(), 1, "{ids:?}");
    let rest = model.tokenize("Be brief.\nUser: Once upon a time\nBot:", false);
    assert_eq!(ids[1..], rest);
    let from_text = model.tokenize(&text, true);
    assert_eq!(from_text[0], 1);
    assert_ne!(from_text[1..], rest);
    // Without the generation prompt the text stops after the last turn.
    let text = model.apply(&turns, false, "").unwrap();
    assert_eq!(text, "<s>Be brief.\nUser: Once upon a time\n");
}

/// A GGUF file's SentencePiece vocabulary does not match special tokens in plain text:
/// the chat ids have `</s>` and `<s>` written in the template's output as ids 2 and 1 (as
/// transformers' tokenizers after `apply_chat_template`), flm_tokenize of the text as
/// characters.
#[test]
fn the_special_tokens_a_gguf_template_writes_are_their_ids() {
    let model = Model::load(&data("gguf/stories260K-f32.gguf"));
    assert_eq!(
        model.tokenizer.chat_template(),
        Some("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    );
    let turns = [("user", "Once upon a time</s>"), ("assistant", "<s>Lily")];
    let text = model.apply(&turns, true, "").unwrap();
    assert_eq!(text, "Once upon a time</s><s>Lily");
    let ids = model.tokenize_chat(&turns, true, "").unwrap();
    assert_eq!(ids, model.rust_ids(&turns, true, ""));
    let once = model.tokenize("Once upon a time", false);
    let lily = model.tokenize("Lily", false);
    assert_eq!(ids, [&once[..], &[2, 1], &lily[..]].concat());
    let plain = model.tokenize(&text, false);
    assert!(!plain.contains(&1) && !plain.contains(&2), "{plain:?}");
}

/// Keyword arguments of any JSON type reach the template as its variables; 0 bytes (NULL
/// in C) are none, whatever the pointer.
#[test]
fn template_arguments_are_the_templates_variables() {
    let model = Model::with_template(&format!(
        "{{{{ who }}}}|{{{{ n + 1 }}}}|{{{{ tags | join(',') }}}}|{{{{ opts.x }}}}|{TEMPLATE}"
    ));
    let args = r#"{"who": "Bob", "n": 3, "tags": ["a", "b"], "opts": {"x": true}}"#;
    let turns = [("user", "Hi")];
    let text = model.apply(&turns, true, args).unwrap();
    assert_eq!(text, "Bob|4|a,b|True|<s>User: Hi\nBot:");
    assert_eq!(
        model.tokenize_chat(&turns, true, args).unwrap(),
        model.rust_ids(&turns, true, args)
    );
    let qwen3 = std::fs::read_to_string(data("templates/Qwen-Qwen3-0.6B.jinja")).unwrap();
    let model = Model::with_template(&qwen3);
    let turns = [("user", "Hello")];
    let messages = messages(&turns);
    let mut text = vec![0u8; 256];
    let mut len = 0;
    let chat = Chat {
        args_len: 0,
        ..Chat::new(
            model.handle,
            &messages,
            true,
            r#"{"enable_thinking": false}"#,
        )
    };
    // SAFETY: a non-NULL pointer with 0 bytes, valid buffers.
    let status = unsafe {
        chat.call(
            flm_apply_chat_template,
            text.as_mut_ptr().cast(),
            text.len(),
            &mut len,
        )
    };
    assert_eq!(status, FlmStatus::Ok);
    assert_eq!(
        std::str::from_utf8(&text[..len]).unwrap(),
        model.apply(&turns, true, "").unwrap()
    );
    assert!(!model.apply(&turns, true, "").unwrap().contains("<think>"));
    assert!(model
        .apply(&turns, true, r#"{"enable_thinking": false}"#)
        .unwrap()
        .ends_with("<think>\n\n</think>\n\n"));
}

/// Each failure of the chat calls is its documented status with a message saying why (a
/// template's refusal: the references test above).
#[test]
fn failures_are_their_documented_statuses() {
    let gemma2 = std::fs::read_to_string(data("templates/google-gemma-2-2b-it.jinja")).unwrap();
    let gemma2 = Model::with_template(&gemma2);
    let turns = [("user", "Hi")];
    for (args, why) in [
        ("[]", "template_args is not a JSON object"),
        ("true", "template_args is not a JSON object"),
        ("{\"a\": 1", "template_args is not valid JSON"),
        ("{\"a\": 1} {}", "template_args is not valid JSON"),
        ("{\"messages\": []}", "`messages`"),
        ("{\"tools\": []}", "`tools`"),
        (
            "{\"add_generation_prompt\": true}",
            "`add_generation_prompt`",
        ),
    ] {
        for outcome in [
            gemma2.apply(&turns, true, args).map(|_| ()),
            gemma2.tokenize_chat(&turns, true, args).map(|_| ()),
        ] {
            let (status, message) = outcome.unwrap_err();
            assert_eq!(status, FlmStatus::InvalidArgument, "{args}: {message}");
            assert!(message.contains(why), "{args}: {message}");
        }
    }

    let plain = Model::load(&data("stories260K/stories260K.bin"));
    for outcome in [
        plain.apply(&turns, true, "").map(|_| ()),
        plain.tokenize_chat(&turns, true, "").map(|_| ()),
    ] {
        let (status, message) = outcome.unwrap_err();
        assert_eq!(status, FlmStatus::NoChatTemplate);
        assert!(message.contains("no chat template"), "{message}");
    }
    assert_eq!(FlmStatus::NoChatTemplate as i32, 13);

    // Pointers and UTF-8.
    let bad = [b'a', 0xff];
    let cases: [(FlmChatMessage, FlmStatus, &str); 3] = [
        (
            FlmChatMessage {
                role: std::ptr::null(),
                role_len: 4,
                content: c"Hi".as_ptr(),
                content_len: 2,
            },
            FlmStatus::NullPointer,
            "messages[1].role is NULL",
        ),
        (
            FlmChatMessage {
                role: c"user".as_ptr(),
                role_len: 4,
                content: bad.as_ptr().cast(),
                content_len: 2,
            },
            FlmStatus::InvalidUtf8,
            "messages[1].content is not valid UTF-8",
        ),
        (
            FlmChatMessage {
                role: bad.as_ptr().cast(),
                role_len: 2,
                content: std::ptr::null(),
                content_len: 0,
            },
            FlmStatus::InvalidUtf8,
            "messages[1].role is not valid UTF-8",
        ),
    ];
    let mut text = [0 as c_char; 64];
    let mut len = 0;
    for (second, status, why) in cases {
        let pair = [messages(&turns)[0], second];
        let chat = Chat {
            args: std::ptr::null(),
            ..Chat::new(gemma2.handle, &pair, true, "")
        };
        // SAFETY: valid pointers but for the documented NULL.
        let got = unsafe {
            chat.call(
                flm_apply_chat_template,
                text.as_mut_ptr(),
                text.len(),
                &mut len,
            )
        };
        assert_eq!(got, status);
        assert!(last_error().contains(why), "{}", last_error());
    }
    let hi = messages(&turns);
    let valid = Chat::new(gemma2.handle, &hi, true, "");
    let mut len = 0;
    let len: *mut usize = &mut len;
    // The call (flm_tokenize_chat, else flm_apply_chat_template) with a NULL output of a
    // capacity, its length written to a pointer, and the message.
    let cases = [
        (
            false,
            Chat {
                model: std::ptr::null(),
                ..valid
            },
            0,
            len,
            "model is NULL",
        ),
        (
            true,
            Chat {
                messages: std::ptr::null(),
                ..valid
            },
            0,
            len,
            "messages is NULL",
        ),
        (false, valid, 0, std::ptr::null_mut(), "text_len is NULL"),
        (true, valid, 64, len, "ids is NULL"),
        (
            false,
            Chat::new(gemma2.handle, &hi, true, "{}"),
            64,
            len,
            "text is NULL",
        ),
    ];
    for (tokenize, chat, capacity, len, why) in cases {
        // SAFETY: valid pointers but for the documented NULL.
        let status = unsafe {
            if tokenize {
                chat.call(flm_tokenize_chat, std::ptr::null_mut(), capacity, len)
            } else {
                chat.call(flm_apply_chat_template, std::ptr::null_mut(), capacity, len)
            }
        };
        assert_eq!(status, FlmStatus::NullPointer, "{why}");
        assert_eq!(last_error(), why);
    }
}
