#!/usr/bin/env python3
"""Policy lab: the experiments behind the expert cache's default policy (docs/STREAMING.md,
"What was tried and dropped"), on routing traces in colibri's JSON format. A prototype
simulator in numpy (the shipped policies are in engine/src/experts/; `coli simulate` is the
measurement of record), kept so the bounds below can be reproduced:

  - LRFU with admission at several half-lives, and the adaptive choice among them (ghosts);
  - oracle bounds no online policy reaches: pinning the trace's own most used experts, and
    Belady's knowledge of the next H tokens (exact next uses within H, LRFU beyond);
  - prefetch-aware eviction: never evict what the next K layer visits route to (an oracle
    standing in for the next layers' routers), at recall R;
  - a learned eviction score (tokens since last use x short and long decayed counts, the
    probability of a use within H tokens estimated online);
  - the routing weight as the size of a use;
  - per-layer capacity quotas (even split, or in proportion to each layer's recent distinct
    experts) instead of one global pool, and a half-life chosen per layer by the ghosts.

    /work/pyenv/bin/python tools/streaming/policy_lab.py TRACE.json [TRACE.json ...]
    LAB_ONLY='per-layer' ...    # only the experiments whose label contains this text

Each row: bytes per token / Belady's at 10%, 25%, 40% of the experts, per trace, and the
worst of them. Needs numpy.
"""
import heapq
import json
import sys
from collections import defaultdict

import numpy as np

def load(path):
    t = json.load(open(path))
    E = t['n_experts']; L = t['n_layers']
    reqs = []  # (step, layer, expert, rows_routed, weightsum)
    toks = 0
    for si, s in enumerate(t['steps']):
        for lr in s['layers']:
            cnt = defaultdict(int); ws = defaultdict(float)
            for ri, row in enumerate(lr['experts']):
                for j, e in enumerate(row):
                    cnt[e] += 1
                    if lr.get('weights'): ws[e] += lr['weights'][ri][j]
            for e in sorted(cnt):
                reqs.append((si, lr['layer'], e, cnt[e], ws[e]))
        toks += s['rows']
    layers = sorted(set(r[1] for r in reqs))
    return dict(t=t, E=E, L=L, reqs=reqs, tokens=toks, rows=[s['rows'] for s in t['steps']], total=len(layers)*E, layers=layers)

def keys_of(tr):
    E = tr['E']
    return np.array([r[1]*E + r[2] for r in tr['reqs']])

def belady_misses(keys, cap):
    n = len(keys)
    nxt = np.full(n, 1<<60)
    last = {}
    for i in range(n-1, -1, -1):
        k = keys[i]
        if k in last: nxt[i] = last[k]
        last[k] = i
    at = {}
    heap = []  # max-heap by next use: (-next, key)
    misses = 0
    for i in range(n):
        k = keys[i]
        if k in at:
            at[k] = nxt[i]; heapq.heappush(heap, (-nxt[i], k)); continue
        misses += 1
        if cap == 0 or nxt[i] >= (1<<60): continue
        if len(at) >= cap:
            while True:
                nn, v = heap[0]
                if v in at and at[v] == -nn: break
                heapq.heappop(heap)
            far = -heap[0][0]
            if far <= nxt[i]: continue
            heapq.heappop(heap)
            del at[v]
        at[k] = nxt[i]; heapq.heappush(heap, (-nxt[i], k))
    return misses

def caps_of(tr, pcts=(10,25,40)):
    return [round(tr['total']*p/100) for p in pcts]


