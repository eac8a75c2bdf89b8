#!/usr/bin/env bash
# Decode alone, llama.cpp and colibri alternated N times (docs/PERFORMANCE.md): decode is
# the figure this noisy machine moves most, and a short loop gives more pairs in the same
# minutes than compare.sh's full rounds.
#
#   [LLAMA_MB=697.4] tools/bench/decode_pairs.sh COLI LLAMA_BIN_DIR CONTAINER[:CONTAINER2...] MODEL.gguf N [THREADS]
#
# One line per pair: llama.cpp's tok/s (`llama-bench -p 0 -n 32 -r 3`), then per container
# colibri's (`coli bench --prompt 8 --tokens 32 --repeat 3`), the ratio, and the share of the
# read bandwidth measured in the same run.
#
# With LLAMA_MB (the MB one llama.cpp token reads: tools/bench/gguf_decode_bytes.py), the
# same yardstick (`coli bench --bandwidth`) is also measured right after llama-bench, and
# each line adds llama.cpp's share of it and the ratio of the two engines' tok/s per GB/s
# of their own yardstick ("per bandwidth"): what the pair's ratio would be had the machine's
# bandwidth held still between the two runs.
set -euo pipefail
coli=$1 bin=$2 containers=$3 gguf=$4 n=$5 t=${6:-2}
llama_mb=${LLAMA_MB:-}
IFS=: read -ra cs <<< "$containers"
for i in $(seq 1 "$n"); do
  l=$("$bin/llama-bench" -m "$gguf" -t "$t" -p 0 -n 32 -r 3 -o jsonl 2>/dev/null |
      grep -o '"avg_ts": [0-9.]*' | cut -d' ' -f2)
  line="pair $i: llama.cpp $l"
  if [ -n "$llama_mb" ]; then
    lbw=$("$coli" bench --bandwidth --threads "$t" | awk '{print $3}')
    lpct=$(awk -v tok="$l" -v mb="$llama_mb" -v bw="$lbw" 'BEGIN { printf "%.0f%%", 100 * tok * mb / 1000 / bw }')
    line+=" ($lpct of $lbw GB/s)"
  fi
  for c in "${cs[@]}"; do
    out=$("$coli" bench --model "$c" --threads "$t" --prompt 8 --tokens 32 --repeat 3 2>&1)
    tok=$(grep -E '^decode +[0-9]' <<< "$out" | awk '{print $2}')
    pct=$(grep -E '^decode reads' <<< "$out" | grep -o '([0-9]*%)' | tr -d '()')
    ratio=$(awk -v a="$tok" -v b="$l" 'BEGIN { printf "%.2f", a / b }')
    line+=" | $(basename "$c") $tok (${ratio}x, $pct of the read bandwidth"
    if [ -n "$llama_mb" ]; then
      cbw=$(grep -E '^decode reads' <<< "$out" | grep -o 'of [0-9.]* GB/s' | awk '{print $2}')
      per=$(awk -v a="$tok" -v ab="$cbw" -v b="$l" -v bb="$lbw" 'BEGIN { printf "%.2f", (a / ab) / (b / bb) }')
      line+=", ${per}x per bandwidth"
    fi
    line+=")"
  done
  echo "$line | load $(cut -d' ' -f1 /proc/loadavg)"
done
