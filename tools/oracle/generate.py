#!/usr/bin/env python3
"""Generate tiny random-weight MoE fixtures with a Hugging Face transformers oracle.

    python tools/oracle/generate.py --out tests/fixtures [--family olmoe] [--family mixtral ...]

For every family this builds a tiny model in f32, re-initialises all weights, rounds every
parameter to bf16 (in place, on the f32 model; buffers such as rotary inv_freq and the router's
e_score_correction_bias stay f32), computes the reference in f32 with eager attention, and saves:

    config.json, generation_config.json, tokenizer.json, tokenizer_config.json,
    model.safetensors (or shards + model.safetensors.index.json), ref.json

The checkpoint uses the Hub's per-expert layout (model.layers.L.mlp.experts.E.gate_proj.weight ...),
written by this script (not by save_pretrained), in bf16 except e_score_correction_bias (f32).
Every fixture is reloaded with from_pretrained and must reproduce the reference logits.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus import corpus  # noqa: E402

transformers.logging.set_verbosity_error()
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

VOCAB_SIZE = 512
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EOS_ID, IM_START_ID, IM_END_ID = 0, 1, 2
N_PROMPT = 12
N_GREEDY = 20
MIN_GAP = 0.015  # min top1-top2 logit gap over the greedy steps (the brief asks > 0.01)
MIN_GREEDY_DISTINCT = 6  # distinct tokens in the 20-token greedy continuation (no trivial loops)
MIN_SOFTMAX_ROUTER_MARGIN = 2e-3  # logits: k-th vs (k+1)-th expert
MIN_SIGMOID_ROUTER_MARGIN = 5e-4  # scores (+bias): k-th vs (k+1)-th expert / group
MIN_INDEXER_MARGIN = 1e-3  # DSA index scores: k-th vs (k+1)-th key
MIN_DISTINCT_EXPERTS = 5  # per MoE layer, over the 32 positions

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

PROMPTS = [
    "The café near the river was quiet, and the old clock struck",
    "Once upon a time, a naïve robot in 日本 wanted to learn",
    "Mixture-of-experts models route every token to a few experts 🚀",
    "She opened the window and the cold morning air filled the room",
    "Our team shipped the new version on Tuesday; the tests passed",
    "In 1969, two astronauts walked on the Moon while millions watched",
    "Good software is simple, honest about its errors, and kind",
    "The weather today is sunny with a light breeze from the west",
]


# ----------------------------------------------------------------------------------------------
# tokenizer


def train_tokenizer(specials: list[str] = SPECIALS) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus().splitlines(keepends=True), trainer=trainer)
    assert tok.get_vocab_size() == VOCAB_SIZE, tok.get_vocab_size()
    for i, s in enumerate(specials):
        assert tok.token_to_id(s) == i
    # multi-byte UTF-8 tokens must exist (merged non-ASCII), as well as lone-byte ones
    multibyte = [t for t in tok.get_vocab() if len(tok.decode([tok.token_to_id(t)]).encode()) > 1
                 and any(ord(c) > 127 for c in tok.decode([tok.token_to_id(t)]))]
    assert multibyte, "no merged multi-byte token"
    return tok


def tokenizer_config() -> dict:
    added = {
        str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                 "single_word": False, "special": True}
        for i, s in enumerate(SPECIALS)
    }
    return {
        "add_bos_token": False,
        "add_eos_token": False,
        "added_tokens_decoder": added,
        "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 256,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }


def pick_prompt(tok: Tokenizer, start: int) -> tuple[str, list[int]]:
    """A prompt whose encoding is exactly N_PROMPT ids (cut at a token boundary that round-trips)."""
    for k in range(len(PROMPTS)):
        text = PROMPTS[(start + k) % len(PROMPTS)]
        ids = tok.encode(text, add_special_tokens=False).ids
        if len(ids) < N_PROMPT:
            continue
        cut = tok.decode(ids[:N_PROMPT])
        if tok.encode(cut, add_special_tokens=False).ids == ids[:N_PROMPT] and "\ufffd" not in cut:
            return cut, ids[:N_PROMPT]
    raise RuntimeError("no prompt of 12 tokens")


# ----------------------------------------------------------------------------------------------
# families


def common(vocab: int) -> dict:
    return dict(vocab_size=vocab, hidden_size=64, num_attention_heads=4, max_position_embeddings=256,
                bos_token_id=EOS_ID, eos_token_id=EOS_ID, pad_token_id=None, tie_word_embeddings=False,
                hidden_act="silu", attention_dropout=0.0)


YARN = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 32,
        "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}


def cfg_olmoe(v):
    return transformers.OlmoeConfig(**common(v), intermediate_size=32, num_hidden_layers=2,
                                    num_key_value_heads=4, rms_norm_eps=1e-5, num_experts=8,
                                    num_experts_per_tok=2, norm_topk_prob=False, clip_qkv=None,
                                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


def cfg_qwen3_moe(v):
    c = common(v)
    c["tie_word_embeddings"] = True
    # Room for the real Qwen3 chat template's tool prompt (chat_template.jinja below); the
    # default RoPE does not depend on it.
    c["max_position_embeddings"] = 2048
    return transformers.Qwen3MoeConfig(**c, num_key_value_heads=2, head_dim=32, intermediate_size=64,
                                       moe_intermediate_size=32, num_hidden_layers=3, mlp_only_layers=[1],
                                       decoder_sparse_step=1, num_experts=8, num_experts_per_tok=2,
                                       norm_topk_prob=True, rms_norm_eps=1e-6,
                                       rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})


def cfg_mixtral(v):
    return transformers.MixtralConfig(**common(v), num_key_value_heads=2, intermediate_size=32,
                                      num_hidden_layers=2, num_local_experts=8, num_experts_per_tok=2,
                                      rms_norm_eps=1e-5, sliding_window=None,
                                      rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})


def _ds_common(v):
    return dict(**common(v), num_key_value_heads=4, intermediate_size=64, moe_intermediate_size=32,
                num_hidden_layers=3, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
                kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32,
                first_k_dense_replace=1, routed_scaling_factor=2.5, norm_topk_prob=True,
                rms_norm_eps=1e-6, attention_bias=False)


def cfg_deepseek_v3(v):
    rp = dict(YARN)
    rp["rope_type"] = rp.pop("type")
    rp["rope_theta"] = 10000.0
    return transformers.DeepseekV3Config(**_ds_common(v), q_lora_rank=32, n_group=4, topk_group=2,
                                         rope_interleave=True, rope_parameters=rp,
                                         num_nextn_predict_layers=1)


def cfg_deepseek_v3_noqlora(v):
    rp = dict(YARN)
    rp["rope_type"] = rp.pop("type")
    rp["rope_theta"] = 10000.0
    return transformers.DeepseekV3Config(**_ds_common(v), q_lora_rank=None, n_group=4, topk_group=2,
                                         rope_interleave=True, rope_parameters=rp,
                                         num_nextn_predict_layers=0)


def cfg_glm4_moe(v):
    return transformers.Glm4MoeConfig(**common(v), num_key_value_heads=2, head_dim=32, intermediate_size=64,
                                      moe_intermediate_size=32, num_hidden_layers=3, n_routed_experts=8,
                                      n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
                                      first_k_dense_replace=1, routed_scaling_factor=2.5, norm_topk_prob=True,
                                      use_qk_norm=True, attention_bias=True, rms_norm_eps=1e-5,
                                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                       "partial_rotary_factor": 0.5},
                                      num_nextn_predict_layers=0)


def cfg_glm_moe_dsa(v):
    return transformers.GlmMoeDsaConfig(**common(v), num_key_value_heads=4, intermediate_size=64,
                                        moe_intermediate_size=32, num_hidden_layers=3, n_routed_experts=8,
                                        n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
                                        first_k_dense_replace=1, routed_scaling_factor=2.5, norm_topk_prob=True,
                                        q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=16,
                                        qk_nope_head_dim=32, v_head_dim=32, index_topk=8, index_head_dim=32,
                                        index_n_heads=8, rms_norm_eps=1e-5, attention_bias=False,
                                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                                        num_nextn_predict_layers=1)


FAMILIES = {
    # name: (config fn, model class, config style, generation eos, mtp, shards)
    "olmoe": dict(cfg=cfg_olmoe, cls="OlmoeForCausalLM", style="legacy", gen_eos=EOS_ID),
    "qwen3_moe": dict(cfg=cfg_qwen3_moe, cls="Qwen3MoeForCausalLM", style="v5", gen_eos=[EOS_ID, IM_END_ID]),
    "mixtral": dict(cfg=cfg_mixtral, cls="MixtralForCausalLM", style="legacy", gen_eos=EOS_ID, shards=3),
    "deepseek_v3": dict(cfg=cfg_deepseek_v3, cls="DeepseekV3ForCausalLM", style="legacy", gen_eos=EOS_ID,
                        mtp=True),
    "deepseek_v3_noqlora": dict(cfg=cfg_deepseek_v3_noqlora, cls="DeepseekV3ForCausalLM", style="v5",
                                gen_eos=EOS_ID),
    "glm4_moe": dict(cfg=cfg_glm4_moe, cls="Glm4MoeForCausalLM", style="legacy",
                     gen_eos=[EOS_ID, IM_END_ID]),
    "glm_moe_dsa": dict(cfg=cfg_glm_moe_dsa, cls="GlmMoeDsaForCausalLM", style="v5",
                        gen_eos=[EOS_ID, IM_END_ID], mtp=True),
}


# ----------------------------------------------------------------------------------------------
# weights


def bf16_round_(t: torch.Tensor) -> None:
    t.copy_(t.to(torch.bfloat16).to(torch.float32))


@torch.no_grad()
def reinit_(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Re-initialise every parameter, then round it to bf16 in place. Buffers are left alone except
    e_score_correction_bias, which gets non-zero random f32 values (not rounded)."""
    for name, p in model.named_parameters():  # shared (tied) parameters are visited once
        leaf = name.split(".")[-1]
        is_norm = "norm" in name and leaf == "weight"
        if is_norm:
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
        elif leaf == "bias":
            p.copy_(0.05 * torch.randn(p.shape, generator=gen))
        elif name.endswith("embed_tokens.weight"):
            # smallish embeddings so the residual stream is not dominated by the current token
            # (with tied embeddings that makes greedy decoding repeat one token forever)
            p.copy_(0.05 * torch.randn(p.shape, generator=gen))
        else:  # projections, routers (varied routing), experts, lm_head
            p.copy_(0.1 * torch.randn(p.shape, generator=gen))
        bf16_round_(p)
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            b.copy_(0.05 * torch.randn(b.shape, generator=gen, dtype=torch.float32))


