/* The subcommands of the ferry CLI. Each returns the process exit status: 0 ok, 1 failure found
 * (a failed check, a verification error, an I/O error), 2 usage error. The CLI uses the public API only. */
#ifndef FERRY_CLI_COMMANDS_H
#define FERRY_CLI_COMMANDS_H

#include "opts.h"

/* Defined in cli/main.c: the table, NULL-name terminated. */
extern const struct ferry_cli_command ferry_cli_commands[];

int ferry_cmd_bench(int argc, char **argv);        /* cli/bench.c */
int ferry_cmd_doctor(int argc, char **argv);       /* cli/doctor.c */
int ferry_cmd_pack(int argc, char **argv);         /* cli/pack.c */
int ferry_cmd_loader_bench(int argc, char **argv); /* cli/loader_bench.c */
int ferry_cmd_top(int argc, char **argv);          /* cli/top.c */
int ferry_cmd_ckpt(int argc, char **argv);         /* cli/ckpt.c */
int ferry_cmd_ckpt_bench(int argc, char **argv);   /* cli/ckpt_bench.c: ferry ckpt bench */
int ferry_cmd_ckpt_plan(int argc, char **argv);    /* cli/ckpt_plan.c: ferry ckpt plan */
int ferry_cmd_snapshot(int argc, char **argv);     /* cli/snapshot.c */
int ferry_cmd_restore(int argc, char **argv);      /* cli/snapshot.c */
int ferry_cmd_stage(int argc, char **argv);        /* cli/stage.c: ferry stage, ferry cp between URL and path */
int ferry_cmd_cp(int argc, char **argv);           /* cli/cz.c: ferry cp (compressed copies, else stage) */
int ferry_cmd_cz(int argc, char **argv);           /* cli/cz.c: ferry cz info */
/* cli/cz.c: every shard of the ferry dataset in dir rewritten as a compressed file (codec, or 0:
 * zstd where it saves a tenth of the shard, else the shard stays plain). 0 or a negative code. */
struct ferry_ctx;
int ferry_cli_cz_shards(struct ferry_ctx *ctx, const char *dir, int codec);

#endif
