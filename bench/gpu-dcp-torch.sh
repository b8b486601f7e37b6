#!/usr/bin/env bash
# Issue 24's targets in one device call (bench/dcp-torch.py --targets): an 8 GB model+optimizer
# state on the GPU through dcp.save/load (warm, cold, saved by 4 ranks and loaded by 1 and by 2),
# dcp.async_save's blocked time and a training step's slowdown, ferry.torch.save/load of a 4 GB
# pytorch_model.bin; each beside stock PyTorch and the ceiling measured in the same run (pinned
# copy into new device memory, device-to-host copy, dd's fsynced write and cold read). Each warm
# row says how much of its files mincore found in the page cache just before the loads ("NOT WARM"
# under 99%); each async_save call prints an ASYNC line splitting the blocked time into the
# writer's staging phases (ferry: plan, alloc, copy, sync of the device snapshot) and
# async_save's own. About 3 minutes at 8g on the H100 (FERRY_DCP_SIZE, FERRY_PT_SIZE to shrink).
#   GPU_BENCHES=gpu-dcp-torch scripts/gpu-check.sh
set -u
DISK=${DISK_DIR:-$PWD/build-bench-disk}
mkdir -p "$DISK"
python3 -c 'import ferry.dcp, torch; assert torch.cuda.is_available()' 2>/dev/null ||
	{ echo "skipped: the ferry Python package, torch or a CUDA device is missing"; exit 77; }
exec python3 bench/dcp-torch.py --targets --device cuda --size "${FERRY_DCP_SIZE:-8g}" \
	--pt-size "${FERRY_PT_SIZE:-4g}" --dir "$DISK/dcp-torch"
