#!/usr/bin/env python3
"""Train a small Mixture-of-Experts language model from scratch on Python's documentation.

    python tools/train/train.py --arch olmoe --out /work/models/olmoe-pydoc
    python tools/train/train.py --arch deepseek_v3 --out /work/models/deepseek-pydoc \\
        --tokenizer /work/models/olmoe-pydoc            # share the first run's tokenizer

Everything is seeded and deterministic for a given --threads (CPU float sums are split by
thread). The model is transformers' own class (OlmoeForCausalLM / DeepseekV3ForCausalLM),
trained in f32 with AdamW; OLMoE adds its load-balancing loss (router_aux_loss_coef), the
DeepSeek-V3 one balances its experts without a loss, as DeepSeek-V3 does: after every step
each MoE layer's e_score_correction_bias moves by --bias-rate towards under-used experts.
At the end every parameter is rounded to bf16, the held-out perplexity is measured on the
rounded model (exactly what is saved) and the folder is written with save_pretrained, in
the Hub's per-expert layout, with a tokenizer, a chat template and a model card (README.md).

Long runs are resumable: every --checkpoint-every steps the whole training state (weights,
AdamW moments, the data order and position, the curve, the wall time so far) is written
atomically to --state (default: OUT.state/), and a run started again with the same arguments
continues from it, to the same bits as a run that was never stopped (the tokenizer is kept
there too). --fresh ignores a saved state.

Besides the checkpoint the folder gets (not needed to run it):
    held_out.txt          the held-out text (whole files never seen in training)
    held_out_ids.txt      its token ids, comma separated (what `coli perplexity --ids-file` reads)
    train_log.json        the training curve and the settings
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import random
import sys
import time
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus  # noqa: E402

transformers.logging.set_verbosity_error()

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EOS_ID, IM_START_ID, IM_END_ID = 0, 1, 2

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def render_chat(user: str, assistant: str | None) -> str:
    s = SPECIALS[0] + "<|im_start|>user\n" + user + "<|im_end|>\n<|im_start|>assistant\n"
    if assistant is not None:
        s += assistant + "<|im_end|>\n"
    return s


# ----------------------------------------------------------------------------------------------
# tokenizer


def train_tokenizer(texts: list[str], vocab: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    assert tok.get_vocab_size() == vocab, tok.get_vocab_size()
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i
    return tok


def tokenizer_config(max_len: int) -> dict:
    added = {str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": True} for i, s in enumerate(SPECIALS)}
    return {"add_bos_token": False, "add_eos_token": False, "added_tokens_decoder": added,
            "bos_token": SPECIALS[0], "eos_token": SPECIALS[0], "pad_token": SPECIALS[0],
            "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False,
            "model_max_length": max_len, "tokenizer_class": "PreTrainedTokenizerFast"}


# ----------------------------------------------------------------------------------------------
# models


def config_for(arch: str, vocab: int, max_pos: int):
    common = dict(vocab_size=vocab, hidden_size=256, num_attention_heads=4,
                  max_position_embeddings=max_pos, bos_token_id=EOS_ID, eos_token_id=EOS_ID,
                  pad_token_id=EOS_ID, tie_word_embeddings=False, hidden_act="silu",
                  attention_dropout=0.0, initializer_range=0.02)
    if arch == "olmoe":
        # OLMoE-1B-7B's shape, shrunk: q/k norms, no shared expert, softmax router without
        # renormalising the top-k weights, 1 expert in 8 active (OLMoE: 8 of 64).
        return transformers.OlmoeConfig(**common, num_hidden_layers=5, num_key_value_heads=4,
                                        intermediate_size=32, num_experts=32, num_experts_per_tok=4,
                                        norm_topk_prob=False, rms_norm_eps=1e-5, clip_qkv=None,
                                        router_aux_loss_coef=0.01, output_router_logits=True,
                                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    if arch == "deepseek_v3":
        # DeepSeek-V3's shape, shrunk: MLA with a q LoRA, first layer dense, sigmoid router with
        # group-limited top-k and the correction bias, one shared expert.
        return transformers.DeepseekV3Config(**common, num_hidden_layers=4, num_key_value_heads=4,
                                             intermediate_size=512, moe_intermediate_size=32,
                                             n_routed_experts=32, n_shared_experts=1,
                                             num_experts_per_tok=4, n_group=4, topk_group=2,
                                             first_k_dense_replace=1, routed_scaling_factor=2.5,
                                             norm_topk_prob=True, q_lora_rank=64, kv_lora_rank=64,
                                             qk_rope_head_dim=32, qk_nope_head_dim=32, v_head_dim=32,
                                             rope_interleave=True, rms_norm_eps=1e-6,
                                             attention_bias=False, num_nextn_predict_layers=0,
                                             rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    raise SystemExit(f"unknown --arch {arch}")


CLASSES = {"olmoe": "OlmoeForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM"}


def routers(model) -> list[torch.nn.Module]:
    return [m for m in model.modules() if type(m).__name__.endswith(("TopkRouter", "TopKRouter"))]


class BiasBalancer:
    """DeepSeek-V3's auxiliary-loss-free balancing: count each router's choices during a
    step, then raise the correction bias of the experts used less than average and lower the
    others by `rate` (the bias only affects which experts are chosen, not their weights)."""

    def __init__(self, model, rate: float):
        self.rate = rate
        self.counts: dict[torch.nn.Module, torch.Tensor] = {}
        for r in routers(model):
            if hasattr(r, "e_score_correction_bias"):
                self.counts[r] = torch.zeros(r.num_experts)
                r.register_forward_hook(self._hook)

    def _hook(self, mod, args, out):
        if mod.training:
            idx = out[2].reshape(-1)
            self.counts[mod] += torch.bincount(idx, minlength=mod.num_experts).float()

    @torch.no_grad()
    def update(self):
        for r, c in self.counts.items():
            if c.sum() > 0:
                r.e_score_correction_bias += self.rate * torch.sign(c.mean() - c)
            c.zero_()


# ----------------------------------------------------------------------------------------------
# data


def token_stream(tok: Tokenizer, c: corpus.Corpus, seed: int) -> torch.Tensor:
    """Training documents and chat examples, shuffled, each starting with <|endoftext|>."""
    pieces = [SPECIALS[0] + d for d in c.train] + [render_chat(q, a) for q, a in c.chat]
    random.Random(seed).shuffle(pieces)
    ids: list[int] = []
    for enc in tok.encode_batch(pieces, add_special_tokens=False):
        ids.extend(enc.ids)
    return torch.tensor(ids, dtype=torch.long)


@torch.no_grad()
def held_out_nll(model, ids: torch.Tensor, ctx: int, max_windows: int | None = None,
                 batch: int = 8) -> tuple[float, int, int]:
    """llama-perplexity's method: non-overlapping windows of ctx ids, scoring the second
    half (targets ids[j+1] from the logits at j, j in [ctx/2, ctx-2]). Returns (sum of NLL
    in nats, tokens scored, windows)."""
    n = len(ids) // ctx
    if max_windows is not None:
        n = min(n, max_windows)
    first = ctx // 2
    total, count = 0.0, 0
    for s in range(0, n, batch):
        w = ids[s * ctx: min(n, s + batch) * ctx].view(-1, ctx)
        logits = model(input_ids=w).logits.float()
        lp = torch.log_softmax(logits[:, first: ctx - 1].double(), dim=-1)
        tgt = w[:, first + 1:]
        total -= float(lp.gather(-1, tgt.unsqueeze(-1)).sum())
        count += tgt.numel()
    return total, count, n


def bf16_round_(model) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).to(torch.float32))


def save_bf16(model, out: Path) -> None:
    """save_pretrained with every parameter in bf16 and buffers (the routers' correction
    bias) in f32, as published DeepSeek-V3 checkpoints keep them."""
    m = copy.deepcopy(model)
    m.config.output_router_logits = False
    with torch.no_grad():
        for p in m.parameters():
            p.data = p.data.to(torch.bfloat16)
    m.config.dtype = "bfloat16"
    m.save_pretrained(str(out))


# ----------------------------------------------------------------------------------------------
# resumable state

# The arguments a saved state must agree with to be continued.
STATE_KEYS = ("arch", "vocab", "seed", "steps", "batch", "seq", "max_positions", "lr", "warmup",
              "wd", "bias_rate", "threads", "eval_every", "eval_windows")


def save_state(path: Path, state: dict) -> None:
    """torch.save to a temporary file, fsync, then rename over the previous state: a crash
    at any moment leaves either the old state or the new one, never a torn file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_state(path: Path, args) -> dict | None:
    if args.fresh or not path.exists():
        return None
    state = torch.load(path, weights_only=False)
    want = {k: getattr(args, k) for k in STATE_KEYS}
    if state["args"] != want:
        diff = {k: (state["args"].get(k), v) for k, v in want.items() if state["args"].get(k) != v}
        raise SystemExit(f"{path} was saved by a run with other arguments (saved, now): {diff}; "
                         "pass the same arguments, or --fresh to start over")
    return state