def hub_state_dict(sd: dict[str, torch.Tensor], family: str) -> dict[str, torch.Tensor]:
    """In-memory (fused experts) names -> Hub per-expert names. bf16 except e_score_correction_bias."""
    out: dict[str, torch.Tensor] = {}

    def put(name, t):
        if family == "mixtral":
            name = name.replace(".mlp.", ".block_sparse_moe.")
            name = name.replace(".gate_proj.weight", ".w1.weight").replace(".up_proj.weight", ".w3.weight")
            name = name.replace(".down_proj.weight", ".w2.weight")
        if name.endswith("e_score_correction_bias"):
            out[name] = t.detach().to(torch.float32).contiguous().clone()
        else:
            assert t.dtype == torch.float32
            b = t.detach().to(torch.bfloat16)
            assert torch.equal(b.to(torch.float32), t.detach()), f"{name} not bf16-exact"
            out[name] = b.contiguous().clone()

    for name, t in sd.items():
        if name.endswith("experts.gate_up_proj"):
            pre = name[: -len("gate_up_proj")]
            E, twoI, _ = t.shape
            inter = twoI // 2
            # modeling code: gate, up = linear(x, gate_up_proj[e]).chunk(2, dim=-1) -> first half is gate
            for e in range(E):
                put(f"{pre}{e}.gate_proj.weight", t[e, :inter, :])
                put(f"{pre}{e}.up_proj.weight", t[e, inter:, :])
        elif name.endswith("experts.down_proj"):
            pre = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                put(f"{pre}{e}.down_proj.weight", t[e])
        else:
            put(name, t)
    return out


