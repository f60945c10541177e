# Shared by netns-ring.sh and netns-nat.sh (sourced, not run): removing namespaces, waiting
# for the bootstrap's address, waiting for the peers. Each function names the calling
# script in its messages ($0).

# netns_remove BRIDGE NS…: kills every process in the namespaces, deletes them and the
# bridge; missing ones are skipped.
netns_remove() {
    local bridge=$1 n
    shift
    for n in "$@"; do
        ip netns pids "$n" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
        ip netns del "$n" 2>/dev/null || true
    done
    ip link del "$bridge" 2>/dev/null || true
}

# bootstrap_address OUT: prints the address peer 0 wrote to OUT/boot.addr, waiting up to
# 10 s; exits the script if it never comes.
bootstrap_address() {
    local out=$1
    for _ in $(seq 100); do [ -s "$out/boot.addr" ] && break; sleep 0.1; done
    [ -s "$out/boot.addr" ] || {
        echo "$(basename "$0"): peer 0 wrote no bootstrap address; see $out/peer-0.log" >&2
        exit 1
    }
    cat "$out/boot.addr"
}

# wait_peers OUT PID…: waits for the peers (PID number r is peer r; an empty one is skipped:
# a peer that was meant to end); returns 1 if any failed, naming its log.
wait_peers() {
    local out=$1 status=0 r=0 pid
    shift
    for pid in "$@"; do
        if [ -n "$pid" ] && ! wait "$pid"; then
            echo "$(basename "$0"): peer $r failed; see $out/peer-$r.log" >&2
            status=1
        fi
        r=$((r + 1))
    done
    return $status
}

# summary_line OUT: peer 0's summary line, without colours.
summary_line() {
    grep -hE "epochs? in" "$1/peer-0.log" | sed 's/\x1b\[[0-9;]*m//g' | tail -1 || true
}
