#!/usr/bin/env python3
"""Drives colibrid's HTTP API with the official `openai` and `anthropic` Python SDKs: the
clients people already use, nothing from this repository. CI runs it through
tools/http_sdk.sh, which starts the real daemon (--max-batch 1 --queue 0, so that a second
request while one runs is a 429) and serves a fixture with `coli serve`.

    tools/http_sdk_test.py --url http://127.0.0.1:PORT/v1 --key KEY --model olmoe \
        --coli target/release/coli --model-dir tests/fixtures/olmoe

Exits 0 when every check passed; prints one line per check.
"""

import argparse
import json
import subprocess
import sys
import time
import urllib.request

import anthropic
import openai

PASSED = []


def check(name):
    def wrap(f):
        def run(*a, **k):
            f(*a, **k)
            PASSED.append(name)
            print(f"ok  {name}", flush=True)
        return run
    return wrap


def metrics(args):
    req = urllib.request.Request(args.url.removesuffix("/v1") + "/metrics",
                                 headers={"Authorization": f"Bearer {args.key}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read().decode()


def gauge(text, prefix):
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{prefix} not in /metrics")


def wait_idle(args):
    """Until no generation runs (a closed stream frees its slot within a step)."""
    t = time.time()
    while gauge(metrics(args), "colibri_active_generations{") != 0:
        assert time.time() - t < 20, "the slot was not freed"
        time.sleep(0.02)


def local_ids(args, *run_args):
    out = subprocess.run([args.coli, "run", "--local", "--model", args.model_dir,
                          "--temperature", "0", "--output", "ids", *run_args],
                         check=True, capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


@check("models.list")
def models_list(oa, an, args):
    ids = [m.id for m in oa.models.list()]
    assert args.model in ids, ids
    assert oa.models.retrieve(args.model).id == args.model
    assert args.model in [m.id for m in an.models.list()]


@check("chat greedy = coli run --local (ids)")
def chat_equals_local(oa, an, args):
    want = local_ids(args, "--max-tokens", "12", "Tell me about the sea")
    r = oa.chat.completions.create(
        model=args.model, messages=[{"role": "user", "content": "Tell me about the sea"}],
        max_tokens=12, temperature=0, extra_body={"return_token_ids": True})
    got = r.choices[0].model_extra["token_ids"]  # vLLM's extension, kept by the SDK
    assert got == want, (got, want)
    assert r.choices[0].message.role == "assistant"
    assert r.usage.completion_tokens == len(want), r.usage
    assert r.choices[0].finish_reason in ("stop", "length")


@check("completions with ids = coli run --local --prompt-ids")
def completions_equal_local(oa, an, args):
    prompt = [1, 17, 42, 99, 7, 3]
    want = local_ids(args, "--max-tokens", "10", "--prompt-ids", ",".join(map(str, prompt)))
    r = oa.completions.create(model=args.model, prompt=prompt, max_tokens=10, temperature=0,
                              extra_body={"return_token_ids": True})
    assert r.choices[0].model_extra["token_ids"] == want
    s = oa.completions.create(model=args.model, prompt=prompt, max_tokens=10, temperature=0,
                              stream=True)
    assert "".join(c.choices[0].text for c in s) == r.choices[0].text


@check("chat streamed = non-streamed, include_usage")
def chat_stream(oa, an, args):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    whole = oa.chat.completions.create(model=args.model, messages=msgs, max_tokens=16, temperature=0)
    chunks = list(oa.chat.completions.create(model=args.model, messages=msgs, max_tokens=16,
                                             temperature=0, stream=True,
                                             stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content, (text, whole.choices[0].message.content)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == [whole.choices[0].finish_reason], finish
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens
    # The same prompt again: the daemon's prefix cache serves its KV (all but the last token).
    u = chunks[-1].usage
    assert 0 < u.prompt_tokens_details.cached_tokens < u.prompt_tokens, u


@check("stop strings")
def stop(oa, an, args):
    base = oa.chat.completions.create(model=args.model, messages=[{"role": "user", "content": "Hi"}],
                                      max_tokens=20, temperature=0).choices[0].message.content
    if len(base.strip()) < 4:
        return
    cut = base[2:4]
    stops = [cut] + [f"never-{i}" for i in range(15)]  # 16 entries
    r = oa.chat.completions.create(model=args.model, messages=[{"role": "user", "content": "Hi"}],
                                   max_tokens=20, temperature=0, stop=stops)
    assert r.choices[0].finish_reason == "stop"
    assert base.startswith(r.choices[0].message.content) and cut not in r.choices[0].message.content
    # This SDK no longer sends sampling fields itself; the body may still carry them.
    m = an.messages.create(model=args.model, max_tokens=20, stop_sequences=[cut],
                           messages=[{"role": "user", "content": "Hi"}], extra_body={"temperature": 0})
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == cut, m


@check("anthropic messages, stream, count_tokens")
def anthropic_messages(oa, an, args):
    m = an.messages.create(model=args.model, max_tokens=12, system="Be brief.",
                           messages=[{"role": "user", "content": "Hello"}], extra_body={"temperature": 0})
    assert m.role == "assistant" and m.stop_reason in ("end_turn", "max_tokens"), m
    text = "".join(b.text for b in m.content if b.type == "text")
    with an.messages.stream(model=args.model, max_tokens=12, system="Be brief.",
                            messages=[{"role": "user", "content": "Hello"}],
                            extra_body={"temperature": 0}) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    assert streamed == text, (streamed, text)
    assert final.usage.output_tokens == m.usage.output_tokens
    n = an.messages.count_tokens(model=args.model, system="Be brief.",
                                 messages=[{"role": "user", "content": "Hello"}])
    # input_tokens are those not read from the prefix cache.
    assert n.input_tokens == m.usage.input_tokens + m.usage.cache_read_input_tokens, (n, m.usage)


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
        },
    },
}


def check_weather(arguments):
    a = json.loads(arguments) if isinstance(arguments, str) else arguments
    assert a["city"] in ("Paris", "Oslo", "Lima") and 1 <= a["days"] <= 7, a
    assert set(a) == {"city", "days"}, a


@check("tool round trip (call -> result -> answer) through the real Qwen3 template, both SDKs")
def tools_round_trip(oa, an, args):
    model = args.tools_model
    msgs = [{"role": "user", "content": "Weather in Oslo for 3 days?"}]
    # A forced call: constrained decoding makes the random-weight model write a valid one.
    r = oa.chat.completions.create(model=model, messages=msgs, tools=[WEATHER], tool_choice="required",
                                   parallel_tool_calls=False, max_tokens=200, temperature=0)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls", ch
    assert ch.message.content is None and len(ch.message.tool_calls) == 1, ch.message
    call = ch.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather" and call.id, call
    check_weather(call.function.arguments)
    # Streamed: the SDK assembles the same call from its deltas.
    parts = {}
    finish = None
    for chunk in oa.chat.completions.create(model=model, messages=msgs, tools=[WEATHER],
                                            tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                            parallel_tool_calls=False, max_tokens=200, temperature=0,
                                            stream=True):
        c = chunk.choices[0]
        finish = c.finish_reason or finish
        for d in c.delta.tool_calls or []:
            p = parts.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
            p["id"] += d.id or ""
            p["name"] += (d.function.name or "") if d.function else ""
            p["arguments"] += (d.function.arguments or "") if d.function else ""
    assert finish == "tool_calls" and list(parts) == [0], parts
    assert parts[0]["name"] == "get_weather" and parts[0]["arguments"] == call.function.arguments, parts
    # The result goes back through the template; the model answers (tools no longer forced).
    history = msgs + [ch.message.model_dump(exclude_none=True),
                      {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 4}'}]
    r2 = oa.chat.completions.create(model=model, messages=history, tools=[WEATHER], tool_choice="none",
                                    max_tokens=8, temperature=0)
    assert r2.choices[0].finish_reason in ("stop", "length") and not r2.choices[0].message.tool_calls, r2
    assert isinstance(r2.choices[0].message.content, str), r2
    # Anthropic: tool_use out, tool_result back.
    tool = {"name": "get_weather", "description": "Current weather in a city",
            "input_schema": WEATHER["function"]["parameters"]}
    m = an.messages.create(model=model, max_tokens=200, tools=[tool], tool_choice={"type": "any",
                           "disable_parallel_tool_use": True}, messages=msgs, extra_body={"temperature": 0})
    assert m.stop_reason == "tool_use", m
    uses = [b for b in m.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather", m.content
    check_weather(uses[0].input)
    with an.messages.stream(model=model, max_tokens=200, tools=[tool], tool_choice={"type": "tool", "name": "get_weather",
                                                                "disable_parallel_tool_use": True},
                            messages=msgs, extra_body={"temperature": 0}) as st:
        final = st.get_final_message()
    streamed = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use" and streamed, final
    check_weather(streamed[0].input)
    m2 = an.messages.create(model=model, max_tokens=8, tools=[tool], extra_body={"temperature": 0}, messages=msgs + [
        {"role": "assistant", "content": [b.model_dump() for b in m.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "4 C"}]},
    ], tool_choice={"type": "none"})
    assert m2.stop_reason in ("end_turn", "max_tokens") and m2.content[0].type == "text", m2
    # A model whose template has no tools: a clean 400.
    try:
        oa.chat.completions.create(model=args.model, messages=msgs, tools=[WEATHER], max_tokens=2)
    except openai.BadRequestError as e:
        assert "tool" in str(e), e
    else:
        raise AssertionError("tools accepted by a model without tool support")


ANSWER = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "enum": ["yes", "no", "maybe"]},
        "confidence": {"type": "integer", "minimum": 0, "maximum": 100},
        "sure": {"type": "boolean"},
    },
    "required": ["answer", "confidence", "sure"],
    "additionalProperties": False,
}


