# Sourced by setup_env.sh and setup_current.sh: which Python the virtual environments are made with.
# The interpreter: $PYTHON, else the first of python3.12, python3.11, python3.10, python3 that runs and is
# 3.10-3.12 (mediapipe 0.10.21 has no wheel past 3.12); none: one line saying what to install.

# "X.Y" of interpreter $1 if it runs and is 3.10-3.12, else nothing (pyenv shims of absent versions fail here)
_py_in_range() {
    local v
    v=$("$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || return 1
    case "$v" in 3.10|3.11|3.12) echo "$v" ;; *) return 1 ;; esac
}

_find_python() {
    local cand v seen=""
    if [ -n "${PYTHON:-}" ]; then
        if _py_in_range "$PYTHON" >/dev/null; then echo "$PYTHON"; return 0; fi
        v=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || v="not runnable"
        echo "[setup] PYTHON=$PYTHON is $v; the set-up needs Python 3.10-3.12 (registration's mediapipe 0.10.21 has no wheel past 3.12): install python3.12 (e.g. apt-get install python3.12-venv, or pyenv install 3.12) and set PYTHON to it" >&2
        return 1
    fi
    for cand in python3.12 python3.11 python3.10 python3; do
        command -v "$cand" >/dev/null 2>&1 || continue
        if _py_in_range "$cand" >/dev/null; then echo "$cand"; return 0; fi
        v=$("$cand" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || continue
        seen="${seen:+$seen, }$cand is $v"
    done
    echo "[setup] no Python 3.10-3.12 found${seen:+ ($seen)}; the set-up needs one (registration's mediapipe 0.10.21 has no wheel past 3.12): install python3.12 (e.g. apt-get install python3.12-venv, or pyenv install 3.12) or set PYTHON=/path/to/python3.12" >&2
    return 1
}
