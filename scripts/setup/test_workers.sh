# Sourced by scripts/test.sh and scripts/setup/test_current_stack.sh with pytest's arguments: sets WORKERS to
# pytest-xdist's (a worker per CPU this shell may use, at most 4; each test file on one worker, the *_ray.py files
# on the same one). None where the arguments choose (-n, -p no:xdist), debug (--pdb, --trace, -s), only collect, or
# DITTO_FAST_TEST_WORKERS=0 / one CPU. With workers, torch's OpenMP threads sleep when idle instead of spinning on
# the cores the other workers need (their number, and so a CPU render's bytes, stay as they are).
WORKERS=()
_test_workers() {
    local a n=${DITTO_FAST_TEST_WORKERS:-}
    for a in "$@"; do
        case "$a" in
            -n|-n*|--numprocesses|--numprocesses=*|no:xdist|-pno:xdist|--pdb|--trace|-s|--capture=no|--co|--collect-only)
                return 0 ;;
        esac
    done
    if [ -z "$n" ]; then n=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc); [ "$n" -gt 4 ] && n=4; fi
    [ "$n" -le 1 ] && return 0
    WORKERS=(-n "$n" --dist loadfile)
    export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
}
_test_workers "$@"
