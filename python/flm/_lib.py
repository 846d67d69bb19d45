"""Loading libflm and declaring the C functions of include/flm.h for ctypes."""

from __future__ import annotations

import ctypes
import ctypes.util
import enum
import os
import sys
from pathlib import Path


class Status(enum.IntEnum):
    """The FlmStatus codes of include/flm.h."""

    OK = 0
    STOPPED = 1
    NULL_POINTER = 2
    INVALID_UTF8 = 3
    INVALID_ARGUMENT = 4
    TOKEN_OUT_OF_RANGE = 5
    BUFFER_TOO_SMALL = 6
    IO = 7
    FORMAT = 8
    CONTEXT_OVERFLOW = 9
    INTERNAL = 10
    TOKENIZER = 11
    STATE = 12
    NO_CHAT_TEMPLATE = 13


class FlmError(Exception):
    """A call to libflm failed: `status` is its FlmStatus, the message flm_last_error()."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def __str__(self) -> str:
        return f"{self.message} ({self.status.name})"


class ModelOptions(ctypes.Structure):
    _fields_ = [
        ("threads", ctypes.c_size_t),
        ("device", ctypes.c_char_p),
        ("context", ctypes.c_size_t),
        ("activation_bits", ctypes.c_uint32),
        ("kv_dtype", ctypes.c_char_p),
        ("gpu_layers", ctypes.c_char_p),
    ]


class Sampling(ctypes.Structure):
    _fields_ = [
        ("temperature", ctypes.c_float),
        ("top_k", ctypes.c_size_t),
        ("top_p", ctypes.c_float),
        ("repeat_penalty", ctypes.c_float),
        ("seed", ctypes.c_uint64),
    ]


class ChatMessage(ctypes.Structure):
    _fields_ = [
        ("role", ctypes.c_char_p),
        ("role_len", ctypes.c_size_t),
        ("content", ctypes.c_char_p),
        ("content_len", ctypes.c_size_t),
    ]


PIECE_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_char), ctypes.c_size_t, ctypes.c_void_p
)


def _library_path() -> str:
    explicit = os.environ.get("FLM_LIBRARY")
    if explicit:
        return explicit
    name = "libflm.dylib" if sys.platform == "darwin" else "libflm.so"
    beside = Path(__file__).with_name(name)
    if beside.is_file():
        return str(beside)
    found = ctypes.util.find_library("flm")
    if found is None:
        raise OSError(
            "libflm not found: `pip install ./python` builds and bundles it; or set "
            "FLM_LIBRARY to the path of libflm.so (cargo build --release -p flm-capi)"
        )
    return found


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    status = ctypes.c_int
    p = ctypes.POINTER
    size_p = p(ctypes.c_size_t)
    signatures = {
        "flm_version": (ctypes.c_char_p, []),
        "flm_last_error": (ctypes.c_char_p, []),
        "flm_model_load": (status, [ctypes.c_char_p, p(ModelOptions), p(ctypes.c_void_p)]),
        "flm_model_free": (None, [ctypes.c_void_p]),
        "flm_tokenize": (
            status,
            [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_bool,
             p(ctypes.c_uint32), ctypes.c_size_t, size_p],
        ),
        "flm_detokenize": (
            status,
            [ctypes.c_void_p, p(ctypes.c_uint32), ctypes.c_size_t, ctypes.c_char_p,
             ctypes.c_size_t, size_p],
        ),
        "flm_apply_chat_template": (
            status,
            [ctypes.c_void_p, p(ChatMessage), ctypes.c_size_t, ctypes.c_bool, ctypes.c_char_p,
             ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t, size_p],
        ),
        "flm_tokenize_chat": (
            status,
            [ctypes.c_void_p, p(ChatMessage), ctypes.c_size_t, ctypes.c_bool, ctypes.c_char_p,
             ctypes.c_size_t, p(ctypes.c_uint32), ctypes.c_size_t, size_p],
        ),
        "flm_session_new": (status, [ctypes.c_void_p, p(ctypes.c_void_p)]),
        "flm_session_free": (None, [ctypes.c_void_p]),
        "flm_generate": (
            status,
            [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, p(Sampling), ctypes.c_size_t,
             PIECE_CALLBACK, ctypes.c_void_p, size_p],
        ),
        "flm_generate_tokens": (
            status,
            [ctypes.c_void_p, p(ctypes.c_uint32), ctypes.c_size_t, ctypes.c_bool, p(Sampling),
             ctypes.c_size_t, PIECE_CALLBACK, ctypes.c_void_p, size_p],
        ),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


_LIB: ctypes.CDLL | None = None


def lib() -> ctypes.CDLL:
    """The loaded libflm, with its functions declared (loaded on first use)."""
    global _LIB
    if _LIB is None:
        _LIB = _declare(ctypes.CDLL(_library_path()))
    return _LIB


def check(status: int) -> Status:
    """Raises FlmError with flm_last_error() for an error status; returns the status
    otherwise (OK or STOPPED). Call it on the thread that made the call."""
    status = Status(status)
    if status in (Status.OK, Status.STOPPED):
        return status
    message = lib().flm_last_error().decode("utf-8", errors="replace")
    raise FlmError(status, message)
