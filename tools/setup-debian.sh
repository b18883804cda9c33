#!/usr/bin/env bash
# Installs the Debian 12 packages cvllm needs to build and test (run as root). Does nothing when they
# are already installed, so it also works without network on a prepared machine.
set -euo pipefail
packages=(build-essential cmake pkg-config git
          libjansson-dev libpcre2-dev libutf8proc-dev libcurl4-openssl-dev libxxhash-dev libyaml-dev
          libssl-dev openssl
          libopenmpi-dev openmpi-bin python3 clang libclang-rt-14-dev)
# OpenSSL (libssl-dev) serves HTTPS (src/server/tls.c); its command line (openssl) makes the tests' certificates.
# OpenMPI (libopenmpi-dev, openmpi-bin) carries tensor parallelism between processes (src/executor/comm.c).
# Node.js and npm run the OpenAI SDK test (tests/sdk); Debian's, unless a node is already installed.
command -v node >/dev/null 2>&1 || packages+=(nodejs npm)
# ajv, a JSON Schema validator, checks every structured output the tests generate (tests/tools/validate_json.js).
packages+=(node-ajv)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