@torch.no_grad()
def mtp_tensors(model, config, family_cls, gen) -> dict[str, torch.Tensor]:
    """Random MTP weights as published DeepSeek-V3 / GLM checkpoints ship them (layer index N)."""
    n = config.num_hidden_layers
    cfg = copy.deepcopy(config)
    cfg.num_hidden_layers = n + 1
    for attr, extra in (("mlp_layer_types", "sparse"), ("indexer_types", "full"), ("layer_types", None)):
        val = getattr(cfg, attr, None)
        if isinstance(val, list) and len(val) == n:
            val.append(extra if extra is not None else val[-1])
    layer_cls = type(model.model.layers[0])
    layer = layer_cls(cfg, n)
    reinit_(layer, gen)
    pre = f"model.layers.{n}."
    sd = {pre + k: v for k, v in layer.state_dict().items()}
    H, V = config.hidden_size, config.vocab_size

    def norm(shape):
        t = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        bf16_round_(t)
        return t

    def w(shape):
        t = 0.1 * torch.randn(shape, generator=gen)
        bf16_round_(t)
        return t

    sd[pre + "enorm.weight"] = norm((H,))
    sd[pre + "hnorm.weight"] = norm((H,))
    sd[pre + "eh_proj.weight"] = w((H, 2 * H))
    sd[pre + "shared_head.norm.weight"] = norm((H,))
    sd[pre + "shared_head.head.weight"] = w((V, H))
    if family_cls == "DeepseekV3ForCausalLM":
        sd[pre + "embed_tokens.weight"] = model.model.embed_tokens.weight.detach().clone()
    return sd