def replay(tr, cap, pol):
    E = tr['E']; G = tr['L']*E
    resident = np.zeros(G, bool); nres = 0
    misses = 0
    tok = 0; cur_step = -1
    steps_rows = tr['rows']
    pol.reset(tr, cap)
    # group requests by (step, layer)
    reqs = tr['reqs']
    i = 0; n = len(reqs)
    while i < n:
        s, l = reqs[i][0], reqs[i][1]
        j = i
        while j < n and reqs[j][0] == s and reqs[j][1] == l: j += 1
        if s != cur_step:
            if cur_step >= 0: tok += steps_rows[cur_step]
            cur_step = s
            pol.begin_step(s, tok, steps_rows[s])
        group = reqs[i:j]
        pol.visit(l, group, tok)  # before accesses: learning hook
        for (_, _, e, rows, w) in group:
            g = l*E + e
            if resident[g]:
                pol.touch(g, tok, rows, w, True)
                continue
            misses += 1
            pol.touch(g, tok, rows, w, False)
            if cap == 0: continue
            if nres < cap:
                if pol.admit_free(g, tok):
                    resident[g] = True; nres += 1
                continue
            idx = np.flatnonzero(resident)
            sc = pol.score(idx, tok, l)
            v = np.argmin(sc)
            if pol.admit(g, tok, sc[v], l):
                resident[idx[v]] = False
                resident[g] = True
        i = j
    return misses / tr['tokens']

class Base:
    def reset(self, tr, cap):
        self.E = tr['E']; G = tr['L']*tr['E']; self.G = G; self.L = tr['L']
    def begin_step(self, s, tok, rows): pass
    def visit(self, l, group, tok): pass
    def admit_free(self, g, tok): return True
    def admit(self, g, tok, vscore, l): return True

class LRFU(Base):
    def __init__(self, h, admit_rule=False): self.h = h; self.ar = admit_rule
    def reset(self, tr, cap):
        super().reset(tr, cap); self.v = np.zeros(self.G); self.t = np.zeros(self.G)
    def touch(self, g, tok, rows, w, hit):
        self.v[g] = self.v[g] * 2**(-(tok - self.t[g])/self.h) + 1; self.t[g] = tok
    def score(self, idx, tok, l):
        return self.v[idx] * 2**(-(tok - self.t[idx])/self.h)
    def admit(self, g, tok, vs, l):
        if not self.ar: return True
        return self.v[g] > vs
    def name(self): return f'lrfu:{self.h}' + ('+adm' if self.ar else '')

def visits_of(tr):
    """list of (step, layer, [experts]) in order"""
    out = []; reqs = tr['reqs']; i = 0
    while i < len(reqs):
        s, l = reqs[i][0], reqs[i][1]; j = i; es = []
        while j < len(reqs) and reqs[j][0] == s and reqs[j][1] == l: es.append(reqs[j][2]); j += 1
        out.append((s, l, es)); i = j
    return out

class Protect(Base):
    """wraps a scorer: experts named by the next K visits (oracle with recall r) get +inf."""
    def __init__(self, inner, K, recall=1.0, seed=1):
        self.inner = inner; self.K = K; self.r = recall; self.seed = seed
    def reset(self, tr, cap):
        super().reset(tr, cap); self.inner.reset(tr, cap)
        self.vis = visits_of(tr); self.vi = -1; self.rng = np.random.default_rng(self.seed)
        self.prot = np.zeros(self.G, bool)
        # predicted sets fixed per visit
        self.pred = []
        for (s, l, es) in self.vis:
            keep = [e for e in es if self.rng.random() < self.r]
            k = len(es) - len(keep)
            others = [e for e in range(self.E) if e not in es]
            fp = list(self.rng.choice(others, size=min(k, len(others)), replace=False)) if k and others else []
            self.pred.append([l*self.E + e for e in keep + fp])
    def begin_step(self, s, tok, rows): self.inner.begin_step(s, tok, rows)
    def visit(self, l, group, tok):
        self.vi += 1
        self.prot[:] = False
        for j in range(self.vi + 1, min(self.vi + 1 + self.K, len(self.vis))):
            self.prot[self.pred[j]] = True
        self.inner.visit(l, group, tok)
    def touch(self, *a): self.inner.touch(*a)
    def score(self, idx, tok, l):
        sc = self.inner.score(idx, tok, l).astype(float)
        sc[self.prot[idx]] += 1e9
        return sc
    def admit(self, g, tok, vs, l): return self.inner.admit(g, tok, vs, l)

