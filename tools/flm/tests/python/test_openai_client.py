"""The real `openai` client against `flm serve`: chat and completions, whole and streamed.

Greedy completions are checked against llama2.c's reference text for stories260K
(tests/data/stories260K/stories260K_reference.json); a streamed reply must concatenate to
the whole one.
"""

import base64
import json
import os
import re
import struct
import subprocess

import jsonschema
import openai
import pytest

from conftest import MODEL_NAME, REPO

REFERENCE = json.loads((REPO / "tests/data/stories260K/stories260K_reference.json").read_text())


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)


def test_models(client):
    models = list(client.models.list())
    assert [m.id for m in models] == [MODEL_NAME]
    # stories260K's config.json: 512 positions.
    assert models[0].max_model_len == 512


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


def test_chat_template_kwargs_through_extra_body(client):
    # The client sends extra_body's fields in the request, as vLLM's docs use it; the test
    # template has no variable of that name, so the reply is the one without it.
    messages = [{"role": "user", "content": "Tell me about Lily."}]
    plain = client.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_tokens=8, temperature=0
    )
    given = client.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_tokens=8, temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert given.choices[0].message.content == plain.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(
            model=MODEL_NAME, messages=messages, max_tokens=8,
            extra_body={"chat_template_kwargs": ["enable_thinking", False]},
        )
    assert error.value.param == "chat_template_kwargs"


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


def test_n_choices_whole_and_streamed(client):
    expected = REFERENCE["greedy_prompt"]
    greedy = client.completions.create(
        model=MODEL_NAME, prompt=expected["prompt"], max_tokens=20, temperature=0, n=3
    )
    assert [c.index for c in greedy.choices] == [0, 1, 2]
    assert all(expected["output_text"].startswith(expected["prompt"] + c.text)
               for c in greedy.choices)
    assert greedy.usage.prompt_tokens == len(expected["input_ids"])
    assert greedy.usage.completion_tokens == 60

    def sampled(stream):
        return client.chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": "Once upon a time"}],
            max_tokens=24, temperature=1.0, seed=3, n=4, stream=stream,
        )

    whole = sampled(False)
    texts = [c.message.content for c in whole.choices]
    assert len(set(texts)) > 1, "each choice has a seed of its own"
    streamed = ["", "", "", ""]
    finished = set()
    for chunk in sampled(True):
        for c in chunk.choices:
            streamed[c.index] += c.delta.content or ""
            if c.finish_reason:
                finished.add(c.index)
    assert streamed == texts
    assert finished == {0, 1, 2, 3}


def test_chat_logprobs(client):
    messages = [{"role": "user", "content": "Tell me about Lily."}]
    whole = client.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_tokens=16, temperature=0,
        logprobs=True, top_logprobs=3,
    )
    choice = whole.choices[0]
    content = choice.logprobs.content
    assert len(content) == whole.usage.completion_tokens
    for t in content:
        # Greedy: the chosen token is the most likely one.
        assert len(t.top_logprobs) == 3
        assert (t.top_logprobs[0].token, t.top_logprobs[0].logprob) == (t.token, t.logprob)
        assert t.logprob <= 0
        assert bytes(t.bytes).decode() == t.token
    assert "".join(t.token for t in content).strip() == choice.message.content.strip()
    stream = client.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_tokens=16, temperature=0,
        logprobs=True, top_logprobs=3, stream=True,
    )
    streamed = [t for c in stream if c.choices and c.choices[0].logprobs
                for t in c.choices[0].logprobs.content]
    assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in content]
    plain = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=4)
    assert plain.choices[0].logprobs is None


def test_completion_logprobs_and_echo(client):
    expected = REFERENCE["greedy_prompt"]
    reply = client.completions.create(
        model=MODEL_NAME, prompt=expected["prompt"], max_tokens=12, temperature=0, logprobs=2
    )
    choice = reply.choices[0]
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 12
    assert "".join(lp.tokens) == choice.text
    assert lp.text_offset[0] == 0
    assert all(len(top) <= 2 and max(top.values()) == p
               for top, p in zip(lp.top_logprobs, lp.token_logprobs))
    echoed = client.completions.create(
        model=MODEL_NAME, prompt=expected["prompt"], max_tokens=12, temperature=0, echo=True
    )
    assert echoed.choices[0].text == expected["prompt"] + choice.text
    stream = client.completions.create(
        model=MODEL_NAME, prompt=expected["prompt"], max_tokens=12, temperature=0, echo=True,
        stream=True,
    )
    assert "".join(c.choices[0].text for c in stream if c.choices) == echoed.choices[0].text


