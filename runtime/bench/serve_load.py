"""Load for an OpenAI-compatible server (duet serve or llama-server), standard library only.

    python3 serve_load.py BASE_URL [--streams 8] [--tokens 128] [--rounds 3] [--wait SECONDS]

--wait first polls BASE_URL/health until the server answers (at most SECONDS; exit status 1
if it never does), for scripts that have just started it.

Every request is POST /v1/completions, streamed, greedy, `ignore_eos` (both servers accept
it) and `max_tokens` TOKENS, so every reply is exactly TOKENS tokens long. Prints one JSON
line with the medians over ROUNDS rounds of:
  single_tps     tokens/s of one stream alone (its tokens / its wall time)
  aggregate_tps  tokens/s of STREAMS concurrent streams (all tokens / wall time of the batch)
  ttft_idle_ms   time to first token of a new request on an idle server
  ttft_busy_ms   the same while STREAMS-1 other streams are generating
The time-to-first-token probes each start with their own words ("Request 7: ..."), so that
neither server finds their prompt cached from an earlier request: they measure a new prompt.
"""
import argparse
import json
import statistics
import sys
import threading
import time
import urllib.request

PROMPT = "The history of the lighthouse begins on a rocky coast, where sailors"


PROBES = iter(range(1, 1 << 30))


def stream(base, tokens, first_token_at=None, prompt=PROMPT):
    """One streamed completion; returns (seconds to the first text, seconds in all, pieces)."""
    body = json.dumps({
        "prompt": prompt, "max_tokens": tokens, "temperature": 0, "stream": True, "ignore_eos": True,
    }).encode()
    req = urllib.request.Request(base + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    first, pieces = None, 0
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            text = (chunk.get("choices") or [{}])[0].get("text") or ""
            if text:
                pieces += 1
                if first is None:
                    first = time.perf_counter() - t0
                    if first_token_at is not None:
                        first_token_at.set()
    return first, time.perf_counter() - t0, pieces


def concurrent(base, n, tokens):
    """Wall time of n concurrent streams of `tokens` tokens."""
    threads = [threading.Thread(target=stream, args=(base, tokens)) for _ in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def wait_up(base, seconds):
    """Polls base/health until it answers; False if it has not within `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(base + "/health", timeout=2)
            return True
        except Exception:
            time.sleep(0.2)
    return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--wait", type=float, default=0, help="seconds to wait for /health first")
    a = ap.parse_args()
    if a.wait > 0 and not wait_up(a.base, a.wait):
        sys.exit(f"error: the server did not come up on {a.base} within {a.wait:g} s")
    stream(a.base, 8)  # warm-up
    single, agg, idle, busy = [], [], [], []
    for _ in range(a.rounds):
        _, dt, _ = stream(a.base, a.tokens)
        single.append(a.tokens / dt)
        agg.append(a.streams * a.tokens / concurrent(a.base, a.streams, a.tokens))
        idle.append(1000 * stream(a.base, 1, prompt=f"Request {next(PROBES)}: {PROMPT}")[0])
        # STREAMS-1 long streams, all generating, then one new request.
        started = [threading.Event() for _ in range(a.streams - 1)]
        others = [threading.Thread(target=stream, args=(a.base, 4 * a.tokens, e)) for e in started]
        for t in others:
            t.start()
        for e in started:
            e.wait(600)
        busy.append(1000 * stream(a.base, 1, prompt=f"Request {next(PROBES)}: {PROMPT}")[0])
        for t in others:
            t.join()
    med = statistics.median
    print(json.dumps({
        "single_tps": round(med(single), 2), "aggregate_tps": round(med(agg), 2),
        "ttft_idle_ms": round(med(idle), 1), "ttft_busy_ms": round(med(busy), 1),
    }))


if __name__ == "__main__":
    main()
