#!/usr/bin/env bash
# Build (or reuse) the development environment of this clone and print its virtualenv's path.
#
#   bash scripts/bootstrap.sh [--redis]
#
# Idempotent and fast on reuse. Progress goes to stderr, and only for a step that installs or
# builds something (a reuse prints nothing; errors always show); stdout carries only the venv path,
# so callers do `venv=$(bash scripts/bootstrap.sh)`. Two environments, both OUTSIDE the clone:
#   1. the base, $DEMB_HOME/base-<lock hash> (a hash of requirements/*.txt and the Python version):
#      every pin of requirements/lock.txt with `pip install --no-deps` (torch from the local CPU
#      wheel; nothing is ever resolved, so no CUDA torch and no CUDA fbgemm-gpu can sneak in).
#      Installed once per lock and shared by every clone; nothing clone-specific goes into it;
#   2. this clone's virtualenv, $DEMB_HOME/venv-<lock hash>-<hash of the clone's path>: under 1 MB
#      that see the base's packages through a .pth file (scripts/layout.py link_base) and hold only
#      this clone's editable installs, so two clones (worktrees, checkouts of other branches) each
#      import their own sources and plugins, and neither's `./dev` touches the other's;
#   3. the core and every plugin under plugins/ (a folder with a pyproject.toml), editable into
#      that virtualenv, with --no-deps --no-build-isolation; redone when a pyproject.toml or the
#      set of plugins changes, after removing editable installs of plugins since removed;
#   4. `python -m dynamicemb_core build --quiet` (compiles csrc/ ahead of time when the cache,
#      $DYNAMICEMB_CACHE_DIR, has no build for these sources and this torch);
#   5. with --redis: scripts/install_redis.sh (the redis-server binary from apt when it is
#      missing; nothing is started: the tests start their own server on a free port).
# Virtualenvs of clones whose folder is gone are removed on the way (scripts/layout.py prune_venvs).
# Environment: DEMB_HOME (where environments live; default $XDG_CACHE_HOME/dynamicemb-core, else
# ~/.cache/dynamicemb-core), DYNAMICEMB_CACHE_DIR (the C++ build cache; default
# $XDG_CACHE_HOME/dynamicemb_core, else ~/.cache/dynamicemb_core), DEMB_PYTHON (interpreter to build
# the environments from; default python3.11), DEMB_ALLOW_TORCH_DOWNLOAD=1 (accept a torch wheel
# that is not on local disk).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
log() { printf '[bootstrap] %s\n' "$*" >&2; }
die() { printf '[bootstrap] error: %s\n' "$*" >&2; exit 1; }

want_redis=0
for arg in "$@"; do
  case "$arg" in
    --redis) want_redis=1 ;;
    *) die "unknown argument '$arg' (expected: --redis)" ;;
  esac
done

# --- the interpreter ------------------------------------------------------------------------------
python="${DEMB_PYTHON:-}"
if [[ -z "$python" ]]; then
  if command -v python3.11 >/dev/null 2>&1; then python=python3.11; else python=python3; fi
fi
command -v "$python" >/dev/null 2>&1 || die "no Python interpreter '$python' (set DEMB_PYTHON)"
py_version="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
# The lock's binary wheels (torch 2.13.0+cpu from local disk among them) are built for CPython 3.11.
[[ "$py_version" == "3.11" ]] || die "requirements/lock.txt is for Python 3.11, '$python' is $py_version (set DEMB_PYTHON)"

layout=("$python" "$repo/scripts/layout.py")
base="$("${layout[@]}" base-dir)"
venv="$("${layout[@]}" venv-dir)"
mkdir -p "$(dirname "$venv")"

