#!/usr/bin/env bash
# Every subcommand parses its options the same way (cli/opts.c): an unknown option, a missing
# value and a bad value each exit 2 with one line on stderr that names the option (and, for a bad
# value, what was expected), nothing on stdout; --help exits 0 with the options listed.
set -u
FERRY=${1:?usage: test_options.sh path/to/ferry}
T=$(mktemp -d "${FERRY_TEST_TMPDIR:-/tmp}/cli-options.XXXXXX")
trap 'rm -rf "$T"' EXIT
fail=0 n=0

# usage_error "SUBCOMMAND WORDS" "what stderr must hold" ARGS...
usage_error() {
	local sub=$1 want=$2; shift 2
	n=$((n + 1))
	# shellcheck disable=SC2086
	"$FERRY" $sub "$@" >"$T/out" 2>"$T/err"
	local rc=$? lines
	lines=$(wc -l <"$T/err")
	if [ $rc != 2 ] || [ "$lines" != 1 ] || [ -s "$T/out" ] || ! grep -qF -- "$want" "$T/err" ||
		! grep -qF -- "(see 'ferry $sub --help')" "$T/err"; then
		echo "FAILED: ferry $sub $*: exit $rc (want 2), $lines stderr lines (want 1) holding '$want':"
		sed 's/^/  | /' "$T/err" "$T/out"
		fail=1
	fi
}

# help "SUBCOMMAND WORDS" OPTION...: --help lists each OPTION
help() {
	local sub=$1; shift
	n=$((n + 1))
	# shellcheck disable=SC2086
	"$FERRY" $sub --help >"$T/out" 2>"$T/err"
	local rc=$? o
	for o in "$@"; do
		if [ $rc != 0 ] || ! grep -qE -- "^  (-., )? *$o\b" "$T/out"; then
			echo "FAILED: ferry $sub --help: exit $rc (want 0), option $o listed:"
			sed 's/^/  | /' "$T/out" "$T/err"
			fail=1
			return
		fi
	done
}

usage_error bench "unknown option '--bogus'" --filename x --bogus=1
usage_error bench "--iodepth expects a whole number from 1 to 65536; got '0'" --filename x --iodepth 0
usage_error bench "--iodepth needs a value" --filename x --iodepth
usage_error bench "-x expects a transfer mode" --filename x -x 9
help bench --filename --iodepth --cold "--output-format" "-x, --xfer"

usage_error "ckpt bench" "unknown option '--bogus'" --bogus
usage_error "ckpt bench" "--loads expects a whole number from 1" --loads 0
usage_error "ckpt bench" "--size expects a size above zero" --size=lots
usage_error "ckpt bench" "--dir needs a value (DIR)" --dir
help "ckpt bench" --dir --size --device --host --cold --loads --keep --json --save-only --saves --phases

usage_error "ckpt inspect" "unknown option '--bogus'" x.safetensors --bogus
usage_error "ckpt inspect" "--json expects 0 or 1" x.safetensors --json=yes
usage_error "ckpt inspect" "no PATH given"
usage_error "ckpt verify" "unknown option '-q'" -q x.safetensors
usage_error "ckpt verify" "unexpected argument 'y'" x y
help "ckpt inspect" --json
help "ckpt verify"

usage_error pack "unknown option '--bogus'" -o "$T/o" --bogus "$T"
usage_error pack "--threads expects a whole number from 1 to 1024; got '0'" -o "$T/o" --threads 0 "$T"
usage_error pack "--format expects ferry or megatron; got 'tar'" --format=tar -o "$T/o" "$T"
usage_error pack "--shard-size expects a size above zero" --shard-size 0 -o "$T/o" "$T"
usage_error pack "-o needs a value (PATH)" "$T" -o
help pack "-o, --output" --format --input --dtype --shard-size --keys --threads --json "-q, --quiet"

usage_error loader-bench "unknown option '--bogus'" "$T" --bogus 1
usage_error loader-bench "--seconds expects a duration above zero" "$T" --seconds soon
usage_error loader-bench "--step-fraction expects a number from 0 to 10" "$T" --step-fraction=-1
usage_error loader-bench "no DATASET given" --batch-size 2
help loader-bench --batch-size --seq-len --order --inline-cached --seconds --step-fraction --name --json

usage_error doctor "unknown option '--bogus'" --bogus
usage_error doctor "--verbose expects 0 or 1" --verbose=2
usage_error doctor "--root needs a value (DIR)" --root
help doctor "-j, --json" "-C, --no-color" "-v, --verbose" "-r, --root"

usage_error top "unknown option '--bogus'" --bogus
usage_error top "-i expects a number from 0.05 to 3600; got 'nope'" -i nope
usage_error top "--count expects a whole number from 1" --count=0
usage_error top "unexpected argument 'extra'" --count 1 extra
help top "-i, --interval" "-n, --count" --json --prometheus

# ferry and ferry ckpt: an unknown command
for sub in "" ckpt; do
	n=$((n + 1))
	# shellcheck disable=SC2086
	"$FERRY" $sub frobnicate >"$T/out" 2>"$T/err"
	rc=$?
	if [ $rc != 2 ] || ! grep -qF "unknown command 'frobnicate'" "$T/err"; then
		echo "FAILED: ferry $sub frobnicate: exit $rc (want 2):"
		sed 's/^/  | /' "$T/err"
		fail=1
	fi
done

[ $fail = 0 ] && echo "test_options: $n passed"
exit $fail
