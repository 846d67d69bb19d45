"""Tool calls through the real `openai` client, on tests/data/qwen2-tools: a tiny random
Qwen2 whose chat template renders `tools`, `tool_calls` and `tool` messages. Its weights are
random, so only the mechanics are checked: a forced call parses and validates, the call and
its result go back through the template, and bad tools are 400s."""

import json

import jsonschema
import openai
import pytest

MODEL = "qwen2-tools"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20},
                           "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string"}}}}}


@pytest.fixture(scope="module")
def client(tools_server):
    return openai.OpenAI(base_url=f"{tools_server}/v1", api_key="unused", max_retries=0)


def test_forced_call_round_trip(client):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    reply = client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER, TIME], tool_choice="required",
        max_tokens=200, temperature=0.8, seed=1,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.id
    assert call.function.name in ("get_weather", "get_time")
    arguments = json.loads(call.function.arguments)
    schema = WEATHER if call.function.name == "get_weather" else TIME
    jsonschema.validate(arguments, schema["function"]["parameters"])
    # The call and its result go back through the template; the next reply is text.
    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"})
    answer = client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER, TIME], tool_choice="none",
        max_tokens=8, temperature=0,
    )
    assert answer.choices[0].message.tool_calls is None
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert answer.usage.prompt_tokens > reply.usage.prompt_tokens


def test_named_call_whole_and_streamed(client):
    kwargs = dict(
        model=MODEL, messages=[{"role": "user", "content": "Weather?"}], tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=200, temperature=0,
    )
    whole = client.chat.completions.create(**kwargs).choices[0]
    assert [c.function.name for c in whole.message.tool_calls] == ["get_weather"]
    deltas = [c.choices[0] for c in client.chat.completions.create(stream=True, **kwargs)
              if c.choices]
    calls = [t for d in deltas for t in (d.delta.tool_calls or [])]
    assert [(t.index, t.function.name, t.function.arguments) for t in calls] == \
        [(0, "get_weather", whole.message.tool_calls[0].function.arguments)]
    assert deltas[-1].finish_reason == "tool_calls"


def test_bad_tools_are_400s(client):
    messages = [{"role": "user", "content": "hi"}]
    for kwargs, param in [
        ({"tools": [WEATHER], "tool_choice": {"type": "function",
                                              "function": {"name": "get_news"}}}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"$ref": "#/x"}}}}}],
          "tool_choice": "required"}, "tools"),
    ]:
        with pytest.raises(openai.BadRequestError) as error:
            client.chat.completions.create(model=MODEL, messages=messages, **kwargs)
        assert error.value.param == param, kwargs
        assert error.value.message
