#!/usr/bin/env bash
# Expert streaming benchmark (docs/STREAMING.md): the synth olmoe-1b-7b int4 model inside a
# cgroup v1 memory limit that counts the page cache, and unconstrained for comparison.
#
#   tools/streaming/bench.sh            # everything; results in $OUT
#   MODEL=/path OUT=dir LIMIT=2G TOKENS=128 tools/streaming/bench.sh
#
# Needs: a release build (cargo build --release -p colibri-client), cgroup v1 memory
# controller writable by this user, GNU dd (iflag=nocache), fincore (util-linux).
set -euo pipefail
cd "$(dirname "$0")/../.."
COLI=${COLI:-$PWD/target/release/coli}
MODEL=${MODEL:-/tmp/colibri-bench/olmoe-synth-int4}
OUT=${OUT:-/tmp/colibri-bench/out}
LIMIT=${LIMIT:-2G}
TOKENS=${TOKENS:-256}
# A short prompt, so decoding starts from a cold cache.
IDS=${IDS:-$(seq -s, 100 115)}
mkdir -p "$OUT"

if [ ! -f "$MODEL/config.json" ]; then
    "$COLI" synth --like olmoe-1b-7b --output "$MODEL" --experts int4 --dense int8
fi

# Evict the model files from the page cache, so the run's reads are charged to its cgroup
# (and come from the disk).
drop_cache() {
    sync
    for f in "$MODEL"/*.safetensors; do dd if="$f" iflag=nocache count=0 status=none; done
    echo "page cache of the model after eviction: $(fincore -b -n -o RES "$MODEL"/*.safetensors | awk '{s+=$1} END {print s+0}') bytes"
}

CG=/sys/fs/cgroup/memory$(awk -F: '$2=="memory"{print $3}' /proc/self/cgroup)/coli-bench-$$
mkdir "$CG"
trap 'rmdir "$CG" 2>/dev/null || true' EXIT
echo "$LIMIT" > "$CG/memory.limit_in_bytes"

# in_cgroup NAME ARGS...: runs coli ARGS inside the limit; JSON report in $OUT/NAME.json.
in_cgroup() {
    local name=$1
    shift
    # Kept results are not measured again (delete $OUT to start over).
    [ -s "$OUT/$name.json" ] && return
    drop_cache
    echo 0 > "$CG/memory.max_usage_in_bytes" || true
    sh -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' sh "$CG" "$COLI" "$@" --json > "$OUT/$name.json"
    echo "$name: cgroup peak (RSS + page cache) $(cat "$CG/memory.max_usage_in_bytes") bytes, failcnt $(cat "$CG/memory.failcnt")"
    cat "$CG/memory.max_usage_in_bytes" > "$OUT/$name.cgroup-peak"
}

unconstrained() {
    local name=$1
    shift
    [ -s "$OUT/$name.json" ] && return
    drop_cache
    "$COLI" "$@" --json > "$OUT/$name.json"
}

# The decode steps are fed a real text (tools/streaming/text_ids.py: Python's reference
# documentation, ids by word) instead of the model's own output: a random model's
# generations are noise, uniform over the vocabulary, while its routers follow the tokens
# they see (engine/src/synth.rs), so a real text gives the routing real statistics.
TEXT_A=$OUT/text-a.ids
TEXT_B=$OUT/text-b.ids
[ -s "$TEXT_A" ] || python3 tools/streaming/text_ids.py --tokens 1100 > "$TEXT_A"
[ -s "$TEXT_B" ] || python3 tools/streaming/text_ids.py --tokens 1100 --skip 30000 > "$TEXT_B"

trace() {
    echo trace --model "$MODEL" --prompt-ids "$IDS" --max-tokens "$TOKENS" --follow-ids "$TEXT_A"
}

"$COLI" plan --model "$MODEL"
sh -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' sh "$CG" "$COLI" plan --model "$MODEL" | tee "$OUT/plan-2g.txt"

# 1. Inside the limit, the default budget and policy, cold start (no history).
in_cgroup text-2g $(trace) --stream --no-history --output "$OUT/trace-text-2g.json"
in_cgroup text-2g-noprefetch $(trace) --stream --no-history --no-prefetch
# I/O variants: buffered reads, one reader.
in_cgroup text-2g-buffered $(trace) --stream --no-history --buffered
in_cgroup text-2g-1reader $(trace) --stream --no-history --readers 1
# Other policies, same limit.
for p in lru lfu-admit arc lrfu:4; do
    in_cgroup "text-2g-$p" $(trace) --stream --no-history --policy "$p"
done

# A long generation: RSS against budget + resident part.
(TOKENS=1024 && in_cgroup text-2g-long $(trace) --stream --no-history)

# 2. Second start: a first run over one text writes the usage history; the second, over
# another part of the documentation, loads it (seeded frequencies, the hottest experts
# preloaded in the background) and is measured over its first 32 tokens. Prefetch off: a
# prefetched expert counts as a hit, which would hide what the history brings.
for p in lrfu pinned-lrfu; do
    [ -s "$OUT/text-history2-$p.json" ] || rm -rf "$OUT/state-$p" "$OUT/text-history1-$p.json"
    in_cgroup "text-history1-$p" $(trace) --stream --no-prefetch --state-dir "$OUT/state-$p" --policy "$p"
    (IDS=$(seq -s, 200 215) && in_cgroup "text-history2-$p" trace --model "$MODEL" --prompt-ids "$IDS" \
        --max-tokens "$TOKENS" --follow-ids "$TEXT_B" --stream --no-prefetch --state-dir "$OUT/state-$p" --policy "$p")
done
# The cold start of that second text, for comparison.
(IDS=$(seq -s, 200 215) && in_cgroup text-b-cold trace --model "$MODEL" --prompt-ids "$IDS" \
    --max-tokens "$TOKENS" --follow-ids "$TEXT_B" --stream --no-prefetch --no-history)

# 3. Synthetic Zipf routing (exponent 0.6, 30% of slots repeat the previous token's
# expert), for comparison with a law chosen by hand; prefetch off (the router no longer
# decides).
ZIPF=${ZIPF:-0.6,0.3}
in_cgroup zipf-2g trace --model "$MODEL" --prompt-ids "$IDS" --max-tokens "$TOKENS" --stream \
    --no-history --no-prefetch --synthetic-routing "$ZIPF" --output "$OUT/trace-zipf-2g.json"

# 4. Unconstrained: streamed with the default budget (everything fits), and the plain memory
# map (experts paged in by the kernel).
unconstrained text-free-stream $(trace) --stream --no-history
unconstrained text-free-mmap $(trace)

# 5. The policy tables on the recorded traces: the capacity the 2 GiB run had, 25% and 50%.
CAP=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["store"]["capacity_experts"])' "$OUT/text-2g.json")
POLICIES=lru,lfu,lfu-admit,lrfu:4,lrfu:16,lrfu:64,lrfu:256,arc,pinned-lrfu,pinned-lfu-admit
for t in text zipf; do
    "$COLI" simulate --trace "$OUT/trace-$t-2g.json" --capacity "$CAP,25%,50%" --policies "$POLICIES" | tee "$OUT/policies-$t.txt"
done
# What a perfectly learned histogram would give: the trace's own counts, all the cache pinned.
"$COLI" simulate --trace "$OUT/trace-text-2g.json" --capacity "$CAP" --warm-from "$OUT/trace-text-2g.json" \
    --pin-share 1 --policies pinned-lru | tee "$OUT/policies-text-oracle-pins.txt"

python3 - "$OUT" <<'EOF'
import json, os, sys
out = sys.argv[1]
def row(name):
    p = os.path.join(out, name + ".json")
    if not os.path.exists(p):
        return
    r = json.load(open(p))
    s, d = r.get("store"), r.get("decode")
    peak = open(os.path.join(out, name + ".cgroup-peak")).read().strip() if os.path.exists(os.path.join(out, name + ".cgroup-peak")) else "-"
    line = f"{name:28} decode {r['decode_tokens_per_second']:6.2f} tok/s  RSS {r['peak_rss_bytes']/2**20:7.0f} MiB  cgroup peak {int(peak)/2**20 if peak != '-' else 0:7.0f} MiB"
    if s:
        line += (f"  hit {100*d['hit_rate']:5.1f}%  read {d['bytes_read_per_token']/2**20:6.1f} MiB/tok"
                 f"  Belady {d['belady_bytes_per_token']/2**20:6.1f} MiB/tok ({d['bytes_read_per_token']/max(d['belady_bytes_per_token'],1):.2f}x)"
                 f"  wait {s['wait_seconds']:.2f}s  disk {s['bytes_read']/max(s['disk_busy_seconds'],1e-9)/1e9:.2f} GB/s"
                 f"  recall {100*s['predicted_correct']/max(s['predicted_actual'],1):.0f}% precision {100*s['predicted_correct']/max(s['predicted'],1):.0f}%")
        if d.get("first_32_tokens_hit_rate") is not None:
            line += f"  first32 {100*d['first_32_tokens_hit_rate']:.1f}% after {100*d['after_32_tokens_hit_rate']:.1f}%"
    print(line)
for n in sorted(f[:-5] for f in os.listdir(out) if f.endswith(".json") and not f.startswith("trace")):
    row(n)
EOF
