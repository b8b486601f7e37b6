/* ferry ckpt inspect/verify of PyTorch's files: DCP directories and torch.save zips (cli/ckpt_torch.c). */
#ifndef FERRY_CLI_CKPT_TORCH_H
#define FERRY_CLI_CKPT_TORCH_H

enum ckpt_torch_kind { CKPT_TORCH_NONE = 0, CKPT_TORCH_DCP = 1, CKPT_TORCH_ZIP = 2 };

/* What path is: a directory holding DCP's `.metadata`, a file that starts as a zip, or neither. */
enum ckpt_torch_kind ckpt_torch_kind(const char *path);
/* Exit statuses as the commands': 0, or 1 after the error or problems printed. */
int ckpt_torch_inspect(const char *path, enum ckpt_torch_kind kind, int json);
int ckpt_torch_verify(const char *path, enum ckpt_torch_kind kind, int json);

#endif
