#!/usr/bin/env python3
"""Time to first token of a conversation's second turn, with and without the prefix cache.

    coli synth --like olmoe-1b-7b --layers 2 --output /tmp/synth
    python3 tools/text/prefix_ttft.py --model /tmp/synth [--prompt 2048] [--rounds 3]

Starts two colibrid daemons (one with the prefix cache, one with --prefix-cache 0) and runs,
alternating between them, the same two-turn exchange through `coli run --prompt-ids`:
turn 1 is a --prompt-long prompt plus a short reply, turn 2 resends it all plus a new user
message (what a chat client does). Prints each turn-2 TTFT and the ratio of the medians.
Each round uses different ids, so nothing is reused across rounds.
"""
import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / "target" / "release"


def run(sock, model, ids, n):
    out = subprocess.run(
        [str(BIN / "coli"), "--socket", sock, "--no-autostart", "run", "--model", model,
         "--prompt-ids", ",".join(map(str, ids)), "--max-tokens", str(n), "--temperature", "0",
         "--ignore-eos", "--output", "json"],
        check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt", type=int, default=2048)
    ap.add_argument("--reply", type=int, default=16)
    ap.add_argument("--followup", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="prefix-ttft-"))
    daemons = {}
    try:
        for name, extra in [("reuse", []), ("no-reuse", ["--prefix-cache", "0"])]:
            sock = str(tmp / name / "colibrid.sock")
            log = open(tmp / f"{name}.log", "w")
            p = subprocess.Popen([str(BIN / "colibrid"), "--socket", sock, "--state-dir",
                                  str(tmp / name / "state"), *extra], stdout=log, stderr=log)
            daemons[name] = (sock, p)
        for name, (sock, _) in daemons.items():
            for _ in range(100):
                if os.path.exists(sock):
                    break
                time.sleep(0.1)
            subprocess.run([str(BIN / "coli"), "--socket", sock, "--no-autostart", "load",
                            "--model", a.model], check=True, capture_output=True)
        vocab = json.load(open(Path(a.model) / "config.json"))["vocab_size"]
        ttft = {n: [] for n in daemons}
        for r in range(a.rounds):
            rng = random.Random(r)
            turn1 = [rng.randrange(3, vocab) for _ in range(a.prompt)]
            follow = [rng.randrange(3, vocab) for _ in range(a.followup)]
            order = list(daemons) if r % 2 == 0 else list(reversed(daemons))
            for name in order:
                sock = daemons[name][0]
                first = run(sock, a.model, turn1, a.reply)
                second = run(sock, a.model, turn1 + first["ids"] + follow, a.reply)
                s = second["stats"]
                ttft[name].append(s["prefill_s"])
                print(f"round {r} {name:9}: turn 1 TTFT {first['stats']['prefill_s']*1e3:8.1f} ms, "
                      f"turn 2 ({s['prompt_tokens']} prompt tokens, {s.get('cached_tokens', 0)} cached) "
                      f"TTFT {s['prefill_s']*1e3:8.1f} ms", flush=True)
        a_ = statistics.median(ttft["no-reuse"])
        b_ = statistics.median(ttft["reuse"])
        print(f"turn-2 TTFT median: no reuse {a_*1e3:.1f} ms, reuse {b_*1e3:.1f} ms, ratio {a_/b_:.1f}x")
    finally:
        for _, p in daemons.values():
            p.terminate()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
