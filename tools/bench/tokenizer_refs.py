"""Times SentencePiece (Llama 2) and HF tokenizers (GPT-2 byte-level BPE) on the texts,
whole or in chunks cut as flm's encode_throughput example cuts them, and writes their ids
as little-endian u32 files for comparison with flm.
usage: python3 ref.py RUNS CHUNK_BYTES [texts...]"""
import os, sys, time, array
os.environ["TOKENIZERS_PARALLELISM"] = "false"
import sentencepiece as spm, tokenizers
REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../tests/data/tokenizer")
sp = spm.SentencePieceProcessor(model_file=f"{REPO}/tokenizer.model")
hf = tokenizers.Tokenizer.from_file(f"{REPO}/gpt2/tokenizer.json")
runs = int(sys.argv[1]); chunk = int(sys.argv[2]); names = sys.argv[3:] or ["licenses", "vimdoc"]

def chunks(b, size):
    if size == 0: return [b]
    out = []
    while b:
        end = min(size, len(b))
        while end < len(b) and (b[end] & 0xC0) == 0x80: end += 1
        nl = b.find(b"\n", end)
        end = len(b) if nl < 0 else nl + 1
        out.append(b[:end]); b = b[end:]
    return out

def sp_enc(parts):
    ids = []
    for p in parts: ids.extend(sp.encode(p))
    return ids

def hf_enc(parts):
    ids = []
    for p in parts: ids.extend(hf.encode(p, add_special_tokens=False).ids)
    return ids

print("sentencepiece", spm.__version__, "tokenizers", tokenizers.__version__)
for name in names:
    raw = open(f"{name}.txt", "rb").read()
    parts = [p.decode() for p in chunks(raw, chunk)]
    mb = len(raw) / 1e6
    for tool, f in [("sp-llama2", sp_enc), ("hf-gpt2", hf_enc)]:
        times = []
        for _ in range(runs):
            t0 = time.perf_counter(); ids = f(parts); times.append(time.perf_counter() - t0)
        times.sort()
        array.array("I", ids).tofile(open(f"ids.{tool}.{name}.c{chunk}.bin", "wb"))
        print(f"{tool:10} {name:9} {mb:.1f} MB in {len(parts)} call(s) {len(ids):8} ids  median {mb/times[len(times)//2]:.2f} MB/s  best {mb/times[0]:.2f} MB/s")