def check_answer(text):
    v = json.loads(text)
    assert v["answer"] in ("yes", "no", "maybe") and 0 <= v["confidence"] <= 100, v
    assert isinstance(v["sure"], bool) and len(v) == 3, v


@check("json_schema output parses and validates (OpenAI response_format, Anthropic output_config)")
def structured(oa, an, args):
    msgs = [{"role": "user", "content": "Is the sea blue? Answer in JSON."}]
    for model, temperature in [(args.model, 0.7), (args.tools_model, 0)]:
        r = oa.chat.completions.create(model=model, messages=msgs, max_tokens=120, temperature=temperature, seed=3,
                                       response_format={"type": "json_schema",
                                                        "json_schema": {"name": "answer", "schema": ANSWER}})
        check_answer(r.choices[0].message.content)
    m = an.messages.create(model=args.model, max_tokens=120, messages=msgs,
                           output_config={"format": {"type": "json_schema", "schema": ANSWER}})
    check_answer("".join(b.text for b in m.content if b.type == "text"))
    try:
        oa.chat.completions.create(model=args.model, messages=msgs, max_tokens=2,
                                   response_format={"type": "json_schema", "json_schema": {"name": "a"}})
    except openai.BadRequestError as e:
        assert e.body["param"] == "response_format.json_schema.schema", e.body
    else:
        raise AssertionError("a json_schema without a schema was accepted")


