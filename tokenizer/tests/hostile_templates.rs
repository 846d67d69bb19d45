//! Hostile chat templates (templates in GGUF metadata that once looped for
//! ever, grew to gigabytes, or aborted the process) end with an error naming the template's
//! origin and the limit, within the render budget: fuel for time, caps on the strings and
//! sequences built and on the output for memory. Each is refused when the template is
//! loaded (the check on a sample conversation) as well as when a request renders it.
//! Templates that would make minijinja's compiler build gigabytes of constants, run for
//! ever or overflow the stack are refused before it compiles them, within a second and a
//! few megabytes (measured by a per-thread count of the allocations).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::{Duration, Instant};

use flm_tests::tokenizer::load;
use flm_tokenizer::{
    Message, TemplateArgs, Tokenizer, MAX_TAG_OPERATORS, MAX_TEMPLATE_ITEMS,
    MAX_TEMPLATE_OPERATORS, MAX_TEMPLATE_SOURCE, MAX_TEMPLATE_TEXT, TEMPLATE_FUEL,
};

/// The system allocator, counting the bytes each thread has allocated and not freed, and
/// the peak of that count.
struct PerThreadCount;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn track(delta: isize) {
    // `try_with`: a thread's last frees may come after its cells are gone.
    let _ = LIVE.try_with(|live| {
        let now = live.get() + delta;
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

// SAFETY: every call goes to the system allocator unchanged; the counting only touches
// const-initialised thread-local cells, which neither allocate nor have destructors.
unsafe impl GlobalAlloc for PerThreadCount {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller keeps `alloc`'s contract, which this passes on.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            track(layout.size() as isize);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            track(layout.size() as isize);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, that is from `System`, with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        track(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for `dealloc`, and the caller keeps `realloc`'s contract.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            track(new_size as isize - layout.size() as isize);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: PerThreadCount = PerThreadCount;

/// `f()`, and the most bytes it had allocated at once on this thread.
fn peak_allocation<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|peak| peak.set(base));
    let out = f();
    (out, PEAK.with(Cell::get).saturating_sub(base) as usize)
}

/// The issue asks for well under a second in a release build; a debug build on a loaded
/// 2-core machine gets this margin.
const BOUND: Duration = Duration::from_secs(5);

fn plain() -> Tokenizer {
    Tokenizer::from_spec(load("tokenizer/tokenizer.model").spec()).unwrap()
}

/// Loading `template` as from GGUF metadata fails with an error that names the origin and
/// contains `why`, within [`BOUND`].
fn refused_at_load(template: &str, why: &str) {
    let origin = "GGUF metadata `tokenizer.chat_template`";
    refused_in_time(template, origin, why, "at load", || {
        plain().with_chat_template(Some(template.into()), origin)
    });
}

/// `attempt` fails within [`BOUND`] with an error that names the chat template from
/// `origin` and contains `why`; `what` (the template or its hostile part) and `stage` (when
/// it is refused) are for messages.
fn refused_in_time<T>(
    what: &str,
    origin: &str,
    why: &str,
    stage: &str,
    attempt: impl FnOnce() -> Result<T, flm_tokenizer::Error>,
) {
    let start = Instant::now();
    let result = attempt();
    let took = start.elapsed();
    let Err(err) = result.map_err(|e| e.to_string()) else {
        panic!("{what}: not refused {stage}");
    };
    assert!(err.contains(&format!("chat template ({origin})")), "{err}");
    assert!(err.contains(why), "{what}: {err}");
    eprintln!("refused {stage} in {:.1} ms: {}", ms(took), short(what));
    assert!(took < BOUND, "{what}: {took:?}");
}

/// Milliseconds of `d`.
fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The first 60 bytes of `template` (or fewer, on a character boundary), for messages.
fn short(template: &str) -> &str {
    let mut end = template.len().min(60);
    while !template.is_char_boundary(end) {
        end -= 1;
    }
    &template[..end]
}

/// A template that passes the load check but is hostile for one conversation (the user
/// turn `attack`) fails for that request, with `why`, within [`BOUND`]; or, when the
/// hostile part is a constant, already when it is loaded.
fn refused_on_request(body: &str, why: &str) {
    let template = format!("{{% if messages[-1].content == 'attack' %}}{body}{{% endif %}}ok");
    let origin = "tokenizer_config.json `chat_template`";
    let tok = match plain().with_chat_template(Some(template), origin) {
        Ok(tok) => tok,
        // A constant operand is folded by the compiler, and checked when the template loads.
        Err(e) => {
            assert!(e.to_string().contains(why), "{body}: {e}");
            return;
        }
    };
    refused_in_time(body, origin, why, "on request", || {
        tok.encode_chat(&[Message::new("user", "attack")], true)
    });
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

/// The probe's templates that minijinja's own rules already stop: Python's object
/// internals (minijinja has none: the attributes are undefined), includes (no loader),
/// `raise_exception`, a range of 10^9 items and `2 ** 200` (integer overflow; the
/// probe's string product of 10^10 meets flm's own limit, in [`compiling_is_bounded`]). Each ends, within [`BOUND`], in the template's own error or a
/// short render, when it loads and when a request renders it; none is taken for a limit.
#[test]
fn minijinjas_own_rules_stop_the_simple_cases() {
    let cases = [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ self.__init__.__globals__ }}",
        "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
        "{% include 'secrets.txt' %}",
        "{% import 'macros' as m %}{{ m.f() }}",
        "{{ raise_exception('no') }}",
        "{% for i in range(10**9) %}{% endfor %}",
        "{{ 2 ** 200 }}",
    ];
    for body in cases {
        let template = format!("{{% if messages[-1].content == 'attack' %}}{body}{{% endif %}}ok");
        let start = Instant::now();
        let rendered = plain()
            .with_chat_template(Some(template), "test")
            .and_then(|tok| tok.encode_chat(&[Message::new("user", "attack")], true));
        let took = start.elapsed();
        eprintln!(
            "{:.1} ms: {} -> {:?}",
            ms(took),
            short(body),
            rendered.as_ref().map(|p| p.text.len())
        );
        match rendered {
            Ok(prompt) => assert!(prompt.text.len() < 1 << 10, "{body}: {}", prompt.text.len()),
            Err(e) => assert!(!e.to_string().contains("limit"), "{body}: {e}"),
        }
        assert!(took < BOUND, "{body}: {took:?}");
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

/// Constants that minijinja's compiler would fold into 100 MB strings (one, or several
/// adding up), into the text of 10^12 items or a comparison that walks them (which never
/// end), or into a length that overflows; chains of operators that would overflow the
/// stack; a source past the limit. Each is refused when the template loads, within
/// [`BOUND`] (a small fraction of it: nothing is compiled) and a few megabytes.
#[test]
fn compiling_is_bounded() {
    let text = format!("past the limit of {MAX_TEMPLATE_TEXT} bytes");
    let items = format!("past the limit of {MAX_TEMPLATE_ITEMS} items");
    let all = format!("more than the limit of {MAX_TEMPLATE_TEXT} bytes in all");
    let operators = format!("more operators than the limit of {MAX_TAG_OPERATORS}");
    let source = format!("past the limit of {MAX_TEMPLATE_SOURCE} bytes");
    let cases = [
        ("{{ 'a' * 10**8 }}".to_string(), &text),
        ("{{ ('a' * 99999999) ~ ('b' * 99999999) }}".into(), &text),
        ("{{ -('a' * 10**8) }}".into(), &text),
        ("{{ 'a' * 1000000 }}".repeat(64), &all),
        ("{{ ('ab' * 1000000 ~ 'c') ~ x }}".repeat(8), &all),
        ("{{ ([1] * 10**12) ~ '' }}".into(), &items),
        ("{{ ([1] * 10**12) == ([1] * 10**12) }}".into(), &items),
        ("{{ 2 in [1] * 10**12 }}".into(), &items),
        ("{{ [1, 2] * 9223372036854775807 }}".into(), &items),
        ("{{ [1] * 10**6 }}".into(), &all),
        (
            "{{ x + 1 }}".repeat(MAX_TEMPLATE_OPERATORS + 1),
            &format!("more operators than the limit of {MAX_TEMPLATE_OPERATORS}"),
        ),
        (format!("{{{{ x{} }}}}", " + 1".repeat(10_000)), &operators),
        (
            format!("{{{{ x{} }}}}", "|string".repeat(10_000)),
            &operators,
        ),
        (
            format!("{{% set y = x{} %}}", ".a".repeat(10_000)),
            &operators,
        ),
        (
            format!("{{{{ x{} }}}}", " + 1".repeat(MAX_TAG_OPERATORS + 1)),
            &operators,
        ),
        ("a".repeat(MAX_TEMPLATE_SOURCE + 1), &source),
    ];
    for (template, why) in cases {
        let tok = plain();
        let start = Instant::now();
        let (err, peak) = peak_allocation(|| {
            tok.with_chat_template(Some(template.clone()), "GGUF metadata")
                .err()
                .map(|e| e.to_string())
        });
        let took = start.elapsed();
        let name = short(&template);
        let err = err.unwrap_or_else(|| panic!("{name} loaded"));
        assert!(err.contains(why.as_str()), "{name}: {err}");
        eprintln!("refused before compiling in {:.1} ms: {name}", ms(took));
        assert!(took < BOUND / 5, "{name}: {took:?}");
        assert!(peak < 16 << 20, "{name}: {peak} bytes");
    }
}

/// Just inside the limits, templates load and render: constants folded at compile time,
/// a tag with as many operators as allowed, as many such tags as allowed (the slowest
/// template to compile, within [`BOUND`]), a source as long as allowed.
#[test]
fn compiling_within_the_limits() {
    let chain = format!("{{{{ 0{} }}}}", " + 1".repeat(MAX_TAG_OPERATORS));
    let chains = MAX_TEMPLATE_OPERATORS / MAX_TAG_OPERATORS;
    let cases = [
        (
            "{{ ('ab' * 1000000) | length }}".to_string(),
            "2000000".to_string(),
        ),
        ("{{ ([1] * 1000) | length }}".into(), "1000".into()),
        ("{{ 'a' ~ 'b' ~ 1 }}".into(), "ab1".into()),
        (chain.clone(), MAX_TAG_OPERATORS.to_string()),
        (
            chain.repeat(chains),
            MAX_TAG_OPERATORS.to_string().repeat(chains),
        ),
        (
            format!("{{{{ 'a' }}}}{}", "b".repeat(MAX_TEMPLATE_SOURCE - 9)),
            format!("a{}", "b".repeat(MAX_TEMPLATE_SOURCE - 9)),
        ),
    ];
    for (template, want) in cases {
        let name = short(&template).to_string();
        let start = Instant::now();
        let tok = plain()
            .with_chat_template(Some(template), "test")
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let got = tok.encode_chat(&[Message::new("user", "u")], true).unwrap();
        assert_eq!(got.text, want, "{name}");
        assert!(start.elapsed() < BOUND, "{name}: {:?}", start.elapsed());
    }
}
