#!/usr/bin/env bash
# install-deps.sh — the Debian 12 packages moet builds against (idempotent; uses sudo when not root).
#   jansson   JSON (safetensors headers, config.json, tokenizer.json): small, strict (rejects duplicate keys), in Debian
#   pcre2     the tokenizers' pre-tokenizer regexes (\p{L}, lookahead) run unchanged with PCRE2_UTF|PCRE2_UCP
#   utf8proc  Unicode normalization (NFC/NFKC normalizers of real tokenizers)
#   microhttpd  the HTTP server under `moet serve` (threads, chunked/SSE responses, connection-close callbacks)
#   clang + libclang-rt-dev   libFuzzer, for the parser fuzz targets (fuzz/)
#   curl, nodejs + npm   the server tests drive `moet serve` with curl and the official openai npm client
set -euo pipefail
pkgs="build-essential cmake pkg-config libjansson-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev clang libclang-rt-dev curl"
missing=""
for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
# Node.js (with npm) for the openai-client tests: the machine's own when there is one (its nodejs package ships npm),
# else Debian's nodejs + npm.
command -v npm >/dev/null 2>&1 || missing="$missing nodejs npm"
if [ -n "$missing" ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  echo "installing:$missing" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >&2
fi
