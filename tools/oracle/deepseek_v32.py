#!/usr/bin/env python3
"""The deepseek_v32 fixture (deepseek-ai/DeepSeek-V3.2, V3.2-Exp, V3.2-Speciale) in the Hub's layout.

    python tools/oracle/deepseek_v32.py --out tests/fixtures

A tiny DeepseekV32ForCausalLM with random weights, written by generate.py's machinery (bf16
params, f32 e_score_correction_bias, per-expert names, MTP weights at model.layers.N.*), with
the config in the spelling DeepSeek publishes: legacy `rope_scaling` (yarn, "type"),
`rope_theta`, no derived head_dim / qk_head_dim, `index_n_heads` / `index_head_dim` /
`index_topk`, `first_k_dense_replace`, `num_nextn_predict_layers`.

What the test must see active: the DSA indexer in every layer with index_topk (8) below the
32 positions of the reference, its rope dims rotated in halves while MLA interleaves (the
difference from GLM-5's indexer), yarn, q_lora, the sigmoid group-limited router with a
non-zero correction bias, a dense first layer.

The chat side of DeepSeek-V3.2 is not a jinja template (the Hub repository ships a Python
encoder, encoding/encoding_dsv32.py): its published test vectors are in
tests/fixtures/deepseek_v32/encoding/ (see the README there).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
import generate as g  # noqa: E402

FAMILY = "deepseek_v32"


def cfg_deepseek_v32(v):
    rp = dict(g.YARN)
    rp["rope_type"] = rp.pop("type")
    rp["rope_theta"] = 10000.0
    c = dict(g._ds_common(v))
    return transformers.DeepseekV32Config(**c, q_lora_rank=32, n_group=4, topk_group=2, rope_parameters=rp,
                                          index_topk=8, index_head_dim=32, index_n_heads=8,
                                          num_nextn_predict_layers=1)


@torch.no_grad()
def v32_indexer_margin(mod, args) -> float:
    """DeepseekV32Indexer's index scores recomputed on its own code path (half-split RoPE on the
    rope dims, which come first in each head): the min gap between the k-th and (k+1)-th causal key."""
    from transformers.models.deepseek_v32.modeling_deepseek_v32 import apply_rotary_pos_emb
    hidden_states, q_resid, (cos, sin) = args[:3]
    B, S, _ = hidden_states.shape
    q = mod.wq_b(q_resid).view(B, S, mod.n_heads, mod.head_dim)
    rd = mod.qk_rope_head_dim
    q_rot, q_pass = torch.split(q, [rd, mod.head_dim - rd], dim=-1)
    kk = mod.k_norm(mod.wk(hidden_states)).unsqueeze(2)
    k_rot, k_pass = torch.split(kk, [rd, mod.head_dim - rd], dim=-1)
    q_rot, k_rot = apply_rotary_pos_emb(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
    q = torch.cat([q_rot, q_pass], dim=-1)
    kk = torch.cat([k_rot, k_pass], dim=-1).squeeze(2)
    scores = F.relu(torch.matmul(q.float(), kk.transpose(-1, -2).float().unsqueeze(1)) * mod.softmax_scale)
    weights = mod.weights_proj(hidden_states).float() * (mod.n_heads ** -0.5)
    idx = torch.matmul(weights.unsqueeze(-2), scores).squeeze(-2)
    m = math.inf
    for s in range(S):
        if s + 1 <= mod.index_topk:
            continue
        v = idx[0, s, : s + 1].sort(descending=True).values
        m = min(m, float(v[mod.index_topk - 1] - v[mod.index_topk]))
    return m


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()

    g.FAMILIES[FAMILY] = dict(cfg=cfg_deepseek_v32, cls="DeepseekV32ForCausalLM", style="legacy",
                              gen_eos=g.EOS_ID, mtp=True)
    glm_margin = g.indexer_margin
    g.indexer_margin = lambda mod, a: (v32_indexer_margin(mod, a) if type(mod).__name__ == "DeepseekV32Indexer"
                                       else glm_margin(mod, a))

    write_config = g.write_config

    def write_v32_config(config, out, family, style, cls_name, mtp):
        d = write_config(config, out, family, style, cls_name, mtp)
        if family == FAMILY:
            # DeepSeek's published config: derived dims are not written, the MoE keys of V3 are.
            for k in ("head_dim", "qk_head_dim", "layer_types", "mlp_layer_types"):
                d.pop(k, None)
            d.update({"topk_method": "noaux_tc", "scoring_func": "sigmoid", "moe_layer_freq": 1, "ep_size": 1})
            d = dict(sorted(d.items()))
            (out / "config.json").write_text(json.dumps(d, indent=2, ensure_ascii=False) + "\n")
        return d

    g.write_config = write_v32_config

    mtp_tensors = g.mtp_tensors

    def v32_mtp(model, config, family_cls, gen):
        sd = mtp_tensors(model, config, family_cls, gen)
        # Like DeepSeek-V3's, the published MTP layer carries its own copy of the embeddings.
        n = config.num_hidden_layers
        sd[f"model.layers.{n}.embed_tokens.weight"] = model.model.embed_tokens.weight.detach().clone()
        return sd

    g.mtp_tensors = v32_mtp

    family_notes = g.family_notes

    def v32_notes(family, config, cfg_json, probe, seed, diff):
        base = family_notes(family, config, cfg_json, probe, seed, diff)
        return base + ("; MLA like DeepSeek-V3 (q_lora 32, kv_lora 32, nope 32, rope 16, v 32), interleaved "
                       "RoPE in MLA; yarn factor 4 (legacy rope_scaling); DSA indexer in every layer: index_topk 8 "
                       "< 32 tokens, index_n_heads 8, index_head_dim 32, its rope dims (first 16 of each head) "
                       f"rotated in halves (rotate_half), not interleaved; indexer margin {probe.indexer:.3g}; "
                       "layer 0 dense, layers 1-2 MoE (sigmoid router + f32 bias, n_group 4, topk_group 2, top-2 "
                       "of 8, routed_scaling_factor 2.5, 1 shared expert); MTP weights at model.layers.3.*")

    g.family_notes = v32_notes

    tok = g.train_tokenizer()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, vocab {tok.get_vocab_size()}")
    g.generate_family(FAMILY, args.out, tok)
    # DeepSeek-V3.2's published tokenizer_config.json has no chat_template (its chat format is
    # the Python encoder encoding_dsv32.py): drop the generic one so the engine's built-in
    # DeepSeek-V3.2 template is what renders this fixture's chats, as it would the real model's.
    tc_path = args.out / FAMILY / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text())
    tc.pop("chat_template", None)
    tc_path.write_text(json.dumps(tc, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
