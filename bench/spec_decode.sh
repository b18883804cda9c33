#!/usr/bin/env bash
# N-gram speculative decoding on a repetitive-output workload: decode tokens/s and acceptance with and
# without --speculative-config, in the same run. The model is the tied reference checkpoint in
# tests/data (random weights whose greedy output repeats one token: the repetitive workload), so the
# numbers show the mechanism (verify k drafts in one pass), not a real model's acceptance.
# Usage: bench/spec_decode.sh [BUILD_DIR] [THREADS]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
threads=${2:-2}
model=$(mktemp -d)
trap 'rm -rf "$model"' EXIT
for f in config.json generation_config.json model.safetensors; do ln -s "$PWD/tests/data/vectors/qwen3-dense-tied-f32/$f" "$model/"; done
for f in tokenizer.json tokenizer_config.json; do ln -s "$PWD/models/qwen3-tokenizer/$f" "$model/"; done
run() {
  CVLLM_LOG_LEVEL=warning "$build/cvllm" bench latency --model "$model" --input-len 64 --output-len 256 \
    --batch-size 4 --num-iters-warmup 1 --num-iters 5 --max-model-len 512 --num-threads "$threads" "$@"
}
plain=$(run | awk '/^Decode throughput/ {print $3}')
spec_out=$(run --speculative-config '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}')
spec=$(echo "$spec_out" | awk '/^Decode throughput/ {print $3}')
echo "commit $(git rev-parse --short HEAD), $(nproc) cores, $threads threads, qwen3-dense-tied-f32 (2 layers, hidden 64)"
echo "decode tokens/s without speculation: $plain"
echo "decode tokens/s with ngram k=4:      $spec"
echo "$spec_out" | grep '^Speculative decoding'
awk -v a="$spec" -v b="$plain" 'BEGIN {printf "speed-up: %.2fx\n", a / b}'
