#!/usr/bin/env python3
"""The kimi_k25 fixture (moonshotai/Kimi-K2.5, text part) in the Hub's published layout.

    python tools/oracle/kimi_k25.py --out tests/fixtures

A tiny DeepSeek-V3-style language model saved the way Moonshot publishes Kimi-K2.5:

- config.json: the multimodal wrapper (`model_type` kimi_k25, `KimiK25ForConditionalGeneration`,
  `media_placeholder_token_id`, `vision_config`) with the language model's config nested in
  `text_config` (`model_type` kimi_k2, legacy `rope_theta` / `rope_scaling` {type: yarn}), and the
  compressed-tensors `quantization_config` inside `text_config` (as published: group_0, int4,
  symmetric, group_size 32, strategy group, format pack-quantized, ignore lm_head / self_attn /
  shared_experts / dense mlp).
- the weights under the wrapper's prefixes: `language_model.model.*`, `language_model.lm_head.weight`,
  plus a few `vision_tower.*` / `mm_projector.*` tensors (ignored by a text-only engine); the routed
  experts as compressed-tensors pack-quantized int4 (`weight_packed` I32 [out, in/8], eight 4-bit
  codes `q + 8` per little-endian word; `weight_scale` BF16 [out, in/32]; `weight_shape` I64 [2]),
  everything else bf16, the routers' `e_score_correction_bias` f32.
- the tokenizer as Moonshot ships it: `tiktoken.model` (base64 token, space, rank per line) and
  `tokenizer_config.json` (`added_tokens_decoder` naming the specials that follow the ranks, the
  `TikTokenTokenizer` class of tokenization_kimi.py); no tokenizer.json. The ranks are a small
  vocabulary trained here; the pattern and the special-token layout (258 specials from
  len(ranks) on, unnamed ones `<|reserved_token_{i}|>`) are Kimi's.

The reference is transformers' DeepseekV3ForCausalLM (eager attention, f32) with the experts set to
exactly what compressed-tensors' PackedQuantizationCompressor.decompress gives (int4 codes times the
bf16 scale, computed and rounded in bf16). Token ids are tiktoken's (Kimi's pattern, allowed_special
"all"); `tokenizer_cases.json` holds a multilingual text (CJK, emoji, code, numbers, specials) and its
ids for the engine's tokenizer test.
"""

from __future__ import annotations

import argparse
import base64
import collections
import json
import math
import shutil
import sys
from pathlib import Path

import regex
import tiktoken
import torch
import transformers
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
import generate as g  # noqa: E402
from corpus import corpus  # noqa: E402

FAMILY = "kimi_k25"
TEMPLATE = Path(__file__).resolve().parent / "kimi_k25.jinja"
N_MERGES = 700
GROUP = 32

# tokenization_kimi.py's pattern (TikTokenTokenizer.pat_str), verbatim.
PAT_STR = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
NUM_RESERVED = 256  # TikTokenTokenizer.num_reserved_special_tokens; specials are len(ranks) + 0..258
# Named specials at their offset from len(ranks), as Kimi-K2.5's tokenizer_config.json places them
# (163584 + offset there).
NAMED = {0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|im_user|>", 4: "<|im_assistant|>",
         6: "<|start_header_id|>", 7: "<|end_header_id|>", 9: "[EOT]", 10: "<|im_system|>",
         11: "<|tool_calls_section_begin|>", 12: "<|tool_calls_section_end|>", 13: "<|tool_call_begin|>",
         14: "<|tool_call_argument_begin|>", 15: "<|tool_call_end|>", 17: "<|im_middle|>",
         18: "<|media_begin|>", 19: "<|media_content|>", 20: "<|media_end|>", 21: "<|media_pad|>",
         22: "<think>", 23: "</think>", 254: "[UNK]", 255: "[PAD]", 256: "<|kimi_k25_video_placeholder|>"}
BOS_OFF, EOS_OFF, IM_END_OFF, MEDIA_PAD_OFF, PAD_OFF = 0, 1, 2, 21, 255

MULTILINGUAL = ("Kimi's café: 你好，世界！今天的天气很好。🙂🚀 naïve Ünïcödé — "
                "def add(a, b):\n    return a + b  # 12345 + 67.89\n\n"
                "日本語のテキスト、한국어 문장. I'm sure they'll say \"we've DONE it\" x=3.14159;"
                "\t\r\n  <|im_user|>user<|im_middle|>hi<|im_end|><think>no</think>"
                " 1,000,000 items @ $9.99\u00a0each\n")


