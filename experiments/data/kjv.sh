#!/usr/bin/env bash
# Regenerates node/data/kjv/kjv.txt.gz, the King James Bible that `--model transformer`
# trains on (see experiments/data/README.md). Needs Debian's package registry (apt).
set -euo pipefail
out="$(cd "$(dirname "$0")/../.." && pwd)/node/data/kjv/kjv.txt.gz"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
apt-get download bible-kjv-text bible-kjv
for deb in ./*.deb; do dpkg-deb -x "$deb" root; done
# The bible program prints verses; a wide line keeps one verse per line.
LD_LIBRARY_PATH="$work/root/usr/lib:${LD_LIBRARY_PATH:-}" \
  "$work/root/usr/bin/bible" -p "$work/root/usr/lib" -l100000 "gen1:1-rev22:21" > kjv.txt
test "$(wc -c < kjv.txt)" -eq 4298239 || { echo "unexpected length: $(wc -c < kjv.txt)" >&2; exit 1; }
gzip -9 -n -c kjv.txt > "$out"
echo "wrote $out"