def write_safetensors(tensors: dict[str, torch.Tensor], out: Path, shards: int) -> list[str]:
    names = sorted(tensors, key=_natural_key)
    if shards <= 1:
        save_file({k: tensors[k] for k in names}, str(out / "model.safetensors"), metadata={"format": "pt"})
        return ["model.safetensors"]
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    per = total / shards
    groups: list[list[str]] = [[]]
    acc = 0
    for k in names:
        sz = tensors[k].numel() * tensors[k].element_size()
        if groups[-1] and acc + sz > per * len(groups) and len(groups) < shards:
            groups.append([])
        groups[-1].append(k)
        acc += sz
    files = []
    weight_map = {}
    for i, g in enumerate(groups):
        fn = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        save_file({k: tensors[k] for k in g}, str(out / fn), metadata={"format": "pt"})
        files.append(fn)
        for k in g:
            weight_map[k] = fn
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items(),
                                                                         key=lambda kv: _natural_key(kv[0])))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return files


def _natural_key(s: str):
    return [int(p) if p.isdigit() else p for p in s.replace(".", " . ").split()]


# ----------------------------------------------------------------------------------------------
# config files


def write_config(config, out: Path, family: str, style: str, cls_name: str, mtp: bool) -> dict:
    config.architectures = [cls_name]
    with tempfile.TemporaryDirectory() as td:
        config.save_pretrained(td)
        d = json.loads((Path(td) / "config.json").read_text())
    d["architectures"] = [cls_name]
    d.pop("dtype", None)
    d.pop("torch_dtype", None)
    if style == "legacy":
        rp = d.pop("rope_parameters")
        d["rope_theta"] = rp["rope_theta"]
        if "partial_rotary_factor" in rp:
            d["partial_rotary_factor"] = rp["partial_rotary_factor"]
        if rp["rope_type"] == "default":
            if family != "mixtral":  # Mixtral's Hub config has no rope_scaling key at all
                d["rope_scaling"] = None
        else:
            legacy = {"type": rp["rope_type"]}
            for k in ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale",
                      "mscale_all_dim"):
                if k in rp:
                    legacy[k] = rp[k]
            d["rope_scaling"] = legacy
        d["torch_dtype"] = "bfloat16"
        if family == "deepseek_v3":
            for k in ("head_dim", "qk_head_dim"):  # derived; the Hub config does not have them
                d.pop(k, None)
            d.update({"topk_method": "noaux_tc", "scoring_func": "sigmoid", "moe_layer_freq": 1,
                      "ep_size": 1})
        if family == "mixtral":
            if d.get("head_dim") is None:
                d.pop("head_dim", None)
    else:
        d["dtype"] = "bfloat16"
    if mtp:
        d["num_nextn_predict_layers"] = 1
    elif "num_nextn_predict_layers" in d:
        d["num_nextn_predict_layers"] = 0
    d = dict(sorted(d.items()))
    (out / "config.json").write_text(json.dumps(d, indent=2, ensure_ascii=False) + "\n")
    return d


# ----------------------------------------------------------------------------------------------
# oracle checks


def is_router(mod) -> bool:
    n = type(mod).__name__
    return n.endswith("TopKRouter") or n.endswith("TopkRouter")