@check("logprobs and top_logprobs per token; penalties and logit_bias accepted")
def logprobs(oa, an, args):
    msgs = [{"role": "user", "content": "Hello"}]
    r = oa.chat.completions.create(model=args.model, messages=msgs, max_tokens=6, temperature=0,
                                   logprobs=True, top_logprobs=3,
                                   extra_body={"ignore_eos": True, "return_token_ids": True})
    lp = r.choices[0].logprobs.content
    assert len(lp) == r.usage.completion_tokens == 6, r
    assert "".join(t.token for t in lp) == r.choices[0].message.content
    for t in lp:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3, t
        assert t.top_logprobs[0].token == t.token, "greedy picks the most likely token"
        assert t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob >= t.top_logprobs[2].logprob
    streamed = []
    for chunk in oa.chat.completions.create(model=args.model, messages=msgs, max_tokens=6, temperature=0,
                                            logprobs=True, top_logprobs=3, stream=True,
                                            extra_body={"ignore_eos": True}):
        if chunk.choices and chunk.choices[0].logprobs:
            streamed += chunk.choices[0].logprobs.content
    assert [(t.token, round(t.logprob, 4)) for t in streamed] == [(t.token, round(t.logprob, 4)) for t in lp]
    c = oa.completions.create(model=args.model, prompt="Hello", max_tokens=4, temperature=0, logprobs=2,
                              extra_body={"ignore_eos": True})
    l = c.choices[0].logprobs
    assert len(l.tokens) == 4 and len(l.top_logprobs[0]) <= 2 and l.text_offset[0] == 0, l
    # logit_bias: banning the greedy first token changes it; penalties are accepted.
    first = r.choices[0].logprobs.content[0]
    ids = r.choices[0].model_extra["token_ids"]
    r2 = oa.chat.completions.create(model=args.model, messages=msgs, max_tokens=1, temperature=0,
                                    logit_bias={str(ids[0]): -100}, frequency_penalty=0.5,
                                    presence_penalty=0.5, logprobs=True)
    assert r2.choices[0].logprobs.content[0].token != first.token, (first, r2)


