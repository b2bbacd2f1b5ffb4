# Shared by the benchmarks (sourced): what a process's BPF programs and the process itself cost, and the
# collectors' command lines (collector_command reads the globals myprobe, pid and traced).

# bpf_programs PID: "id name run_time_ns run_cnt", a line per BPF program process PID holds open (from its fds:
# bpftool's own pid lookup is not available on every build)
bpf_programs() {
    local ids
    ids=$(awk '/^prog_id:/ { print $2 }' /proc/"$1"/fdinfo/* 2>/dev/null | sort -un | jq -sc .)
    bpftool -j prog show 2>/dev/null |
        jq -r --argjson ids "${ids:-[]}" '.[] | select(.id as $i | $ids | index($i)) |
            "\(.id) \(.name) \(.run_time_ns // 0) \(.run_cnt // 0)"'
}

# questions DIR: the statements the server of scripts/testdb's DIR has run so far (its status' Questions)
questions() { scripts/testdb sql "$1" "SHOW GLOBAL STATUS LIKE 'Questions'" -N -B | awk '{ print $2 }'; }

# cpu_ticks PID: user + system clock ticks of a process so far
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }

# median [VALUE...]: median of the numeric arguments, "n/a" if none
median() {
    printf '%s\n' "$@" | awk '/^-?[0-9.]+$/ { v[n++] = $1 }
        END {
            if (n == 0) { print "n/a"; exit }
            for (i = 1; i < n; i++) for (j = i; j > 0 && v[j - 1] > v[j]; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
            m = (n % 2) ? v[(n - 1) / 2] : (v[n / 2 - 1] + v[n / 2]) / 2
            printf "%.2f\n", m
        }'
}

# collector_command COLLECTOR OUTFILE: sets cmd (the myprobe command line) and cmd_stdout
collector_command() {
    local c o=$2 options
    read -r c options <<<"$1"
    read -ra options <<<"${options:-}"
    cmd_stdout=/dev/null
    case $c in
        queries) cmd=("$myprobe" queries -p "$pid" -d "$traced" --json) ;;
        # 'trace FUNC': every call timed; the rate guard is off, the cost is what is measured.
        trace) cmd=("$myprobe" trace -p "$pid" -d "$traced" --max-rate 0) ;;
        # Every collector at once, and the page written.
        report) cmd=("$myprobe" report -p "$pid" -d "$traced" -o "${o%.folded}.html") ;;
        # Always on: stopped by a signal after the run (SIGINT in overhead, SIGTERM in alternate); windows of 10 s,
        # six times the default's work of writing windows, so that it is in the figures.
        agent) cmd=("$myprobe" agent -p "$pid" --listen 127.0.0.1:19369 --window 10s --dir "${o%.folded}-windows") ;;
        # The same for every server of the host (bench/alternate's BENCH_EXTRA_SERVERS adds idle ones).
        agent-all) cmd=("$myprobe" agent --listen 127.0.0.1:19369 --window 10s --dir "${o%.folded}-windows") ;;
        # No collector: a process that sleeps, what the method measures when nothing traces.
        null) cmd=(sleep "$traced") ;;
        # The kernel's own sampler at the agent's rate, no BPF: what any sampling profiler costs the load.
        perf) cmd=(perf record -F 19 -a -g -o "${o%.folded}.perf.data" -- sleep "$traced") ;;
        *) cmd=("$myprobe" profile "$c" -p "$pid" -d "$traced" -o "$o") ;; # cpu offcpu alloc memleak locks ...
    esac
    cmd+=("${options[@]}")
}

# bpf_snapshot PID: "run_time_ns run_cnt" summed over the BPF programs process PID holds
bpf_snapshot() {
    bpf_programs "$1" | awk '{ t += $3; n += $4 } END { printf "%.0f %.0f\n", t, n }'
}

# kernel_mem_mib PID: the kernel memory of the BPF maps process PID holds open (their fdinfo's memlock), MiB; each
# map once, however many descriptors it holds of it (the unwind tables, shared by its collectors)
kernel_mem_mib() {
    awk '/^map_type:/ { map = 1 } /^memlock:/ && map { m = $2 } /^map_id:/ && map { by_id[$2] = m; map = 0 }
        END { for (id in by_id) t += by_id[id]; printf "%.1f\n", t / 1048576 }' \
        /proc/"$1"/fdinfo/* 2>/dev/null || echo n/a
}

# measure_tracing PID SECONDS OUT: while myprobe (PID) traces, the in-kernel cost of its programs and its own
# CPU over SECONDS, its peak RSS and its maps' kernel memory; writes "ns_per_run runs_per_s bpf_cpu_pct
# myprobe_cpu_pct rss_mib kernel_mib" to OUT, and each program's "name ns_per_run runs_per_s" to OUT with
# .programs for .cost
measure_tracing() {
    local p=$1 window=$2 out=$3 t0 t1 c0 c1 hz before after
    hz=$(getconf CLK_TCK)
    # PID is timeout's: myprobe is its child.
    p=$(pgrep -n -P "$p" || echo "$p")
    before=$(bpf_programs "$p")
    read -r t0 n0 < <(bpf_snapshot "$p")
    c0=$(cpu_ticks "$p")
    sleep "$window"
    after=$(bpf_programs "$p")
    read -r t1 n1 < <(bpf_snapshot "$p")
    c1=$(cpu_ticks "$p")
    awk -v w="$window" 'NR == FNR { t[$1] = $3; n[$1] = $4; next }
        { dn = $4 - n[$1]; printf "%s %s %.0f\n", $2, (dn > 0 ? sprintf("%.0f", ($3 - t[$1]) / dn) : "n/a"), dn / w }' \
        <(printf '%s\n' "$before") <(printf '%s\n' "$after") >"${out%.cost}.programs"
    rss=$(awk '/^VmHWM:/ { printf "%.1f", $2 / 1024 }' "/proc/$p/status" 2>/dev/null || echo n/a)
    kmem=$(kernel_mem_mib "$p")
    awk -v t="$((t1 - t0))" -v n="$((n1 - n0))" -v c="$((c1 - c0))" -v hz="$hz" -v w="$window" -v rss="$rss" \
        -v kmem="$kmem" 'BEGIN { printf "%s %.0f %.3f %.2f %s %s\n", (n > 0 ? sprintf("%.0f", t / n) : "n/a"), n / w,
                 t / w / 1e7, c * 100 / hz / w, rss, kmem }' >"$out"
}

# Where each side runs: BENCH_SERVER_CPUS, BENCH_LOAD_CPUS, BENCH_TRACER_CPUS, and bench/alternate's twin server
# with its load, BENCH_TWIN_CPUS (taskset's CPU lists; unset, the scheduler places it, and there is no twin).
# pinning checks them and sets load_on, tracer_on and twin_on, the prefixes of sysbench's, the collector's and the
# twin's command lines; pin_server PID [CPUS] moves every thread of a server, and so those it makes later, to CPUS
# (BENCH_SERVER_CPUS unless given).
pinning() {
    local v
    for v in BENCH_SERVER_CPUS BENCH_LOAD_CPUS BENCH_TRACER_CPUS BENCH_TWIN_CPUS; do
        [[ -z ${!v:-} ]] || taskset -c "${!v}" true 2>/dev/null ||
            { echo "$v must be a list of this machine's CPUs, as taskset -c takes it (got '${!v}')" >&2; exit 2; }
    done
    load_on=() tracer_on=() twin_on=()
    [[ -z ${BENCH_LOAD_CPUS:-} ]] || load_on=(taskset -c "$BENCH_LOAD_CPUS")
    [[ -z ${BENCH_TRACER_CPUS:-} ]] || tracer_on=(taskset -c "$BENCH_TRACER_CPUS")
    [[ -z ${BENCH_TWIN_CPUS:-} ]] || twin_on=(taskset -c "$BENCH_TWIN_CPUS")
}
pin_server() {
    local cpus=${2:-${BENCH_SERVER_CPUS:-}}
    [[ -z $cpus ]] || taskset -a -p -c "$cpus" "$1" >/dev/null
}