@torch.no_grad()
def router_stats(mod, x) -> tuple[float, torch.Tensor]:
    x = x.reshape(-1, mod.hidden_dim).float()
    logits = x @ mod.weight.float().t()
    k = mod.top_k
    if hasattr(mod, "e_score_correction_bias"):
        s = logits.sigmoid()
        sc = s + mod.e_score_correction_bias
        G, E = mod.num_group, mod.num_experts
        margin = math.inf
        gs = sc.view(-1, G, E // G).topk(2, dim=-1).values.sum(-1)
        if mod.topk_group < G:
            gsort = gs.sort(-1, descending=True).values
            margin = min(margin, float((gsort[:, mod.topk_group - 1] - gsort[:, mod.topk_group]).min()))
        gidx = gs.topk(mod.topk_group, dim=-1).indices
        gmask = torch.zeros_like(gs).scatter_(1, gidx, 1).bool()
        emask = gmask.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E)
        sc = sc.masked_fill(~emask, float("-inf"))
        ss = sc.sort(-1, descending=True).values
        if k < ss.shape[1]:
            m = ss[:, k - 1] - ss[:, k]
            margin = min(margin, float(m.min()))
        chosen = sc.topk(k, dim=-1).indices
        # diagnostics: how many tokens would pick a different expert set without the correction
        # bias, or without the group limit
        def sel(v):
            return set(map(tuple, v.topk(k, dim=-1).indices.sort(-1).values.tolist()))
        base = chosen.sort(-1).values.tolist()
        nobias = s.view(-1, G, E // G).topk(2, dim=-1).values.sum(-1).topk(mod.topk_group, dim=-1).indices
        nb_mask = torch.zeros_like(gs).scatter_(1, nobias, 1).bool().unsqueeze(-1).expand(-1, G, E // G)
        nb = s.masked_fill(~nb_mask.reshape(-1, E), float("-inf")).topk(k, dim=-1).indices.sort(-1).values.tolist()
        ng = (s + mod.e_score_correction_bias).topk(k, dim=-1).indices.sort(-1).values.tolist()
        mod._oracle_diag = (sum(a != b for a, b in zip(base, nb)), sum(a != b for a, b in zip(base, ng)),
                            len(base))
        return margin / MIN_SIGMOID_ROUTER_MARGIN, chosen
    ls = logits.sort(-1, descending=True).values
    margin = float((ls[:, k - 1] - ls[:, k]).min())
    chosen = logits.topk(k, dim=-1).indices
    return margin / MIN_SOFTMAX_ROUTER_MARGIN, chosen


@torch.no_grad()
def indexer_margin(mod, args) -> float:
    """Recompute GlmMoeDsaIndexer's index scores (same code path) and return the min gap between the
    k-th and (k+1)-th causal key over all query positions that have more than k keys."""
    hidden_states, q_resid, (cos, sin), attention_mask = args[:4]
    from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import apply_rotary_pos_emb_interleave
    B, S, _ = hidden_states.shape
    q = mod.wq_b(q_resid).view(B, S, mod.n_heads, mod.head_dim)
    q_rot, q_pass = torch.split(q, [mod.qk_rope_head_dim, mod.head_dim - mod.qk_rope_head_dim], dim=-1)
    kk = mod.k_norm(mod.wk(hidden_states)).unsqueeze(2)
    k_rot, k_pass = torch.split(kk, [mod.qk_rope_head_dim, mod.head_dim - mod.qk_rope_head_dim], dim=-1)
    q_rot, k_rot = apply_rotary_pos_emb_interleave(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
    q = torch.cat([q_rot, q_pass], dim=-1)
    kk = torch.cat([k_rot, k_pass], dim=-1).squeeze(2)
    scores = F.relu(torch.matmul(q.float(), kk.transpose(-1, -2).float().unsqueeze(1)) * mod.softmax_scale)
    weights = mod.weights_proj(hidden_states).float() * (mod.n_heads ** -0.5)
    idx = torch.matmul(weights.unsqueeze(-2), scores).squeeze(-2)  # [B, S, T]
    m = math.inf
    topk = mod.index_topk
    for s in range(S):
        if s + 1 <= topk:
            continue
        v = idx[0, s, : s + 1].sort(descending=True).values
        m = min(m, float(v[topk - 1] - v[topk]))
    return m


class Probe:
    """Forward hooks recording routing margins, distinct experts, and DSA indexer margins."""

    def __init__(self, model):
        self.router_margin = math.inf  # normalised: 1.0 == threshold
        self.experts: dict[str, set] = {}
        self.indexer = math.inf
        self.diag: dict[str, tuple] = {}
        self.handles = []
        for name, mod in model.named_modules():
            if is_router(mod):
                self.handles.append(mod.register_forward_hook(self._router_hook(name)))
            if type(mod).__name__.endswith("Indexer"):
                self.handles.append(mod.register_forward_hook(self._indexer_hook))

    def _router_hook(self, name):
        def hook(mod, args, out):
            m, chosen = router_stats(mod, args[0])
            self.router_margin = min(self.router_margin, m)
            self.experts.setdefault(name, set()).update(int(i) for i in chosen.flatten())
            if hasattr(mod, "_oracle_diag"):
                self.diag[name] = mod._oracle_diag
        return hook

    def _indexer_hook(self, mod, args, out):
        self.indexer = min(self.indexer, indexer_margin(mod, args))

    def close(self):
        for h in self.handles:
            h.remove()


@torch.no_grad()
def run_oracle(model, prompt_ids, probe_cls=None):
    """Greedy ids (a full forward per step), the teacher-forced logits with `probe_cls`'s
    hooks (default Probe) attached, the min top-1/top-2 gap and whether both agree."""
    probe_cls = probe_cls or Probe
    ids = list(prompt_ids)
    gaps = []
    for _ in range(N_GREEDY):
        logits = model(torch.tensor([ids])).logits[0, -1].float()
        top = torch.topk(logits, 2).values
        gaps.append(float(top[0] - top[1]))
        ids.append(int(torch.argmax(logits)))
    greedy = ids[len(prompt_ids):]
    probe = probe_cls(model)
    tf = model(torch.tensor([ids])).logits[0].float()
    probe.close()
    # teacher-forced argmax must agree with the step-by-step greedy continuation
    am = tf.argmax(-1).tolist()
    consistent = am[len(prompt_ids) - 1: len(ids) - 1] == greedy
    return greedy, ids, tf, min(gaps), probe, consistent


def load_model(cls, src, **kw):
    return cls.from_pretrained(src, dtype=torch.float32, attn_implementation="eager",
                               experts_implementation="eager", **kw).eval()


def build(family: str, spec: dict, tok: Tokenizer, seed: int):
    cls = getattr(transformers, spec["cls"])
    config = spec["cfg"](tok.get_vocab_size())
    model = cls._from_config(config, attn_implementation="eager", experts_implementation="eager",
                             dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(seed)
    reinit_(model, gen)
    return cls, config, model, gen


def fmt(x: float) -> float:
    return float(f"{x:.6g}")


def generate_family(family: str, out_root: Path, tok: Tokenizer, max_tries: int = 300) -> dict:
    spec = FAMILIES[family]
    seed_base = 1000 * (list(FAMILIES).index(family) + 1)
    chosen = None
    for t in range(max_tries):
        seed = seed_base + t
        cls, config, model, gen = build(family, spec, tok, seed)
        prompt_text, prompt_ids = pick_prompt(tok, t)
        greedy, ids, tf, gap, probe, consistent = run_oracle(model, prompt_ids)
        distinct = min((len(v) for v in probe.experts.values()), default=99)
        ok = (gap > MIN_GAP and probe.router_margin >= 1.0 and probe.indexer >= MIN_INDEXER_MARGIN
              and consistent and distinct >= MIN_DISTINCT_EXPERTS and len(set(greedy)) >= MIN_GREEDY_DISTINCT)
        print(f"  {family} seed {seed}: gap {gap:.4f} router {probe.router_margin:.2f}x "
              f"indexer {probe.indexer:.2e} experts {distinct} greedy-distinct {len(set(greedy))} "
              f"consistent {consistent} -> {'ok' if ok else 'retry'}")
        if ok:
            chosen = (seed, cls, config, model, gen, prompt_text, prompt_ids, greedy, ids, tf, gap, probe)
            break
    if chosen is None:
        raise RuntimeError(f"{family}: no seed passed the robustness checks")
    seed, cls, config, model, gen, prompt_text, prompt_ids, greedy, ids, tf, gap, probe = chosen

    out = out_root / family
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)

    # ---- checkpoint (Hub per-expert layout) ----
    sd = model.state_dict()  # params + persistent buffers (e_score_correction_bias); no inv_freq
    if config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    tensors = hub_state_dict(sd, family)
    if spec.get("mtp"):
        tensors.update(hub_state_dict(mtp_tensors(model, config, spec["cls"], gen), family))
    files = write_safetensors(tensors, out, spec.get("shards", 1))

    # ---- config, generation config, tokenizer ----
    cfg_json = write_config(config, out, family, spec["style"], spec["cls"], bool(spec.get("mtp")))
    gen_cfg = {"bos_token_id": EOS_ID, "eos_token_id": spec["gen_eos"], "do_sample": False,
               "transformers_version": transformers.__version__}
    (out / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2) + "\n")
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2, ensure_ascii=False) + "\n")
    if family == "qwen3_moe":
        # The real Qwen3 chat template (tools, tool calls, think tags): tool-calling tests
        # run on this fixture. chat_template.jinja takes precedence over tokenizer_config's.
        shutil.copy(Path(__file__).resolve().parents[2] / "tests/fixtures/templates/qwen3.jinja",
                    out / "chat_template.jinja")

    # ---- verify: reload from the folder and compare ----
    reloaded = load_model(cls, str(out))
    with torch.no_grad():
        rl = reloaded(torch.tensor([ids])).logits[0].float()
    diff = float((rl - tf).abs().max())
    mine = dict(model.named_parameters())
    theirs = dict(reloaded.named_parameters())
    assert set(mine) == set(theirs), (set(mine) ^ set(theirs))
    for k in mine:
        assert torch.equal(mine[k], theirs[k]), f"{family}: reloaded {k} differs"
    for k, b in model.named_buffers():
        if k.endswith("e_score_correction_bias"):
            assert torch.equal(b, dict(reloaded.named_buffers())[k]), k
    assert diff < 1e-5, f"{family}: reload logits differ by {diff}"
    # the written tensors must be exactly what the oracle used
    loaded = {}
    for fn in files:
        loaded.update(load_file(str(out / fn)))
    assert set(loaded) == set(tensors)
    for k, v in tensors.items():
        assert loaded[k].dtype == v.dtype and torch.equal(loaded[k], v), k
    # tokenizer via transformers
    htok = transformers.AutoTokenizer.from_pretrained(str(out))
    assert htok.encode(prompt_text, add_special_tokens=False) == prompt_ids
    assert len(htok) == config.vocab_size

    notes = family_notes(family, config, cfg_json, probe, seed, diff)
    ref = {
        "family": family,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "prompt_text": prompt_text,
        "prompt_ids": prompt_ids,
        "greedy_ids": greedy,
        "input_ids": ids,
        "logits": [[fmt(x) for x in row] for row in tf.tolist()],
        "top2_gap_min_greedy": fmt(gap),
        "notes": notes,
    }
    (out / "ref.json").write_text(json.dumps(ref, ensure_ascii=False, separators=(",", ":")) + "\n")
    print(f"  {family}: wrote {out} (seed {seed}, reload max|diff| {diff:.2e}, gap {gap:.4f})")
    return {"family": family, "seed": seed, "reload_diff": diff, "gap": gap,
            "tensors": {k: (list(v.shape), str(v.dtype).replace("torch.", "")) for k, v in tensors.items()}}


