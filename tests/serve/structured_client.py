"""Structured output of `duet serve` through the real `openai` Python client
(tests/serve_http.rs runs it and validates what it prints).

    python structured_client.py BASE_URL SCHEMA_FILE

Sends 50 chat requests with `response_format: json_schema` (strict) at temperature 1, seeds
0 to 49, one `json_object` request, and a llama-server `grammar` request; checks that a schema
or grammar that cannot constrain a reply is a 400 with the reason; a tool round trip (tools →
tool_calls → a tool message → the final answer) with the client's own types, streamed and
not. Prints one JSON object: {"replies": [[content, finish_reason], ...], "grammar": content,
"calls": [arguments, ...]}.
"""
import json
import sys

import openai

base, schema_file = sys.argv[1], sys.argv[2]
schema = json.load(open(schema_file))
client = openai.OpenAI(base_url=base, api_key="none", max_retries=0, timeout=120)
model = client.models.list().data[0].id
messages = [{"role": "user", "content": "Describe a person."}]

replies = []
for seed in range(50):
    r = client.chat.completions.create(
        model=model,
        messages=messages,
        temperature=1,
        seed=seed,
        max_tokens=400,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": schema}},
    )
    replies.append([r.choices[0].message.content, r.choices[0].finish_reason])

obj = client.chat.completions.create(
    model=model, messages=messages, temperature=0, max_tokens=400, response_format={"type": "json_object"}
)
assert obj.choices[0].message.content.startswith("{"), obj.choices[0].message.content

# llama-server's field, which the client passes through as it is.
gram = client.completions.create(
    model=model,
    prompt="Answer:",
    temperature=1,
    seed=3,
    max_tokens=20,
    extra_body={"grammar": 'root ::= ("yes" | "no") "!"'},
)
assert gram.choices[0].finish_reason == "stop", gram.choices[0]

for bad, reason in [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "integer", "minimum": 5, "maximum": 3}}}}, "minimum (5) is greater than maximum (3)"),
    ({"extra_body": {"grammar": "root ::= undefined-rule"}}, "rule 'undefined-rule' is used but never defined"),
    ({"extra_body": {"grammar": 'root ::= "a" root'}}, "admits no string"),
    ({"extra_body": {"json_schema": {"type": "object", "description": "x" * 70000}}}, "duet takes at most 65536 bytes"),
]:
    try:
        client.chat.completions.create(model=model, messages=messages, max_tokens=5, **bad)
        raise AssertionError(f"accepted {bad}")
    except openai.BadRequestError as e:
        assert reason in str(e), (reason, str(e))

# Tools: the bundled model's template knows nothing of them (the generic format); with
# tool_choice "required" every reply is a call whose arguments follow the parameters.
tools = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 24}, "unit": {"enum": ["C", "F"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}]
ask = [{"role": "user", "content": "What is the weather in Oslo?"}]
calls = []
for seed in range(5):
    # (One call a reply: a model this small would go on calling until the token limit.)
    r = client.chat.completions.create(
        model=model, messages=ask, tools=tools, tool_choice="required", parallel_tool_calls=False, temperature=1, seed=seed, max_tokens=120
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather" and call.id, call
    calls.append(call.function.arguments)
    # The client's own message object goes back, with the tool's answer.
    follow = ask + [choice.message, {"role": "tool", "tool_call_id": call.id, "content": "12 degrees and rain"}]
    final = client.chat.completions.create(model=model, messages=follow, tools=tools, tool_choice="none", temperature=0, max_tokens=12)
    assert final.choices[0].finish_reason in ("stop", "length") and final.choices[0].message.tool_calls is None, final
    assert isinstance(final.choices[0].message.content, str)

named = {"type": "function", "function": {"name": "get_weather"}}
name, args, finish = None, "", None
for chunk in client.chat.completions.create(model=model, messages=ask, tools=tools, tool_choice=named, parallel_tool_calls=False, temperature=1, seed=9, max_tokens=120, stream=True):
    for c in chunk.choices:
        for tc in c.delta.tool_calls or []:
            name = tc.function.name or name
            args += tc.function.arguments or ""
        finish = c.finish_reason or finish
assert name == "get_weather" and finish == "tool_calls", (name, finish)
calls.append(args)

print(json.dumps({"replies": replies, "grammar": gram.choices[0].text, "calls": calls}))