# ----------------------------------------------------------------------------------------------
# model card


def model_card(args, cfg_json: dict, log: dict, c: corpus.Corpus) -> str:
    tr, ho = c.chars()
    arch = "OLMoE" if args.arch == "olmoe" else "DeepSeek-V3 (MLA)"
    curve = "\n".join(f"| {e['step']} | {e['tokens'] / 1e6:.2f} | {e['train_loss']:.3f} | "
                      f"{e['held_out_loss']:.3f} | {math.exp(e['held_out_loss']):.1f} | {e['minutes']:.1f} |"
                      for e in log["curve"])
    f = log["final"]
    moe = (f"{cfg_json['num_experts']} experts per layer, {cfg_json['num_experts_per_tok']} active, "
           f"expert width {cfg_json['intermediate_size']}, load-balancing loss coefficient "
           f"{cfg_json['router_aux_loss_coef']}") if args.arch == "olmoe" else (
        f"{cfg_json['n_routed_experts']} routed experts per MoE layer ({cfg_json['num_experts_per_tok']} active, "
        f"{cfg_json['n_group']} groups, top {cfg_json['topk_group']} groups) + {cfg_json['n_shared_experts']} shared, "
        f"expert width {cfg_json['moe_intermediate_size']}; layer 0 dense (width {cfg_json['intermediate_size']}); "
        f"MLA q_lora_rank {cfg_json['q_lora_rank']}, kv_lora_rank {cfg_json['kv_lora_rank']}; "
        f"auxiliary-loss-free balancing (bias rate {args.bias_rate})")
    return f"""---
license: apache-2.0
language: en
library_name: transformers
pipeline_tag: text-generation
tags: [moe, {args.arch}, colibri]
---

# {args.out.name}: a tiny {arch} mixture-of-experts trained on Python's documentation

A {f['params'] / 1e6:.2f} M-parameter `{CLASSES[args.arch]}` trained from scratch by colibri's
`tools/train/train.py` so that the engine has a model with trained weights to test and
measure against (quantization accuracy, routing, perplexity). It writes English about
Python; it is not a useful assistant.

- Architecture: {cfg_json['num_hidden_layers']} layers, hidden {cfg_json['hidden_size']}, {cfg_json['num_attention_heads']} heads; {moe}.
- Tokenizer: byte-level BPE, {cfg_json['vocab_size']} tokens, trained with `tokenizers` on the training split;
  `<|endoftext|>` = 0 (bos/eos/pad), `<|im_start|>` = 1, `<|im_end|>` = 2; ChatML chat template.
- Weights: bf16, Hub per-expert layout (`save_pretrained`){", routers' e_score_correction_bias in f32" if args.arch != "olmoe" else ""}.

## Data

Python 3.11's documentation (the reStructuredText sources in Debian 12's `python3.11-doc`
package, /usr/share/doc/python3.11/html/_sources), turned into plain text by
`tools/train/corpus.py`. Licence: Python Software Foundation License Version 2 (PSF-2.0);
the docs' code examples are also Zero-Clause BSD. Changes made: markup removed, sections
rewritten as chat examples ("Tell me about <heading>." answered by the section's first
paragraphs).

- Training: {len(c.train)} files, {tr / 1e6:.2f} MB of text, plus {len(c.chat)} chat examples;
  {log['train_tokens'] / 1e6:.2f} M tokens.
- Held out: {len(c.held_out)} whole files ({ho / 1e6:.2f} MB, {log['held_out_tokens']} tokens), chosen by the
  SHA-1 of their path: {', '.join(c.held_out_files)}. `held_out.txt` is that text,
  `held_out_ids.txt` its token ids.

## Training

Seed {args.seed}; {args.steps} steps of {args.batch} × {args.seq} tokens ({args.steps * args.batch * args.seq / 1e6:.2f} M tokens,
{args.steps * args.batch * args.seq / log['train_tokens']:.2f} epochs); AdamW (β 0.9/0.95, weight decay {args.wd} on matrices), learning
rate {args.lr} with {args.warmup} warm-up steps and a cosine decay to 10%, gradient clipping at 1.0;
f32, CPU, {args.threads} thread(s). Wall time {f['minutes']:.1f} minutes on a 2-core VM shared with other jobs
(torch {torch.__version__}, transformers {transformers.__version__}).

| step | tokens (M) | train loss | held-out loss | held-out ppl | minutes |
|---|---|---|---|---|---|
{curve}

(Held-out loss during training: the first {args.eval_windows} windows of {args.seq} ids, second halves
scored.)

## Held-out perplexity (bf16 weights, as saved)

llama-perplexity's method on {"all" if args.final_windows is None else f"the first {f['windows']} windows"} of `held_out_ids.txt`: non-overlapping windows of {args.seq}
ids, the tokens t[j+1] for j in [{args.seq // 2}, {args.seq - 2}] scored from the logits at j,
no BOS added: **perplexity {f['ppl']:.3f}** ({f['tokens_scored']} tokens in {f['windows']} windows,
NLL sum {f['nll_sum']:.3f} nats), computed by transformers in f32 on the bf16 weights.
`coli perplexity --model DIR --ids-file held_out_ids.txt --ctx {args.seq}{"" if args.final_windows is None else f" --chunks {f['windows']}"}` reproduces it.

## Use

```sh
coli run --local --model {args.out.name} "Tell me about lists."
coli perplexity --local --model {args.out.name} --file held_out.txt --ctx {args.seq}
```
"""