def family_notes(family, config, cfg_json, probe, seed, diff) -> str:
    parts = [f"seed {seed}; reference = eager attention, f32 compute on bf16-rounded params, f32 buffers; "
             f"reload via from_pretrained max|diff| {diff:.1e}",
             f"min routing margin {probe.router_margin:.1f}x threshold; distinct experts per MoE layer "
             + str({k.split('.')[2]: len(v) for k, v in probe.experts.items()})]
    if probe.diag:
        parts.append("tokens whose expert set would change without e_score_correction_bias / without the "
                     "group limit, per MoE layer: " + ", ".join(
                         f"layer {k.split('.')[2]}: {a}/{n} and {b}/{n}" for k, (a, b, n) in probe.diag.items()))
    rope_keys = "legacy rope_theta/rope_scaling" if "rope_parameters" not in cfg_json else "v5 rope_parameters"
    parts.append(f"config uses {rope_keys}")
    if family == "olmoe":
        parts.append("softmax router, top-2 of 8, norm_topk_prob=false; q_norm/k_norm RMSNorm over the whole "
                     "projected q (num_heads*head_dim) / k (num_kv_heads*head_dim) before reshaping into heads")
    if family == "qwen3_moe":
        parts.append("GQA 4 heads/2 kv heads, head_dim 32 != hidden/heads; per-head q_norm/k_norm; layer 1 dense "
                     "(mlp_only_layers=[1], intermediate_size 64), layers 0,2 MoE (moe_intermediate_size 32); "
                     "norm_topk_prob=true; tie_word_embeddings=true (no lm_head.weight in checkpoint)")
    if family == "mixtral":
        parts.append("GQA 4/2, top-2 of 8 softmax router, renormalised; sharded checkpoint")
    if family.startswith("deepseek_v3"):
        parts.append("MLA: q_lora_rank " + str(config.q_lora_rank) + ", kv_lora_rank 32, qk_nope 32, qk_rope 16, "
                     "v_head 32; rope_interleave=true; layer 0 dense (first_k_dense_replace=1, intermediate 64), "
                     "layers 1-2 MoE: sigmoid router + f32 e_score_correction_bias (non-zero), n_group 4, "
                     "topk_group 2, top-2 of 8, norm_topk_prob, routed_scaling_factor 2.5, 1 shared expert "
                     "(moe_intermediate 32); yarn factor 4, original_max_position_embeddings 64, beta_fast 32, "
                     "beta_slow 1, mscale 1, mscale_all_dim 1 (cos/sin attention_factor 1.0; softmax scale "
                     "qk_head_dim^-0.5 * (0.1*ln(4)+1)^2)")
        if config.q_lora_rank is not None:
            parts.append("MTP weights at model.layers.3.* (ignored by transformers, no oracle)")
    if family == "glm4_moe":
        parts.append("GQA 4/2, head_dim 32, partial_rotary_factor 0.5 (rotary dim 16, NOT interleaved: "
                     "rotate_half on the first 16 dims, last 16 pass through), per-head q_norm/k_norm before RoPE, "
                     "q/k/v bias (no o_proj bias); layer 0 dense, layers 1-2 MoE with sigmoid router + "
                     "non-zero f32 e_score_correction_bias, n_group 1, top-2 of 8, routed_scaling_factor 2.5, "
                     "1 shared expert; partial_rotary_factor is a top-level config key (legacy form)")
    if family == "glm_moe_dsa":
        parts.append("MLA like DeepSeek-V3 (q_lora 32, kv_lora 32, nope 32, rope 16, v 32), interleaved RoPE, "
                     "default rope theta 1e4 (no yarn); DSA indexer on every layer (indexer_types all 'full'): "
                     "index_topk 8 < 32 tokens, index_n_heads 8, index_head_dim 32; indexer margin "
                     f"{probe.indexer:.3g}; layer 0 dense, layers 1-2 MoE (sigmoid router + bias, n_group 1, "
                     "top-2 of 8, routed_scaling_factor 2.5, 1 shared expert); MTP weights at model.layers.3.*")
    return "; ".join(parts)


