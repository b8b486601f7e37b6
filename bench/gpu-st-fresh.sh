#!/usr/bin/env bash
# Issue 22's fresh-process safetensors target in one device call (GPU_BENCHES=gpu-st-fresh):
# one load_file per new process, 4 GB of 78 bf16 tensors (and 4,000 small ones: the per-tensor
# target) into GPU memory, ferry beside InstantTensor, fastsafetensors and kvikio (carried in .whl/,
# installed by scripts/gpu-check.sh) and the pinned copy into new device memory (the ceiling); first
# from /dev/shm, then from the disk's page cache (a directory on the repository's disk, the file
# read once before the rounds). bench/st-fresh.py prints the TABLE rows (ferry vs ceiling and best
# peer, rounds within 15% of their median, 4,000 vs 78 tensors); a peer that fails gets a FAILED row
# and the others go on; then ferry alone with the engine's timeline of each fresh load. About 3
# minutes on the H100 VM. FERRY_ST_FRESH_SIZE (default 4g), FERRY_ST_FRESH_PROCS (3),
# FERRY_ST_FRESH_TENSORS (78,4000), FERRY_ST_FRESH_LOADERS (every peer and the ceiling),
# FERRY_ST_FRESH_DISK_DIR (default $FERRY_BUILD_DIR/st-fresh-disk); steps: FERRY_ST_FRESH_STEPS
# (default "shm timeline pincost disk"; a shortened run: FERRY_ST_FRESH_STEPS="shm timeline"
# FERRY_ST_FRESH_LOADERS=ferry,instanttensor,ceiling, about 2 minutes).
set -u
cd "$(dirname "$0")/.." || exit 1
PY=${PYTHON:-python3}
"$PY" -c 'import ferry.safetensors' 2>/dev/null || { echo "skipped: the ferry Python package is not installed (pip install .)"; exit 77; }
SIZE=${FERRY_ST_FRESH_SIZE:-4g}
PROCS=${FERRY_ST_FRESH_PROCS:-3}
LOADERS=${FERRY_ST_FRESH_LOADERS:-ferry,instanttensor,fastsafetensors,kvikio,ceiling}
TENSORS=${FERRY_ST_FRESH_TENSORS:-78,4000}
STEPS=" ${FERRY_ST_FRESH_STEPS:-shm timeline pincost disk} "
step() { case "$STEPS" in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
SHM=/dev/shm/ferry-st-fresh
DISK=${FERRY_ST_FRESH_DISK_DIR:-${FERRY_BUILD_DIR:-build-gpu-check}/st-fresh-disk}
rm -rf "$SHM" "$DISK" && mkdir -p "$SHM" "$DISK" || exit 1
rc=0
if step shm; then
	echo "=== /dev/shm"
	FERRY_TRACE=1 "$PY" bench/st-fresh.py --device cuda --size "$SIZE" --tensors "$TENSORS" --procs "$PROCS" \
		--loads 2 --loaders "$LOADERS" --dir "$SHM" --json "$SHM/st-fresh-shm.json" --keep
	rc=$?
	if [ $rc -eq 77 ]; then # no CUDA device: st-fresh.py said why
		rm -rf "$SHM" "$DISK"
		exit 77
	fi
fi
# Where a fresh load's time goes (issue 22): one ferry load per new process with the engine's
# timeline (FERRY_ENGINE_TRACE=1: workers set up, GPU streams and copy units made, slots pinned,
# first chunk taken, first unit copy, request done) placed beside load_file's spans. Apart from the
# rows above, so that the tracing does not touch their figures (its own TABLE rows are left out:
# no ceiling or peer runs there). The files of the run above are reused. About 15 s.
if step timeline; then
	echo "=== timeline of fresh loads (/dev/shm, ferry alone, FERRY_ENGINE_TRACE=1)"
	FERRY_TRACE=1 FERRY_ENGINE_TRACE=1 "$PY" bench/st-fresh.py --device cuda --size "$SIZE" --tensors "$TENSORS" \
		--procs 2 --loads 1 --loaders ferry --dir "$SHM" --json "$SHM/st-fresh-timeline.json" >"$SHM/timeline.out"
	trc=$?
	[ $trc -eq 77 ] && { rm -rf "$SHM" "$DISK"; exit 77; }
	[ $trc -ne 0 ] && rc=1
	grep -v '^{\|^TABLE' "$SHM/timeline.out"
fi
# What the driver charges a fresh process for the pinned buffers and streams the engine makes (the
# copy units made two ways, the old slots, the workers' streams): the next step's choice. ~30 s.
if step pincost; then
	echo "=== driver costs in a fresh process (bench/pin-cost.py)"
	"$PY" bench/pin-cost.py --procs 2 --json "$SHM/pin-cost.json" >"$SHM/pin-cost.out" || rc=1
	grep -v '^{' "$SHM/pin-cost.out"
fi
fs=$(stat -f -c %T "$DISK")
if ! step disk; then
	echo "=== the disk's page cache: not run (FERRY_ST_FRESH_STEPS=\"${FERRY_ST_FRESH_STEPS:-}\")"
elif [ "$fs" = tmpfs ]; then
	echo "=== the disk's page cache: $DISK ($fs)"
	echo "TABLE st-fresh page cache | skipped | $DISK is on tmpfs, not a disk: set FERRY_ST_FRESH_DISK_DIR"
else
	echo "=== the disk's page cache: $DISK ($fs)"
	"$PY" bench/st-fresh.py --device cuda --size "$SIZE" --tensors 78 --procs "$PROCS" --loads 2 \
		--loaders "$LOADERS" --dir "$DISK" --json "$DISK/st-fresh-disk.json" || rc=1
fi
[ -n "${FERRY_LOG_DIR:-}" ] && cp "$SHM"/*.json "$DISK"/*.json "$FERRY_LOG_DIR/" 2>/dev/null
rm -rf "$SHM" "$DISK"
exit $rc
