#!/usr/bin/env python3
"""Transformers' reference outputs for a trained checkpoint (the oracle the Rust tests use).

    python tools/train/reference.py --model models/olmoe-pydoc \\
        --held-out /work/models/olmoe-pydoc --out tests/fixtures/trained/olmoe-pydoc

Writes ref.json in the format of tools/oracle's fixtures (prompt_ids, greedy_ids, input_ids,
teacher-forced logits of every position) plus two perplexity references, scored with
llama-perplexity's method (second half of each window) by transformers in f32 on the bf16
weights, eager attention, eager experts: the first --windows windows of --ctx held-out ids,
and the start of the held-out text as transformers' tokenizer encodes it (special tokens
included, as `coli perplexity --file` encodes a text).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch
import transformers

transformers.logging.set_verbosity_error()
torch.set_num_threads(1)

PROMPTS = ["Tell me about lists.", "What is a dictionary?", "Explain exceptions.",
           "Tell me about the for statement.", "What is a module?", "Explain classes.",
           "Tell me about strings.", "What is a function?", "Explain generators.",
           "Tell me about files.", "What is a tuple?", "Explain the import system."]
N_GREEDY = 20
# Min top-1/top-2 logit gap over the greedy steps: no near-ties. 5x the Rust tests' logit
# tolerance (2e-3), so an engine within tolerance cannot pick another token.
MIN_GAP = 0.01
TEXT_CHARS = 4000


def fmt(x: float) -> float:
    return float(f"{x:.6g}")


def chat_ids(tok, text: str) -> list[int]:
    ids = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                  add_generation_prompt=True)
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return list(ids)


@torch.no_grad()
def greedy(model, prompt: list[int]) -> tuple[list[int], float]:
    ids = list(prompt)
    gaps = []
    for _ in range(N_GREEDY):
        logits = model(torch.tensor([ids])).logits[0, -1].float()
        top = torch.topk(logits, 2).values
        gaps.append(float(top[0] - top[1]))
        ids.append(int(torch.argmax(logits)))
    return ids[len(prompt):], min(gaps)


@torch.no_grad()
def perplexity(model, ids: list[int], ctx: int, windows: int) -> dict:
    first = ctx // 2
    nll, count = 0.0, 0
    for w in range(windows):
        x = torch.tensor([ids[w * ctx:(w + 1) * ctx]])
        lp = torch.log_softmax(model(x).logits[0].double(), dim=-1)
        for j in range(first, ctx - 1):
            nll -= float(lp[j, x[0, j + 1]])
            count += 1
    return {"ctx": ctx, "ids": ids[: windows * ctx], "windows": windows, "tokens_scored": count,
            "nll_sum": nll, "ppl": math.exp(nll / count)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--held-out", type=Path, required=True,
                    help="the training run's folder (held_out.txt and held_out_ids.txt)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--windows", type=int, default=4)
    a = ap.parse_args()

    config = transformers.AutoConfig.from_pretrained(str(a.model))
    cls = getattr(transformers, config.architectures[0])
    model = cls.from_pretrained(str(a.model), dtype=torch.float32, attn_implementation="eager",
                                experts_implementation="eager").eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(a.model))
    chosen = None
    for text in PROMPTS:
        prompt = chat_ids(tok, text)
        out, gap = greedy(model, prompt)
        ids = prompt + out
        tf = model(torch.tensor([ids])).logits[0].float()
        consistent = tf.argmax(-1).tolist()[len(prompt) - 1: len(ids) - 1] == out
        print(f"{text!r}: gap {gap:.4f}, consistent {consistent}: {tok.decode(out)!r}")
        if gap > MIN_GAP and consistent:
            chosen = (text, prompt, out, ids, tf, gap)
            break
    if chosen is None:
        raise SystemExit("no prompt gives a greedy continuation without near-ties")
    text, prompt, out, ids, tf, gap = chosen
    held = [int(x) for x in (a.held_out / "held_out_ids.txt").read_text().replace(",", " ").split()]
    ppl = perplexity(model, held, a.ctx, a.windows)
    print(f"perplexity of the first {a.windows} windows of {a.ctx}: {ppl['ppl']:.6f}")
    # A text tokenized by transformers' tokenizer (what `coli perplexity --file` does with ours):
    # the start of the held-out text, cut at a line end, a few windows long.
    text = (a.held_out / "held_out.txt").read_text()[:TEXT_CHARS]
    text = text[: text.rfind("\n") + 1]
    text_ids = tok(text, add_special_tokens=True)["input_ids"]
    text_windows = len(text_ids) // a.ctx
    text_ppl = perplexity(model, text_ids, a.ctx, text_windows)
    text_ppl.pop("ids")
    text_ppl["text"] = text
    print(f"perplexity of {len(text)} characters ({len(text_ids)} ids): {text_ppl['ppl']:.6f}")
    ref = {
        "model": a.model.name,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "prompt_text": text,
        "prompt_ids": prompt,
        "greedy_ids": out,
        "greedy_text": tok.decode(out),
        "input_ids": ids,
        "logits": [[fmt(x) for x in row] for row in tf.tolist()],
        "top2_gap_min_greedy": fmt(gap),
        "perplexity": ppl,
        "perplexity_text": text_ppl,
        "notes": "reference = transformers, eager attention and experts, f32 compute on the bf16 "
                 "checkpoint as saved (loaded with from_pretrained(dtype=float32)); prompt = the "
                 "user message through the model's chat template; perplexity = llama-perplexity's "
                 "method on the first windows of the held-out ids (no BOS added)",
    }
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "ref.json").write_text(json.dumps(ref, ensure_ascii=False, separators=(",", ":")) + "\n")
    print(f"wrote {a.out / 'ref.json'}")


if __name__ == "__main__":
    main()
