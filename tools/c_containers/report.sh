#!/usr/bin/env bash
# The docs/FORMAT.md table of C-project layouts: each committed C container
# (tests/fixtures/c_containers) and, beside it, the same fixture written by `coli convert`
# with the nearest formats it has, each measured against transformers run on its own
# dequantized weights (reference.py). Needs target/release/coli and the example built:
#   cargo build --release && cargo build --release -p colibri-engine --example c_container_report
#   tools/c_containers/report.sh [python]
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${1:-python3}
fx=tests/fixtures
c=$fx/c_containers
w=$(mktemp -d); trap 'rm -rf "$w"' EXIT
coli=target/release/coli
ref() { "$py" tools/c_containers/reference.py "$@" >/dev/null 2>&1; }
conv() { # name fixture experts group dense
  "$coli" convert --input $fx/$2 --output "$w/$1" --experts $3 --group-size $4 --dense $5 2>/dev/null
  ref --fixture $fx/$2 --container "$w/$1" --out "$w/$1.f32" ${6:-}
}
mkdir -p "$w/glm_main"
cp $c/glm_moe_dsa/config.json $c/glm_moe_dsa/out-00000.safetensors "$w/glm_main"
"$py" tools/c_containers/write.py glm --input $fx/deepseek_v3 --output "$w/c_ds_int3" --ebits 8 --xbits 3 --group-size 0
ref --fixture $fx/deepseek_v3 --container "$w/c_ds_int3" --out "$w/c_ds_int3.f32"
"$py" tools/c_containers/write.py glm --input $fx/olmoe --output "$w/c_olmoe_int2" --ebits 8 --xbits 2 --group-size 0 --io-bits 8
ref --fixture $fx/olmoe --container "$w/c_olmoe_int2" --out "$w/c_olmoe_int2.f32"
conv ours_glm glm_moe_dsa int4 32 int8
conv ours_ds_int3 deepseek_v3 int3 0 int8
conv ours_olmoe_int8 olmoe int8 0 bf16
conv ours_qwen_g32 qwen3_moe int4 32 int8
conv ours_olmoe_int2 olmoe int2 0 int8
target/release/examples/c_container_report \
  "C glm_moe_dsa, no indexer/MTP (dense attention ref)" "$w/glm_main" $c/glm_moe_dsa/reference_dense.f32 $fx/glm_moe_dsa \
  "C glm_moe_dsa + indexer + MTP passes" $c/glm_moe_dsa $c/glm_moe_dsa/reference_dsa.f32 $fx/glm_moe_dsa \
  "coli convert glm_moe_dsa --experts int4 -g32 --dense int8" "$w/ours_glm" "$w/ours_glm.f32" $fx/glm_moe_dsa \
  "C deepseek_v3, experts int4/int3/int2 per projection" $c/deepseek_v3_mixed $c/deepseek_v3_mixed/reference.f32 $fx/deepseek_v3 \
  "C deepseek_v3, experts int3-g64" "$w/c_ds_int3" "$w/c_ds_int3.f32" $fx/deepseek_v3 \
  "coli convert deepseek_v3 --experts int3 --dense int8" "$w/ours_ds_int3" "$w/ours_ds_int3.f32" $fx/deepseek_v3 \
  "C olmoe merged int8 experts" $c/olmoe_merged $c/olmoe_merged/reference.f32 $fx/olmoe \
  "coli convert olmoe --experts int8" "$w/ours_olmoe_int8" "$w/ours_olmoe_int8.f32" $fx/olmoe \
  "C olmoe, experts int2 rows, rest int8" "$w/c_olmoe_int2" "$w/c_olmoe_int2.f32" $fx/olmoe \
  "coli convert olmoe --experts int2 -g0 --dense int8" "$w/ours_olmoe_int2" "$w/ours_olmoe_int2.f32" $fx/olmoe \
  "C qwen3_moe, experts int4-g16" $c/qwen3_moe_g16 $c/qwen3_moe_g16/reference.f32 $fx/qwen3_moe \
  "coli convert qwen3_moe --experts int4 -g32 --dense int8" "$w/ours_qwen_g32" "$w/ours_qwen_g32.f32" $fx/qwen3_moe
