"""flm: Python bindings of libflm, the C ABI of the flm LLM inference runtime.

>>> import flm
>>> with flm.Model("tests/data/stories260K/stories260K.bin") as model:  # doctest: +SKIP
...     text = "".join(model.session().generate("Once upon a time", temperature=0))

A `Model` holds the weights, the tokenizer and a thread pool; each `Session` has its own
KV cache, so several sessions of one model can generate at the same time on different
threads. `Session.generate` is an iterator of text pieces. Every failure raises
`FlmError` carrying the library's status and message.

A chat turn goes through the model's chat template, as `flm chat` takes it:

>>> messages = [{"role": "user", "content": "Hello"}]
>>> ids = model.tokenize_chat(messages, enable_thinking=False)  # doctest: +SKIP
>>> reply = "".join(model.session().generate(ids))  # doctest: +SKIP

(`Model.apply_chat_template` gives the same prompt as text, for display.)
"""

from __future__ import annotations

import ctypes
import json
import os
import queue
import threading
from typing import Any, Callable, Iterator, Mapping, Sequence, TypeVar

from ._lib import (
    PIECE_CALLBACK,
    ChatMessage,
    FlmError,
    ModelOptions,
    Sampling,
    Status,
    check,
    lib,
)

__all__ = ["FlmError", "Model", "Session", "Status", "version"]


def version() -> str:
    """The version of the loaded libflm."""
    return lib().flm_version().decode()


def _sized(call: Callable[[Any, int, Any], int], element: Any) -> ctypes.Array[Any]:
    """The counted result of `call(out, capacity, n)`, a libflm call that writes the size
    to `n` and the elements to `out` when they fit: a size query first, then a buffer of
    that many `element`s."""
    needed = ctypes.c_size_t()
    status = call(None, 0, ctypes.byref(needed))
    if status != Status.BUFFER_TOO_SMALL:
        check(status)
    out = (element * needed.value)()
    check(call(out, len(out), ctypes.byref(needed)))
    return out


_H = TypeVar("_H", bound="_Handle")


class _Handle:
    """An owned libflm handle, freed by `close()`, at the end of a `with` block, or when
    the object is collected."""

    _handle: ctypes.c_void_p | None = None
    _free = ""  # the libflm function that frees the handle

    def close(self) -> None:
        """Frees the handle (a model's sessions stay usable)."""
        if self._handle is not None:
            getattr(lib(), self._free)(self._handle)
            self._handle = None

    def __enter__(self: _H) -> _H:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


