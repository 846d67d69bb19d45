//! Hostile chat templates (issue 48's probe: templates in GGUF metadata that looped for
//! ever, grew to gigabytes, or aborted the process) end with an error naming the template's
//! origin and the limit, within the render budget: fuel for time, caps on the strings and
//! sequences built and on the output for memory. Each is refused when the template is
//! loaded (the check on a sample conversation) as well as when a request renders it.

mod common;

use std::time::{Duration, Instant};

use common::load;
use flm_tokenizer::{
    Message, TemplateArgs, Tokenizer, MAX_TEMPLATE_ITEMS, MAX_TEMPLATE_TEXT, TEMPLATE_FUEL,
};

/// The issue asks for well under a second in a release build; a debug build on a loaded
/// 2-core machine gets this margin.
const BOUND: Duration = Duration::from_secs(5);

fn plain() -> Tokenizer {
    Tokenizer::from_spec(load("tokenizer/tokenizer.model").spec()).unwrap()
}

/// Loading `template` as from GGUF metadata fails with an error that names the origin and
/// contains `why`, within [`BOUND`].
fn refused_at_load(template: &str, why: &str) {
    let start = Instant::now();
    let err = match plain().with_chat_template(
        Some(template.into()),
        "GGUF metadata `tokenizer.chat_template`",
    ) {
        Ok(_) => panic!("{template} loaded"),
        Err(e) => e.to_string(),
    };
    let took = start.elapsed();
    assert!(
        err.contains("chat template (GGUF metadata `tokenizer.chat_template`)"),
        "{err}"
    );
    assert!(err.contains(why), "{template}: {err}");
    assert!(took < BOUND, "{template}: {took:?}");
}

/// A template that passes the load check but is hostile for one conversation (the user
/// turn `attack`) fails for that request, with `why`, within [`BOUND`]; or, when the
/// hostile part is a constant, already when it is loaded.
fn refused_on_request(body: &str, why: &str) {
    let template = format!("{{% if messages[-1].content == 'attack' %}}{body}{{% endif %}}ok");
    let tok =
        match plain().with_chat_template(Some(template), "tokenizer_config.json `chat_template`") {
            Ok(tok) => tok,
            // A constant operand is folded by the compiler, and checked when the template loads.
            Err(e) => {
                assert!(e.to_string().contains(why), "{body}: {e}");
                return;
            }
        };
    let start = Instant::now();
    let err = match tok.encode_chat(&[Message::new("user", "attack")], true) {
        Ok(p) => panic!("{body} rendered {} bytes", p.text.len()),
        Err(e) => e.to_string(),
    };
    let took = start.elapsed();
    assert!(
        err.contains("chat template (tokenizer_config.json `chat_template`)"),
        "{err}"
    );
    assert!(err.contains(why), "{body}: {err}");
    assert!(took < BOUND, "{body}: {took:?}");
    assert_eq!(
        tok.encode_chat(&[Message::new("user", "hi")], true)
            .unwrap()
            .text,
        "ok"
    );
}

#[test]
fn loops_and_recursion_run_out_of_fuel() {
    let fuel =
        format!("out of fuel (in <string>:1) (the limit of {TEMPLATE_FUEL} instructions a render)");
    let cases = [
        // range(100000) inside range(100000).
        "{% for i in range(100000) %}{% for j in range(100000) %}{% set k = j %}\
         {% endfor %}{% endfor %}",
        // 10^3 cubed.
        "{% for i in range(1000) %}{% for j in range(1000) %}{% for k in range(1000) %}\
         {% set x = k %}{% endfor %}{% endfor %}{% endfor %}",
        // Exponential macro recursion: 2^40 calls.
        "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}\
         {{ f(40) }}",
    ];
    for template in cases {
        refused_at_load(template, &fuel);
        refused_on_request(template, &fuel);
    }
}

