# Sourced by the fio-only disk probes (bench/write-ceilings.sh, bench/probe-discard.sh): their
# common settings and their measure.
#   FIO (fio, else .deb/fio), DIR (DISK_DIR, else build-bench-disk, made here), SIZE (8g),
#   ROUNDS (2); bytes: SIZE in bytes; q: a quarter of it (each of the 4 jobs' share)
#   fio_wall NAME FIO-ARGS...   GB/s of $bytes over that fio process's wall time (file creation,
#                               fallocate and the end fsync included, as a save's time includes
#                               them), or n/a if fio failed
FIO=${FIO:-$(command -v fio || echo .deb/fio)}
DIR=${DIR:-${DISK_DIR:-$PWD/build-bench-disk}}
SIZE=${SIZE:-8g}
ROUNDS=${ROUNDS:-2}
mkdir -p "$DIR"
bytes=$(python3 -c "import sys; s=sys.argv[1]; print(int(float(s[:-1]) * {'k':1<<10,'m':1<<20,'g':1<<30}[s[-1].lower()]))" "$SIZE")
q=$((bytes / 4))

fio_wall() {
	local name=$1 t0 t1
	shift
	t0=$(date +%s.%N)
	"$FIO" --name="$name" "$@" >/dev/null || { echo "n/a"; return; }
	t1=$(date +%s.%N)
	python3 -c "import sys; print('%.2f' % (int(sys.argv[1]) / (float(sys.argv[3]) - float(sys.argv[2])) / 1e9))" "$bytes" "$t0" "$t1"
}
