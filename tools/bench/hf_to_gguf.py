#!/usr/bin/env python3
"""llama.cpp's convert_hf_to_gguf.py on a `coli synth --format hf` checkpoint, run with the
Python that already has torch (e.g. /work/pyenv) instead of installing another one.

The synth tokenizer is made up, so llama.cpp does not recognise its pre-tokenizer hash; it
is treated as gpt-2's (what ../shared/bench/llama_baseline.sh does with a sed on the
converter, done here without editing the shared tree).

    tools/bench/hf_to_gguf.py LLAMA_CPP_DIR HF_DIR OUT.gguf [--outtype q8_0|bf16|f16]
"""
import runpy
import sys
from pathlib import Path


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    llama, hf, out = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    rest = sys.argv[4:] or ["--outtype", "q8_0"]
    sys.path.insert(0, str(llama))
    sys.path.insert(1, str(llama / "gguf-py"))
    import conversion.base as base

    original = base.TextModel.get_vocab_base_pre

    def lenient(self, tokenizer):
        try:
            return original(self, tokenizer)
        except NotImplementedError:
            return "gpt-2"

    base.TextModel.get_vocab_base_pre = lenient
    sys.argv = [str(llama / "convert_hf_to_gguf.py"), hf, "--outfile", out, *rest]
    runpy.run_path(str(llama / "convert_hf_to_gguf.py"), run_name="__main__")


if __name__ == "__main__":
    main()
