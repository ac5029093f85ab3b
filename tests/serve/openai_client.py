"""Drives `duet serve` with the real `openai` Python client (tests/serve_http.rs runs it).

    python openai_client.py BASE_URL API_KEY

Checks the model list, a non-streamed and a streamed chat completion (greedy: the same
text both ways, usage counted) and a completion; prints "ok" at the end.
"""
import sys

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

bad = openai.OpenAI(base_url=base, api_key="wrong", max_retries=0, timeout=60)
try:
    bad.models.list()
    raise AssertionError("a wrong key was accepted")
except openai.AuthenticationError:
    pass
print("ok")