# ----------------------------------------------------------------------------------------------
# tokenizer: a small tiktoken BPE trained on the corpus


def train_ranks() -> dict[bytes, int]:
    """tiktoken-style ranks: the 256 bytes, then N_MERGES merges learned on the corpus split by
    Kimi's pattern (so merges never cross its pieces)."""
    pat = regex.compile(PAT_STR, flags=regex.V1)
    text = corpus() + MULTILINGUAL
    words = collections.Counter(tuple(bytes([b]) for b in p.encode()) for p in pat.findall(text))
    ranks = {bytes([b]): b for b in range(256)}
    words = dict(words)
    for _ in range(N_MERGES):
        pairs = collections.Counter()
        for w, n in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += n
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        new = a + b
        ranks[new] = len(ranks)
        merged = {}
        for w, n in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(new)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + n
        words = merged
    return ranks


def special_tokens(n_base: int) -> dict[str, int]:
    return {NAMED.get(i, f"<|reserved_token_{n_base + i}|>"): n_base + i for i in range(NUM_RESERVED + 2)}


def encoding(ranks: dict[bytes, int]) -> tiktoken.Encoding:
    return tiktoken.Encoding(name="tiktoken.model", pat_str=PAT_STR, mergeable_ranks=ranks,
                             special_tokens=special_tokens(len(ranks)))


def write_tiktoken(ranks: dict[bytes, int], out: Path) -> None:
    lines = [f"{base64.b64encode(t).decode()} {r}" for t, r in sorted(ranks.items(), key=lambda kv: kv[1])]
    (out / "tiktoken.model").write_text("\n".join(lines) + "\n")


def tokenizer_config(n_base: int) -> dict:
    added = {str(n_base + i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                               "single_word": False, "special": True} for i, s in sorted(NAMED.items())}
    return {"added_tokens_decoder": added,
            "additional_special_tokens": ["<|im_end|>", "<|im_user|>", "<|im_assistant|>",
                                          "<|start_header_id|>", "<|end_header_id|>", "[EOT]",
                                          "<|im_system|>", "<|im_middle|>"],
            "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
            "bos_token": "[BOS]", "clean_up_tokenization_spaces": False, "eos_token": "[EOS]",
            "extra_special_tokens": {}, "model_max_length": 1000000000000000019884624838656,
            "pad_token": "[PAD]", "tokenizer_class": "TikTokenTokenizer", "unk_token": "[UNK]"}


# ----------------------------------------------------------------------------------------------
# model


def text_config(vocab: int) -> transformers.DeepseekV3Config:
    rp = {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 64, "beta_fast": 32.0,
          "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "rope_theta": 50000.0}
    return transformers.DeepseekV3Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8,
        num_experts_per_tok=2, routed_scaling_factor=2.827, kv_lora_rank=32, q_lora_rank=48,
        qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32, n_group=1, topk_group=1,
        first_k_dense_replace=1, norm_topk_prob=True, max_position_embeddings=2048, rms_norm_eps=1e-5,
        rope_parameters=rp, tie_word_embeddings=False, attention_bias=False, hidden_act="silu",
        bos_token_id=None, eos_token_id=None, pad_token_id=None)


def scheme() -> QuantizationScheme:
    return QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(
        num_bits=4, type="int", symmetric=True, group_size=GROUP, strategy="group", dynamic=False,
        observer="minmax"))


