"""A `flm serve` process for the Python tests of the server.

The binary is `$FLM_BIN` (`.ci/run` builds it). The model is the repository's stories260K
in Hugging Face layout (tests/data/hf-stories260K), copied with a Jinja `chat_template`
added to its tokenizer_config.json, since stories260K has none of its own (the same
template as tools/flm/tests/chat.rs gives `flm chat`).
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[4]
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}"
    "User: {{ m.content }}\n{% elif m.role == 'system' %}{{ m.content }}\n{% else %}"
    "Bot: {{ m.content }}\n{% endif %}{% endfor %}{% if add_generation_prompt %}Bot:{% endif %}"
)
MODEL_NAME = "stories260K"


def chat_model(directory: Path) -> Path:
    """A copy of hf-stories260K whose tokenizer_config.json has TEMPLATE."""
    model = directory / MODEL_NAME
    shutil.copytree(REPO / "tests/data/hf-stories260K", model)
    config_path = model / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = TEMPLATE
    config_path.write_text(json.dumps(config))
    return model


@pytest.fixture(scope="session")
def chat_model_dir(tmp_path_factory):
    """stories260K with a chat template."""
    return chat_model(tmp_path_factory.mktemp("model"))


def serve(model: Path):
    """Starts `flm serve` on `model`; yields its base URL and stops it at the end."""
    binary = os.environ.get("FLM_BIN")
    if not binary:
        pytest.fail("set FLM_BIN to the flm binary (cargo build -p flm-cli)")
    process = subprocess.Popen(
        [binary, "serve", "--model", str(model), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        for line in process.stdout:
            if line.startswith("flm serve: listening on "):
                url = line.removeprefix("flm serve: listening on ").strip()
                break
        else:
            pytest.fail(f"flm serve exited with status {process.wait()} before listening")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture(scope="session")
def server(chat_model_dir):
    """The base URL of a running `flm serve` of stories260K with a chat template."""
    yield from serve(chat_model_dir)


@pytest.fixture(scope="session")
def tools_server():
    """The base URL of a running `flm serve` of tests/data/qwen2-tools, a tiny random Qwen2
    whose chat template takes tools (tools/serve/make_tiny_qwen2_tools.py)."""
    yield from serve(REPO / "tests/data/qwen2-tools")