class Model(_Handle):
    """A model loaded by flm_model_load(): a llama2.c .bin, .flm, GGUF file or Hugging Face
    directory, with the tokenizer inside or beside it.

    threads: worker threads of the model's pool (0: one per core); device: "cpu", "cuda"
    (a usable CUDA GPU, else FlmError with status INVALID_ARGUMENT saying why) or "auto"
    (the GPU when one is usable); context: KV cache positions of each session (0: the
    model's, at most 4096); activation_bits: 8 (int8 activation blocks, as llama.cpp) or
    16 (their rounding residual too: the logits of unrounded activations, slower) for
    quantised weights on the CPU; kv_dtype: "f32", "f16" (half the bytes attention reads,
    each key and value rounded to the nearest f16) or "auto" (f16 for a cache on a GPU, f32
    in host memory, where the sessions' caches live) for the KV cache; gpu_layers: how many
    of the model's first layers live in the GPU's memory ("auto": as many as it holds;
    0: none, the GPU running their ops from host memory; a count above 0 without a GPU
    raises FlmError with status INVALID_ARGUMENT).
    Raises FlmError (status IO for a missing file, FORMAT for a malformed one...).
    """

    _free = "flm_model_free"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        threads: int = 0,
        device: str = "auto",
        context: int = 0,
        activation_bits: int = 8,
        kv_dtype: str = "auto",
        gpu_layers: int | str = "auto",
    ) -> None:
        self._handle: ctypes.c_void_p | None = None
        options = ModelOptions(threads, device.encode(), context, activation_bits,
                               kv_dtype.encode(), str(gpu_layers).encode())
        handle = ctypes.c_void_p()
        check(lib().flm_model_load(os.fsencode(path), ctypes.byref(options), ctypes.byref(handle)))
        self._handle = handle

    def _live(self) -> ctypes.c_void_p:
        if self._handle is None:
            raise ValueError("the model is closed")
        return self._handle

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        """The token ids of `text`, with the begin-of-sequence id first if `add_bos`.
        Raises FlmError (TOKENIZER for a text the tokenizer cannot cut)."""
        data = text.encode()
        ids = _sized(lambda out, capacity, n: lib().flm_tokenize(
            self._live(), data, len(data), add_bos, out, capacity, n), ctypes.c_uint32)
        return list(ids)

    def detokenize(self, ids: Sequence[int]) -> str:
        """The text of `ids` (SentencePiece decoding). Raises FlmError with status
        TOKEN_OUT_OF_RANGE for an id outside the vocabulary."""
        array = (ctypes.c_uint32 * len(ids))(*ids)
        text = _sized(lambda out, capacity, n: lib().flm_detokenize(
            self._live(), array, len(ids), out, capacity, n), ctypes.c_char)
        return text.raw.decode()

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, str]],
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> str:
        """The conversation `messages` (dicts with a "role" and a "content" string, oldest
        first) rendered by the model's chat template, as `flm chat` and `flm serve` build
        their prompts: the Jinja template of the model's files as transformers'
        `apply_chat_template(messages, tokenize=False, add_generation_prompt=...,
        **template_kwargs)` renders it, or the built-in ChatGLM format. With
        `add_generation_prompt` the prompt ends where the assistant's reply starts.
        `template_kwargs` are the template's variables (such as `enable_thinking=False` for
        Qwen3), any JSON-serialisable values.

        Special tokens are spelled out in the text: it is for display; generate from the
        ids of `tokenize_chat`, which `tokenize` of the text does not always give.

        Raises FlmError: NO_CHAT_TEMPLATE (the model has none), TOKENIZER (the template
        refused the conversation, such as Gemma's `raise_exception` for a system turn),
        INVALID_ARGUMENT (a keyword argument `tools`, which the conversation sets);
        TypeError for a value that is not JSON or a message that is not such a dict.
        """
        text = self._chat(lib().flm_apply_chat_template, ctypes.c_char, messages,
                          add_generation_prompt, template_kwargs)
        return bytes(text).decode()

    def tokenize_chat(
        self,
        messages: Sequence[Mapping[str, str]],
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> list[int]:
        """The token ids of the prompt of `apply_chat_template` (same arguments): the ids
        `flm chat` and `flm serve` feed the model, BOS or ChatGLM's prefix included where
        the template or format writes one. `Session.generate(ids)` generates the reply.
        Raises as `apply_chat_template`, and FlmError with status TOKENIZER for a prompt
        the tokenizer cannot cut."""
        ids = self._chat(lib().flm_tokenize_chat, ctypes.c_uint32, messages,
                         add_generation_prompt, template_kwargs)
        return list(ids)

    def _chat(
        self,
        fn: Any,
        element: Any,
        messages: Sequence[Mapping[str, str]],
        add_generation_prompt: bool,
        template_kwargs: dict[str, Any],
    ) -> ctypes.Array[Any]:
        """Calls the chat function `fn` with a size query, then a buffer of `element`s."""
        texts = []
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping) or not all(
                isinstance(m.get(k), str) for k in ("role", "content")
            ):
                raise TypeError(f"messages[{i}] is not a dict with a 'role' and a 'content' "
                                f"string: {m!r}")
            texts.append((m["role"].encode(), m["content"].encode()))
        array = (ChatMessage * len(texts))(
            *(ChatMessage(role, len(role), content, len(content)) for role, content in texts)
        )
        args = json.dumps(template_kwargs, allow_nan=False).encode() if template_kwargs else b""
        return _sized(lambda out, capacity, n: fn(
            self._live(), array, len(texts), add_generation_prompt, args, len(args), out,
            capacity, n), element)

    def session(self) -> Session:
        """A new session of this model, with its own KV cache."""
        return Session(self)


