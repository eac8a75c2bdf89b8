#!/usr/bin/env python3
"""Helpers of tools/train/llama_cpp.sh.

    llama_cpp.py convert LLAMA_DIR MODEL_DIR OUT.gguf   # convert_hf_to_gguf.py --outtype bf16
    llama_cpp.py report OUT_DIR                        # the figures of the llama-perplexity logs, as JSON

convert runs llama.cpp's own converter in this process, with one change made from outside
(the source tree is shared and stays untouched): a BPE tokenizer llama.cpp does not know is
given GPT-2's pre-tokenizer, which is what tools/train's tokenizer uses (byte-level, GPT-2
regex). It then checks that llama.cpp tokenizes a sample exactly as `tokenizers` does.
"""

from __future__ import annotations

import json
import re
import runpy
import sys
from pathlib import Path


def convert(llama: Path, model: Path, out: Path) -> None:
    import conversion.base as base  # from llama.cpp's tree (PYTHONPATH)

    known = base.TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer):
        try:
            return known(self, tokenizer)
        except NotImplementedError:
            return "gpt-2"

    base.TextModel.get_vocab_base_pre = get_vocab_base_pre
    sys.argv = ["convert_hf_to_gguf.py", str(model), "--outtype", "bf16", "--outfile", str(out)]
    runpy.run_path(str(llama / "convert_hf_to_gguf.py"), run_name="__main__")
    check_tokenizer(model, out)


def check_tokenizer(model: Path, gguf_path: Path) -> None:
    """llama.cpp's vocabulary and merges are the ones of tokenizer.json (same ids)."""
    import gguf
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    r = gguf.GGUFReader(str(gguf_path))

    def field(name):
        f = r.fields[name]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    tokens = field("tokenizer.ggml.tokens")
    assert len(tokens) == tok.get_vocab_size(), (len(tokens), tok.get_vocab_size())
    for i, t in enumerate(tokens):
        assert tok.token_to_id(t) == i, (i, t)
    pre = bytes(r.fields["tokenizer.ggml.pre"].parts[-1]).decode()
    print(f"gguf tokenizer: {len(tokens)} tokens, pre-tokenizer {pre!r}, ids as in tokenizer.json")


FLOAT = r"([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"


def parse(log: str) -> dict:
    out = {}
    m = re.search(r"Final estimate: PPL = " + FLOAT, log)
    if m:
        out["ppl"] = float(m.group(1))
    m = re.search(r"Mean\s+PPL\(Q\)\s*:\s*" + FLOAT, log)
    if m:
        out["ppl"] = float(m.group(1))
    m = re.search(r"Mean\s+KLD:\s*" + FLOAT, log)
    if m:
        out["kl_mean"] = float(m.group(1))
    m = re.search(r"Same top p:\s*" + FLOAT, log)
    if m:
        out["top1_agreement"] = float(m.group(1)) / 100
    m = re.search(r"calculating perplexity over (\d+) chunks, n_ctx=(\d+)", log)
    if m:
        out["windows"], out["ctx"] = int(m.group(1)), int(m.group(2))
    return out


def report(out_dir: Path) -> None:
    res = {}
    for name in ("bf16", "Q8_0", "Q4_0"):
        p = out_dir / f"ppl-{name}.log"
        if p.exists():
            res[name] = parse(p.read_text(errors="replace"))
    for p in sorted(out_dir.glob("*.gguf")):
        res.setdefault("sizes", {})[p.name] = p.stat().st_size
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    if sys.argv[1] == "convert":
        convert(Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]))
    elif sys.argv[1] == "report":
        report(Path(sys.argv[2]))
    else:
        raise SystemExit(__doc__)