def quantize(w: torch.Tensor) -> dict[str, torch.Tensor]:
    """compressed-tensors pack-quantized int4 of one [out, in] weight: bf16 scales amax/7.5 per 32."""
    out_f, in_f = w.shape
    groups = w.reshape(out_f, in_f // GROUP, GROUP)
    scale = (groups.abs().amax(-1) / 7.5).to(torch.bfloat16)
    q = torch.clamp(torch.round(groups / scale.float().unsqueeze(-1)), -8, 7).to(torch.int8)
    return {"weight_packed": pack_to_int32(q.reshape(out_f, in_f), 4), "weight_scale": scale,
            "weight_shape": torch.tensor([out_f, in_f])}


def dequantize(packed: dict[str, torch.Tensor]) -> torch.Tensor:
    """Exactly what transformers' compressed-tensors path loads (bf16), as f32."""
    return PackedQuantizationCompressor.decompress(dict(packed), scheme())["weight"].float()


@torch.no_grad()
def build(vocab: int, seed: int):
    cfg = text_config(vocab)
    model = transformers.DeepseekV3ForCausalLM._from_config(cfg, attn_implementation="eager",
                                                            experts_implementation="eager",
                                                            dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(seed)
    g.reinit_(model, gen)
    packed = {}
    for i, layer in enumerate(model.model.layers):
        if i < cfg.first_k_dense_replace:
            continue
        ex = layer.mlp.experts
        inter = cfg.moe_intermediate_size
        pre = f"language_model.model.layers.{i}.mlp.experts."
        for e in range(cfg.n_routed_experts):
            parts = {"gate_proj": ex.gate_up_proj[e, :inter, :], "up_proj": ex.gate_up_proj[e, inter:, :],
                     "down_proj": ex.down_proj[e]}
            for name, w in parts.items():
                pk = quantize(w.clone())
                w.copy_(dequantize(pk))
                for k, v in pk.items():
                    packed[f"{pre}{e}.{name}.{k}"] = v
    return cfg, model, packed


def hub_tensors(model, packed, gen) -> dict[str, torch.Tensor]:
    sd = {k: v for k, v in model.state_dict().items()
          if not (k.endswith("experts.gate_up_proj") or k.endswith("experts.down_proj"))}
    out = {}
    for k, v in g.hub_state_dict(sd, "deepseek_v3").items():
        out["language_model." + k] = v  # model.* -> language_model.model.*, lm_head -> language_model.lm_head
    out.update(packed)
    # A sliver of the vision side, as the wrapper publishes it: a text-only engine ignores it.
    for name, shape in (("vision_tower.patch_embed.proj.weight", (16, 3, 2, 2)),
                        ("vision_tower.patch_embed.proj.bias", (16,)),
                        ("vision_tower.encoder.blocks.0.wqkv.weight", (48, 16)),
                        ("mm_projector.pre_norm.weight", (64,)),
                        ("mm_projector.proj.0.weight", (64, 64)),
                        ("mm_projector.proj.2.weight", (64, 64))):
        out[name] = (0.02 * torch.randn(shape, generator=gen)).to(torch.bfloat16)
    return out


def write_config(cfg, out: Path, n_base: int) -> dict:
    d = cfg.to_dict()
    rp = dict(d.pop("rope_parameters"))
    keep = ["attention_bias", "attention_dropout", "first_k_dense_replace", "hidden_act", "hidden_size",
            "initializer_range", "intermediate_size", "kv_lora_rank", "max_position_embeddings",
            "moe_intermediate_size", "n_group", "n_routed_experts", "n_shared_experts", "norm_topk_prob",
            "num_attention_heads", "num_experts_per_tok", "num_hidden_layers", "num_key_value_heads",
            "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "rms_norm_eps", "routed_scaling_factor",
            "topk_group", "v_head_dim", "vocab_size"]
    text = {k: d[k] for k in keep}
    text.update({
        "_name_or_path": "", "architectures": ["DeepseekV3ForCausalLM"], "auto_map": {
            "AutoConfig": "configuration_deepseek.DeepseekV3Config",
            "AutoModel": "modeling_deepseek.DeepseekV3Model",
            "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"},
        "aux_loss_alpha": 0.001, "bos_token_id": n_base + BOS_OFF, "dtype": "bfloat16",
        "eos_token_id": n_base + EOS_OFF, "ep_size": 1, "model_type": "kimi_k2", "moe_layer_freq": 1,
        "num_nextn_predict_layers": 0, "pad_token_id": n_base + PAD_OFF, "pretraining_tp": 1,
        "rope_theta": rp.pop("rope_theta"), "scoring_func": "sigmoid", "seq_aux": True,
        "tie_word_embeddings": False, "topk_method": "noaux_tc", "use_cache": True,
        "quantization_config": {
            "config_groups": {"group_0": {
                "input_activations": None, "output_activations": None, "targets": ["Linear"],
                "weights": {"actorder": None, "block_structure": None, "dynamic": False, "group_size": GROUP,
                            "num_bits": 4, "observer": "minmax", "observer_kwargs": {}, "strategy": "group",
                            "symmetric": True, "type": "int"}}},
            "format": "pack-quantized",
            "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
                       "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
            "kv_cache_scheme": None, "quant_method": "compressed-tensors", "quantization_status": "compressed"},
    })
    rp.pop("rope_type")
    text["rope_scaling"] = {"type": "yarn", **dict(sorted(rp.items()))}
    wrapper = {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "auto_map": {"AutoConfig": "configuration_kimi_k25.KimiK25Config",
                     "AutoModel": "modeling_kimi_k25.KimiK25ForConditionalGeneration",
                     "AutoModelForCausalLM": "modeling_kimi_k25.KimiK25ForConditionalGeneration"},
        "bos_token_id": n_base + BOS_OFF, "dtype": "bfloat16", "eos_token_id": n_base + EOS_OFF,
        "ignore_index": -100, "media_placeholder_token_id": n_base + MEDIA_PAD_OFF, "model_type": "kimi_k25",
        "pad_token_id": n_base + PAD_OFF, "text_config": dict(sorted(text.items())), "tie_word_embeddings": False,
        "transformers_version": "4.57.1", "use_unified_vision_chunk": True,
        "video_placeholder": "<|kimi_k25_video_placeholder|>",
        "vision_config": {"_attn_implementation": "flash_attention_2", "init_pos_emb_height": 64,
                          "init_pos_emb_time": 4, "init_pos_emb_width": 64, "merge_kernel_size": [2, 2],
                          "merge_type": "sd2_tpool", "mm_hidden_size": 16, "mm_projector_type": "patchmerger",
                          "patch_size": 2, "pos_emb_type": "divided_fixed", "projector_hidden_act": "gelu",
                          "projector_ln_eps": 1e-05, "text_hidden_size": 64, "video_attn_type": "spatial_temporal",
                          "vt_hidden_size": 16, "vt_intermediate_size": 32, "vt_num_attention_heads": 2,
                          "vt_num_hidden_layers": 1},
    }
    (out / "config.json").write_text(json.dumps(wrapper, indent=2) + "\n")
    return wrapper


def ids_of(enc: tiktoken.Encoding, text: str) -> list[int]:
    return enc.encode(text, allowed_special="all")


def generate(out_root: Path, max_tries: int = 200) -> None:
    ranks = train_ranks()
    enc = encoding(ranks)
    n_base = len(ranks)
    vocab = n_base + NUM_RESERVED  # config vocab_size: the last two specials lie past it, as in K2.5

    def pick_prompt(t: int):
        for k in range(len(g.PROMPTS)):
            text = g.PROMPTS[(t + k) % len(g.PROMPTS)]
            ids = ids_of(enc, text)
            if len(ids) >= g.N_PROMPT:
                cut = enc.decode(ids[: g.N_PROMPT])
                if ids_of(enc, cut) == ids[: g.N_PROMPT] and "\ufffd" not in cut:
                    return cut, ids[: g.N_PROMPT]
        raise RuntimeError("no prompt")

    def attempt(t: int, seed: int):
        cfg, model, packed = build(vocab, seed)
        prompt_text, prompt_ids = pick_prompt(t)
        greedy, ids, tf, gap, probe, consistent = g.run_oracle(model, prompt_ids)
        distinct = min((len(v) for v in probe.experts.values()), default=0)
        ok = all([gap > g.MIN_GAP, probe.router_margin > 1.0, consistent, distinct >= g.MIN_DISTINCT_EXPERTS,
                  len(set(greedy)) >= g.MIN_GREEDY_DISTINCT, max(greedy) < vocab])
        line = (f"gap {gap:.4f} router margin {probe.router_margin:.2f} experts {distinct} greedy-distinct "
                f"{len(set(greedy))} consistent {consistent}")
        return ok, (seed, cfg, model, packed, prompt_text, prompt_ids, greedy, ids, tf, gap, probe), line

    chosen = None
    for t in range(max_tries):
        ok, result, line = attempt(t, 47007 + t)
        print(f"  {FAMILY} seed {47007 + t}: {line} -> {'ok' if ok else 'retry'}")
        if ok:
            chosen = result
            break
    if chosen is None:
        raise RuntimeError("no seed passed the robustness checks")
    seed, cfg, model, packed, prompt_text, prompt_ids, greedy, ids, tf, gap, probe = chosen

    out = out_root / FAMILY
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    gen = torch.Generator().manual_seed(seed + 1)
    tensors = hub_tensors(model, packed, gen)
    files = g.write_safetensors(tensors, out, 2)
    write_config(cfg, out, n_base)
    gen_cfg = {"max_length": 262144, "eos_token_id": n_base + IM_END_OFF}
    (out / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2) + "\n")
    write_tiktoken(ranks, out)
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(n_base), indent=2) + "\n")
    shutil.copy(TEMPLATE, out / "chat_template.jinja")

    # ---- verify: the files hold exactly the tensors, the experts decompress to the oracle's ----
    loaded = {}
    for f in files:
        loaded.update(load_file(str(out / f)))
    assert set(loaded) == set(tensors)
    for k, v in tensors.items():
        assert loaded[k].dtype == v.dtype and torch.equal(loaded[k], v), k
    ref_model = transformers.DeepseekV3ForCausalLM._from_config(cfg, attn_implementation="eager",
                                                                experts_implementation="eager",
                                                                dtype=torch.float32).eval()
    sd = {}
    for k, v in loaded.items():
        if k.startswith("language_model.") and ".mlp.experts." not in k:
            sd[k[len("language_model."):]] = v.float()
    inter = cfg.moe_intermediate_size
    for i in range(cfg.first_k_dense_replace, cfg.num_hidden_layers):
        pre = f"language_model.model.layers.{i}.mlp.experts."
        gu, dn = [], []
        for e in range(cfg.n_routed_experts):
            w = {p: dequantize({s: loaded[f"{pre}{e}.{p}.{s}"] for s in ("weight_packed", "weight_scale",
                                                                        "weight_shape")})
                 for p in ("gate_proj", "up_proj", "down_proj")}
            gu.append(torch.cat([w["gate_proj"], w["up_proj"]]))
            dn.append(w["down_proj"])
        sd[f"model.layers.{i}.mlp.experts.gate_up_proj"] = torch.stack(gu)
        sd[f"model.layers.{i}.mlp.experts.down_proj"] = torch.stack(dn)
    missing, unexpected = ref_model.load_state_dict(sd, strict=False)
    assert not unexpected, unexpected
    assert all("rotary" in m for m in missing), missing
    with torch.no_grad():
        diff = float((ref_model(torch.tensor([ids])).logits[0].float() - tf).abs().max())
    assert diff < 1e-5, f"reload logits differ by {diff}"
    # bf16 products matter: the dequantized experts are not code * f32 scale everywhere.
    pk = {s: loaded[f"language_model.model.layers.1.mlp.experts.0.gate_proj.{s}"]
          for s in ("weight_packed", "weight_scale", "weight_shape")}
    exact = dequantize(pk)
    codes = torch.stack([(pk["weight_packed"] >> (4 * j)) & 0xF for j in range(8)], -1).reshape(exact.shape) - 8
    f32 = codes.float() * pk["weight_scale"].float().repeat_interleave(GROUP, -1)
    rounded = int((exact != f32).sum())
    assert rounded > 0, "no bf16 rounding in the dequantized experts"

    tok_cases(enc, out, n_base)
    chat_cases(out, enc)

    notes = (f"seed {seed}; reference = transformers DeepseekV3ForCausalLM (the Kimi-K2.5 wrapper's text model), "
             f"eager attention, f32 compute; experts = compressed-tensors PackedQuantizationCompressor.decompress "
             f"(int4 code * bf16 scale, rounded to bf16: {rounded} of {exact.numel()} values of one expert matrix "
             f"differ from code * f32 scale); reload from the written files max|diff| {diff:.1e}; MLA q_lora 48, "
             f"kv_lora 32, rope 16 (interleaved), yarn factor 32 / mscale_all_dim 1 (softmax scale), rope_theta 50000; "
             f"layer 0 dense (bf16), layers 1-2 MoE: 8 routed experts (int4, group 32) top-2, sigmoid router with "
             f"e_score_correction_bias, n_group 1, routed_scaling_factor 2.827, 1 shared expert (bf16); router "
             f"margin x{probe.router_margin:.1f} of {g.MIN_SIGMOID_ROUTER_MARGIN}; distinct experts per layer "
             f"{ {k: len(v) for k, v in probe.experts.items()} }; tokenizer: tiktoken ranks {n_base}, specials "
             f"{n_base}..{n_base + NUM_RESERVED + 1}, config vocab_size {vocab}")
    ref = {"family": FAMILY, "transformers_version": transformers.__version__, "torch_version": torch.__version__,
           "prompt_text": prompt_text, "prompt_ids": prompt_ids, "greedy_ids": greedy, "input_ids": ids,
           "logits": [[g.fmt(x) for x in row] for row in tf.tolist()], "top2_gap_min_greedy": g.fmt(gap),
           "notes": notes}
    (out / "ref.json").write_text(json.dumps(ref, ensure_ascii=False, separators=(",", ":")) + "\n")
    print(f"  {FAMILY}: wrote {out} (seed {seed}, gap {gap:.4f}, bf16-rounded {rounded})")


