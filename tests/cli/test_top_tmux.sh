#!/usr/bin/env bash
# ferry top in a real terminal (tmux): while a writer streams O_DIRECT writes to the disk under
# FERRY_TEST_TMPDIR, the screen must show that disk's row with a nonzero write rate.
# Usage: test_top_tmux.sh FERRY_BINARY
set -u
ferry=$1
tmp=${FERRY_TEST_TMPDIR:-/tmp}/top-tmux-$$
command -v tmux >/dev/null || { echo "skipped: tmux is not installed"; exit 77; }
mkdir -p "$tmp"
session=ferry-top-test-$$
writer=
cleanup() {
	tmux kill-session -t "$session" 2>/dev/null
	[ -n "$writer" ] && kill "$writer" 2>/dev/null && wait "$writer" 2>/dev/null
	rm -rf "$tmp"
}
trap cleanup EXIT

# The whole disk under the scratch directory, as diskstats names it.
dev=$(stat -c '%d' "$tmp")
maj=$(( (dev >> 8) & 0xfff )); min=$(( (dev & 0xff) | ((dev >> 12) & 0xfff00) ))
sysdev=$(readlink -f "/sys/dev/block/$maj:$min" 2>/dev/null)
if [ -z "$sysdev" ] || [ ! -e "$sysdev" ]; then
	echo "skipped: $tmp is not on a block device ($maj:$min), so no diskstats row can move"
	exit 77
fi
[ -e "$sysdev/partition" ] && sysdev=$(dirname "$sysdev")
disk=$(basename "$sysdev")

# The writer beside it: ferry bench, O_DIRECT so that the bytes reach the device during the test,
# bounded to 20 s.
"$ferry" bench --filename "$tmp/load" --size 32m --rw write --bs 1m --direct 1 --runtime 20 \
	--output "$tmp/bench.out" 2>"$tmp/bench.err" &
writer=$!

tmux new-session -d -s "$session" -x 150 -y 50 "$ferry top -i 0.5; sleep 30" ||
	{ echo "FAIL: tmux new-session (TERM=${TERM:-unset})"; exit 1; }
ok=0
screen=
for _ in $(seq 1 30); do
	sleep 0.5
	screen=$(tmux capture-pane -p -t "$session" 2>&1) || { echo "capture-pane: $screen"; break; }
	# DEVICE rMB/s wMB/s r/s w/s ...: the disk's write rate column must be above zero.
	w=$(printf '%s\n' "$screen" | awk -v d="$disk" '$1 == d { print $3; exit }')
	# and the benchmark's own row (it publishes its counters): PID NAME PATH rMB/s wMB/s ...
	fw=$(printf '%s\n' "$screen" | awk -v p="$writer" '$1 == p { print $5; exit }')
	if [ -n "$w" ] && awk -v w="$w" 'BEGIN { exit !(w > 0) }' && [ -n "$fw" ] &&
		awk -v w="$fw" 'BEGIN { exit !(w > 0) }'; then
		ok=1
		break
	fi
done
fail=0
if [ $ok -ne 1 ]; then
	echo "FAIL: no nonzero wMB/s for $disk and for ferry bench (pid $writer) on the screen (bench: $(cat "$tmp/bench.err" 2>/dev/null)); last screen:"
	printf '%s\n' "$screen"
	fail=1
fi
# the interval shown is the one measured between samples (0.5 s asked, a little more on a busy machine)
for want in "DEVICE" "CPU  busy" "interval 0\.[5-9][0-9]s" "FERRY"; do
	if ! printf '%s\n' "$screen" | grep -q "$want"; then
		echo "FAIL: screen lacks '$want'; the screen:"
		printf '%s\n' "$screen"
		fail=1
	fi
done
[ $fail -eq 0 ] && echo "top showed $disk writing at $w MB/s and ferry bench (pid $writer) at $fw MB/s"
exit $fail