#[test]
fn growing_values_are_refused_before_they_are_built() {
    let text = format!("past the limit of {MAX_TEMPLATE_TEXT} bytes");
    let items = format!("past the limit of {MAX_TEMPLATE_ITEMS} items");
    let cases = [
        // A namespace value doubled in a loop, as a string (`~` and `+`) and as a list.
        (
            "{% set ns = namespace(s='ab') %}{% for i in range(64) %}\
             {% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
            &text,
        ),
        (
            "{% set ns = namespace(s='ab') %}{% for i in range(64) %}\
             {% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}",
            &text,
        ),
        (
            "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}\
             {% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l | length }}",
            &items,
        ),
        // Doubling by recursion through a macro's argument.
        (
            "{% macro g(s, n) %}{% if n > 0 %}{{ g(s ~ s, n - 1) }}{% else %}{{ s|length }}\
             {% endif %}{% endmacro %}{{ g('ab', 64) }}",
            &text,
        ),
        // Filters that build their result from a number.
        ("{{ 'a\nb' | indent(10**9) }}", &text),
        ("{{ range(10) | batch(10**12) }}", &items),
        ("{{ range(10) | batch(10**12, 0) }}", &items),
        ("{{ range(10) | slice(10**12) }}", &items),
        ("{{ '%1000000000s' | format('a') }}", &text),
        ("{{ '{:>1000000000}'.format('a') }}", &text),
        (
            "{% set s = 'a' * 1000000 %}{{ s | replace('a', 'aaaaaaaaaaaaaaaa') }}",
            &text,
        ),
        (
            "{% set s = 'a' * 1000000 %}{{ s.replace('a', 'aaaaaaaaaaaaaaaa') }}",
            &text,
        ),
        ("{{ ('x' * 2000000) | list | length }}", &items),
        ("{{ [1] * 10**12 }}", &items),
        ("{% set n = 10**12 %}{{ [1] * n }}", &items),
        ("{% set n = 10**8 %}{{ 'a' * n }}", &text),
        ("{{ ',' .join(['ab' * 1000000] * 10) }}", &text),
        // A 10^8-character string, and 10^8 characters of output in small pieces.
        ("{{ 'a' * 100000000 }}", &text),
        (
            "{% for i in range(100000) %}{{ 'a' * 1000 }}{% endfor %}",
            &text,
        ),
        // Raw text, captured and emitted.
        (
            "{% set x %}{% for i in range(100000) %}0123456789012345678901234567890123456789\
             0123456789012345678901234567890123456789{% endfor %}{% endset %}{{ x }}",
            &text,
        ),
    ];
    for (template, why) in cases {
        refused_at_load(template, why);
        refused_on_request(template, why);
    }
}

/// The limits leave room: a long conversation, loops and joins of a real size render.
#[test]
fn real_sizes_render() {
    let template = "{% for m in messages %}<|{{ m.role }}|>{{ m.content | indent(2) }}\n\
                    {% endfor %}{% set ns = namespace(n=0) %}{% for m in messages %}\
                    {% set ns.n = ns.n + m.content | length %}{% endfor %}[{{ ns.n }}]\
                    {{ messages | map(attribute='role') | join(',') | length }}";
    let tok = plain()
        .with_chat_template(Some(template.into()), "test")
        .unwrap();
    let messages: Vec<Message> = (0..2000)
        .map(|i| Message::new(["user", "assistant"][i % 2], "word ".repeat(100)))
        .collect();
    let text = tok
        .encode_chat_with_args(&messages, true, &TemplateArgs::new())
        .unwrap()
        .text;
    assert!(
        text.contains(&format!("[{}]", 2000 * 500)),
        "{}",
        text.len()
    );
    assert!(text.len() > 1_000_000);
}

/// Templates that refuse the sample conversation on purpose (Gemma refuses system turns)
/// or need a request's keyword arguments load; ones that do not parse do not.
#[test]
fn the_load_check_accepts_the_templates_own_errors_and_refuses_syntax_errors() {
    let gemma = "{% if messages[0].role == 'system' %}\
                 {{ raise_exception('System role not supported') }}{% endif %}\
                 {% for m in messages %}{{ m.content }}{% endfor %}";
    let tok = plain()
        .with_chat_template(Some(gemma.into()), "test")
        .unwrap();
    let err = tok
        .encode_chat(&[Message::new("system", "s")], true)
        .unwrap_err()
        .to_string();
    assert!(err.contains("System role not supported"), "{err}");
    refused_at_load("{% for %}", "syntax error");
    // Errors of the template's own, such as a keyword argument a request must give.
    for own in ["{{ undefined_function() }}", "{{ n + 1 }}"] {
        let tok = plain()
            .with_chat_template(Some(own.into()), "test")
            .unwrap();
        assert!(tok.encode_chat(&[Message::new("user", "u")], true).is_err());
    }
}