def tok_cases(enc: tiktoken.Encoding, out: Path, n_base: int) -> None:
    texts = [MULTILINGUAL, "", " ", "hello world", "   leading spaces\n\n\ntrailing   ", "ÀÉÎÕÜ àéîõü ñ ß",
             "😀😃😄😁 👨‍👩‍👧‍👦 🇯🇵", "中文分词测试：北京大学生前来应聘", "x = [1, 22, 333, 4444, 55555]",
             "I'M SURE HE'LL GO; she's 'quoted' it's", "<|im_end|><|reserved_token_%d|>[BOS]<think>" % (n_base + 30),
             "tab\there\r\nwindows\rold-mac", "e\u0301 combining accent, Ω≈ç√∫",
             "    def f(x):\n        return {\"k\": x ** 2}\n"]
    cases = [{"text": t, "ids": ids_of(enc, t)} for t in texts]
    for c in cases:
        assert enc.decode(c["ids"]) == c["text"]
    doc = {"tiktoken_version": tiktoken.__version__,
           "note": "tiktoken.Encoding(pat_str=tokenization_kimi's, mergeable_ranks=tiktoken.model, "
                   "special_tokens=258 from len(ranks)).encode(text, allowed_special='all')",
           "cases": cases}
    (out / "tokenizer_cases.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Gets the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city's name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}
NOW = {"type": "function", "function": {"name": "now", "description": "The current time",
                                        "parameters": {"type": "object", "properties": {}}}}
CALL = {"id": "functions.get_weather:0", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}

CHATS = [
    {"messages": [{"role": "user", "content": "Hi café 🙂"}], "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": True, "thinking": False},
    {"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"},
                  {"role": "assistant", "content": "Hello.", "reasoning_content": "Greet back."},
                  {"role": "user", "content": "Weather in Paris?"}], "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": "", "reasoning_content": "I should call the tool.",
                   "tool_calls": [CALL]},
                  {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "18 degrees, sunny"}],
     "tools": [WEATHER, NOW], "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": "Let me check.", "tool_calls": [CALL]},
                  {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "18 degrees"},
                  {"role": "assistant", "content": "It is 18 degrees.", "reasoning_content": "Report it."},
                  {"role": "user", "content": "Thanks"}],
     "tools": [WEATHER], "add_generation_prompt": True, "thinking": False},
    {"messages": [{"role": "user", "content": "Time?"},
                  {"role": "assistant", "content": "Noon.", "reasoning_content": "It is noon."}],
     "tools": [NOW], "add_generation_prompt": False},
]


def chat_cases(out: Path, enc: tiktoken.Encoding) -> None:
    env = transformers.utils.chat_template_utils._compile_jinja_template(TEMPLATE.read_text())
    cases = []
    for c in CHATS:
        kw = {"tools": c["tools"]} if "tools" in c else {}
        if "thinking" in c:
            kw["thinking"] = c["thinking"]
        rendered = env.render(messages=c["messages"], add_generation_prompt=c["add_generation_prompt"],
                              bos_token="[BOS]", eos_token="[EOS]", **kw)
        cases.append({**c, "rendered": rendered, "ids": ids_of(enc, rendered)})
    doc = {"transformers_version": transformers.__version__,
           "note": "rendered with transformers' own jinja2 environment (_compile_jinja_template) and the "
                   "template's kwargs; ids by tiktoken with allowed_special='all'", "cases": cases}
    (out / "chat_cases.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    generate(args.out)


if __name__ == "__main__":
    main()
