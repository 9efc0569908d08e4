"""Data-parallel training on the processes of one worker (`train.processes`): torch.distributed with NCCL, one
GPU per process, on CUDA, else gloo on CPU processes. Each process takes every `processes`-th row of each
batch (the batches themselves, and their order, are the single-process ones: the same seeded RNG in every
process), DistributedDataParallel averages the gradients, and each process's loss is weighted by its share of
the batch's rows, so every step is the step one process takes on the whole batch. Process 0 writes the
checkpoints (a killed run resumes as before); the weights and the per-epoch history come back to the caller.
A model whose loss does not go through its forward (the NER taggers' CRF) cannot be wrapped: one error line."""
from __future__ import annotations

import json
import logging
import os
import socket
from pathlib import Path

import torch
import torch.distributed as dist

from tasks.errors import ConfigError
from tasks.models.trainer import FitResult, LoopConfig, Task, fit

log = logging.getLogger("zhpipe")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ShardedTask(Task):
    """This process's share of a task: rows `rank::world` of each batch, the loss weighted so that the averaged
    gradient is the whole batch's; the loss it reports is the whole batch's mean (summed over processes)."""

    def __init__(self, task: Task, rank: int, world: int):
        self.inner, self.rank, self.world, self._share = task, rank, world, 1.0
        super().__init__(self._batches, task.steps_per_epoch, self._loss, task.validate)

    def _batches(self, rng):
        for rows, batch in self.inner.batches(rng):
            local = torch.arange(self.rank, rows, self.world)
            self._share = len(local) / rows  # loss() follows its batch in the loop
            yield rows, {k: v[local] if torch.is_tensor(v) and v.dim() and len(v) == rows else v for k, v in batch.items()}

    def _loss(self, model, batch):
        try:
            mean = self.inner.loss(model, batch)
        except AttributeError as e:
            raise ConfigError(f"train.processes: this model computes its loss outside its forward pass ({e}); train it with "
                              "train.processes=1") from None
        weighted = mean * self._share
        whole = weighted.detach().clone()
        dist.all_reduce(whole)  # the whole batch's mean loss, for the history
        # DDP averages the gradients over processes: `world * weighted` makes the average the whole batch's gradient
        return self.world * weighted + (whole - self.world * weighted).detach()


def _run_rank(rank: int, world: int, port: int, backend: str, name: str, model, task: Task, cfg: LoopConfig, checkpoints: Path,
              out: Path) -> None:
    from torch.nn.parallel import DistributedDataParallel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(backend, rank=rank, world_size=world)
    try:
        cuda = backend == "nccl"
        if cuda:
            torch.cuda.set_device(rank % torch.cuda.device_count())
        device = torch.device("cuda", rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
        wrapped = DistributedDataParallel(model.to(device), device_ids=[device.index] if cuda else None)
        result = fit(name, wrapped, ShardedTask(task, rank, world), cfg, checkpoints)
        if rank == 0:
            out.write_text(json.dumps({"history": result.history, "best_epoch": result.best_epoch, "resumed": result.resumed_from_epoch,
                                       "device": result.device, "bf16": result.bf16, "precision": result.precision,
                                       "seconds": result.seconds}), encoding="utf-8")
    finally:
        dist.destroy_process_group()


def fit_data_parallel(name: str, model, task: Task, cfg: LoopConfig, checkpoints: Path, tracker=None, prefix: str = "") -> FitResult:
    """`fit` on `cfg.processes` processes (forked from this one, so the model and its data need no pickling);
    returns as `fit` does, the best epoch's weights in `model`."""
    import torch.multiprocessing as mp

    world = cfg.processes
    cuda = torch.cuda.is_available() and cfg.device != "cpu"
    if cuda and torch.cuda.device_count() < world:
        raise ConfigError(f"train.processes={world}: this worker has {torch.cuda.device_count()} GPUs (one process per GPU)")
    backend = "nccl" if cuda else "gloo"
    checkpoints.mkdir(parents=True, exist_ok=True)
    out = checkpoints / "data_parallel.json"
    out.unlink(missing_ok=True)
    log.info("%s: data-parallel training on %d %s processes (%s)", name, world, "GPU" if cuda else "CPU", backend)
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, threads // world))  # the processes share the cores
    try:
        mp.start_processes(_run_rank, args=(world, _free_port(), backend, name, model, task, cfg, checkpoints, out),
                           nprocs=world, join=True, start_method="fork")
    except mp.ProcessRaisedException as e:
        last = str(e).strip().splitlines()[-1]
        raise ConfigError(f"train.processes={world}: a training process failed: {last}") from None
    finally:
        torch.set_num_threads(threads)
    summary = json.loads(out.read_text(encoding="utf-8"))
    model.load_state_dict(torch.load(checkpoints / "best.pt", map_location="cpu", weights_only=True))
    model.eval()
    if tracker is not None:
        for row in summary["history"]:
            tracker.metrics({f"{prefix}{k}": v for k, v in row.items() if k != "epoch"}, step=row["epoch"])
    return FitResult(summary["history"], summary["best_epoch"], summary["resumed"], summary["device"], summary["bf16"],
                     precision=summary["precision"], seconds=summary["seconds"], extra={"processes": world, "backend": backend})
