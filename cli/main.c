/* ferry: command-line front end. Dispatches to subcommands; only the CLI prints and exits. */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "ferry/ferry.h"

static int cmd_version(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	printf("ferry %s\n", ferry_version());
	return 0;
}

/* Add a row per subcommand (keep the help order: main job first). */
const struct ferry_cli_command ferry_cli_commands[] = {
	{"bench", "measure storage and GPU transfer speed (fio- and gdsio-compatible options)", ferry_cmd_bench},
	{"ckpt", "safetensors files and checkpoints: inspect, verify, bench, plan", ferry_cmd_ckpt},
	{"pack", "pack files, JSON Lines or token arrays into shards (or Megatron .bin/.idx)", ferry_cmd_pack},
	{"loader-bench", "measure the data loader: samples/s, bytes/s, how long each step waited", ferry_cmd_loader_bench},
	{"doctor", "check the machine and the storage under PATHs against the tuning checklist", ferry_cmd_doctor},
	{"top", "live view of block devices, CPU, GPUs and ferry transfers (--json, --prometheus)", ferry_cmd_top},
	{"snapshot", "suspend a CUDA process (GPU state, then CRIU) into a directory", ferry_cmd_snapshot},
	{"restore", "bring back a process from ferry snapshot's directory", ferry_cmd_restore},
	{"stage", "copy objects to local storage and back: s3:// prefix <-> directory, resumable", ferry_cmd_stage},
	{"cp", "ferry stage, and compressed copies: --compress zstd|lz4, or a compressed SRC decompressed", ferry_cmd_cp},
	{"cz", "compressed files: cz info FILE (codec, ratio, chunks)", ferry_cmd_cz},
	{"version", "print the version", cmd_version},
	{NULL, NULL, NULL},
};

int main(int argc, char **argv)
{
	if (argc > 1 && !strcmp(argv[1], "--version"))
		return cmd_version(0, NULL);
	return cli_dispatch("ferry", ferry_cli_commands, NULL, argc, argv);
}
