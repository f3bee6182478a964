# Sourced by the device scripts that run an earlier tree against this one (device_before_after.sh,
# device_tp_serve.sh): use_tree DIR reinstalls the packages of the tree at DIR, core and plugins,
# editable and without an index, having removed every minisgl distribution first (two trees may
# ship different plugin sets).
use_tree() {
  local tree=$1 pkgs=(-e .)
  python3 -m pip list --format=freeze 2>/dev/null | grep -i '^minisgl' | cut -d= -f1 |
    xargs -r python3 -m pip uninstall -q -y >/dev/null 2>&1
  for d in "$tree"/plugins/*/*/; do [ -f "$d/pyproject.toml" ] && pkgs+=(-e "${d#"$tree"/}"); done
  (cd "$tree" && python3 -m pip install -q --no-index --no-deps --no-build-isolation "${pkgs[@]}")
}
