#!/bin/sh
# Two "hosts" on this machine for the multi-host tests of `mpirun --hostfile` (tests/dist/train_dist_test.cc):
# two network namespaces joined by a veth pair, 192.0.2.1 and 192.0.2.2 (TEST-NET-1, RFC 5737: addresses
# that exist only inside these namespaces and route nowhere), each with its own loopback. Their ranks share
# nothing but that link (and the file system, as hosts share an NFS --out).
#
#   netns_hosts.sh up DIR     makes them and writes, in DIR:
#                             hostfile   "192.0.2.1 slots=1" and "192.0.2.2 slots=1"
#                             agent      an rsh agent for mpirun (--mca plm_rsh_agent): where ssh would log
#                                        into HOST and run the command in its shell, it runs the command in
#                                        HOST's namespace, and appends "HOST" to DIR/agent.log
#                             names      the two namespaces' names, for `ip netns exec` and `down`
#   netns_hosts.sh down DIR   deletes them (their veth pair goes with them)
#
# Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2; exits non-zero with a message otherwise.
set -eu
cmd=${1:-}; dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 up|down DIR" >&2; exit 2; }
if [ "$cmd" = down ]; then
  [ -f "$dir/names" ] || exit 0
  for ns in $(cat "$dir/names"); do ip netns del "$ns" 2>/dev/null || true; done
  rm -f "$dir/names"
  exit 0
fi
[ "$cmd" = up ] || { echo "usage: $0 up|down DIR" >&2; exit 2; }
command -v ip >/dev/null || { echo "netns_hosts: needs iproute2's ip" >&2; exit 1; }
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
# Names unique on the machine (interface names at most 15 characters).
a="dc$$a"; b="dc$$b"
ip netns add "$a"
echo "$a" > "$dir/names"
ip netns add "$b"
echo "$a $b" > "$dir/names"
ip link add "v$a" type veth peer name "v$b"
ip link set "v$a" netns "$a"
ip link set "v$b" netns "$b"
ip -n "$a" addr add 192.0.2.1/24 dev "v$a"
ip -n "$b" addr add 192.0.2.2/24 dev "v$b"
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set "v$a" up
ip -n "$b" link set "v$b" up
printf '192.0.2.1 slots=1\n192.0.2.2 slots=1\n' > "$dir/hostfile"
cat > "$dir/agent" <<EOF
#!/bin/sh
# mpirun's rsh agent for the namespaces of $dir: \$1 the host, the rest the command a remote shell would run.
host=\$1; shift
case \$host in
  192.0.2.1) ns=$a ;;
  192.0.2.2) ns=$b ;;
  *) echo "agent: no test host \$host" >&2; exit 1 ;;
esac
echo "\$host" >> "$dir/agent.log"
exec ip netns exec "\$ns" /bin/sh -c "\$*"
EOF
chmod +x "$dir/agent"
