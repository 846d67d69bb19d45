"""The real `openai` client against `flm serve`: chat and completions, whole and streamed.

Greedy completions are checked against llama2.c's reference text for stories260K
(tests/data/stories260K/stories260K_reference.json); a streamed reply must concatenate to
the whole one.
"""

import json
import os
import subprocess

import openai
import pytest

from conftest import MODEL_NAME, REPO

REFERENCE = json.loads((REPO / "tests/data/stories260K/stories260K_reference.json").read_text())


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)


def test_models(client):
    assert [m.id for m in client.models.list()] == [MODEL_NAME]


def test_completion_is_llama2c_greedy(client):
    expected = REFERENCE["greedy_prompt"]
    reply = client.completions.create(
        model=MODEL_NAME,
        prompt=expected["prompt"],
        max_tokens=expected["max_new_tokens"],
        temperature=0,
    )
    choice = reply.choices[0]
    assert expected["prompt"] + choice.text == expected["output_text"]
    assert choice.finish_reason == "length"
    assert reply.usage.prompt_tokens == len(expected["input_ids"])
    assert reply.usage.completion_tokens == expected["max_new_tokens"]


def test_streamed_completion_equals_whole(client):
    expected = REFERENCE["greedy_from_bos"]
    stream = client.completions.create(
        model=MODEL_NAME,
        prompt="",
        max_tokens=200,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == expected["output_text"]
    assert chunks[-1].usage.completion_tokens == 200
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_chat_whole_and_streamed(client, chat_model_dir):
    messages = [
        {"role": "system", "content": "A story."},
        {"role": "user", "content": "Tell me about Lily."},
    ]
    whole = client.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_tokens=40, temperature=0
    )
    choice = whole.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content
    # `flm chat` (one sequence, its own KV cache, no engine) gives the same greedy reply.
    chat = subprocess.run(
        [os.environ["FLM_BIN"], "chat", "--model", str(chat_model_dir), "--system",
         "A story.", "--temperature", "0", "--max-tokens", "40"],
        input="Tell me about Lily.\n", capture_output=True, text=True, check=True,
    )
    assert chat.stdout == choice.message.content + "\n"
    assert choice.finish_reason in ("stop", "length")
    assert 0 < whole.usage.completion_tokens <= 40
    assert whole.object == "chat.completion"

    stream = client.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_tokens=40, temperature=0, stream=True
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == choice.message.content
    assert chunks[-1].choices[0].finish_reason == choice.finish_reason


def test_sampling_parameters(client):
    def sample(seed):
        return client.chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": "Once upon a time"}],
            max_tokens=30,
            temperature=1.0,
            top_p=0.9,
            presence_penalty=0.5,
            frequency_penalty=0.5,
            seed=seed,
        ).choices[0].message.content

    assert sample(7) == sample(7)
    texts = {sample(seed) for seed in range(4)}
    assert len(texts) > 1


def test_stop_sequence(client):
    reply = client.completions.create(
        model=MODEL_NAME, prompt="", max_tokens=100, temperature=0, stop=[" Lily"]
    )
    text = REFERENCE["greedy_from_bos"]["output_text"]
    assert reply.choices[0].text == text[: text.index(" Lily")]
    assert reply.choices[0].finish_reason == "stop"


def test_bad_request_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], temperature=5
        )
    assert error.value.param == "temperature"
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(model=MODEL_NAME, prompt="Lily " * 600, max_tokens=8)
    assert error.value.code == "context_length_exceeded"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="hi")
