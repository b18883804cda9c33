#!/usr/bin/env bash
# N-gram speculative decoding on a repetitive-output workload: batch-1 decode tokens/s and acceptance
# with and without --speculative-config, in the same run. The model is Qwen3-0.6B's shape with dummy
# weights: random tied embeddings make greedy output repeat, which is the repetitive workload; the
# numbers show what verifying k drafts in one pass buys, not a real model's acceptance rate.
# Usage: bench/spec_decode.sh [BUILD_DIR] [THREADS]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
threads=${2:-2}
run() {
  CVLLM_LOG_LEVEL=warning "$build/cvllm" bench latency --model Qwen/Qwen3-0.6B --load-format dummy \
    --input-len 64 --output-len 64 --batch-size 1 --num-iters-warmup 1 --num-iters 3 --max-model-len 512 \
    --num-threads "$threads" "$@"
}
plain=$(run | awk '/^Decode throughput/ {print $3}')
spec_out=$(run --speculative-config '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}')
spec=$(echo "$spec_out" | awk '/^Decode throughput/ {print $3}')
echo "commit $(git rev-parse --short HEAD), $(nproc) cores, $threads threads, Qwen3-0.6B shape (dummy bf16 weights), batch 1"
echo "decode tokens/s without speculation: $plain"
echo "decode tokens/s with ngram k=4:      $spec"
echo "$spec_out" | grep '^Speculative decoding'
awk -v a="$spec" -v b="$plain" 'BEGIN {printf "speed-up: %.2fx\n", a / b}'