@check("reasoning split: reasoning_content / thinking blocks (a DeepSeek-R1 template)")
def reasoning(oa, an, args):
    msgs = [{"role": "user", "content": "Why is the sky blue?"}]
    # The R1 template opens a think block: the random-weight model's text is reasoning.
    r = oa.chat.completions.create(model=args.reasoning_model, messages=msgs, max_tokens=8, temperature=0)
    m = r.choices[0].message
    reasoning = m.model_extra.get("reasoning_content")
    assert reasoning and not m.content, m
    got = ""
    for chunk in oa.chat.completions.create(model=args.reasoning_model, messages=msgs, max_tokens=8,
                                            temperature=0, stream=True):
        if chunk.choices:
            d = chunk.choices[0].delta
            got += (d.model_extra or {}).get("reasoning_content") or ""
            assert not d.content, d
    assert got == reasoning, (got, reasoning)
    mm = an.messages.create(model=args.reasoning_model, max_tokens=8, messages=msgs,
                            thinking={"type": "enabled", "budget_tokens": 1024}, extra_body={"temperature": 0})
    assert [b.type for b in mm.content] == ["thinking"] and mm.content[0].thinking == reasoning, mm
    with an.messages.stream(model=args.reasoning_model, max_tokens=8, messages=msgs,
                            extra_body={"temperature": 0}) as st:
        final = st.get_final_message()
    assert final.content[0].type == "thinking" and final.content[0].thinking == reasoning, final


@check("stream closed early frees the slot")
def closed_early(oa, an, args):
    s = oa.chat.completions.create(model=args.model, messages=[{"role": "user", "content": "Go on"}],
                                   max_tokens=200, temperature=0, stream=True,
                                   extra_body={"ignore_eos": True})
    next(iter(s))
    s.close()
    wait_idle(args)
    # The only slot (--max-batch 1 --queue 0) takes a new request. The admission count is
    # released by the engine thread a moment after the metrics gauge drops (seen once under
    # load): allow 2 s of 429s, no more.
    t = time.time()
    while True:
        try:
            oa.chat.completions.create(model=args.model, messages=[{"role": "user", "content": "x"}],
                                       max_tokens=2)
            break
        except openai.RateLimitError:
            assert time.time() - t < 2, "the slot was not freed within 2 s"
            time.sleep(0.05)
    with an.messages.stream(model=args.model, max_tokens=200, messages=[{"role": "user", "content": "Go"}]) as st:
        next(iter(st.text_stream), None)
    wait_idle(args)


