#!/bin/sh
# test_install.sh BUILD_DIR SOURCE_DIR CC [CFLAGS] — the installed tree as its users meet it.
#
# `cmake --install` into a scratch prefix (not the configured one), then: libcvllm.so exports exactly
# the functions cvllm.h declares; examples/generate.c builds with `pkg-config --cflags --libs cvllm`
# against libcvllm.so and, statically, against libcvllm.a, and both print what the installed `cvllm
# generate` prints for the same greedy request on the tiny reference checkpoint; the installed
# program and library find the shipped model files under PREFIX/share/cvllm, not in the source tree.
set -eu
build=$1 src=$2 cc=$3 cflags=${4:-}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cvllm-install-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() {
    echo "test_install: FAIL: $*" >&2
    exit 1
}

cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log" 2>&1 || fail "cmake --install: $(tail -3 "$tmp/install.log")"
prefix=$(cd "$tmp/prefix" && pwd -P)
pc=$(find "$prefix" -name cvllm.pc)
[ -n "$pc" ] || fail "no cvllm.pc installed"
export PKG_CONFIG_PATH="${pc%/cvllm.pc}"
libdir=$(pkg-config --variable=libdir cvllm)
libdir=$(cd "$libdir" && pwd -P) || fail "pkg-config's libdir does not exist"
for f in "$prefix/bin/cvllm" "$prefix/include/cvllm.h" "$libdir/libcvllm.so" "$libdir/libcvllm.a" \
         "$prefix/share/cvllm/models/Qwen/Qwen3-0.6B/config.json" \
         "$prefix/share/cvllm/models/Qwen/Qwen3-0.6B/tokenizer.json" \
         "$prefix/share/cvllm/models/vllm-ascend/Qwen3-32B-W8A8/quant_model_description.json"; do
    [ -e "$f" ] || fail "not installed: $f"
done

# The shared library's dynamic symbols are the API, all of it and nothing else.
nm -D --defined-only "$libdir/libcvllm.so" | awk '{print $3}' | sort -u >"$tmp/exported"
grep -o 'cvllm_[a-z_]*(' "$prefix/include/cvllm.h" | tr -d '(' | sort -u >"$tmp/declared"
diff "$tmp/declared" "$tmp/exported" >"$tmp/symbols.diff" || fail "exports differ from cvllm.h (< declared, > exported): $(cat "$tmp/symbols.diff")"

# A model folder: the f32 reference checkpoint with the installed tokenizer.
model=$tmp/model
mkdir "$model"
for f in config.json generation_config.json model.safetensors; do ln -s "$src/tests/data/vectors/qwen3-dense-f32/$f" "$model/$f"; done
for f in tokenizer.json tokenizer_config.json; do ln -s "$prefix/share/cvllm/models/qwen3-tokenizer/$f" "$model/$f"; done
prompt="I am in the house"
export CVLLM_LOG_LEVEL=warning CVLLM_CACHE_ROOT="$tmp/cache"

"$prefix/bin/cvllm" generate "$model" --prompt "$prompt" --temperature 0 --max-tokens 8 --max-model-len 256 \
    --output json >"$tmp/cli.json" || fail "installed cvllm generate failed"
python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["outputs"][0]["text"])' "$tmp/cli.json" >"$tmp/cli.txt"

# shellcheck disable=SC2046,SC2086 # pkg-config's flags are meant to split
"$cc" -std=c17 -Wall -Wextra -Werror $cflags "$src/examples/generate.c" $(pkg-config --cflags --libs cvllm) \
    -o "$tmp/generate" || fail "examples/generate.c does not build against libcvllm.so"
LD_LIBRARY_PATH="$libdir" "$tmp/generate" "$model" "$prompt" 8 >"$tmp/shared.txt" || fail "generate (shared) failed"
cmp -s "$tmp/cli.txt" "$tmp/shared.txt" || fail "libcvllm.so generated '$(cat "$tmp/shared.txt")', cvllm '$(cat "$tmp/cli.txt")'"

# Static, as the README says: libcvllm.a, with its dependencies (cvllm.pc's Requires.private) linked
# as the shared system libraries they are (`pkg-config --static` would want libcurl's own static
# dependencies too), and libm, libdl and threads (its Libs.private).
# shellcheck disable=SC2046,SC2086
"$cc" -std=c17 -Wall -Wextra -Werror $cflags "$src/examples/generate.c" $(pkg-config --cflags cvllm) \
    "$libdir/libcvllm.a" $(pkg-config --libs $(pkg-config --print-requires-private cvllm)) -lm -ldl -pthread \
    -o "$tmp/generate-static" || fail "examples/generate.c does not build against libcvllm.a"
if readelf -d "$tmp/generate-static" | grep -q 'libcvllm'; then fail "the static example needs libcvllm.so"; fi
"$tmp/generate-static" "$model" "$prompt" 8 >"$tmp/static.txt" || fail "generate (static) failed"
cmp -s "$tmp/cli.txt" "$tmp/static.txt" || fail "libcvllm.a generated '$(cat "$tmp/static.txt")', cvllm '$(cat "$tmp/cli.txt")'"

# The shipped files come from the prefix: the installed program's tokenizer for a shipped id, and
# the library's config for one (Qwen3-32B, refused for memory before any weight is made).
shipped="$prefix/share/cvllm/models/Qwen/Qwen3-32B"
HF_HUB_CACHE="$tmp/hub" HF_HUB_OFFLINE=1 CVLLM_LOG_LEVEL=info "$prefix/bin/cvllm" tokenize Qwen/Qwen3-32B --text hi \
    >"$tmp/tok.out" 2>"$tmp/tok.err" || fail "installed cvllm tokenize failed: $(cat "$tmp/tok.err")"
grep -qF "($shipped)" "$tmp/tok.err" || fail "installed cvllm did not use $shipped: $(cat "$tmp/tok.err")"
HF_HUB_CACHE="$tmp/hub" HF_HUB_OFFLINE=1 CVLLM_LOG_LEVEL=info VLLM_CPU_KVCACHE_SPACE=0.001 LD_LIBRARY_PATH="$libdir" \
    "$tmp/generate" Qwen/Qwen3-32B hi 1 dummy >/dev/null 2>"$tmp/lib.err" && fail "Qwen3-32B fit a 1 MiB KV cache"
grep -qF "($shipped)" "$tmp/lib.err" || fail "libcvllm.so did not use $shipped: $(cat "$tmp/lib.err")"
grep -qF "To serve at least one request" "$tmp/lib.err" || fail "unexpected failure: $(cat "$tmp/lib.err")"
echo "test_install: passed"
