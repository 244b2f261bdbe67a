# Shared by the *-venv.sh scripts and deploy-check.sh (sourced, not run): a Python venv pinned
# by a requirements file, made once per machine and reused. Every failure says what is
# missing and exits non-zero.
#
#   ensure_venv NAME REQUIREMENTS OUT_DIR MIN_PYTHON_MINOR SMOKE_IMPORTS
#
# NAME prefixes messages; the venv is reached as OUT_DIR/venv; MIN_PYTHON_MINOR is the
# least 3.x; SMOKE_IMPORTS a Python import statement that must succeed once installed.
# Sets PY_BIN. PYTHON= picks the interpreter that makes the venv (default python3).
#
# The venv itself lives in A2A_VENV_CACHE (default ~/.cache/a2a-gateway/venvs), named after
# NAME and the sha256 of the requirements, and OUT_DIR/venv links to it: a fresh clone on a
# machine that has run the tests before links it in at once, rather than spending minutes
# (LiteLLM's proxy alone is 800 MB) installing what it already has. A venv is complete
# only once its stamp is written; concurrent runs are serialised with flock.
ensure_venv() {
    local name=$1 req=$2 out=$3 minor=$4 smoke=$5
    local base_py="${PYTHON:-python3}"
    local cache="${A2A_VENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/a2a-gateway/venvs}"
    die() { echo "$name: ERROR: $*" >&2; exit 1; }
    [ -f "$req" ] || die "missing $req"
    command -v "$base_py" >/dev/null || die "'$base_py' not found (set PYTHON=... to a python >= 3.$minor)"
    command -v flock >/dev/null || die "'flock' not found (util-linux)"
    mkdir -p "$out" "$cache" || die "cannot create $out or $cache"
    local want
    want="$(sha256sum "$req" | cut -d' ' -f1)"
    local venv="$cache/$name-${want:0:16}"
    local stamp="$venv/.requirements.sha256"
    # Serialise concurrent runs (two test jobs, or two clones, starting at once).
    exec 9>"$cache/.$name.lock"
    flock 9
    if ! { [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; }; then
        "$base_py" -c "import sys; sys.exit(sys.version_info < (3, $minor))" \
            || die "needs python >= 3.$minor; '$base_py' is $("$base_py" --version 2>&1)"
        echo "$name: creating $venv" >&2
        rm -rf "$venv"
        "$base_py" -m venv "$venv" \
            || die "'$base_py -m venv' failed (on Debian/Ubuntu: apt-get install python3-venv)"
        echo "$name: installing $req" >&2
        "$venv/bin/python" -m pip install --disable-pip-version-check --no-input -q -r "$req" \
            || die "pip install -r $req failed"
        "$venv/bin/python" -m pip check --disable-pip-version-check >&2 \
            || die "installed packages are inconsistent (pip check)"
        "$venv/bin/python" -c "$smoke" || die "import smoke test failed: $smoke"
        echo "$want" >"$stamp.tmp" && mv "$stamp.tmp" "$stamp"
    fi
    # A venv made in place by an earlier version of this script is replaced by the link.
    if [ "$(readlink "$out/venv" 2>/dev/null)" != "$venv" ]; then
        rm -rf "$out/venv" && ln -s "$venv" "$out/venv" || die "cannot link $out/venv to $venv"
    fi
    PY_BIN="$out/venv/bin/python"
    exec 9>&-   # the venv is ready: release the lock
}