class Session(_Handle):
    """A generation session (flm_session_new): its own KV cache over a model's weights.
    Use one session from one thread at a time."""

    _free = "flm_session_free"

    def __init__(self, model: Model) -> None:
        self._handle: ctypes.c_void_p | None = None
        handle = ctypes.c_void_p()
        check(lib().flm_session_new(model._live(), ctypes.byref(handle)))
        self._handle = handle
        self._busy = threading.Lock()

    def generate(
        self,
        prompt: str | Sequence[int],
        *,
        max_tokens: int = 256,
        temperature: float = 0.8,
        top_k: int = 40,
        top_p: float = 0.95,
        repeat_penalty: float = 1.0,
        seed: int = 0,
        at_start: bool = True,
    ) -> Iterator[str]:
        """Generates a continuation of `prompt` (the prompt is not repeated), yielding the
        text piece by piece as `flm run` prints it. Stops at end-of-sequence, after
        `max_tokens`, when the context is full, or when the iterator is closed (leaving a
        `for` loop early). temperature 0 is greedy. The session keeps its KV cache between
        calls: only the part of `prompt` after what it shares with the previous prompt and
        reply is prefilled (multi-turn chat). Raises FlmError (INVALID_ARGUMENT for
        bad sampling parameters, CONTEXT_OVERFLOW for a prompt that fills the context,
        TOKENIZER for a prompt the tokenizer cannot cut).

        `prompt` is a text, encoded with BOS (flm_generate), or token ids from position 0
        to which nothing is added (flm_generate_tokens), such as those of
        `Model.tokenize_chat` for a chat reply. For ids, `at_start` decodes the reply as
        the start of a text, as `flm chat` prints it (the leading space of its first piece
        dropped); pass False to continue a text's ids. Ids raise FlmError with status
        TOKEN_OUT_OF_RANGE for an id outside the vocabulary, INVALID_ARGUMENT for none.
        """
        if self._handle is None:
            raise ValueError("the session is closed")
        sampling = Sampling(temperature, top_k, top_p, repeat_penalty, seed)
        if isinstance(prompt, str):
            data, ids = prompt.encode(), None
        else:
            data, ids = b"", (ctypes.c_uint32 * len(prompt))(*prompt)
        pieces: queue.Queue[tuple[str, object]] = queue.Queue()
        stop = threading.Event()
        handle = self._handle

        def on_piece(piece: ctypes.Array[ctypes.c_char], length: int, _: object) -> int:
            pieces.put(("piece", ctypes.string_at(piece, length).decode()))
            return 1 if stop.is_set() else 0

        callback = PIECE_CALLBACK(on_piece)

        def run() -> None:
            try:
                if ids is None:
                    status = lib().flm_generate(handle, data, len(data),
                                                ctypes.byref(sampling), max_tokens, callback,
                                                None, None)
                else:
                    status = lib().flm_generate_tokens(handle, ids, len(ids), at_start,
                                                       ctypes.byref(sampling), max_tokens,
                                                       callback, None, None)
                check(status)
                pieces.put(("done", None))
            except BaseException as error:  # handed to the consuming thread
                pieces.put(("error", error))

        if not self._busy.acquire(blocking=False):
            raise RuntimeError("the session is already generating; use another session")
        worker = threading.Thread(target=run, name="flm-generate", daemon=True)
        worker.start()
        try:
            while True:
                kind, value = pieces.get()
                if kind == "piece":
                    yield str(value)
                elif kind == "error":
                    raise value  # type: ignore[misc]
                else:
                    return
        finally:
            stop.set()
            worker.join()
            self._busy.release()
