#!/usr/bin/env bash
# Builds cvllm twice (optimized, then with AddressSanitizer + UndefinedBehaviorSanitizer) and runs
# every test in both builds, then gives each libFuzzer target a short run. Installs what it needs.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup-debian.sh
jobs=$(nproc)

# The OpenAI SDK test's npm package (tests/sdk, pinned by its package-lock.json). An existing
# node_modules is kept, so this also runs offline; without the package that ctest reports "skipped".
if [[ ! -d tests/sdk/node_modules ]] && command -v npm >/dev/null 2>&1; then
  (cd tests/sdk && npm ci --no-audit --no-fund) || echo "npm ci failed: test_openai_sdk will be skipped"
fi

echo "== release build"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure -j"$jobs" -E '^fuzz_')

echo "== AddressSanitizer + UBSan build"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCVLLM_SANITIZE=ON >/dev/null
cmake --build build-asan -j"$jobs"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
(cd build-asan && CVLLM_SANITIZED=1 ctest --output-on-failure -j"$jobs" -E '^fuzz_')

echo "== libFuzzer targets"
CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCVLLM_FUZZ=ON -DCVLLM_TESTS=ON >/dev/null
cmake --build build-fuzz -j"$jobs" --target cvllm_fuzzers
(cd build-fuzz && ctest --output-on-failure -j"$jobs" -R '^fuzz_')
