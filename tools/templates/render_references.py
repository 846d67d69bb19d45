"""Reference renderings of the chat templates in tests/data/templates, by Hugging Face
transformers' own `render_jinja_template` (the code behind `apply_chat_template`), for
flm's tokenizer/tests/templates.rs.

Run from the repository root: `python tools/templates/render_references.py`. Writes
`tests/data/templates/references.json`: per case the template file, the messages,
`add_generation_prompt`, the template's keyword arguments (`kwargs`, as given to
`apply_chat_template(..., **kwargs)`; Qwen3's `enable_thinking`), and the rendered text or
the template's exception message. The
special tokens are those of the Llama 2 tokenizer the test loads (`<s>`, `</s>`).
"""

import json
from pathlib import Path

import jinja2
import transformers
from transformers.utils.chat_template_utils import render_jinja_template

HERE = Path(__file__).resolve().parents[2] / "tests" / "data" / "templates"
THINKING = "<think>\nThe user greets me; greet back.\n</think>\n\nHello! How can I help?"
CASES = [
    ("Qwen-Qwen3-0.6B.jinja", [("user", "Hello")], True),
    ("Qwen-Qwen3-0.6B.jinja", [("system", "You are terse."), ("user", "Hi")], True),
    # A reply with its reasoning, then a new turn: the template keeps only the answer.
    (
        "Qwen-Qwen3-0.6B.jinja",
        [("system", "Be kind."), ("user", "Hi"), ("assistant", THINKING), ("user", "2+2?")],
        True,
    ),
    ("Qwen-Qwen3-0.6B.jinja", [("user", "Hi"), ("assistant", THINKING)], False),
    # Qwen3's thinking switch: off, an empty <think> block follows the generation prompt.
    ("Qwen-Qwen3-0.6B.jinja", [("user", "Hello")], True, dict(enable_thinking=False)),
    ("Qwen-Qwen3-0.6B.jinja", [("user", "Hello")], True, dict(enable_thinking=True)),
    (
        "Qwen-Qwen3-0.6B.jinja",
        [("user", "Hi"), ("assistant", THINKING), ("user", "2+2?")],
        True,
        dict(enable_thinking=False),
    ),
    (
        "Qwen-Qwen3-0.6B.jinja",
        [("user", "Hi"), ("assistant", THINKING)],
        False,
        dict(enable_thinking=False),
    ),
    ("google-gemma-2-2b-it.jinja", [("user", " Hello ")], True),
    (
        "google-gemma-2-2b-it.jinja",
        [("user", "Hi"), ("assistant", "Hello!"), ("user", "Name a colour.")],
        True,
    ),
    ("google-gemma-2-2b-it.jinja", [("user", "Hi"), ("assistant", "Hello!")], False),
    ("google-gemma-2-2b-it.jinja", [("system", "No."), ("user", "Hi")], True),
    ("google-gemma-2-2b-it.jinja", [("user", "Hi"), ("user", "Again")], True),
]


def main():
    out = []
    for template, messages, gen, *kwargs in CASES:
        kwargs = kwargs[0] if kwargs else {}
        msgs = [dict(role=r, content=c) for r, c in messages]
        case = dict(template=template, messages=msgs, add_generation_prompt=gen, kwargs=kwargs)
        try:
            rendered, _ = render_jinja_template(
                conversations=[msgs],
                chat_template=(HERE / template).read_text(),
                add_generation_prompt=gen,
                bos_token="<s>",
                eos_token="</s>",
                **kwargs,
            )
            case["text"] = rendered[0]
        except jinja2.exceptions.TemplateError as e:
            case["error"] = str(e)
        out.append(case)
    doc = dict(
        generator="tools/templates/render_references.py",
        transformers=transformers.__version__,
        jinja2=jinja2.__version__,
        cases=out,
    )
    (HERE / "references.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
