"""Reference renderings of gpt-oss's harmony chat template
(tests/data/templates/openai-gpt-oss-120b.jinja, llama.cpp's copy) by Hugging Face
transformers' `render_jinja_template` (the code behind `apply_chat_template`), for flm's
tokenizer/tests/harmony_template.rs.

The template writes `strftime_now("%Y-%m-%d")` into its system message; transformers'
`strftime_now` formats `datetime.now()`, which is pinned here to 2025-08-05 17:04:09
(Unix time 1754413449 read as UTC, what the Rust test fixes with
`Tokenizer::set_template_time`).

Run from the repository root: `/work/hfenv/bin/python tools/templates/render_gpt_oss.py`
(transformers 5.25.0, jinja2 3.1.6). Writes `tests/data/templates/gpt-oss-references.json`:
per case the messages (OpenAI's JSON shape, with `thinking` or `reasoning_content` on
assistant turns, `tool_calls`, `tool` turns), the tools, `add_generation_prompt`, the
keyword arguments (`reasoning_effort`, `model_identity`, `builtin_tools`), and the rendered
text with its ids by Hugging Face `tokenizers` 0.23.3 and o200k_harmony
(tests/data/tokenizer/o200k-harmony/tokenizer.json.xz), or the template's exception message.
"""

import datetime as dt
import json
import lzma
from pathlib import Path

import jinja2
import transformers
import transformers.utils.chat_template_utils as ctu
from tokenizers import Tokenizer
from transformers.utils.chat_template_utils import render_jinja_template

HERE = Path(__file__).resolve().parents[2] / "tests" / "data" / "templates"
TEMPLATE = "openai-gpt-oss-120b.jinja"
NOW = dt.datetime(2025, 8, 5, 17, 4, 9)


class PinnedDatetime(dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return NOW


ctu.datetime = PinnedDatetime

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Gets the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
                "days": {"type": "integer", "description": "Days of forecast", "default": 1},
                "tags": {"type": "array", "items": {"type": "string"}},
                "point": {
                    "type": "object",
                    "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
                    "required": ["lat"],
                },
                "strict": {"type": "boolean"},
                "any_of": {"type": ["string", "number"]},
            },
            "required": ["city"],
        },
    },
}
NOW_TOOL = {"type": "function", "function": {"name": "now", "description": "The time.", "parameters": {}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
# OpenAI's wire form: arguments as a JSON string.
CALL_STR = {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}

U = lambda c: {"role": "user", "content": c}
A = lambda c, **kw: {"role": "assistant", "content": c, **kw}

CASES = [
    ([U("Hello")], None, True, {}),
    ([{"role": "system", "content": "You are terse."}, U("Hi")], None, True, {"reasoning_effort": "high"}),
    ([{"role": "developer", "content": "Answer in French."}, U("Hi")], None, True, {"reasoning_effort": "low"}),
    # Earlier turns lose their analysis; a last assistant turn without the generation prompt
    # keeps it and ends with <|return|>.
    ([U("Hi"), A("Hello!", thinking="The user greets me."), U("2+2?")], None, True, {}),
    ([U("Hi"), A("Hello!", thinking="The user greets me.")], None, False, {"reasoning_effort": "high"}),
    # OpenAI-style `reasoning_content`, which transformers copies into `thinking`.
    ([U("Hi"), A("Hello!", reasoning_content="Greet back.")], None, False, {}),
    ([U("Hi"), A("Hello!", reasoning_content="Greet back."), U("Bye")], None, True, {}),
    # Tools: the call (with its analysis while no final answer follows), the tool's reply.
    (
        [
            {"role": "system", "content": "Use tools."},
            U("Weather in Paris?"),
            A("", thinking="I should call get_weather.", tool_calls=[CALL]),
            {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
        ],
        [WEATHER, NOW_TOOL],
        True,
        {},
    ),
    (
        [
            U("Weather in Oslo?"),
            {"role": "assistant", "tool_calls": [CALL_STR]},
            {"role": "tool", "tool_call_id": "call_2", "content": "cold"},
            A("It is cold in Oslo."),
            U("Thanks"),
        ],
        [WEATHER],
        True,
        {"reasoning_effort": "low"},
    ),
    ([U("Hi")], None, True, {"model_identity": "You are a test model.", "builtin_tools": ["browser", "python"]}),
    # The template refuses channel tags in the content.
    ([U("Hi"), A("<|channel|>final<|message|>Hello")], None, True, {}),
    ([{"role": "tool", "content": "x"}], None, True, {}),
]


def main():
    template = (HERE / TEMPLATE).read_text()
    tokenizer_json = HERE.parent / "tokenizer" / "o200k-harmony" / "tokenizer.json.xz"
    tok = Tokenizer.from_str(lzma.decompress(tokenizer_json.read_bytes()).decode("utf-8"))
    out = []
    for messages, tools, gen, kwargs in CASES:
        case = dict(messages=messages, tools=tools, add_generation_prompt=gen, kwargs=kwargs)
        try:
            rendered, _ = render_jinja_template(
                conversations=[messages],
                tools=tools,
                chat_template=template,
                add_generation_prompt=gen,
                bos_token="<|startoftext|>",
                eos_token="<|return|>",
                **kwargs,
            )
            case["text"] = rendered[0]
            case["ids"] = tok.encode(rendered[0], add_special_tokens=False).ids
        except jinja2.exceptions.TemplateError as e:
            case["error"] = str(e)
        out.append(case)
    doc = dict(
        generator="tools/templates/render_gpt_oss.py",
        template=TEMPLATE,
        transformers=transformers.__version__,
        jinja2=jinja2.__version__,
        now_unix_utc=int(NOW.replace(tzinfo=dt.timezone.utc).timestamp()),
        cases=out,
    )
    (HERE / "gpt-oss-references.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
