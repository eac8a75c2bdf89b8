#!/usr/bin/env bash
# colibri against llama.cpp on the same synth weights, the two engines alternating so that
# load from other processes hits both alike (docs/PERFORMANCE.md).
#
#   tools/bench/compare.sh COLI LLAMA_BIN_DIR CONTAINER_DIR[:DIR2...] MODEL.gguf ROUNDS OUT_DIR [THREADS]
#
# Per round and engine: prefill 64 and 512 tokens, decode 32 tokens, decode 32 at depth 512
# (llama-bench -d 512), each repeated; odd rounds start with llama.cpp, even ones with
# colibri (every container in turn). Raw outputs go to OUT_DIR/round-N-llama-*.txt and
# OUT_DIR/round-N-colibri-CONTAINER_NAME-*.txt; then
# tools/bench/summarize.py OUT_DIR prints the table. Extra colibri settings come from the
# environment (COLIBRI_KV, COLIBRI_KERNELS, ...).
set -euo pipefail
coli=$1 bin=$2 container=$3 gguf=$4 rounds=$5 out=$6 t=${7:-2}
mkdir -p "$out"
llama() {
  local r=$1
  "$bin/llama-bench" -m "$gguf" -t "$t" -p 64,512 -n 32 -r 3 -o jsonl > "$out/round-$r-llama-d0.txt" 2>/dev/null
  "$bin/llama-bench" -m "$gguf" -t "$t" -p 64 -n 32 -d 512 -r 3 -o jsonl > "$out/round-$r-llama-d512.txt" 2>/dev/null
}
colibri() {
  local r=$1 c name
  IFS=: read -ra cs <<< "$container"
  for c in "${cs[@]}"; do
    name=$(basename "$c")
    "$coli" bench --model "$c" --threads "$t" --prompt 64 --tokens 32 --repeat 3 > "$out/round-$r-colibri-$name-p64.txt"
    "$coli" bench --model "$c" --threads "$t" --prompt 512 --tokens 0 --repeat 2 > "$out/round-$r-colibri-$name-p512.txt"
    "$coli" bench --model "$c" --threads "$t" --prompt 64 --tokens 32 --depth 512 --repeat 3 > "$out/round-$r-colibri-$name-d512.txt"
  done
}
# Both engines' files into the page cache first: a model evicted by other work would be read
# back from disk by page faults during the first timed runs (measured: one prefill of 64
# tokens at 2 tok/s instead of 128).
IFS=: read -ra warm <<< "$container"
cat "$gguf" > /dev/null
for c in "${warm[@]}"; do cat "$c"/*.safetensors > /dev/null; done
for r in $(seq 1 "$rounds"); do
  echo "round $r: $(cut -d' ' -f1-3 /proc/loadavg) load" | tee -a "$out/load.txt"
  if (( r % 2 )); then llama "$r"; colibri "$r"; else colibri "$r"; llama "$r"; fi
done
echo "done: $(cut -d' ' -f1-3 /proc/loadavg) load" | tee -a "$out/load.txt"
