#!/usr/bin/env bash
# Prefix caching under `cvllm bench serve`: the same workload with a shared random prefix against
# `cvllm serve` with and without --enable-prefix-caching, in the same run. Prints mean/median TTFT of
# both and the server's prefix-cache hit rate from /metrics.
# Usage: bench/prefix_cache.sh [BUILD_DIR] [MODEL] [THREADS]   (MODEL default: Qwen/Qwen3-0.6B, dummy weights;
# the hybrid: bench/configs/qwen3.6-35b-a3b-4layers; the Qwen3 tokenizer serves every shape)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
model=${2:-Qwen/Qwen3-0.6B}
threads=${3:-2}
port=18231
out=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$out"' EXIT

serve() { # $1 = --enable-prefix-caching | --no-enable-prefix-caching
  "$build/cvllm" serve "$model" --load-format dummy --tokenizer models/qwen3-tokenizer --port $port --max-model-len 2048 --num-threads "$threads" \
    --max-num-seqs 8 "$1" --disable-log-stats > "$out/server.log" 2>&1 &
  for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && return 0; sleep 0.2; done
  echo "server did not start:"; cat "$out/server.log"; exit 1
}

run() { # $1 = label, $2 = server flag
  serve "$2"
  "$build/cvllm" bench serve --port $port --model "$model" --tokenizer models/qwen3-tokenizer \
    --dataset-name random --random-prefix-len 384 --random-input-len 64 --random-output-len 8 \
    --num-prompts 16 --max-concurrency 2 --seed 7 --num-warmups 1 --ignore-eos > "$out/$1.txt"
  local q h
  q=$(curl -s "http://127.0.0.1:$port/metrics" | awk '/^vllm:prefix_cache_queries_total/ {print $2}')
  h=$(curl -s "http://127.0.0.1:$port/metrics" | awk '/^vllm:prefix_cache_hits_total/ {print $2}')
  kill %1; wait %1 2>/dev/null || true
  printf "%-22s mean TTFT %8s ms, median TTFT %8s ms, prefix-cache hit rate %s\n" "$1" \
    "$(awk '/^Mean TTFT/ {print $4}' "$out/$1.txt")" "$(awk '/^Median TTFT/ {print $4}' "$out/$1.txt")" \
    "$(awk -v q="${q:-0}" -v h="${h:-0}" 'BEGIN { if (q > 0) printf "%.1f%%", 100 * h / q; else print "n/a" }')"
}

echo "commit $(git rev-parse --short HEAD), $(nproc) cores, $threads threads, $model (dummy weights), 384-token shared prefix + 64 random tokens, 16 prompts, concurrency 2"
run caching-off --no-enable-prefix-caching
run caching-on --enable-prefix-caching
