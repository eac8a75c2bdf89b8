#!/usr/bin/env python3
"""Token ids of a real English text, for driving a random-weight (synth) model's decode
steps with natural token statistics (`coli trace --follow-ids`).

A synth model's routing depends on which tokens it sees (its routers read a residual stream
led by the token's embedding); its own generations are noise, uniform over the vocabulary.
Real text has what the expert cache lives on: a Zipf-like token frequency and bursts of
repeated words. The text is Python's own reference documentation (pydoc_data, shipped with
every Python), split into words and punctuation; a word's id is its frequency rank (a real
BPE tokenizer would split rare words further; which id a word gets does not matter to a
random model, only which positions share one).

    tools/streaming/text_ids.py --tokens 512 [--skip 0] [--vocab 50304] > ids.txt
"""
import argparse
import collections
import re

import pydoc_data.topics


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--skip", type=int, default=0, help="words to skip from the start")
    ap.add_argument("--vocab", type=int, default=50304)
    a = ap.parse_args()
    topics = pydoc_data.topics.topics
    text = "\n".join(topics[k] for k in sorted(topics))
    # Headings' underlines ("*****", "-----") are markup, not text.
    text = re.sub(r"(?m)^\s*([*=~^\"+-])\1+\s*$", "", text)
    words = re.findall(r"\w+|[^\w\s]", text)
    rank = {w: i for i, (w, _) in enumerate(collections.Counter(words).most_common())}
    # Ids from 16 up, below the vocabulary's end (the low ids are special tokens in most
    # tokenizers).
    ids = [min(16 + rank[w], a.vocab - 1) for w in words[a.skip : a.skip + a.tokens]]
    if len(ids) < a.tokens:
        raise SystemExit(f"the text has only {len(words)} words")
    print(",".join(map(str, ids)))


if __name__ == "__main__":
    main()