def test_new_bad_inputs_are_400s(client):
    for kwargs, param in [
        ({"n": 0}, "n"),
        ({"logprobs": 21}, "logprobs"),
        ({"logprobs": 1, "echo": True}, "echo"),
    ]:
        with pytest.raises(openai.BadRequestError) as error:
            client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=4, **kwargs)
        assert error.value.param == param, kwargs
        assert error.value.message
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], top_logprobs=2
        )
    assert error.value.param == "top_logprobs"


def test_embeddings_equal_transformers(client):
    # tests/data/stories260K/embeddings_reference.json: transformers' last_hidden_state,
    # pooled and normalised (tools/serve/make_embeddings_reference.py); without a
    # 1_Pooling/config.json, flm serve pools the last token.
    reference = json.loads(
        (REPO / "tests/data/stories260K/embeddings_reference.json").read_text())
    # Without encoding_format the client asks for base64 and decodes it.
    for encoding in ({}, {"encoding_format": "float"}):
        reply = client.embeddings.create(model=MODEL_NAME, input=reference["inputs"], **encoding)
        assert [d.index for d in reply.data] == [0, 1, 2]
        for got, want in zip(reply.data, reference["last"]):
            assert len(got.embedding) == len(want) == 64
            assert max(abs(g - w) for g, w in zip(got.embedding, want)) < 1e-4
        assert reply.usage.prompt_tokens == sum(len(i) for i in reference["inputs"])
    text = client.embeddings.create(model=MODEL_NAME, input="Once upon a time")
    assert len(text.data[0].embedding) == 64
    raw = client.embeddings.create(
        model=MODEL_NAME, input="Once upon a time", encoding_format="base64")
    floats = struct.unpack("<64f", base64.b64decode(raw.data[0].embedding))
    assert max(abs(a - b) for a, b in zip(floats, text.data[0].embedding)) < 1e-6
    with pytest.raises(openai.BadRequestError) as error:
        client.embeddings.create(model=MODEL_NAME, input=[[]])
    assert error.value.param == "input"
    with pytest.raises(openai.BadRequestError) as error:
        client.embeddings.create(model=MODEL_NAME, input="hi", dimensions=8)
    assert error.value.param == "dimensions"


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0},
        "happy": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
        "color": {"enum": ["red", "green", "blue"]},
        "pet": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {
            "kind": {"type": "string"}, "legs": {"type": "number"}}}]},
    },
    "required": ["name", "age", "happy", "tags", "color", "pet"],
}


def test_fifty_schema_constrained_replies_parse_and_validate(client):
    # stories260K writes stories, not JSON: every reply is JSON only by the constraint.
    replies = []
    for seed in range(5):
        reply = client.chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": "Tell me about Lily."}],
            max_tokens=400, temperature=1.0, seed=seed, n=10,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "person", "schema": PERSON}},
        )
        replies += [c.message.content for c in reply.choices]
        assert all(c.finish_reason == "stop" for c in reply.choices)
    assert len(replies) == 50
    for text in replies:
        jsonschema.validate(json.loads(text), PERSON)
    assert len(set(replies)) > 1


def test_json_object_replies_parse(client):
    reply = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "Once upon a time"}],
        max_tokens=400, temperature=1.0, seed=1, n=10,
        response_format={"type": "json_object"},
    )
    for choice in reply.choices:
        assert isinstance(json.loads(choice.message.content), dict), choice.message.content


def test_bad_response_formats_are_400s(client):
    for response_format in [
        {"type": "xml"},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/a"}}},
    ]:
        with pytest.raises(openai.BadRequestError) as error:
            client.chat.completions.create(
                model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}],
                response_format=response_format,
            )
        assert error.value.param == "response_format"
        assert error.value.message


def test_regex_constrained_replies_match(client):
    pattern = r"(yes|no), [a-z]{3,8} [0-9]{1,3}!"
    reply = client.completions.create(
        model=MODEL_NAME, prompt="Once upon a time", max_tokens=60, temperature=1.0, seed=4,
        n=10, extra_body={"response_format": {"type": "regex", "regex": pattern}},
    )
    for choice in reply.choices:
        assert re.fullmatch(pattern, choice.text), choice.text
        assert choice.finish_reason == "stop"
