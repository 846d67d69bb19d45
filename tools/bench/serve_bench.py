#!/usr/bin/env python3
"""Latency figures of a running `flm serve`, measured as a client sees them (streamed
`/v1/completions` with token-id prompts, so any tokenizer of the model's vocabulary will do):

- `prefix`: time to first token of a request with a fresh prompt of --prefix + --tail
  tokens, then of a second one sharing its first --prefix tokens (served from the prefix
  cache), then of a third fresh one; the ratio of the first to the second.
- `chunked`: --streams requests decode together; once each has --warmup tokens, a prompt
  of --long tokens arrives. Time per output token of the streams (every gap between
  consecutive tokens of one stream, after their warm-up) over the window from the long
  prompt's arrival to its first token, against the same gaps over the warm-up; p50 and p99.
- `constrained`: the mean time per output token of --requests streamed completions whose
  reply a JSON schema constrains (a string of up to 200 characters and an integer), against
  the same requests unconstrained: the cost of masking the vocabulary each step.
- `hostile`: --streams requests of --max-tokens tokens decode together, alone and then
  beside one client per --formats entry that sends its request once as they start, or with
  --repeat again and again until the streams end (issue 48's probe: 0 a union of 10,000 types, 1 `(.{0,64}){0,64}`,
  2 `((a|b)*)*c`, 3 an enum of 20,000 strings, 200 tokens each at temperature 0.8). Time
  per output token of the streams (every gap between consecutive tokens of one stream),
  p50 and p99, and the hostile requests answered by status.

Prompts are uniform random ids from 3 to --vocab − 1 (seeded), one request per prompt, greedy,
stdlib only. Prints one JSON object.

Usage:
    flm serve --model tinyllama-int8.flm --tokenizer tokenizer.model --threads 2 --port 8080 &
    python3 tools/bench/serve_bench.py --url http://127.0.0.1:8080 prefix --prefix 1000
    python3 tools/bench/serve_bench.py --url http://127.0.0.1:8080 chunked --long 2000
    python3 tools/bench/serve_bench.py --url http://127.0.0.1:8080 constrained
    python3 tools/bench/serve_bench.py --url http://127.0.0.1:8080 hostile --formats 0,1,2,3 --repeat
"""

import argparse
import http.client
import json
import random
import statistics
import threading
import time
import urllib.parse


def stream(url, prompt, max_tokens, on_token):
    """POSTs a streamed greedy completion; calls on_token(time) for each token chunk and
    hangs up (the server cancels the request) when it returns False."""
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=3600)
    body = json.dumps(
        {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    )
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        raise RuntimeError(f"{response.status}: {response.read().decode()}")
    for line in response:
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        data = line[len(b"data: "):]
        if data == b"[DONE]":
            break
        if json.loads(data)["choices"] and on_token(time.perf_counter()) is False:
            break
    conn.close()


def ttft(url, prompt):
    """Seconds from sending `prompt` to its first token."""
    start = time.perf_counter()
    times = []
    stream(url, prompt, 1, times.append)
    return times[0] - start


def percentile(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def prefix(args, rng):
    ids = lambda n: [rng.randrange(3, args.vocab) for _ in range(n)]
    shared = ids(args.prefix)
    first = ttft(args.url, [1] + shared + ids(args.tail))
    second = ttft(args.url, [1] + shared + ids(args.tail))
    fresh = ttft(args.url, [1] + ids(args.prefix + args.tail))
    return {
        "prefix_tokens": args.prefix,
        "tail_tokens": args.tail,
        "ttft_first_s": round(first, 4),
        "ttft_second_shared_s": round(second, 4),
        "ttft_third_fresh_s": round(fresh, 4),
        "speedup": round(first / second, 2),
    }


def chunked(args, rng):
    times = [[] for _ in range(args.streams)]
    lock = threading.Lock()
    warmed = [0]
    warm, finished = threading.Event(), threading.Event()

    def run(i):
        def on_token(t):
            times[i].append(t)
            if len(times[i]) == args.warmup:
                with lock:
                    warmed[0] += 1
                    if warmed[0] == args.streams:
                        warm.set()
            return not finished.is_set()

        prompt = [1] + [rng.randrange(3, args.vocab) for _ in range(16)]
        stream(args.url, prompt, args.max_tokens, on_token)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(args.streams)]
    for t in threads:
        t.start()
    warm.wait()
    arrival = time.perf_counter()
    long_ttft = ttft(args.url, [1] + [rng.randrange(3, args.vocab) for _ in range(args.long)])
    done = arrival + long_ttft
    finished.set()
    for t in threads:
        t.join()
    before, during = [], []
    for ts in times:
        for a, b in zip(ts[1:], ts[2:]):
            if b <= arrival:
                before.append(b - a)
            elif a < done:
                during.append(b - a)
        if ts[-1] < done:
            raise RuntimeError("a stream ended before the long prompt's first token: raise --max-tokens")
    return {
        "streams": args.streams,
        "long_prompt_tokens": args.long,
        "long_ttft_s": round(long_ttft, 3),
        "tpot_before_p50_s": round(statistics.median(before), 4),
        "tpot_before_p99_s": round(percentile(before, 99), 4),
        "tpot_during_p50_s": round(statistics.median(during), 4),
        "tpot_during_p99_s": round(percentile(during, 99), 4),
        "p99_raise": round(percentile(during, 99) / percentile(before, 99), 2),
    }


SCHEMA = {"type": "object", "properties": {"text": {"type": "string", "maxLength": 200},
                                           "n": {"type": "integer"}}}


def timed_completion(url, prompt, max_tokens, response_format):
    """Seconds per token after the first of one streamed completion, and its token count."""
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=3600)
    request = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 1.0, "seed": 1,
               "stream": True}
    if response_format:
        request["response_format"] = response_format
    conn.request("POST", "/v1/completions", json.dumps(request),
                 {"Content-Type": "application/json"})
    times = []
    for line in conn.getresponse():
        if line.startswith(b"data: {") and json.loads(line[6:])["choices"]:
            times.append(time.perf_counter())
    conn.close()
    return (times[-1] - times[0]) / max(1, len(times) - 1), len(times)


