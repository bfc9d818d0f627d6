#!/usr/bin/env bash
# make_synthetic.sh — goldens for synthetic models (kiln-gen, deterministic) of every
# family and weight type the parity test covers. Needs the build directory (kiln-gen)
# and llama.cpp (see make_goldens.sh).
#   scripts/parity/make_synthetic.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
for fam in llama qwen2 qwen3 gemma3; do
  for ty in f32 f16 q8_0 q4_0 q4_K; do
    name=tiny-$fam-$ty
    model=$build/parity-models/$name.gguf
    gen="-p tiny -f $fam -t $ty -s 7 --layers 3"
    mkdir -p "$build/parity-models"
    "$build/kiln-gen" -q $gen -o "$model"
    scripts/parity/make_goldens.sh "$name" "$model"
    {
      echo "# kiln-gen $gen (seed 7); goldens from llama.cpp, see SOURCE"
      case $ty in
        q*) echo "# quantized weights: compared in ggml numerics (llama.cpp's 8-bit activation"
            echo "# arithmetic, docs/PLAN.md \"Numerics\"). Quantization amplifies f32-order"
            echo "# differences chaotically, so per-token agreement is bounded by llama.cpp's own"
            echo "# reproducibility: llama.cpp with flash attention on vs off agrees 95.5-98.2%"
            echo "# top-1 (KL 1e-4..5e-4) and 1-9 of 12 greedy prompts on these models. Thresholds"
            echo "# at that level: top-1 >= 95%, the issue's KL < 1e-3 and PPL 0.5%, greedy reported."
            echo "numerics ggml"
            echo "expect 0.95 0.001 0.0 0.005" ;;
      esac
      echo "gen $gen"
      echo "model path:parity-models/$name.gguf"
      echo "tf tf.txt"
      echo "greedy greedy.txt"
      echo "ppl ppl.txt"
    } > "tests/data/parity/$name/manifest"
  done
done