class OracleStatic(Base):
    """pins the trace's top `share*cap` most used keys (oracle), inner LRFU for the rest"""
    def __init__(self, share=1.0, h=16): self.share = share; self.h = h
    def reset(self, tr, cap):
        super().reset(tr, cap)
        cnt = np.zeros(self.G)
        for r in tr['reqs']: cnt[r[1]*self.E + r[2]] += 1
        order = np.argsort(-cnt, kind='stable')
        self.pin = np.zeros(self.G, bool); self.pin[order[:int(self.share*cap)]] = True
        self.v = np.zeros(self.G); self.t = np.zeros(self.G)
    def touch(self, g, tok, rows, w, hit):
        self.v[g] = self.v[g] * 2**(-(tok - self.t[g])/self.h) + 1; self.t[g] = tok
    def score(self, idx, tok, l):
        s = self.v[idx] * 2**(-(tok - self.t[idx])/self.h)
        s[self.pin[idx]] += 1e9
        return s
    def admit(self, g, tok, vs, l): return vs < 1e9 or self.pin[g]

class HorizonBelady(Base):
    """knows exact next use (in request index) if within H tokens; else falls back to LRFU score (always below)."""
    def __init__(self, H, h=16, bypass=True): self.H = H; self.h = h; self.byp = bypass
    def reset(self, tr, cap):
        super().reset(tr, cap)
        self.v = np.zeros(self.G); self.t = np.zeros(self.G)
        # next use token for each key after current time: precompute per request index
        E = self.E
        toks = []; tok = 0; cur = -1
        for r in tr['reqs']:
            if r[0] != cur:
                if cur >= 0: tok += tr['rows'][cur]
                cur = r[0]
            toks.append(tok)
        self.rtok = np.array(toks, float)
        keys = np.array([r[1]*E + r[2] for r in tr['reqs']])
        n = len(keys); nxt = np.full(n, np.inf); last = {}
        for i in range(n-1, -1, -1):
            k = keys[i]
            if k in last: nxt[i] = last[k]
            last[k] = i
        self.nxt_req = nxt
        self.keys = keys
        self.nextuse = np.full(self.G, np.inf)  # request index of next use
        self.ri = -1
    def touch(self, g, tok, rows, w, hit):
        self.ri += 1
        assert self.keys[self.ri] == g
        self.nextuse[g] = self.nxt_req[self.ri]
        self.v[g] = self.v[g] * 2**(-(tok - self.t[g])/self.h) + 1; self.t[g] = tok
    def _s(self, idx, tok):
        nu = self.nextuse[idx]
        known = np.isfinite(nu)
        nt = np.where(known, self.rtok[np.minimum(np.where(known, nu, 0), len(self.rtok)-1).astype(int)], np.inf)
        within = nt - tok <= self.H
        lr = self.v[idx] * 2**(-(tok - self.t[idx])/self.h)
        # known within horizon: score high, sooner = higher
        return np.where(within, 1e6 - nu, np.minimum(lr, 1e5))
    def score(self, idx, tok, l): return self._s(idx, tok)
    def admit(self, g, tok, vs, l):
        if not self.byp: return True
        return self._s(np.array([g]), tok)[0] > vs