def constrained(args, rng):
    fmt = {"type": "json_schema", "json_schema": {"name": "bench", "schema": SCHEMA}}
    plain, masked = [], []
    for _ in range(args.requests):
        prompt = [1] + [rng.randrange(3, args.vocab) for _ in range(8)]
        masked.append(timed_completion(args.url, prompt, args.max_tokens, fmt))
        plain.append(timed_completion(args.url, prompt, masked[-1][1], None))
    mean = lambda xs: statistics.mean(x[0] for x in xs)
    return {
        "requests": args.requests,
        "tokens_constrained": [m[1] for m in masked],
        "tpot_plain_s": round(mean(plain), 4),
        "tpot_constrained_s": round(mean(masked), 4),
        "ratio": round(mean(masked) / mean(plain), 2),
    }


def hostile_formats():
    """The probe's response formats, by index (see `hostile`)."""
    def schema(s):
        return {"type": "json_schema", "json_schema": {"name": "probe", "schema": s}}
    return [
        schema({"type": ["string"] * 10_000}),
        {"type": "regex", "regex": "(.{0,64}){0,64}"},
        {"type": "regex", "regex": "((a|b)*)*c"},
        schema({"enum": [f"value number {i}" for i in range(20_000)]}),
    ]


def hostile(args, rng):
    u = urllib.parse.urlparse(args.url)
    formats = hostile_formats()
    bodies = [
        json.dumps({"prompt": "Once", "max_tokens": 200, "temperature": 0.8, "seed": 1,
                    "response_format": formats[int(i)]}).encode()
        for i in args.formats.split(",")
    ]
    prompts = [[1] + [rng.randrange(3, args.vocab) for _ in range(8)]
               for _ in range(args.streams)]

    def streams():
        gaps = []

        def run(prompt):
            times = []
            stream(args.url, prompt, args.max_tokens, times.append)
            gaps.extend(b - a for a, b in zip(times, times[1:]))
        threads = [threading.Thread(target=run, args=(p,)) for p in prompts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return gaps

    streams()
    alone = streams()
    done = threading.Event()
    answered = {}

    def send(body):
        while True:
            conn = http.client.HTTPConnection(u.hostname, u.port, timeout=3600)
            conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            status = conn.getresponse().status
            conn.close()
            answered[status] = answered.get(status, 0) + 1
            if not args.repeat or done.is_set():
                return
    senders = [threading.Thread(target=send, args=(b,)) for b in bodies]
    for t in senders:
        t.start()
    beside = streams()
    done.set()
    for t in senders:
        t.join()
    ms = lambda x: round(1e3 * x, 1)
    return {
        "streams": args.streams,
        "formats": args.formats,
        "alone_ms": {"p50": ms(percentile(alone, 50)), "p99": ms(percentile(alone, 99))},
        "beside_ms": {"p50": ms(percentile(beside, 50)), "p99": ms(percentile(beside, 99))},
        "p99_ratio": round(percentile(beside, 99) / percentile(alone, 99), 2),
        "hostile_answered": answered,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--seed", type=int, default=0)
    sub = parser.add_subparsers(dest="mode", required=True)
    # Each mode's count options and their defaults.
    counts = {
        "prefix": {"--prefix": 1000, "--tail": 8},
        "chunked": {"--streams": 8, "--long": 2000, "--warmup": 16, "--max-tokens": 1000},
        "constrained": {"--requests": 3, "--max-tokens": 120},
        "hostile": {"--streams": 8, "--max-tokens": 64},
    }
    modes = {}
    for name, options in counts.items():
        modes[name] = sub.add_parser(name)
        for option, default in options.items():
            modes[name].add_argument(option, type=int, default=default)
    h = modes["hostile"]
    h.add_argument("--formats", default="0,1,2,3")
    h.add_argument("--repeat", action="store_true",
                   help="resend each hostile request until the streams end (a flood)")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    mode = {"prefix": prefix, "chunked": chunked, "constrained": constrained,
            "hostile": hostile}[args.mode]
    print(json.dumps(mode(args, rng)))


if __name__ == "__main__":
    main()
