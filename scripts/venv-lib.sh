# Shared by interop-venv.sh and deploy-check.sh (sourced, not run): a Python venv pinned by a
# requirements file, made once and reused. A stamp holding the sha256 of the requirements
# makes a repeat run a no-op; concurrent runs are serialised with flock. Every failure says
# what is missing and exits non-zero.
#
#   ensure_venv NAME REQUIREMENTS OUT_DIR MIN_PYTHON_MINOR SMOKE_IMPORTS
#
# NAME prefixes messages; the venv is OUT_DIR/venv; MIN_PYTHON_MINOR is the least 3.x;
# SMOKE_IMPORTS a Python import statement that must succeed once installed. Sets PY_BIN.
# PYTHON= picks the interpreter that makes the venv (default python3).
ensure_venv() {
    local name=$1 req=$2 out=$3 minor=$4 smoke=$5
    local venv="$out/venv" base_py="${PYTHON:-python3}"
    local stamp="$venv/.requirements.sha256"
    PY_BIN="$venv/bin/python"
    die() { echo "$name: ERROR: $*" >&2; exit 1; }
    [ -f "$req" ] || die "missing $req"
    command -v "$base_py" >/dev/null || die "'$base_py' not found (set PYTHON=... to a python >= 3.$minor)"
    command -v flock >/dev/null || die "'flock' not found (util-linux)"
    mkdir -p "$out"
    # Serialise concurrent runs (e.g. two test jobs starting at once).
    exec 9>"$out/.venv.lock"
    flock 9
    local want
    want="$(sha256sum "$req" | cut -d' ' -f1)"
    if ! { [ -x "$PY_BIN" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; }; then
        "$base_py" -c "import sys; sys.exit(sys.version_info < (3, $minor))" \
            || die "needs python >= 3.$minor; '$base_py' is $("$base_py" --version 2>&1)"
        echo "$name: creating $venv" >&2
        rm -rf "$venv"
        "$base_py" -m venv "$venv" \
            || die "'$base_py -m venv' failed (on Debian/Ubuntu: apt-get install python3-venv)"
        echo "$name: installing $req" >&2
        "$PY_BIN" -m pip install --disable-pip-version-check --no-input -q -r "$req" \
            || die "pip install -r $req failed"
        "$PY_BIN" -m pip check --disable-pip-version-check >&2 \
            || die "installed packages are inconsistent (pip check)"
        "$PY_BIN" -c "$smoke" || die "import smoke test failed: $smoke"
        echo "$want" >"$stamp.tmp" && mv "$stamp.tmp" "$stamp"
    fi
    exec 9>&-   # the venv is ready: release the lock
}
