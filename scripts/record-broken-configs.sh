#!/usr/bin/env bash
# Regenerates tests/fixtures/broken-configs.json: every config the config tests
# (src/config/tests.rs) reject through assert_rejected, with the line and field they
# expect. tests/check_config.rs runs `sluice --check-config` on each;
# config::tests::broken_config_fixtures_are_rejected_as_recorded keeps them current.
#
#   scripts/record-broken-configs.sh      (builds and runs the config unit tests)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
# The fixture check itself fails while the fixtures are stale: the recording stands.
(cd "$here" && SLUICE_RECORD_BROKEN_CONFIGS="$dir" cargo test --release --lib config:: -q >/dev/null 2>&1) || true
python3 - "$dir" "$here/tests/fixtures/broken-configs.json" <<'PY'
import json, os, sys
src, dst = sys.argv[1], sys.argv[2]
cases = {}
for f in os.listdir(src):
    c = json.load(open(os.path.join(src, f)))
    cases[c["text"]] = c  # the same text from two tests once
if not cases:
    sys.exit("no rejected configs recorded: do the config tests build? (cargo test --release --lib config::)")
out = sorted(cases.values(), key=lambda c: (c["test"], c["line"], c["field"], c["text"]))
with open(dst, "w") as f:
    json.dump(out, f, indent=1, ensure_ascii=False)
    f.write("\n")
print(f"{len(out)} cases in {dst}")
PY
