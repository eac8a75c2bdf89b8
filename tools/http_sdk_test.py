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
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 0


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
    assert n.input_tokens == m.usage.input_tokens, (n, m.usage)


@check("structured output and tools refused by name (not implemented yet)")
def refused(oa, an, args):
    msgs = [{"role": "user", "content": "x"}]
    for extra, field in [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}}, "response_format"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}, "tools"),
        ({"logprobs": True}, "logprobs"),
    ]:
        try:
            oa.chat.completions.create(model=args.model, messages=msgs, max_tokens=2, **extra)
        except openai.BadRequestError as e:
            assert e.body["param"] == field, e.body
        else:
            raise AssertionError(f"{field} was accepted")
    try:
        an.messages.create(model=args.model, max_tokens=2, messages=msgs,
                           output_config={"format": {"type": "json_schema", "schema": {"type": "object"}}})
    except anthropic.BadRequestError as e:
        assert "output_config.format" in str(e), e
    else:
        raise AssertionError("output_config.format was accepted")


@check("stream closed early frees the slot")
def closed_early(oa, an, args):
    s = oa.chat.completions.create(model=args.model, messages=[{"role": "user", "content": "Go on"}],
                                   max_tokens=200, temperature=0, stream=True,
                                   extra_body={"ignore_eos": True})
    next(iter(s))
    s.close()
    wait_idle(args)
    # The only slot (--max-batch 1 --queue 0) takes a new request at once.
    oa.chat.completions.create(model=args.model, messages=[{"role": "user", "content": "x"}], max_tokens=2)
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
    # 429: the only slot is taken by a running stream.
    s = oa.chat.completions.create(model=args.model, messages=[{"role": "user", "content": "Go on"}],
                                   max_tokens=200, temperature=0, stream=True,
                                   extra_body={"ignore_eos": True})
    it = iter(s)
    next(it)
    try:
        oa.chat.completions.create(model=args.model, messages=msgs, max_tokens=2)
    except openai.RateLimitError as e:
        assert e.response.headers.get("retry-after") == "1"
    else:
        raise AssertionError("no 429 while the only slot was busy")
    try:
        an.messages.create(model=args.model, max_tokens=2, messages=msgs)
    except anthropic.RateLimitError:
        pass
    else:
        raise AssertionError("no 429 while the only slot was busy")
    s.close()
    wait_idle(args)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True, help="the API's base URL, .../v1")
    ap.add_argument("--key", required=True)
    ap.add_argument("--model", required=True, help="the model's name in /v1/models")
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--coli", required=True)
    args = ap.parse_args()
    # No retries: a 429 must reach the test, not be retried away.
    oa = openai.OpenAI(base_url=args.url, api_key=args.key, max_retries=0, timeout=120)
    an = anthropic.Anthropic(base_url=args.url.removesuffix("/v1"), api_key=args.key,
                             max_retries=0, timeout=120)
    tests = [models_list, chat_equals_local, completions_equal_local, chat_stream, stop,
             anthropic_messages, refused, closed_early, errors]
    for t in tests:
        t(oa, an, args)
    print(f"{len(PASSED)} passed, 0 failed")


if __name__ == "__main__":
    sys.exit(main())
