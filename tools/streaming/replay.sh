#!/usr/bin/env bash
# Real routing on a full-size model, inside a memory limit (docs/STREAMING.md, "Real routing
# replayed"): a synth model of a trace's expert topology (`coli synth --like-trace`) runs
# `coli trace --replay-routing TRACE` in a cgroup v1 memory limit that counts the page cache,
# then the usage history's effect on a second run (the trace's two halves).
#
#   TRACE=/work/shared/traces/qwen3-30b-a3b.trace.json MODEL=/path/qwen3-like OUT=dir \
#     LIMIT=2G tools/streaming/replay.sh
#
# Needs: a release build (cargo build --release -p colibri-client), the cgroup v1 memory
# controller writable by this user, GNU dd (iflag=nocache), fincore (util-linux), python3.
set -euo pipefail
cd "$(dirname "$0")/../.."
COLI=${COLI:-$PWD/target/release/coli}
TRACE=${TRACE:?give TRACE=routing trace}
MODEL=${MODEL:?give MODEL=folder (written with coli synth --like-trace if missing)}
OUT=${OUT:-/tmp/colibri-replay}
LIMIT=${LIMIT:-2G}
mkdir -p "$OUT"

if [ ! -f "$MODEL/config.json" ]; then
    "$COLI" synth --like-trace "$TRACE" --output "$MODEL" --experts int4 --dense int8
fi

drop_cache() {
    sync
    for f in "$MODEL"/*.safetensors; do dd if="$f" iflag=nocache count=0 status=none; done
    echo "page cache of the model after eviction: $(fincore -b -n -o RES "$MODEL"/*.safetensors | awk '{s+=$1} END {print s+0}') bytes"
}

CG=/sys/fs/cgroup/memory$(awk -F: '$2=="memory"{print $3}' /proc/self/cgroup)/coli-replay-$$
mkdir "$CG"
trap 'rmdir "$CG" 2>/dev/null || true' EXIT
echo "$LIMIT" > "$CG/memory.limit_in_bytes"

# in_cgroup NAME ARGS...: coli ARGS inside the limit; JSON in $OUT/NAME.json, the cgroup's
# peak (RSS + page cache) and failcnt beside it.
in_cgroup() {
    local name=$1
    shift
    [ -s "$OUT/$name.json" ] && return
    drop_cache
    echo 0 > "$CG/memory.max_usage_in_bytes" || true
    local f0
    f0=$(cat "$CG/memory.failcnt")
    sh -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' sh "$CG" "$COLI" "$@" --json > "$OUT/$name.json"
    cat "$CG/memory.max_usage_in_bytes" > "$OUT/$name.cgroup-peak"
    echo $(( $(cat "$CG/memory.failcnt") - f0 )) > "$OUT/$name.failcnt"
    echo "$name: cgroup peak $(cat "$OUT/$name.cgroup-peak") bytes, failcnt +$(cat "$OUT/$name.failcnt")"
}

# The two halves of the trace (by rows; a step is never split).
python3 - "$TRACE" "$OUT" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
total = sum(s["rows"] for s in t["steps"])
seen, cut = 0, 0
for i, s in enumerate(t["steps"]):
    if seen >= total // 2:
        cut = i
        break
    seen += s["rows"]
for name, steps in (("half1", t["steps"][:cut]), ("half2", t["steps"][cut:])):
    json.dump(dict(t, steps=steps), open(f"{sys.argv[2]}/{name}.trace.json", "w"))
PY

"$COLI" plan --model "$MODEL" | tee "$OUT/plan.txt" >/dev/null
sh -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' sh "$CG" "$COLI" plan --model "$MODEL" | tee "$OUT/plan-limit.txt"

# 1. The whole trace, cold (no history), default policy; and the old default for comparison.
in_cgroup replay trace --model "$MODEL" --replay-routing "$TRACE" --max-tokens 100000 --stream --no-history --output "$OUT/replayed.trace.json"
in_cgroup replay-lrfu64 trace --model "$MODEL" --replay-routing "$TRACE" --max-tokens 100000 --stream --no-history --policy lrfu:64

# 2. Warm start: the first half writes the usage history, the second half loads it (seeded
# scores, hottest experts preloaded in the background); against the second half cold.
[ -s "$OUT/warm2.json" ] || rm -rf "$OUT/state"
in_cgroup warm1 trace --model "$MODEL" --replay-routing "$OUT/half1.trace.json" --max-tokens 100000 --stream --state-dir "$OUT/state"
in_cgroup warm2 trace --model "$MODEL" --replay-routing "$OUT/half2.trace.json" --max-tokens 100000 --stream --state-dir "$OUT/state"
in_cgroup cold2 trace --model "$MODEL" --replay-routing "$OUT/half2.trace.json" --max-tokens 100000 --stream --no-history

CAP=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["store"]["capacity_experts"])' "$OUT/replay.json")
"$COLI" simulate --trace "$TRACE" --capacity "$CAP,10%,25%,40%" | tee "$OUT/simulate.txt"
"$COLI" simulate --trace "$OUT/half2.trace.json" --capacity "$CAP,10%,25%,40%" --warm-from "$OUT/half1.trace.json" \
    --policies lrfu-auto | tee "$OUT/simulate-warm.txt"

python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
for name in ["replay", "replay-lrfu64", "warm1", "warm2", "cold2"]:
    p = os.path.join(out, name + ".json")
    if not os.path.exists(p):
        continue
    r = json.load(open(p))
    s, d = r["store"], r["decode"]
    peak = int(open(os.path.join(out, name + ".cgroup-peak")).read())
    fc = open(os.path.join(out, name + ".failcnt")).read().strip()
    first = d.get("first_32_tokens_hit_rate")
    print(f"{name:14} {s['policy']:10} cap {s['capacity_experts']:5}  decode {r['decode_tokens_per_second']:5.2f} tok/s"
          f"  hit {100*d['hit_rate']:5.1f}%  read {d['bytes_read_per_token']/1e6:6.1f} MB/tok"
          f"  Belady {d['belady_bytes_per_token']/1e6:6.1f} MB/tok ({d['bytes_read_per_token']/max(d['belady_bytes_per_token'],1):.2f}x)"
          f"  wait {s['wait_seconds']:.1f}s  RSS {r['peak_rss_bytes']/2**20:.0f} MiB  cgroup peak {peak/2**20:.0f} MiB  failcnt +{fc}"
          + (f"  first32 {100*first:.1f}%" if first is not None else "") + f"  preload {s['preload_bytes']/1e6:.0f} MB")
PY
