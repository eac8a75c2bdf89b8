#!/usr/bin/env bash
# colibri against llama.cpp on the same weights inside a memory limit (docs/STREAMING.md,
# "Against llama.cpp"): decode speed on a random token stream, cgroup peak and failcnt.
#
#   LLAMA_BIN=$(../shared/bench/llama_baseline.sh build) \
#   HF=/path/olmoe-synth-hf  GGUF=/path/olmoe-synth-q4_0.gguf  MODEL=/path/olmoe-synth-int4 \
#   OUT=dir LIMITS="2G 3G" TOKENS=32 ROUNDS=2 tools/streaming/vs_llama.sh
#
# The weights: `coli synth --like olmoe-1b-7b --format hf` (Hub bf16), converted for llama.cpp
# (../shared/bench/llama_baseline.sh gguf, or tools/bench/hf_to_gguf.py) and for colibri
# (`coli convert --experts int4 --dense int8`; made here when MODEL is missing). llama-bench's
# tg feeds random tokens; colibri's decode steps get random ids too (`coli trace
# --follow-ids`). The two engines alternate within each round. Needs the cgroup v1 memory
# controller, GNU dd (iflag=nocache), python3.
set -euo pipefail
cd "$(dirname "$0")/../.."
COLI=${COLI:-$PWD/target/release/coli}
LLAMA_BIN=${LLAMA_BIN:?give LLAMA_BIN=llama.cpp bin folder}
GGUF=${GGUF:?give GGUF=model.gguf}
MODEL=${MODEL:?give MODEL=colibri container}
OUT=${OUT:-/tmp/colibri-vs-llama}
LIMITS=${LIMITS:-2G 3G}
TOKENS=${TOKENS:-32}
ROUNDS=${ROUNDS:-2}
THREADS=${THREADS:-2}
# llama-bench repetitions per run, and a limit on any one run (seconds): under a limit
# smaller than the model, llama.cpp's memory-mapped weights are re-read from the disk on
# every token (measured: ~200 MB/s of page faults at 2 GiB), and a run can take an hour.
REPS=${REPS:-1}
RUN_LIMIT=${RUN_LIMIT:-1800}
mkdir -p "$OUT"

if [ ! -f "$MODEL/config.json" ]; then
    "$COLI" convert --input "${HF:?give HF=Hub checkpoint to convert}" --output "$MODEL" --experts int4 --dense int8
fi
[ -s "$OUT/random.ids" ] || python3 -c "import random; r = random.Random(7); print(','.join(str(r.randrange(50304)) for _ in range(4096)))" > "$OUT/random.ids"

drop_cache() {
    sync
    for f in "$MODEL"/*.safetensors "$GGUF"; do dd if="$f" iflag=nocache count=0 status=none; done
}

CG=/sys/fs/cgroup/memory$(awk -F: '$2=="memory"{print $3}' /proc/self/cgroup)/coli-vs-llama-$$
mkdir "$CG"
trap 'rmdir "$CG" 2>/dev/null || true' EXIT

# run NAME CMD...: CMD inside the limit; stdout in $OUT/NAME.out, exit status, the cgroup's
# peak (RSS + page cache) and failcnt beside it.
run() {
    local name=$1
    shift
    [ -s "$OUT/$name.status" ] && return
    drop_cache
    # Pages the previous run left charged to the group (measured: 1.32 GiB of llama.cpp's
    # page cache after a run that thrashed at 2 GiB, which `dd iflag=nocache` did not drop)
    # would be counted against the next engine: reclaim everything (the group has no tasks).
    echo 0 > "$CG/memory.force_empty" || true
    cat "$CG/memory.usage_in_bytes" > "$OUT/$name.before"
    echo 0 > "$CG/memory.max_usage_in_bytes" || true
    local f0 st=0
    f0=$(cat "$CG/memory.failcnt")
    timeout "$RUN_LIMIT" sh -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' sh "$CG" "$@" > "$OUT/$name.out" 2> "$OUT/$name.err" || st=$?
    echo "$st" > "$OUT/$name.status"
    cat "$CG/memory.max_usage_in_bytes" > "$OUT/$name.peak"
    echo $(( $(cat "$CG/memory.failcnt") - f0 )) > "$OUT/$name.failcnt"
    echo "$name: exit $st, cgroup peak $(( $(cat "$OUT/$name.peak") >> 20 )) MiB, failcnt +$(cat "$OUT/$name.failcnt")"
}

llama() {
    run "$1" "$LLAMA_BIN/llama-bench" -m "$GGUF" -t "$THREADS" -p 0 -n "$TOKENS" -r "$REPS" -o json "${@:2}"
}
colibri() {
    run "$1" "$COLI" trace --model "$MODEL" --prompt-ids 1 --max-tokens "$TOKENS" --follow-ids "$OUT/random.ids" \
        --stream --no-history --json
}

for limit in $LIMITS; do
    echo "$limit" > "$CG/memory.limit_in_bytes"
    # llama.cpp's default repacks the weights into anonymous memory: the whole model resident.
    llama "llama-$limit-repack1" --repack 1
    for r in $(seq 1 "$ROUNDS"); do
        echo "round $r at $limit: load $(cut -d' ' -f1-3 /proc/loadavg)"
        if (( r % 2 )); then
            llama "llama-$limit-r$r" --repack 0
            colibri "colibri-$limit-r$r"
        else
            colibri "colibri-$limit-r$r"
            llama "llama-$limit-r$r" --repack 0
        fi
    done
done

TOKENS=$TOKENS RUN_LIMIT=$RUN_LIMIT python3 - "$OUT" "$LIMITS" "$ROUNDS" <<'PY'
import json, os, sys
out, limits, rounds = sys.argv[1], sys.argv[2].split(), int(sys.argv[3])
def side(name):
    st = int(open(f"{out}/{name}.status").read())
    peak = int(open(f"{out}/{name}.peak").read()) >> 20
    fc = open(f"{out}/{name}.failcnt").read().strip()
    tps = None
    if st == 0:
        txt = open(f"{out}/{name}.out").read()
        if name.startswith("llama"):
            rows = json.loads(txt)
            tps = [r["avg_ts"] for r in rows if r.get("n_gen", 0) > 0][0]
        else:
            tps = json.loads(txt)["decode_tokens_per_second"]
    return tps, peak, fc, st
for lim in limits:
    t, p, f, s = side(f"llama-{lim}-repack1")
    how = "killed by the OOM killer" if s == 137 else "past the run limit" if s == 124 else f"exit {s}"
    print(f"{lim}: llama.cpp --repack 1: " + (f"{t:.2f} tok/s" if t else how) + f", peak {p} MiB, failcnt +{f}")
    for r in range(1, rounds + 1):
        l, c = side(f"llama-{lim}-r{r}"), side(f"colibri-{lim}-r{r}")
        ratio = f"{c[0] / l[0]:.2f}x" if l[0] and c[0] else "-"
        if l[3] == 124 and c[0]:
            # llama.cpp did not finish: at most TOKENS in RUN_LIMIT seconds.
            bound = int(os.environ.get("TOKENS", "32")) / int(os.environ.get("RUN_LIMIT", "1800"))
            ratio = f"> {c[0] / bound:.1f}x (llama.cpp past the run limit: < {bound:.3f} tok/s)"
        print(f"{lim} round {r}: llama.cpp --repack 0 {l[0] or 0:.2f} tok/s (peak {l[1]} MiB, failcnt +{l[2]}); "
              f"colibri {c[0] or 0:.2f} tok/s (peak {c[1]} MiB, failcnt +{c[2]}); colibri/llama.cpp {ratio}")
PY
