"""Drives `duet serve` with the real `openai` Python client (tests/serve_http.rs runs it).

    python openai_client.py BASE_URL API_KEY

Checks the model list, a non-streamed and a streamed chat completion (greedy: the same
text both ways, usage counted), a completion, log probabilities (the greedy token is the
most likely, probabilities at most 1, alternatives sorted) streamed and not, `n` = 3, CORS
preflights from an allowed and a refused origin, and unsupported fields refused by name;
prints "ok" at the end.
"""
import math
import sys
import urllib.error
import urllib.request

import openai

base, key = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=60)

models = client.models.list()
ids = [m.id for m in models.data]
assert len(ids) == 1 and ids[0].endswith(".gguf"), ids
model = ids[0]

messages = [{"role": "user", "content": "Tell me about the sea."}]
whole = client.chat.completions.create(model=model, messages=messages, max_tokens=16, temperature=0)
text = whole.choices[0].message.content
assert whole.object == "chat.completion" and whole.choices[0].message.role == "assistant"
assert whole.choices[0].finish_reason in ("stop", "length"), whole.choices[0].finish_reason
assert whole.usage.prompt_tokens > 0 and 0 < whole.usage.completion_tokens <= 16, whole.usage

pieces, finish, usage = [], None, None
for chunk in client.chat.completions.create(model=model, messages=messages, max_tokens=16, temperature=0, stream=True):
    assert chunk.object == "chat.completion.chunk"
    if chunk.choices:
        delta = chunk.choices[0].delta
        if delta.content:
            pieces.append(delta.content)
        finish = chunk.choices[0].finish_reason or finish
    if chunk.usage:
        usage = chunk.usage
assert "".join(pieces) == text, ("".join(pieces), text)
assert finish == whole.choices[0].finish_reason
assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens

done = client.completions.create(model=model, prompt="Call me Ishmael.", max_tokens=8, temperature=0)
assert done.object == "text_completion" and done.usage.completion_tokens <= 8
assert isinstance(done.choices[0].text, str)

try:
    client.chat.completions.create(model=model, messages=messages, temperature="hot")
    raise AssertionError("a bad temperature was accepted")
except openai.BadRequestError as e:
    assert "temperature" in str(e), e

# Log probabilities: greedy, so each drawn token is the most likely one.
lp = client.chat.completions.create(
    model=model, messages=messages, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3
)
content = lp.choices[0].logprobs.content
assert len(content) == lp.usage.completion_tokens, (len(content), lp.usage)
assert "".join(t.token for t in content) == lp.choices[0].message.content
for t in content:
    assert t.logprob <= 0 and math.exp(t.logprob) <= 1
    tops = [x.logprob for x in t.top_logprobs]
    assert len(tops) == 3 and tops == sorted(tops, reverse=True), tops
    assert t.token == t.top_logprobs[0].token and abs(t.logprob - tops[0]) < 1e-6, (t.token, t.top_logprobs)
    assert bytes(t.bytes).decode("utf-8", "replace") == t.token, (t.bytes, t.token)
streamed = []
for chunk in client.chat.completions.create(
    model=model, messages=messages, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3, stream=True
):
    if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content:
        streamed.extend(chunk.choices[0].logprobs.content)
assert [t.token for t in streamed] == [t.token for t in content]
done = client.completions.create(model=model, prompt="Call me Ishmael.", max_tokens=4, temperature=0, logprobs=2)
l = done.choices[0].logprobs
assert len(l.tokens) == len(l.token_logprobs) == len(l.top_logprobs) == done.usage.completion_tokens
assert all(max(top.values()) == lp for top, lp in zip(l.top_logprobs, l.token_logprobs))

# n choices: three, each with its own seed.
three = client.chat.completions.create(model=model, messages=messages, max_tokens=6, temperature=1, seed=5, n=3)
assert sorted(c.index for c in three.choices) == [0, 1, 2], three.choices
assert three.usage.completion_tokens <= 18, three.usage
assert len({c.message.content for c in three.choices}) > 1, [c.message.content for c in three.choices]
indices = set()
for chunk in client.chat.completions.create(model=model, messages=messages, max_tokens=4, n=3, stream=True):
    indices.update(c.index for c in chunk.choices)
assert indices == {0, 1, 2}, indices


def preflight(origin):
    req = urllib.request.Request(
        base + "/chat/completions",
        method="OPTIONS",
        # (The OpenAI JS SDK in a browser asks for its x-stainless-* headers too.)
        headers={"Origin": origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers.get("Access-Control-Allow-Origin"), r.headers.get("Access-Control-Allow-Headers") or ""
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Access-Control-Allow-Origin"), ""


status, allow, headers = preflight("http://localhost:5173")
assert status == 204 and allow == "http://localhost:5173" and "x-stainless-os" in headers, (status, allow, headers)
status, allow, _ = preflight("https://elsewhere.example")
assert status == 403 and allow is None, (status, allow)

# Every field duet does not implement (at a value that asks for more than it does) is a
# 400 naming it; FIELDS in runtime/src/tools/serve/openai.rs lists them.
for field, value in [("logit_bias", {"5": 10}), ("store", True), ("stream_options", {"x": 1}), ("frobnicate", 1)]:
    try:
        client.chat.completions.create(model=model, messages=messages, max_tokens=2, extra_body={field: value})
        raise AssertionError(f"{field} was accepted")
    except openai.BadRequestError as e:
        assert f"'{field}'" in str(e), e
for field, value in [("best_of", 2), ("echo", True), ("suffix", "end"), ("logit_bias", {"5": 1})]:
    try:
        client.completions.create(model=model, prompt="Call me", max_tokens=2, extra_body={field: value})
        raise AssertionError(f"{field} was accepted")
    except openai.BadRequestError as e:
        assert f"'{field}'" in str(e), e

# Embeddings: unit length, one per input, the same text the same vector.
emb = client.embeddings.create(model=model, input=["The sea is calm.", "The sea is calm.", "Taxes are due."])
vecs = [d.embedding for d in emb.data]
assert [d.index for d in emb.data] == [0, 1, 2] and emb.usage.prompt_tokens > 0, emb
for v in vecs:
    assert abs(math.sqrt(sum(x * x for x in v)) - 1) < 1e-4
assert sum(a * b for a, b in zip(vecs[0], vecs[1])) > 0.9999

bad = openai.OpenAI(base_url=base, api_key="wrong", max_retries=0, timeout=60)
try:
    bad.models.list()
    raise AssertionError("a wrong key was accepted")
except openai.AuthenticationError:
    pass
print("ok")
