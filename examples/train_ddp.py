"""Train, checkpoint, resume: a small transformer on a packed token corpus, with DDP.

    python -m torch.distributed.run --nproc_per_node 2 examples/train_ddp.py \
        --data corpus/ --ckpt ckpts/ --steps 200

Kill it at any moment (SIGKILL included, during an asynchronous save too) and run the same
command again: it resumes from the newest step that verifies and sees, step for step, the samples
the uninterrupted run would have seen, ending with bit-identical parameters (tests/python/
test_example_train.py checks exactly that). docs/CHECKPOINTS.md walks through it.

What each piece does:
- ferry.Loader reads rank RANK's share of the corpus in DistributedSampler's order, straight into
  tensors on the device; loader.state_dict() says where the next batch starts.
- ferry.checkpoint.async_save snapshots the state and returns; the write, the commit (a manifest
  and `latest`, once every rank's shard is in) and pruning run in the background. State that is
  the same on every rank (the DDP model and optimizer) is written once, split across the ranks.
- ferry.checkpoint.load_latest returns the newest committed step that verifies (checksums), or
  (None, {}) when the directory has none yet (missing_ok: the first run).
"""
import argparse
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn

import ferry
import ferry.checkpoint as ckpt


class TinyLM(nn.Module):
    """A 2-layer transformer language model (causal), small enough for a CPU test."""

    def __init__(self, vocab=256, d=32, heads=2, layers=2, ctx=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(ctx, d))
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True)
        self.body = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(ctx), persistent=False)

    def forward(self, x):
        n = x.shape[1]
        h = self.emb(x) + self.pos[:n]
        return self.head(self.body(h, mask=self.mask[:n, :n], is_causal=True))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="a ferry dataset (ferry pack / ferry.write_dataset)")
    ap.add_argument("--ckpt", required=True, help="the checkpoint directory")
    ap.add_argument("--steps", type=int, default=200, help="optimizer steps in all")
    ap.add_argument("--every", type=int, default=25, help="checkpoint every N steps")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=32)
    ap.add_argument("--sync", action="store_true", help="ferry.checkpoint.save instead of async_save")
    ap.add_argument("--log", help="append 'step epoch sample-ids hash' per step here (the test's record)")
    ap.add_argument("--out", help="rank 0 writes the final parameters here (torch.save)")
    a = ap.parse_args()

    dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the launcher
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    model = nn.parallel.DistributedDataParallel(TinyLM(ctx=a.ctx))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    # seq_len = ctx + 1 tokens: inputs and labels shifted by one
    loader = ferry.Loader(a.data, batch_size=a.batch, seq_len=a.ctx + 1, seed=1234, device="cpu")

    step, state = ckpt.load_latest(a.ckpt, missing_ok=True)
    if step is None:
        step, epoch = 0, 0
    else:  # every rank gets the same step (load_latest agrees on it across ranks)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        loader.load_state_dict(state["loader"])
        epoch = state["epoch"]
    log = open(a.log, "a") if a.log else None
    pending = None
    while step < a.steps:
        loader.set_epoch(epoch)  # keeps the position when resuming inside this epoch
        for batch in loader:
            x, y = batch[:, :-1].long(), batch[:, 1:].long()
            loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            if log:
                ids = loader.last_indices
                log.write("%d %d %s %s\n" % (step, epoch, ",".join(map(str, ids.tolist())),
                                             hashlib.sha256(batch.numpy().tobytes()).hexdigest()[:16]))
                log.flush()
            if step % a.every == 0 or step == a.steps:
                state = {"model": model.module.state_dict(), "optim": opt.state_dict(),
                         "loader": loader.state_dict(), "epoch": epoch}
                if pending is not None:
                    pending.wait()  # one save in flight at a time; raises the last one's error
                if a.sync:
                    ckpt.save(state, a.ckpt, step=step)
                else:
                    pending = ckpt.async_save(state, a.ckpt, step=step)
                    print("rank %d: async save of step %d started" % (rank, step), flush=True)
            if step >= a.steps:
                break
        else:
            epoch += 1
    if pending is not None:
        pending.wait()
    if rank == 0 and a.out:
        torch.save(model.module.state_dict(), a.out)
    loader.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
