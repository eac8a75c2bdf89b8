#!/usr/bin/env bash
# Many sessions on one warm daemon (issue 15): `coli bench --daemon` on a full-size synth
# model, resident (memory map) and with the routed experts streamed through a cache of 40%
# of their size, unconstrained and inside cgroup v1 memory limits that count the page cache
# (/work/shared/DESIGN.md "Benchmarking"). Each run alternates the session counts over
# --rounds rounds; ratios to one session are taken within a round.
#
#   tools/bench/sessions.sh                     # everything; JSON reports in $OUT
#   MODEL=/path OUT=dir SESSIONS=1,4 TOKENS=48 ONLY="resident" tools/bench/sessions.sh
#
# Kept reports are not measured again (delete $OUT/NAME.json to redo one): a long run that
# is cut off resumes where it stopped.
set -euo pipefail
cd "$(dirname "$0")/../.."
COLI=${COLI:-$PWD/target/release/coli}
MODEL=${MODEL:-/work/models/olmoe-1b-7b-synth-int4-dense8}
OUT=${OUT:-/tmp/colibri-bench/sessions}
SESSIONS=${SESSIONS:-1,2,4,8}
PROMPT=${PROMPT:-16}
TOKENS=${TOKENS:-48}
ROUNDS=${ROUNDS:-2}
PREFILL=${PREFILL:-2048}
ONLY=${ONLY:-"resident streamed streamed-2g streamed-3g"}
mkdir -p "$OUT"

# 40% of the routed experts' bytes, in MiB.
EXPERTS=$(du -cb "$MODEL"/experts-*.safetensors | tail -1 | cut -f1)
BUDGET=$((EXPERTS * 4 / 10 / 1048576))

drop_cache() {
    sync
    for f in "$MODEL"/*.safetensors; do dd if="$f" iflag=nocache count=0 status=none; done
}

CG=/sys/fs/cgroup/memory$(awk -F: '$2=="memory"{print $3}' /proc/self/cgroup)/coli-sessions-$$
cleanup() { rmdir "$CG" 2>/dev/null || true; }
trap cleanup EXIT

# run NAME LIMIT ARGS...: coli bench --daemon ARGS, inside LIMIT when not "none" (the daemon
# it starts is its child, so inside the limit too).
run() {
    local name=$1 limit=$2
    shift 2
    case " $ONLY " in *" $name "*) ;; *) return 0 ;; esac
    [ -s "$OUT/$name.json" ] && { echo "$name: kept $OUT/$name.json"; return 0; }
    drop_cache
    local args=(bench --daemon --model "$MODEL" --sessions "$SESSIONS" --rounds "$ROUNDS"
        --prompt "$PROMPT" --tokens "$TOKENS" --prefill-during "$PREFILL" --json "$@")
    if [ "$limit" = none ]; then
        "$COLI" "${args[@]}" > "$OUT/$name.json.part"
    else
        mkdir -p "$CG"
        echo "$limit" > "$CG/memory.limit_in_bytes"
        echo 0 > "$CG/memory.max_usage_in_bytes" || true
        sh -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' sh "$CG" "$COLI" "${args[@]}" \
            > "$OUT/$name.json.part"
        echo "$name: cgroup peak (RSS + page cache) $(cat "$CG/memory.max_usage_in_bytes") bytes, failcnt $(cat "$CG/memory.failcnt")"
    fi
    mv "$OUT/$name.json.part" "$OUT/$name.json"
    python3 - "$OUT/$name.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"{sys.argv[1]}: expert cache {r['expert_cache_mib'] or 'resident'}")
for s in r["summary"]:
    extra = ""
    if s.get("hit_rate") is not None:
        extra = f"  hit {s['hit_rate']*100:.1f}%  {s['mib_read_per_token']:.1f} MiB/token"
    ratio = s["ratio_to_one"]
    print(f"  {s['sessions']} sessions: {s['aggregate_tok_s']:.2f} tok/s"
          f" ({ratio:.2f}x one)" if ratio else "", end="")
    print(f"  per session {s['per_session_tok_s']:.2f}  TTFT {s['ttft_ms']:.0f} ms"
          f"  ITL p50 {s['itl_p50_ms']:.1f} p99 {s['itl_p99_ms']:.1f} ms  rows/step {s['rows_per_step']:.2f}{extra}")
p = r.get("prefill")
if p:
    print(f"  {p['decoding_sessions']} decoding during a {p['prompt_tokens']}-token prefill:"
          f" ITL alone p50 {p['alone_p50_ms']:.1f} ms; during p50 {p['during_p50_ms']:.1f}"
          f" p99 {p['during_p99_ms']:.1f} max {p['during_max_ms']:.1f} ms"
          f" (p99 / alone p50 = {p['during_p99_ms']/max(p['alone_p50_ms'],1e-9):.2f});"
          f" its TTFT {p['ttft_ms']:.0f} ms")
EOF
}

run resident none
run streamed none --expert-cache "$BUDGET"
run streamed-3g 3G --expert-cache "$BUDGET"
run streamed-2g 2G --expert-cache "$BUDGET"
