#!/usr/bin/env bash
# Structured outputs: time per output token with a JSON-schema constraint against the same workload
# unconstrained, in the same run and against the same server, at concurrency 1 and 16. The model is
# Qwen3-0.6B's shape with dummy weights and the real tokenizer: random weights spread probability over
# the whole vocabulary, so the constrained runs visit many grammar states (the hard case for the mask).
# The schema (an array of at least 50 records) cannot end within the output length, so every
# constrained token is a masked token, never an eos-only tail. Both arms use --ignore-eos.
# Usage: bench/structured.sh [BUILD_DIR] [THREADS] [REPS]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
threads=${2:-2}
reps=${3:-2}
port=18232
out=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$out"' EXIT

schema='{"type":"object","properties":{"records":{"type":"array","minItems":50,"items":{"type":"object",
"properties":{"id":{"type":"integer","minimum":0},"name":{"type":"string","maxLength":16},
"email":{"type":"string","format":"email"},"active":{"type":"boolean"},"role":{"enum":["admin","user","guest"]},
"tags":{"type":"array","items":{"type":"string","maxLength":8},"maxItems":4}},
"required":["id","name","active","role"]}}},"required":["records"]}'
body=$(python3 -c 'import json, sys; print(json.dumps({"structured_outputs": {"json": json.loads(sys.argv[1])}}))' "$schema")

"$build/cvllm" serve Qwen/Qwen3-0.6B --load-format dummy --port $port --max-model-len 1024 --num-threads "$threads" \
  --max-num-seqs 16 --disable-log-stats > "$out/server.log" 2>&1 &
for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.2; done
curl -sf "http://127.0.0.1:$port/health" >/dev/null || { echo "server did not start:"; cat "$out/server.log"; exit 1; }

tpot() { # $1 = concurrency, $2.. = extra bench flags -> mean TPOT in ms
  local c=$1; shift
  "$build/cvllm" bench serve --port $port --model Qwen/Qwen3-0.6B --dataset-name random --random-input-len 64 \
    --random-output-len 128 --num-prompts $((c * 2)) --max-concurrency "$c" --seed 11 --ignore-eos "$@" > "$out/run.txt"
  grep -q 'Failed requests: *0 *$' "$out/run.txt" || { echo "failed requests:"; cat "$out/run.txt"; exit 1; }
  awk -F: '/^Mean TPOT/ {gsub(/ /, "", $2); print $2}' "$out/run.txt"
}

echo "commit $(git rev-parse --short HEAD), $(nproc) cores, $threads threads, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "Qwen3-0.6B shape, dummy bf16 weights, random 64 in / 128 out, ignore_eos"
tpot 1 >/dev/null  # warm-up: first compile of the schema and first visits of its states happen here too
tpot 1 --extra-body "$body" >/dev/null
for c in 1 16; do
  for r in $(seq "$reps"); do
    p=$(tpot "$c") j=$(tpot "$c" --extra-body "$body")
    awk -v c="$c" -v r="$r" -v p="$p" -v j="$j" \
      'BEGIN {printf "concurrency %2d rep %d: TPOT plain %.2f ms, json schema %.2f ms, ratio %.3f\n", c, r, p, j, j / p}'
  done
done