class Feat(Base):
    """feature-bucket table score, learned online: P(used within H visits of its layer).
    state = (bucket of tokens since last use, bucket of decayed count h=hs, bucket of decayed count h=hl)"""
    def __init__(self, mode='online', target_H=4, hs=4, hl=64, prior=None, bypass=True):
        self.mode = mode; self.H = target_H; self.hs = hs; self.hl = hl; self.byp = bypass
    def reset(self, tr, cap):
        super().reset(tr, cap)
        G = self.G
        self.last = np.full(G, -1e9); self.vs = np.zeros(G); self.ts = np.zeros(G); self.vl = np.zeros(G); self.tl = np.zeros(G)
        self.NB = (8, 8, 8)
        self.num = np.zeros(self.NB) + 0.0; self.den = np.zeros(self.NB) + 0.0
        # pending observations: for each layer visit, state snapshot of that layer's experts; resolved after H tokens
        self.pending = []  # (tok, layer, states(E,3 idx), used_future accumulate)
        self.tok = 0
    def state(self, idx, tok):
        d = tok - self.last[idx]
        db = np.clip(np.floor(np.log2(np.maximum(d, 1))) + 1, 0, 7).astype(int); db[self.last[idx] < -1e8] = 7
        cs = self.vs[idx] * 2**(-(tok - self.ts[idx])/self.hs)
        cl = self.vl[idx] * 2**(-(tok - self.tl[idx])/self.hl)
        sb = np.clip(np.floor(np.log2(cs*4 + 1)), 0, 7).astype(int)
        lb = np.clip(np.floor(np.log2(cl + 1)*1.5), 0, 7).astype(int)
        return db, sb, lb
    def begin_step(self, s, tok, rows):
        self.tok = tok
    def visit(self, l, group, tok):
        # learning: record state of all experts in this layer now; label later = used within next H visits of this layer (including this one? no: this visit)
        E = self.E
        idx = np.arange(l*E, (l+1)*E)
        used = np.zeros(E, bool); used[[g[2] for g in group]] = True
        # resolve pending for this layer: add 'used now' to each pending entry of this layer
        keep = []
        for p in self.pending:
            if p[1] == l:
                p[3] |= used; p[4] += 1
                if p[4] >= self.H:
                    db, sb, lb = p[2]
                    np.add.at(self.den, (db, sb, lb), 1); np.add.at(self.num, (db, sb, lb), p[3])
                    continue
            keep.append(p)
        self.pending = keep
        self.pending.append([tok, l, self.state(idx, tok), np.zeros(E, bool), 0])
    def touch(self, g, tok, rows, w, hit):
        self.last[g] = tok
        self.vs[g] = self.vs[g] * 2**(-(tok - self.ts[g])/self.hs) + 1; self.ts[g] = tok
        self.vl[g] = self.vl[g] * 2**(-(tok - self.tl[g])/self.hl) + 1; self.tl[g] = tok
    def _score(self, idx, tok):
        db, sb, lb = self.state(idx, tok)
        p = (self.num[db, sb, lb] + 0.1) / (self.den[db, sb, lb] + 0.2)
        # tie-break by long count
        cl = self.vl[idx] * 2**(-(tok - self.tl[idx])/self.hl)
        return p + 1e-4 * cl
    def score(self, idx, tok, l): return self._score(idx, tok)
    def admit(self, g, tok, vs, l):
        if not self.byp: return True
        return self._score(np.array([g]), tok)[0] > vs

class LRFUx(Base):
    """LRFU in tokens; admission by score; prefill rows weighting option"""
    def __init__(self, h, admit=True, rows_w=False, margin=0.0): self.h = h; self.ad = admit; self.rw = rows_w; self.m = margin
    def reset(self, tr, cap):
        super().reset(tr, cap); self.v = np.zeros(self.G); self.t = np.zeros(self.G)
    def touch(self, g, tok, rows, w, hit):
        inc = rows if self.rw else 1
        self.v[g] = self.v[g] * 2**(-(tok - self.t[g])/self.h) + inc; self.t[g] = tok
    def score(self, idx, tok, l):
        return self.v[idx] * 2**(-(tok - self.t[idx])/self.h)
    def admit(self, g, tok, vs, l):
        if not self.ad: return True
        return self.v[g] > vs + self.m

class Shadow:
    """ghost cache replaying the same stream with LRFU(h)+admission, counting misses (keys only)."""
    def __init__(self, G, cap, h):
        self.h = h; self.cap = cap; self.res = np.zeros(G, bool); self.n = 0
        self.v = np.zeros(G); self.t = np.zeros(G); self.miss = 0.0
    def access(self, g, tok):
        self.v[g] = self.v[g] * 2**(-(tok - self.t[g])/self.h) + 1; self.t[g] = tok
        if self.res[g]: return True
        self.miss += 1
        if self.cap == 0: return False
        if self.n < self.cap: self.res[g] = True; self.n += 1; return False
        idx = np.flatnonzero(self.res); sc = self.v[idx] * 2**(-(tok - self.t[idx])/self.h)
        v = np.argmin(sc)
        if self.v[g] > sc[v]: self.res[idx[v]] = False; self.res[g] = True
        return False