@check("400 401 404 413 429 in each SDK's exceptions")
def errors(oa, an, args):
    msgs = [{"role": "user", "content": "x"}]
    try:
        oa.chat.completions.create(model=args.model, messages=msgs, n=2)
    except openai.BadRequestError as e:
        assert e.body["param"] == "n"
    else:
        raise AssertionError("n=2 accepted")
    bad = openai.OpenAI(base_url=args.url, api_key="wrong", max_retries=0)
    try:
        bad.models.list()
    except openai.AuthenticationError:
        pass
    else:
        raise AssertionError("a wrong key was accepted")
    try:
        anthropic.Anthropic(base_url=args.url.removesuffix("/v1"), api_key="wrong", max_retries=0).messages.create(
            model=args.model, max_tokens=2, messages=msgs)
    except anthropic.AuthenticationError:
        pass
    else:
        raise AssertionError("a wrong key was accepted")
    try:
        oa.chat.completions.create(model="no-such-model", messages=msgs)
    except openai.NotFoundError as e:
        assert e.body["code"] == "model_not_found", e.body
    try:
        an.messages.create(model="no-such-model", max_tokens=2, messages=msgs)
    except anthropic.NotFoundError:
        pass
    try:
        oa.chat.completions.create(model=args.model, messages=[{"role": "user", "content": "x" * (2 << 20)}])
    except openai.APIStatusError as e:
        assert e.status_code == 413, e.status_code
    else:
        raise AssertionError("a body over the limit was accepted")
    try:
        an.messages.create(model=args.model, max_tokens=2, messages=[{"role": "user", "content": "x " * 400}])
    except anthropic.BadRequestError as e:
        assert "context" in str(e), e
    # 429: the only slot is taken by a running stream. On the tiny fixture its 200 tokens can
    # all be generated before the probe arrives (the server does not wait for the client to
    # read them), which frees the slot: a probe accepted after the stream ended is a lost
    # race, not a failure, so the stream is started again (a few tries).
    def busy_stream():
        s = oa.chat.completions.create(model=args.model, messages=[{"role": "user", "content": "Go on"}],
                                       max_tokens=200, temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
        it = iter(s)
        next(it)
        return s

    def probe(call, limited):
        for _ in range(5):
            s = busy_stream()
            try:
                call()
            except limited as e:
                s.close()
                wait_idle(args)
                return e
            # Accepted: the stream had finished generating first. Try again.
            s.close()
            wait_idle(args)
        raise AssertionError("no 429 while the only slot was busy (5 tries)")

    e = probe(lambda: oa.chat.completions.create(model=args.model, messages=msgs, max_tokens=2),
              openai.RateLimitError)
    assert e.response.headers.get("retry-after") == "1"
    probe(lambda: an.messages.create(model=args.model, max_tokens=2, messages=msgs),
          anthropic.RateLimitError)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True, help="the API's base URL, .../v1")
    ap.add_argument("--key", required=True)
    ap.add_argument("--model", required=True, help="the model's name in /v1/models")
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--coli", required=True)
    ap.add_argument("--tools-model", required=True, help="a model whose template has tools")
    ap.add_argument("--reasoning-model", required=True, help="a model whose template opens a think block")
    args = ap.parse_args()
    # No retries: a 429 must reach the test, not be retried away.
    oa = openai.OpenAI(base_url=args.url, api_key=args.key, max_retries=0, timeout=120)
    an = anthropic.Anthropic(base_url=args.url.removesuffix("/v1"), api_key=args.key,
                             max_retries=0, timeout=120)
    tests = [models_list, chat_equals_local, completions_equal_local, chat_stream, stop,
             anthropic_messages, tools_round_trip, structured, logprobs, reasoning, closed_early, errors]
    for t in tests:
        t(oa, an, args)
    print(f"{len(PASSED)} passed, 0 failed")


if __name__ == "__main__":
    sys.exit(main())
