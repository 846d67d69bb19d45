"""Adds llama.cpp's ids to cases.json: `llama-tokenize` (llama.cpp vendored in
llama-cpp-python 0.3.36, built with `cmake --build build --target llama-tokenize`) on
o200k-harmony-16k.gguf for every case, special tokens parsed (its default for this tool), no BOS
(the GGUF's `add_bos_token` is false), the text read from a file as it is (`--no-escape`).
Records them as `cut.llama_cpp` beside the ids of `tokenizers`.

    /work/hfenv/bin/python tests/data/tokenizer/o200k-harmony/llama_cpp_refs.py \
        /work/ext/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-tokenize
"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
tool = sys.argv[1]
cases_file = HERE / "cases.json"
doc = json.loads(cases_file.read_text("utf-8"))
with tempfile.TemporaryDirectory() as tmp:
    for case in doc["cases"]:
        text_file = Path(tmp) / "text"
        text_file.write_bytes(case["text"].encode("utf-8"))
        out = subprocess.run(
            [tool, "-m", str(HERE / "o200k-harmony-16k.gguf"), "-f", str(text_file), "--ids",
             "--no-escape", "--log-disable"],
            check=True, capture_output=True, text=True,
        ).stdout
        case["cut"]["llama_cpp"] = json.loads(out.strip().splitlines()[-1])
same = sum(c["cut"]["llama_cpp"] == c["cut"]["ids"] for c in doc["cases"])
print(f"llama.cpp equals tokenizers on {same} of {len(doc['cases'])} cases")
cases_file.write_text(json.dumps(doc, ensure_ascii=False, indent=0) + "\n", "utf-8")
