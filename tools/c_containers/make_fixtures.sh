#!/usr/bin/env bash
# Regenerates tests/fixtures/c_containers: colibri C engine containers written from the
# transformers fixtures exactly as the C converters lay them out (write.py), and the logits
# transformers computes on their dequantized weights (reference.py). Deterministic.
#   tools/c_containers/make_fixtures.sh [python]   (numpy for write.py; torch + transformers
#                                                   for reference.py: tools/oracle/requirements.txt)
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${1:-python3}
fx=tests/fixtures
out=$fx/c_containers
rm -rf "$out"
mkdir -p "$out"
w() { "$py" tools/c_containers/write.py "$@"; }
ref() { "$py" tools/c_containers/reference.py "$@"; }
keep() { # config files only: the tests feed token ids
  for f in "$1"/*; do case $(basename "$f") in
    tokenizer.json|tokenizer_config.json) rm "$f";; esac; done
}

# GLM-5 as convert_fp8_to_int4.py writes it: resident matrices int8 per row, routed experts
# int4 in groups of 32 (the fixture's rows are 64 wide), norms/routers f32; the main pass
# (out-00000), the DSA indexer pass (out-idx-00000) and the MTP pass (out-mtp-00000), int8.
w glm --input $fx/glm_moe_dsa --output $out/glm_moe_dsa --ebits 8 --xbits 4 --group-size 32 --indexer --mtp
keep $out/glm_moe_dsa
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cp $out/glm_moe_dsa/config.json $out/glm_moe_dsa/out-00000.safetensors "$tmp"
ref --fixture $fx/glm_moe_dsa --container "$tmp" --dense-attention --out $out/glm_moe_dsa/reference_dense.f32
ref --fixture $fx/glm_moe_dsa --container $out/glm_moe_dsa --out $out/glm_moe_dsa/reference_dsa.f32

# Every C format in one MLA container: attention/dense MLP/embeddings int8, shared experts
# int4 rows, routed experts gate int4 rows, up int3-g64, down int2 rows.
w glm --input $fx/deepseek_v3 --output $out/deepseek_v3_mixed --ebits 8 --xbits 4 --group-size 0 \
  --shared-bits 4 --up-bits 3 --down-bits 2
keep $out/deepseek_v3_mixed
ref --fixture $fx/deepseek_v3 --container $out/deepseek_v3_mixed --out $out/deepseek_v3_mixed/reference.f32

# OLMoE as convert_olmoe_merged.py writes it: merged int8 experts, dense tensors unchanged.
w merged --input $fx/olmoe --output $out/olmoe_merged --flush-every 16
keep $out/olmoe_merged
ref --fixture $fx/olmoe --container $out/olmoe_merged --out $out/olmoe_merged/reference.f32

# Grouped int4 with a group size colibri's own converter does not write (16).
w glm --input $fx/qwen3_moe --output $out/qwen3_moe_g16 --ebits 8 --xbits 4 --group-size 16
keep $out/qwen3_moe_g16
ref --fixture $fx/qwen3_moe --container $out/qwen3_moe_g16 --out $out/qwen3_moe_g16/reference.f32

# The layout test vectors: each C format of a few rows, packed by cformats.py.
"$py" tools/c_containers/vectors.py --out $out/vectors.safetensors
du -sh $out
