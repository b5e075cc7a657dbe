#!/usr/bin/env bash
# install-deps.sh — the Debian 12 packages moet builds against (idempotent; uses sudo when not root).
#   jansson   JSON (safetensors headers, config.json, tokenizer.json): small, strict (rejects duplicate keys), in Debian
#   pcre2     the tokenizers' pre-tokenizer regexes (\p{L}, lookahead) run unchanged with PCRE2_UTF|PCRE2_UCP
#   utf8proc  Unicode normalization (NFC/NFKC normalizers of real tokenizers)
#   clang + libclang-rt-dev   libFuzzer, for the parser fuzz targets (fuzz/)
set -euo pipefail
pkgs="build-essential cmake pkg-config libjansson-dev libpcre2-dev libutf8proc-dev clang libclang-rt-dev"
missing=""
for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  echo "installing:$missing" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >&2
fi
