#!/usr/bin/env python3
"""Runs every command of README.md, as a user would, so that the guide cannot drift.

Each ```sh block of README.md is one bash script (``set -eo pipefail``), run from the
repository root with ``flm`` on the PATH as ``target/release/flm`` (the README says so) and
a line of text on standard input (what ``flm chat`` reads as a user's turn). Fenced blocks
of another kind (``text``: the commands' synopses) are not commands.

Rules, each printed where it applies:
- ``cargo test --workspace`` is not run: it is the test command that .ci/run runs just
  before this script.
- A block that builds with ``--features cuda`` runs only where ``nvidia-smi -L`` lists a
  GPU.
- ``mpirun`` runs as CI's user, root, which Open MPI refuses unless told
  (``OMPI_ALLOW_RUN_AS_ROOT``); a user's shell needs no such variable.
- ``path/to/NAME`` stands for a checkpoint the reader downloads; PLACEHOLDERS maps each to
  a small checkpoint of the same kind in tests/data. A placeholder without an entry fails.

Files and directories the commands create at the repository root (``base.kld``, ``app``,
``.venv``...) and ``/tmp/smollm2`` are removed afterwards, unless they were there before.

Exit status: 0 when every block that ran exited 0; 1 otherwise, naming each failure.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

# The checkpoint a placeholder names, and the one of tests/data that stands for it.
PLACEHOLDERS = {
    # A tiny Qwen2 with Qwen2's chat template (tests/data/SOURCES.md).
    "path/to/Qwen2-0.5B-Instruct": "tests/data/qwen2-tools",
    # A Hugging Face Llama directory: stories260K as safetensors.
    "path/to/TinyLlama-1.1B": "tests/data/hf-stories260K",
}
# What a user types to `flm chat`, and to any other command that reads its input.
STDIN = "Tell me a story.\n"
# The longest a block may take: the release builds of a fresh clone on 2 cores.
BLOCK_TIMEOUT_S = 40 * 60
# Paths outside the repository that the commands create.
OUTSIDE = [Path("/tmp/smollm2")]


def blocks(text):
    """The ```sh blocks of `text`, as (line number of the fence, body)."""
    found, body, start = [], None, 0
    for n, line in enumerate(text.splitlines(), 1):
        fence = re.match(r"^```(\S*)\s*$", line)
        if fence and body is None:
            body, start, kind = [], n, fence.group(1)
        elif line.startswith("```") and body is not None:
            if kind == "sh":
                found.append((start, "\n".join(body)))
            body = None
        elif body is not None:
            body.append(line)
    if body is not None:
        sys.exit(f"README.md: the block at line {start} is not closed")
    return found


def commands(body):
    """The commands of a block: its lines joined across `\\` continuations, without
    comments and blank lines."""
    out, pending = [], ""
    for line in body.splitlines():
        s = line.strip()
        if s.endswith("\\"):
            pending += s[:-1].strip() + " "
            continue
        full, pending = (pending + s).strip(), ""
        if full and not full.startswith("#"):
            out.append(full)
    return out


def has_gpu():
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0
    except OSError:
        return False


def main():
    text = README.read_text()
    unknown = sorted(set(re.findall(r"path/to/[\w.\-]+", text)) - set(PLACEHOLDERS))
    if unknown:
        sys.exit(f"README.md: no stand-in for {', '.join(unknown)} in PLACEHOLDERS")
    before = set(os.listdir(ROOT))
    outside_before = {p for p in OUTSIDE if p.exists()}
    bin_dir = Path(tempfile.mkdtemp(prefix="flm-readme-"))
    (bin_dir / "flm").symlink_to(ROOT / "target" / "release" / "flm")
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    gpu = has_gpu()
    ran, skipped, failed = 0, 0, []
    try:
        for line, body in blocks(text):
            cmds = commands(body)
            if "--features cuda" in body and not gpu:
                print(f"README.md:{line}: skipped ({len(cmds)} commands): no GPU")
                skipped += len(cmds)
                continue
            script = []
            for cmd in body.splitlines():
                if cmd.strip() == "cargo test --workspace":
                    print(f"README.md:{line}: `cargo test --workspace` is .ci/run's own step")
                    skipped += 1
                    continue
                for placeholder, stand_in in PLACEHOLDERS.items():
                    cmd = cmd.replace(placeholder, stand_in)
                script.append(cmd)
            todo = [c for c in cmds if c != "cargo test --workspace"]
            print(f"== README.md:{line}: {len(todo)} commands", flush=True)
            for c in todo:
                print(f"   $ {c}")
            started = time.monotonic()
            # Background jobs (`flm serve &`) end with the block.
            prologue = "set -eo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n"
            try:
                status = subprocess.run(
                    ["bash", "-c", prologue + "\n".join(script)],
                    cwd=ROOT,
                    env=env,
                    input=STDIN,
                    text=True,
                    timeout=BLOCK_TIMEOUT_S,
                ).returncode
            except subprocess.TimeoutExpired:
                status = "timed out"
            took = time.monotonic() - started
            # On a line of its own: a command's output may not end with a newline (curl's).
            print(f"\n== README.md:{line}: exit {status} in {took:.0f} s", flush=True)
            ran += len(todo)
            if status != 0:
                failed.append(f"README.md:{line} (exit {status})")
    finally:
        shutil.rmtree(bin_dir)
        for name in set(os.listdir(ROOT)) - before:
            path = ROOT / name
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        for path in set(OUTSIDE) - outside_before:
            shutil.rmtree(path, ignore_errors=True)
    print(f"README.md: ran {ran} commands, skipped {skipped}, {len(failed)} blocks failed")
    if failed:
        sys.exit("failed: " + ", ".join(failed))


if __name__ == "__main__":
    main()