class Adaptive(Base):
    """live LRFU with a half-life chosen among hs by shadow caches' decayed miss counts."""
    def __init__(self, hs=(2, 8, 32, 128), win=32, admit=True): self.hs = hs; self.win = win; self.ad = admit
    def reset(self, tr, cap):
        super().reset(tr, cap)
        self.sh = [Shadow(self.G, cap, h) for h in self.hs]
        self.v = np.zeros((len(self.hs), self.G)); self.t = np.zeros(self.G)
        self.cur = len(self.hs)//2; self.lt = 0
        self.hist = []
    def begin_step(self, s, tok, rows):
        if tok != self.lt:
            d = 2**(-(tok - self.lt)/self.win)
            for s_ in self.sh: s_.miss *= d
            self.lt = tok
            self.cur = int(np.argmin([s_.miss for s_ in self.sh]))
    def touch(self, g, tok, rows, w, hit):
        for s_ in self.sh: s_.access(g, tok)
        hs = np.array(self.hs, float)
        self.v[:, g] = self.v[:, g] * 2**(-(tok - self.t[g])/hs) + 1; self.t[g] = tok
    def score(self, idx, tok, l):
        h = self.hs[self.cur]
        return self.v[self.cur, idx] * 2**(-(tok - self.t[idx])/h)
    def admit(self, g, tok, vs, l):
        return (not self.ad) or self.v[self.cur, g] > vs

class LRFUw(LRFUx):
    def __init__(self, h, a=0.5, b=1.0): super().__init__(h); self.a = a; self.b = b
    def touch(self, g, tok, rows, w, hit):
        self.v[g] = self.v[g] * 2**(-(tok - self.t[g])/self.h) + self.a + self.b * w; self.t[g] = tok


class PerLayer(LRFUx):
    """LRFU + admission inside per-layer quotas: a layer at or over its quota evicts its own
    coldest expert, one under it takes the coldest of a layer over quota. Quotas: an even split
    (`mode='even'`), or in proportion to the distinct experts each layer used over the last
    `win` tokens (`mode='distinct'`), recomputed every token."""
    def __init__(self, h=16, mode='even', win=16):
        super().__init__(h); self.mode = mode; self.win = win
    def reset(self, tr, cap):
        super().reset(tr, cap); self.cap = cap
        self.quota = np.full(self.L, cap / self.L)
        self.last = np.full(self.G, -1e9); self.lt = -1
    def begin_step(self, s, tok, rows):
        if self.mode == 'distinct' and tok != self.lt:
            self.lt = tok
            recent = (tok - self.last) <= self.win
            d = recent.reshape(self.L, self.E).sum(1).astype(float) + 1.0
            self.quota = self.cap * d / d.sum()
    def touch(self, g, tok, rows, w, hit):
        super().touch(g, tok, rows, w, hit); self.last[g] = tok
    def score(self, idx, tok, l):
        sc = super().score(idx, tok, l).astype(float)
        lay = idx // self.E
        n = np.bincount(lay, minlength=self.L)
        if n[l] >= self.quota[l]:
            sc[lay != l] += 1e9
        else:
            sc[n[lay] <= self.quota[lay]] += 1e9
        return sc
    def admit(self, g, tok, vs, l):
        return super().admit(g, tok, vs, l)

