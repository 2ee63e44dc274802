#!/bin/sh
# Installs the Debian packages the project needs when they are missing (needs root).
set -e
# chromium + chromium-driver: the live page's headless browser test (tests/test_live_browser.py)
# libllvm19: Mitsuba's vectorised llvm_ad_rgb variant for world v2 (bookworm's default libLLVM 15 aborts it)
PKGS="libegl1 libegl-mesa0 libgl1-mesa-dri libgbm1 chromium chromium-driver libllvm19"
missing=""
for p in $PKGS; do
  dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "missing system packages:$missing (run as root: apt-get install$missing)" >&2
  exit 0
fi
apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
