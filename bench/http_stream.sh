#!/usr/bin/env bash
# http_stream.sh — streaming throughput through the HTTP layer: `cvllm bench serve` against two
# `cvllm serve` binaries on the tiny reference checkpoint (2 layers, hidden 64, vocabulary 4096),
# where the model costs little and the server path (parsing, SSE framing, socket writes) most.
# The two servers take turns, REPS times each, on the same port and flags; the bench client is the
# NEW binary's for both. Prints each run, the medians and the ratio NEW / OLD.
# On a machine with two or more CPUs the server (engine on one thread) is pinned to CPU 0 and the
# client to CPU 1, so the figure is the server's cost per token rather than the luck of where a
# dozen threads land on few cores.
#
# usage: bench/http_stream.sh OLD_CVLLM NEW_CVLLM [REPS=3] [CONCURRENCY=16; 0 = bench serve's default,
#        every prompt at once]
set -euo pipefail
old=$1 new=$2 reps=${3:-3} conc=${4:-16}
root=$(cd "$(dirname "$0")/.." && pwd)
port=18231
log=$(mktemp)
# The reference shape with the full Qwen3 vocabulary and dummy weights: bench serve's random prompts
# draw ids from the whole tokenizer, which the 4,096-token reference vocabulary would refuse.
model=$(mktemp -d)
trap 'rm -rf "$log" "$model"' EXIT
python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); c["vocab_size"] = 151936; json.dump(c, open(sys.argv[2], "w"))' \
    "$root"/tests/data/vectors/qwen3-dense-f32/config.json "$model"/config.json
ln -s "$root"/tests/data/vectors/qwen3-dense-f32/generation_config.json "$model"/
ln -s "$root"/models/qwen3-tokenizer/* "$model"/
prompts=$(( conc > 0 ? (conc < 4 ? 32 : (4 * conc > 128 ? 4 * conc : 128)) : 256 ))

run_one() { # binary -> output tok/s
  $pin_server "$1" serve "$model" --port $port --host 127.0.0.1 --max-model-len 1024 --num-threads 1 \
      --kv-cache-memory-bytes 256M --dtype float32 --max-num-seqs 256 --load-format dummy --disable-log-stats >"$log" 2>&1 &
  local pid=$!
  for _ in $(seq 100); do curl -sf http://127.0.0.1:$port/health >/dev/null && break; sleep 0.2; done
  local out
  out=$($pin_client "$new" bench serve --port $port --model "$model" --tokenizer "$model" --dataset-name random \
      --num-prompts $prompts --random-input-len 16 --random-output-len 256 --ignore-eos \
      ${conc_flag[@]+"${conc_flag[@]}"} --seed 1 2>/dev/null)
  kill -TERM $pid; wait $pid 2>/dev/null || true
  if ! echo "$out" | grep -q 'Failed requests: *0 *$'; then echo "failed requests:" >&2; echo "$out" >&2; exit 1; fi
  echo "$out" | awk -F: '/Output token throughput/ {gsub(/ /, "", $2); print $2}'
}

conc_flag=()
[[ $conc -gt 0 ]] && conc_flag=(--max-concurrency "$conc")
pin_server= pin_client=
if [[ $(nproc) -ge 2 ]] && command -v taskset >/dev/null; then pin_server="taskset -c 0" pin_client="taskset -c 1"; fi

median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

o=() n=()
for r in $(seq "$reps"); do
  o+=("$(run_one "$old")"); n+=("$(run_one "$new")")
  echo "rep $r: old ${o[-1]} tok/s, new ${n[-1]} tok/s"
done
mo=$(printf '%s\n' "${o[@]}" | median) mn=$(printf '%s\n' "${n[@]}" | median)
echo "median output tok/s: old $mo, new $mn, new/old $(awk -v a="$mn" -v b="$mo" 'BEGIN {printf "%.3f", a / b}')"