class AdaptivePerLayer(Adaptive):
    """Adaptive, but each layer follows the half-life whose ghost missed least on that layer's
    requests (the ghosts are still global caches)."""
    def reset(self, tr, cap):
        super().reset(tr, cap)
        self.lmiss = np.zeros((self.L, len(self.hs))); self.lcur = np.full(self.L, self.cur)
    def begin_step(self, s, tok, rows):
        if tok != self.lt:
            self.lmiss *= 2**(-(tok - self.lt)/self.win)
            self.lt = tok
            self.lcur = np.argmin(self.lmiss, axis=1)
    def touch(self, g, tok, rows, w, hit):
        l = g // self.E
        for i, s_ in enumerate(self.sh):
            if not s_.access(g, tok): self.lmiss[l, i] += 1
        hs = np.array(self.hs, float)
        self.v[:, g] = self.v[:, g] * 2**(-(tok - self.t[g])/hs) + 1; self.t[g] = tok
    def score(self, idx, tok, l):
        c = self.lcur[idx // self.E]
        h = np.array(self.hs, float)[c]
        return self.v[c, idx] * 2**(-(tok - self.t[idx])/h)
    def admit(self, g, tok, vs, l):
        c = self.lcur[g // self.E]
        return (not self.ad) or self.v[c, g] > vs


EXPERIMENTS = [
    ("lrfu:16 (plain)", lambda: LRFUx(16, admit=False)),
    ("lrfu:4 + admission", lambda: LRFUx(4)),
    ("lrfu:16 + admission", lambda: LRFUx(16)),
    ("lrfu:64 + admission", lambda: LRFUx(64)),
    ("adaptive 2/8/32/128, window 8 (lrfu-auto)", lambda: Adaptive(win=8)),
    ("adaptive, window 32", lambda: Adaptive(win=32)),
    ("adaptive, no admission", lambda: Adaptive(win=8, admit=False)),
    ("lrfu:16 + admission, weight-sized uses", lambda: LRFUw(16, 0.5, 1.0)),
    ("lrfu:16 + admission, prefill uses = rows", lambda: LRFUx(16, rows_w=True)),
    ("per-layer quotas, even split (lrfu:16 + adm.)", lambda: PerLayer(16, 'even')),
    ("per-layer quotas ~ distinct experts, 16 tokens", lambda: PerLayer(16, 'distinct', 16)),
    ("adaptive, half-life chosen per layer", lambda: AdaptivePerLayer(win=8)),
    ("learned P(use within 2 tokens)", lambda: Feat("online", 2)),
    ("protect next 1 layer visit (oracle, recall 1)", lambda: Protect(LRFU(16), 1)),
    ("protect next 1 layer visit (recall 0.8)", lambda: Protect(LRFU(16), 1, 0.8)),
    ("protect next 8 layer visits (oracle)", lambda: Protect(LRFU(16), 8)),
    ("oracle: trace's top experts pinned (all)", lambda: OracleStatic(1.0)),
    ("oracle: knows the rest of this token (H=0)", lambda: HorizonBelady(0)),
    ("oracle: knows the next token (H=1)", lambda: HorizonBelady(1)),
    ("oracle: knows the next 2 tokens", lambda: HorizonBelady(2)),
    ("oracle: knows the next 4 tokens", lambda: HorizonBelady(4)),
    ("oracle: knows the next 8 tokens", lambda: HorizonBelady(8)),
]


def main():
    import time
    paths = sys.argv[1:]
    if not paths:
        sys.exit(__doc__)
    trs = [load(p) for p in paths]
    bel = {}
    for i, tr in enumerate(trs):
        k = keys_of(tr)
        for c in caps_of(tr):
            bel[(i, c)] = belady_misses(k, c) / tr["tokens"]
    print("traces: " + ", ".join(f"{tr['t']['model']} ({tr['tokens']} tokens)" for tr in trs))
    print("each: 10% 25% 40%; bytes per token / Belady's")
    import os
    only = os.environ.get("LAB_ONLY")
    for label, mk in EXPERIMENTS:
        if only and only not in label:
            continue
        t0 = time.time()
        vals = []
        for i, tr in enumerate(trs):
            for c in caps_of(tr):
                vals.append(replay(tr, c, mk()) / bel[(i, c)])
        print(f"{label:48s} " + " | ".join(" ".join(f"{v:.2f}" for v in vals[j:j + 3]) for j in range(0, len(vals), 3))
              + f"  max {max(vals):.2f}  ({time.time() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
