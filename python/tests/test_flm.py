"""pytest tests of the flm Python package over libflm, on the shipped stories260K.

The greedy text is checked against llama2.c's reference (the text `flm run` is checked
against in tools/flm/tests/cli.rs) and, when FLM_BIN names the flm binary, against what
`flm run --temperature 0` prints.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

import flm

DATA = Path(__file__).resolve().parents[2] / "tests" / "data" / "stories260K"
MODEL = DATA / "stories260K.bin"
TEMPLATES = DATA.parent / "templates"


def reference(case: str) -> str:
    with open(DATA / "stories260K_reference.json", encoding="utf-8") as f:
        return json.load(f)[case]["output_text"]


@pytest.fixture(scope="module")
def model() -> flm.Model:
    with flm.Model(MODEL, threads=2) as m:
        yield m


def greedy(session: flm.Session, prompt: str, max_tokens: int) -> str:
    return "".join(session.generate(prompt, max_tokens=max_tokens, temperature=0))


@pytest.mark.parametrize(
    "prompt, max_tokens, case",
    [("", 200, "greedy_from_bos"), ("Once upon a time", 32, "greedy_prompt")],
)
def test_greedy_text_equals_flm_run(model: flm.Model, prompt: str, max_tokens: int, case: str) -> None:
    text = greedy(model.session(), prompt, max_tokens)
    expected = reference(case)[len(prompt):]
    assert text == expected
    flm_bin = os.environ.get("FLM_BIN")
    if flm_bin:
        out = subprocess.run(
            [flm_bin, "run", "--model", str(MODEL), "--prompt", prompt,
             "--temperature", "0", "--max-tokens", str(max_tokens)],
            check=True, capture_output=True,
        )
        assert out.stdout.decode() == text + "\n"


def test_generate_streams_pieces_and_stops_when_the_loop_breaks(model: flm.Model) -> None:
    session = model.session()
    full = list(session.generate("Lily", max_tokens=40, temperature=0))
    assert len(full) > 5
    taken = []
    for piece in session.generate("Lily", max_tokens=40, temperature=0):
        taken.append(piece)
        if len(taken) == 3:
            break
    assert taken == full[:3]
    # The session is usable again after an early stop.
    assert list(session.generate("Lily", max_tokens=40, temperature=0)) == full


def test_a_second_turn_reuses_the_kv_cache_and_equals_a_fresh_session(model: flm.Model) -> None:
    # The second prompt extends the first prompt and its reply, so the session prefills
    # only the new part; its continuation must equal a fresh session's and llama2.c's.
    session = model.session()
    prompt = "Once upon a time"
    first = greedy(session, prompt, 8)
    second = greedy(session, prompt + first, 12)
    assert second == greedy(model.session(), prompt + first, 12)
    assert (prompt + first + second).startswith(reference("greedy_prompt")[: len(prompt) + 20])


def test_two_sessions_on_two_threads_equal_their_solo_runs(model: flm.Model) -> None:
    jobs = [("Once upon a time", 0.0, 0), ("Tom had a dog", 0.8, 7)]

    def run(prompt: str, temperature: float, seed: int) -> str:
        session = model.session()
        return "".join(session.generate(prompt, max_tokens=100, temperature=temperature, seed=seed))

    solo = [run(*job) for job in jobs]
    together: list[str] = ["", ""]

    def worker(i: int) -> None:
        together[i] = run(*jobs[i])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert together == solo


def test_tokenize_round_trip(model: flm.Model) -> None:
    ids = model.tokenize("Once upon a time")
    assert ids[0] == 1
    assert model.detokenize(ids) == "Once upon a time"


def test_errors_carry_the_library_message(model: flm.Model, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model.bin"
    # Each call, the status it fails with, and what its message says.
    cases = [
        (lambda: flm.Model(missing), flm.Status.IO, str(missing)),
        (lambda: model.detokenize([1, 100000]), flm.Status.TOKEN_OUT_OF_RANGE, "100000"),
        (
            lambda: list(model.session().generate("Hi", top_p=1.5)),
            flm.Status.INVALID_ARGUMENT,
            "top-p",
        ),
        (lambda: flm.Model(MODEL, device="tpu"), flm.Status.INVALID_ARGUMENT, "tpu"),
        (
            lambda: flm.Model(MODEL, activation_bits=12),
            flm.Status.INVALID_ARGUMENT,
            "activation_bits is 12",
        ),
        (lambda: flm.Model(MODEL, kv_dtype="int8"), flm.Status.INVALID_ARGUMENT, "kv_dtype"),
        (
            lambda: flm.Model(MODEL, device="cpu", gpu_layers=2),
            flm.Status.INVALID_ARGUMENT,
            "gpu_layers is 2, and no GPU runs the model",
        ),
    ]
    for call, status, needle in cases:
        with pytest.raises(flm.FlmError) as err:
            call()
        assert err.value.status == status, needle
        assert needle in err.value.message


def chat_model(dir: Path, template: str) -> Path:
    """A copy of tests/data/hf-stories260K in `dir` with `template` as its chat template."""
    shutil.copytree(DATA.parent / "hf-stories260K", dir, dirs_exist_ok=True)
    config = dir / "tokenizer_config.json"
    settings = json.loads(config.read_text())
    settings["chat_template"] = template
    config.write_text(json.dumps(settings))
    return dir


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory) -> flm.Model:
    template = (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text()
    with flm.Model(chat_model(tmp_path_factory.mktemp("qwen3"), template), threads=2) as m:
        yield m


def test_apply_chat_template_renders_what_transformers_renders(qwen3: flm.Model) -> None:
    refs = json.loads((TEMPLATES / "references.json").read_text())["cases"]
    cases = [c for c in refs if c["template"] == "Qwen-Qwen3-0.6B.jinja"]
    assert len(cases) >= 6 and any(c["kwargs"] for c in cases)
    for case in cases:
        text = qwen3.apply_chat_template(case["messages"], case["add_generation_prompt"],
                                         **case["kwargs"])
        assert text == case["text"], case
        ids = qwen3.tokenize_chat(case["messages"], case["add_generation_prompt"],
                                  **case["kwargs"])
        assert ids and qwen3.detokenize(ids) == text, case


def test_a_chat_reply_from_tokenize_chat_equals_flm_chat(qwen3: flm.Model, tmp_path: Path) -> None:
    messages = [{"role": "user", "content": "Hello"}]
    ids = qwen3.tokenize_chat(messages, enable_thinking=False)
    reply = "".join(qwen3.session().generate(ids, max_tokens=16, temperature=0))
    assert reply.strip()
    flm_bin = os.environ.get("FLM_BIN")
    if flm_bin:
        template = (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text()
        out = subprocess.run(
            [flm_bin, "chat", "--model", str(chat_model(tmp_path, template)),
             "--temperature", "0", "--max-tokens", "16",
             "--template-arg", "enable_thinking=false"],
            input=b"Hello\n", check=True, capture_output=True,
        )
        assert out.stdout.decode() == reply + "\n"


def test_generate_from_ids_equals_generate_from_text(model: flm.Model) -> None:
    prompt = "Once upon a time"
    ids = model.tokenize(prompt)
    from_ids = "".join(
        model.session().generate(ids, max_tokens=32, temperature=0, at_start=False)
    )
    assert from_ids == greedy(model.session(), prompt, 32) == reference("greedy_prompt")[16:]
    with pytest.raises(flm.FlmError) as err:
        list(model.session().generate([1, 100000]))
    assert err.value.status == flm.Status.TOKEN_OUT_OF_RANGE
    with pytest.raises(flm.FlmError) as err:
        list(model.session().generate([]))
    assert err.value.status == flm.Status.INVALID_ARGUMENT


def test_chat_errors(model: flm.Model, qwen3: flm.Model) -> None:
    hello = [{"role": "user", "content": "Hello"}]
    with pytest.raises(flm.FlmError) as err:
        model.apply_chat_template(hello)
    assert err.value.status == flm.Status.NO_CHAT_TEMPLATE
    assert "no chat template" in err.value.message
    with pytest.raises(flm.FlmError) as err:
        qwen3.tokenize_chat(hello, tools=[])
    assert err.value.status == flm.Status.INVALID_ARGUMENT
    assert "`tools`" in err.value.message
    with pytest.raises(TypeError):
        qwen3.apply_chat_template(hello, enable_thinking=object())
    with pytest.raises(TypeError):
        qwen3.apply_chat_template([{"role": "user"}])


def test_a_template_that_refuses_the_conversation_is_a_tokenizer_error(tmp_path: Path) -> None:
    refs = json.loads((TEMPLATES / "references.json").read_text())["cases"]
    refusals = [c for c in refs if c["template"] == "google-gemma-2-2b-it.jinja" and "error" in c]
    assert refusals
    template = (TEMPLATES / "google-gemma-2-2b-it.jinja").read_text()
    with flm.Model(chat_model(tmp_path, template), threads=1) as gemma:
        for case in refusals:
            with pytest.raises(flm.FlmError) as err:
                gemma.apply_chat_template(case["messages"], case["add_generation_prompt"])
            assert err.value.status == flm.Status.TOKENIZER
            assert case["error"] in err.value.message


def test_status_codes_are_the_headers() -> None:
    header = (Path(__file__).resolve().parents[2] / "include" / "flm.h").read_text()
    declared = {
        m.group(1): int(m.group(2)) for m in re.finditer(r"FLM_STATUS_(\w+) = (\d+),", header)
    }
    assert declared == {s.name: s.value for s in flm.Status}
    assert flm.Status.TOKENIZER == 11
    assert flm.Status.STATE == 12
    assert flm.Status.NO_CHAT_TEMPLATE == 13


def test_16_bit_activations_load_and_generate() -> None:
    # stories260K's weights are f32, which no activation rounding touches: the same text.
    with flm.Model(MODEL, threads=1, activation_bits=16) as m:
        assert greedy(m.session(), "Once upon a time", 32) == reference("greedy_prompt")[16:]


def test_f16_kv_cache_generates_the_reference() -> None:
    # Rounding stories260K's keys and values to f16 does not flip a greedy token here.
    with flm.Model(MODEL, threads=1, kv_dtype="f16") as m:
        assert greedy(m.session(), "Once upon a time", 32) == reference("greedy_prompt")[16:]


def test_version() -> None:
    assert flm.version().count(".") == 2
