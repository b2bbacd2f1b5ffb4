# Shared by the benchmarks (sourced): what a process's BPF programs and the process itself cost.

# bpf_programs PID: "id name run_time_ns run_cnt", a line per BPF program process PID holds open (from its fds:
# bpftool's own pid lookup is not available on every build)
bpf_programs() {
    local ids
    ids=$(awk '/^prog_id:/ { print $2 }' /proc/"$1"/fdinfo/* 2>/dev/null | sort -un | jq -sc .)
    bpftool -j prog show 2>/dev/null |
        jq -r --argjson ids "${ids:-[]}" '.[] | select(.id as $i | $ids | index($i)) |
            "\(.id) \(.name) \(.run_time_ns // 0) \(.run_cnt // 0)"'
}

# cpu_ticks PID: user + system clock ticks of a process so far
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }
