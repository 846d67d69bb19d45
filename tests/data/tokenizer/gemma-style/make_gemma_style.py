"""Gemma-style `tokenizer.json` files and the ids Hugging Face `tokenizers` gives for test
texts, for flm's tokenizer/tests/gemma_style.rs.

Run from this folder: `python make_gemma_style.py`. The vocabulary and merges are those
of stories260K's SentencePiece model (`../../stories260K/tok512.model`, extracted by
transformers' `SentencePieceExtractor`); the pipeline is the one transformers'
`GemmaConverter` builds for Gemma's tokenizer.json: a `Replace(" ", "▁")` normaliser, a
`Split(" ", "merged_with_previous")` pre-tokenizer (a no-op after that normaliser: Gemma
runs BPE over the whole text), BPE with byte fallback, no prefix space. Three more files
keep the Split but drop the normaliser, one per delimiter behaviour, so that the split
itself is exercised. Writes `<name>.json` per pipeline and `cases.json`.
"""

import json
from pathlib import Path

import tokenizers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers.convert_slow_tokenizer import SentencePieceExtractor

HERE = Path(__file__).resolve().parent
TEXTS = [
    "Hello world",
    "Once upon a time, there was a little girl named Lily.",
    "  two  spaces and a trailing one ",
    "tabs\tand\nnew lines\n\n",
    "123 ünïcödé 😀 日本語",
    " leading space",
    "",
]


def build(normalize: bool, behavior: str) -> Tokenizer:
    extracted = SentencePieceExtractor(str(HERE / "../../stories260K/tok512.model")).extract(
        models.BPE
    )
    tok = Tokenizer(
        models.BPE(
            vocab=extracted["vocab"],
            merges=extracted["merges"],
            unk_token="<unk>",
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    if normalize:
        tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior)
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    return tok


def main():
    files = {
        "gemma": (True, "merged_with_previous"),
        "split-previous": (False, "merged_with_previous"),
        "split-next": (False, "merged_with_next"),
        "split-isolated": (False, "isolated"),
        "split-removed": (False, "removed"),
    }
    cases = dict(generator="make_gemma_style.py", tokenizers=tokenizers.__version__, files={})
    for name, (normalize, behavior) in files.items():
        tok = build(normalize, behavior)
        tok.save(str(HERE / f"{name}.json"))
        cases["files"][name] = [dict(text=t, ids=tok.encode(t).ids) for t in TEXTS]
    (HERE / "cases.json").write_text(json.dumps(cases, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
