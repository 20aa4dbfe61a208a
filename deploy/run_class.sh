#!/usr/bin/env bash
# Serve a class with several Streamlit processes behind HAProxy (deploy/haproxy.cfg).
#
# Starts one `streamlit run app` per `server` line of deploy/haproxy.cfg (on 127.0.0.1 and
# the port that line names), waits until each answers /_stcore/health, then runs HAProxy in
# the foreground and prints the address. Ctrl-C (or any process exiting) stops all of them.
#
# Usage (from anywhere, with the project's venv active):
#   deploy/run_class.sh                               # http://127.0.0.1:8600
#   PAGED_LAB_PROXY_BIND=0.0.0.0:8600 deploy/run_class.sh   # the class's machines too
# PAGED_LAB_* settings (app/hosting.py) are passed on to every Streamlit process.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
cfg="$here/haproxy.cfg"
export PAGED_LAB_PROXY_BIND="${PAGED_LAB_PROXY_BIND:-127.0.0.1:8600}"
export PAGED_LAB_STATS_BIND="${PAGED_LAB_STATS_BIND:-127.0.0.1:8404}"
# two glibc heaps per process, from its start: a class's memory comes back when it leaves
# (app/process_memory.py limit_heap_arenas; docs/hosting.md "A class of 100")
export MALLOC_ARENA_MAX="${MALLOC_ARENA_MAX:-2}"

command -v haproxy >/dev/null || { echo "haproxy not found: apt-get install haproxy" >&2; exit 1; }
command -v streamlit >/dev/null || { echo "streamlit not found: activate the venv" >&2; exit 1; }
haproxy -c -q -f "$cfg"

# the backend ports, from lines like "server st1 127.0.0.1:8601 cookie st1"
ports=$(sed -nE 's/^[[:space:]]*server[[:space:]]+[^[:space:]]+[[:space:]]+127\.0\.0\.1:([0-9]+).*/\1/p' "$cfg")
[ -n "$ports" ] || { echo "no 'server ... 127.0.0.1:PORT' lines in $cfg" >&2; exit 1; }

pids=()
cleanup() {
    trap - EXIT INT TERM
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM        # exit runs the EXIT trap

cd "$root"
for port in $ports; do
    streamlit run app --server.port "$port" --server.headless true \
        --server.address 127.0.0.1 --server.fileWatcherType none &
    pids+=("$!")
done
for port in $ports; do          # each process loads the model before it is healthy
    for _ in $(seq 120); do
        curl -fs -o /dev/null "http://127.0.0.1:$port/_stcore/health" && break
        sleep 1
    done
    curl -fsS -o /dev/null "http://127.0.0.1:$port/_stcore/health" ||
        { echo "streamlit on port $port did not become healthy" >&2; exit 1; }
done

# each process's first session pays for its imports, the model and the first figures (~4 s
# of CPU): one session per process does that now, before the class (deploy/warm_up.py)
python "$here/warm_up.py" $(for port in $ports; do echo "http://127.0.0.1:$port"; done)

haproxy -db -f "$cfg" &         # -db: stay in the foreground, under this script
pids+=("$!")
echo "PagedAttention Lab: http://$PAGED_LAB_PROXY_BIND ($(echo $ports | wc -w) processes;" \
     "status page http://$PAGED_LAB_STATS_BIND). Ctrl-C stops all."
wait -n                         # one process ended: stop the others
echo "a process exited; stopping all" >&2
exit 1