def tokenizer_cases(tok: Tokenizer, out_root: Path) -> None:
    """Encode/decode/chat cases shared by all families (same tokenizer.json)."""
    texts = ["Hello, world!", "The café is naïve.", "日本語と東京", "rockets 🚀🚀 and 🙂", "  two  spaces\n\nnewlines",
             "<|im_start|>user\nhi<|im_end|>\n"]
    cases = []
    for t in texts:
        enc = tok.encode(t, add_special_tokens=False)
        cases.append({"text": t, "ids": enc.ids, "tokens": enc.tokens,
                      "decoded": tok.decode(enc.ids, skip_special_tokens=False)})
    htok = transformers.AutoTokenizer.from_pretrained(str(out_root / "olmoe"))
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi café 🙂"}]
    rendered = htok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    chat_ids = htok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
    if isinstance(chat_ids, dict) or hasattr(chat_ids, "keys"):
        chat_ids = chat_ids["input_ids"]
    doc = {"transformers_version": transformers.__version__, "cases": cases,
           "chat": {"messages": msgs, "add_generation_prompt": True, "rendered": rendered,
                    "ids": list(chat_ids)}}
    (out_root / "tokenizer_cases.json").write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--family", action="append", choices=list(FAMILIES))
    ap.add_argument("--summary", type=Path, help="write a JSON summary (tensor names/shapes, reload diffs)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, vocab {tok.get_vocab_size()}")
    summary = []
    for fam in args.family or list(FAMILIES):
        summary.append(generate_family(fam, args.out, tok))
    if (args.out / "olmoe").exists():
        tokenizer_cases(tok, args.out)
    if args.summary:
        args.summary.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