# --- 1: the base environment (the lock's packages, shared by every clone) -------------------------
if [[ ! -f "$base/.demb-lock-installed" ]]; then
  # One installer at a time per base (two clones, or demo and test started together).
  exec 8>"$base.lock"
  flock 8
  if [[ ! -f "$base/.demb-lock-installed" ]]; then
    start=$SECONDS
    bpy="$base/bin/python"
    bpip=("$bpy" -m pip --disable-pip-version-check)
    if ! "$bpy" -c '' >/dev/null 2>&1; then
      log "creating $base (the lock's packages, shared by every clone)"
      "$python" -m venv --clear "$base"
    fi
    # Ask pip, without installing, which torch file it would take: the local CPU wheel, or refuse.
    url="$("$bpy" "$repo/scripts/layout.py" check-torch "$bpy")" || die "refusing to download torch"
    log "torch comes from $url"
    log "installing requirements/lock.txt (--no-deps, every version pinned)"
    # (This machine kind's pip config names index folders that do not all exist; pip warns once per
    # package about them. Those lines are dropped, everything else pip says is kept.)
    "${bpip[@]}" install --quiet --no-deps -r "$repo/requirements/lock.txt" \
      2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
    "$bpy" -c 'import torch, fbgemm_gpu, torchrec' \
      || die "the pinned torch / fbgemm-gpu-cpu / torchrec set does not import"
    touch "$base/.demb-lock-installed"
    log "pinned environment ready in $((SECONDS - start)) s"
  fi
  exec 8>&-
fi

# --- 2: this clone's virtualenv, seeing the base --------------------------------------------------
# One bootstrap at a time per clone (demo and test started together).
exec 9>"$venv.lock"
flock 9
vpy="$venv/bin/python"
pip=("$vpy" -m pip --disable-pip-version-check)
if [[ "$(cat "$venv/.demb-base" 2>/dev/null || true)" != "$base" ]] || ! "$vpy" -c '' 2>/dev/null; then
  "${layout[@]}" prune-venvs
  log "creating $venv (this clone's editable installs; its packages come from $base)"
  "$python" -m venv --clear --without-pip "$venv"
  "${layout[@]}" link-base "$venv" "$base"
  echo "$repo" >"$venv/.demb-clone"
  echo "$base" >"$venv/.demb-base"
fi

# --- 3: the core and the plugins, editable --------------------------------------------------------
mapfile -t plugins < <("$vpy" "$repo/scripts/layout.py" plugins)
editable_key="$("$vpy" "$repo/scripts/layout.py" editable-key)"
if [[ "$(cat "$venv/.demb-editables" 2>/dev/null || true)" != "$editable_key" ]]; then
  start=$SECONDS
  # Editable installs of a plugin folder since removed (or of another path) would shadow ours.
  mapfile -t stale < <("$vpy" - "$repo" <<'EOF'
import json, subprocess, sys
from pathlib import Path
repo = Path(sys.argv[1]).resolve()
rows = json.loads(subprocess.check_output(
    [sys.executable, "-m", "pip", "list", "--editable", "--format=json", "--disable-pip-version-check"]))
for row in rows:
    location = Path(row.get("editable_project_location") or "/").resolve()
    outside = location != repo and repo not in location.parents
    if outside or not (location / "pyproject.toml").is_file():
        print(row["name"])
EOF
  )
  if ((${#stale[@]})); then
    log "removing stale editable installs: ${stale[*]}"
    "${pip[@]}" uninstall --quiet --yes "${stale[@]}"
  fi
  editables=()
  for dir in "$repo" "${plugins[@]}"; do editables+=(-e "$dir"); done
  log "installing editable (--no-deps --no-build-isolation): core${plugins[*]:+ + ${#plugins[@]} plugin(s)}"
  # -qq: setuptools warns about flat layouts on every editable build; errors still show.
  # DYNAMICEMB_WHEEL_OPS=0: an editable install bundles no ops library (setup.py).
  DYNAMICEMB_WHEEL_OPS=0 "${pip[@]}" install -qq --no-deps --no-build-isolation "${editables[@]}"
  echo "$editable_key" >"$venv/.demb-editables"
  log "editable installs done in $((SECONDS - start)) s"
fi

# --- 4: the C++ extension, ahead of time ----------------------------------------------------------
# --quiet: silent when the library is already in the cache; when it compiles, it says so and how long.
"$vpy" -m dynamicemb_core build --quiet >&2 || die "python -m dynamicemb_core build failed"

# --- 5: redis-server (the binary only) ------------------------------------------------------------
if ((want_redis)); then
  bash "$repo/scripts/install_redis.sh"
fi

echo "$venv"
