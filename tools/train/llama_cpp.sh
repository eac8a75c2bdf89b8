#!/usr/bin/env bash
# llama.cpp's perplexity of a trained model, for docs/FORMAT.md's table: converts the Hub
# checkpoint to GGUF (bf16, Q8_0, Q4_0) with llama.cpp's own convert_hf_to_gguf.py and
# llama-quantize, then runs llama-perplexity on the held-out text with the same window as
# `coli perplexity --ctx N`, the KL divergence of Q8_0/Q4_0 measured against the bf16 GGUF.
#
#   tools/train/llama_cpp.sh MODEL_DIR HELD_OUT.txt OUT_DIR [CTX [CHUNKS]]   (report: OUT_DIR/report.json)
#
# The llama.cpp build is the shared yardstick's (../shared/bench/llama_baseline.sh build);
# the conversion runs with this project's Python (torch, transformers, numpy, safetensors:
# /work/pyenv or tools/oracle/requirements.txt) and llama.cpp's gguf-py from its source tree,
# so nothing is installed. Our BPE tokenizer is unknown to llama.cpp: its pre-tokenizer is
# declared GPT-2's (the same byte-level regex), which tools/train/llama_cpp.py checks by
# comparing llama.cpp's token count with ours.
set -euo pipefail
MODEL=$1 TEXT=$2 OUT=$3 CTX=${4:-256} CHUNKS=${5:--1}
PY=${PYTHON:-/work/pyenv/bin/python}
BASELINE=${LLAMA_BASELINE:-$(dirname "$0")/../../../shared/bench/llama_baseline.sh}
[ -x "$BASELINE" ] || BASELINE=/work/shared/bench/llama_baseline.sh
BIN=$("$BASELINE" build | tail -1)
LLAMA=$(dirname "$(dirname "$BIN")")
mkdir -p "$OUT"
name=$(basename "$MODEL")
if [ ! -f "$OUT/$name-bf16.gguf" ]; then
  PYTHONPATH="$LLAMA:$LLAMA/gguf-py" "$PY" "$(dirname "$0")/llama_cpp.py" convert "$LLAMA" "$MODEL" "$OUT/$name-bf16.gguf" >&2
fi
for q in Q8_0 Q4_0; do
  [ -f "$OUT/$name-$q.gguf" ] || "$BIN/llama-quantize" "$OUT/$name-bf16.gguf" "$OUT/$name-$q.gguf" "$q" > "$OUT/quantize-$q.log" 2>&1
done
common=(-f "$TEXT" -c "$CTX" --chunks "$CHUNKS" -t "${THREADS:-2}")
"$BIN/llama-perplexity" -m "$OUT/$name-bf16.gguf" "${common[@]}" --kl-divergence-base "$OUT/logits-bf16.bin" > "$OUT/ppl-bf16.log" 2>&1
for q in Q8_0 Q4_0; do
  "$BIN/llama-perplexity" -m "$OUT/$name-$q.gguf" "${common[@]}" --kl-divergence-base "$OUT/logits-bf16.bin" --kl-divergence > "$OUT/ppl-$q.log" 2>&1
done
# The report (JSON) on stdout and in OUT/report.json (formats.py --llama reads it).
"$PY" "$(dirname "$0")/llama_cpp.py" report "$OUT" | tee "$OUT/report.json"