# ----------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", choices=list(CLASSES), default="olmoe")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--docs", type=Path, default=corpus.DEFAULT_DOCS)
    ap.add_argument("--tokenizer", type=Path, help="reuse tokenizer.json from this folder")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--max-positions", type=int, default=4096)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--bias-rate", type=float, default=2e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--eval-windows", type=int, default=64)
    ap.add_argument("--final-windows", type=int,
                    help="windows of the final held-out perplexity (default: all of the held-out ids)")
    ap.add_argument("--state", type=Path, help="resumable training state (default: OUT.state)")
    ap.add_argument("--checkpoint-every", type=int, default=10)
    ap.add_argument("--fresh", action="store_true", help="ignore a saved training state")
    ap.add_argument("--stop-at", type=int, help="exit after saving the state at this step "
                    "(to test resuming)")
    args = ap.parse_args()
    state_dir = args.state or args.out.with_name(args.out.name + ".state")
    state_file = state_dir / "train_state.pt"
    saved = load_state(state_file, args)

    t0 = time.time()
    # Wall time of earlier sessions of this run (their minutes count in the curve and card).
    before = saved["elapsed"] if saved else 0.0
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)

    c = corpus.load(args.docs, seed=args.seed)
    tr_chars, ho_chars = c.chars()
    print(f"corpus: {len(c.train)} training files ({tr_chars / 1e6:.2f} MB) + {len(c.chat)} chat examples, "
          f"{len(c.held_out)} held-out files ({ho_chars / 1e6:.2f} MB)", flush=True)
    if saved:
        tok = Tokenizer.from_str(saved["tokenizer"])
    elif args.tokenizer:
        tok = Tokenizer.from_file(str(args.tokenizer / "tokenizer.json"))
    else:
        tok = train_tokenizer(c.train + [q + "\n" + a for q, a in c.chat], args.vocab)
    vocab = tok.get_vocab_size()
    stream = token_stream(tok, c, args.seed)
    held_text = "\n\n".join(c.held_out)
    held = torch.tensor(tok.encode(held_text, add_special_tokens=False).ids, dtype=torch.long)
    print(f"tokens: {len(stream)} training, {len(held)} held out; vocab {vocab} "
          f"({time.time() - t0:.0f} s)", flush=True)

    cls = getattr(transformers, CLASSES[args.arch])
    config = config_for(args.arch, vocab, args.max_positions)
    model = cls._from_config(config, attn_implementation="sdpa", experts_implementation="grouped_mm",
                             dtype=torch.float32)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{CLASSES[args.arch]}: {n_params / 1e6:.2f} M parameters ({2 * n_params / 1e6:.1f} MB in bf16)", flush=True)
    balancer = BiasBalancer(model, args.bias_rate) if args.arch == "deepseek_v3" else None

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.wd},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)

    def lr_at(step):
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        p = (step - args.warmup) / max(1, args.steps - args.warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))

    # Sequences: non-overlapping windows of the stream, visited in a seeded random order
    # (re-shuffled every epoch).
    n_seq = (len(stream) - 1) // args.seq
    gen = torch.Generator().manual_seed(args.seed)
    order = torch.randperm(n_seq, generator=gen)
    pos = 0
    curve = []
    running = None
    first_step = 0
    if saved:
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        gen.set_state(saved["gen"])
        torch.set_rng_state(saved["rng"])
        order, pos, curve, running, first_step = (saved["order"], saved["pos"], saved["curve"],
                                                  saved["running"], saved["step"])
        print(f"resumed from {state_file} at step {first_step}/{args.steps} "
              f"({before / 60:.1f} min before)", flush=True)
        del saved

    def elapsed() -> float:
        return before + time.time() - t0

    def checkpoint(done: int) -> None:
        save_state(state_file, {
            "args": {k: getattr(args, k) for k in STATE_KEYS}, "step": done,
            "model": model.state_dict(), "opt": opt.state_dict(), "gen": gen.get_state(),
            "rng": torch.get_rng_state(), "order": order, "pos": pos, "curve": curve,
            "running": running, "elapsed": elapsed(), "tokenizer": tok.to_str()})

    t_session, first_session_step = time.time(), first_step
    for step in range(first_step, args.steps):
        model.train()
        if pos + args.batch > n_seq:
            order = torch.randperm(n_seq, generator=gen)
            pos = 0
        idx = order[pos: pos + args.batch]
        pos += args.batch
        x = torch.stack([stream[i * args.seq: (i + 1) * args.seq] for i in idx.tolist()])
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        out = model(input_ids=x, labels=x)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if balancer:
            balancer.update()
        lm = out.loss.item() - args_aux(out, config)
        running = lm if running is None else 0.95 * running + 0.05 * lm
        done = step + 1
        if done % args.eval_every == 0 or done == args.steps or done == 1:
            model.eval()
            with torch.no_grad():
                nll, cnt, _ = held_out_nll(model, held, args.seq, args.eval_windows)
            e = {"step": done, "tokens": done * args.batch * args.seq, "train_loss": running,
                 "held_out_loss": nll / cnt, "minutes": elapsed() / 60}
            curve.append(e)
        if done % args.checkpoint_every == 0 and done < args.steps:
            checkpoint(done)
            if done == args.stop_at:
                raise SystemExit(f"stopped at step {done} (--stop-at); state in {state_file}")
        el = time.time() - t_session
        rate = (done - first_session_step) * args.batch * args.seq / max(el, 1e-9)
        eta = (args.steps - done) * el / (done - first_session_step)
        bar = "=" * int(30 * done / args.steps)
        print(f"\r[{bar:<30}] step {done}/{args.steps} loss {running:.3f} "
              f"held-out {curve[-1]['held_out_loss']:.3f} {rate:.0f} tok/s ETA {eta / 60:.1f} min ",
              end="" if done < args.steps else "\n", flush=True)
    if first_step < args.steps:
        # The trained state, so that a crash while measuring or saving below costs no training.
        checkpoint(args.steps)

    # The shipped weights: bf16. Everything below is measured on exactly those values.
    model.eval()
    bf16_round_(model)
    with torch.no_grad():
        nll, cnt, windows = held_out_nll(model, held, args.seq, args.final_windows)
    final = {"params": n_params, "nll_sum": nll, "tokens_scored": cnt, "windows": windows,
             "ppl": math.exp(nll / cnt), "minutes": elapsed() / 60}
    print(f"held-out perplexity (bf16, ctx {args.seq}): {final['ppl']:.3f} over {cnt} tokens", flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    save_bf16(model, args.out)
    gen_cfg = {"bos_token_id": EOS_ID, "eos_token_id": [EOS_ID, IM_END_ID], "do_sample": False,
               "transformers_version": transformers.__version__}
    (args.out / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2) + "\n")
    tok.save(str(args.out / "tokenizer.json"))
    (args.out / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(args.max_positions), indent=2) + "\n")
    (args.out / "held_out.txt").write_text(held_text)
    (args.out / "held_out_ids.txt").write_text(",".join(map(str, held.tolist())) + "\n")
    cfg_json = json.loads((args.out / "config.json").read_text())
    log = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
           "train_tokens": len(stream), "held_out_tokens": len(held), "curve": curve, "final": final,
           "torch": torch.__version__, "transformers": transformers.__version__}
    (args.out / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")
    (args.out / "README.md").write_text(model_card(args, cfg_json, log, c))

    # The folder must load back with from_pretrained to exactly the weights measured above.
    back = cls.from_pretrained(str(args.out), dtype=torch.float32).eval()
    mine, theirs = dict(model.named_parameters()), dict(back.named_parameters())
    assert set(mine) == set(theirs)
    for k in mine:
        assert torch.equal(mine[k], theirs[k]), k
    for k, b in model.named_buffers():
        if k.endswith("e_score_correction_bias"):
            assert torch.equal(b, dict(back.named_buffers())[k]), k
    print(f"wrote {args.out} in {elapsed() / 60:.1f} min", flush=True)


def args_aux(out, config) -> float:
    """The load-balancing part of the loss (OLMoE adds coef * aux_loss to the LM loss)."""
    aux = getattr(out, "aux_loss", None)
    if aux is None:
        return 0.0
    return config.router_aux_loss_coef * aux.item()


if __name__ == "__main__":
    main()
