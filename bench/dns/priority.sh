# Sourced by bench/dns/run and bench/dns/profile: the machine is shared with other work, which
# would take a few percent of the pinned server's core and leave the server short of it. This
# gives the benchmark's processes (the calling shell and everything it starts) the largest
# share of CPU time the scheduler knows: a cpu cgroup (v1) with the highest weight, and the
# lowest autogroup nice value. priority_restore puts both back. PRIORITY= (empty) does neither.
priority=${PRIORITY--20}
priority_cgroup=
priority_old_nice=
priority_raise() {
  [ -n "$priority" ] || return 0
  local cpu=/sys/fs/cgroup/cpu
  if [ -w "$cpu/cgroup.procs" ] && [ -f "$cpu/cpu.shares" ]; then
    priority_cgroup=$cpu/endpointd-dns-bench.$BASHPID
    if mkdir "$priority_cgroup" 2>/dev/null && echo 262144 >"$priority_cgroup/cpu.shares" &&
      echo "$BASHPID" >"$priority_cgroup/cgroup.procs"; then
      :
    else
      rmdir "$priority_cgroup" 2>/dev/null || true
      priority_cgroup=
    fi
  fi
  if [ -w /proc/$BASHPID/autogroup ]; then
    priority_old_nice=$(awk '{print $NF}' /proc/$BASHPID/autogroup)
    echo "$priority" >/proc/$BASHPID/autogroup 2>/dev/null || priority_old_nice=
  fi
}
priority_restore() {
  if [ -n "$priority_cgroup" ]; then
    echo "$BASHPID" >/sys/fs/cgroup/cpu/cgroup.procs 2>/dev/null || true
    rmdir "$priority_cgroup" 2>/dev/null || true
    priority_cgroup=
  fi
  if [ -n "$priority_old_nice" ]; then
    echo "$priority_old_nice" >/proc/$BASHPID/autogroup 2>/dev/null || true
    priority_old_nice=
  fi
}
# What the results say about it.
priority_note() {
  if [ -n "$priority_cgroup" ]; then
    echo "Server and clients ran in a cpu cgroup of the highest weight (cpu.shares 262144) and at"
    echo "autogroup nice $priority, so that the other work on the machine does not take their cores."
  elif [ -n "$priority_old_nice" ]; then
    echo "Server and clients ran at autogroup nice $priority, so that the other work on the machine"
    echo "takes less of their cores."
  fi
}
