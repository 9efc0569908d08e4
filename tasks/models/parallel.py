"""Data-parallel training on the processes of one worker (`train.processes`): torch.distributed with NCCL, one GPU per
process, on CUDA, else gloo on CPU processes (`fit` hands over to `fit_data_parallel` here)."""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import torch
import torch.distributed as dist

from tasks.errors import ConfigError
from tasks.models.trainer import FitResult, LoopConfig, Task, _rank_device, fit, log, resolve_device

# ---- data-parallel training (`train.processes`) ----------------------------------------------------------------
# Data-parallel training on the processes of one worker (`train.processes`): torch.distributed with NCCL, one
# GPU per process, on CUDA, else gloo on CPU processes. Each process takes every `processes`-th row of each
# batch (the batches themselves, and their order, are the single-process ones: the same seeded RNG in every
# process), DistributedDataParallel averages the gradients, and each process's loss is weighted by its share of
# the batch's rows, so every step is the step one process takes on the whole batch. Process 0 writes the
# checkpoints (a killed run resumes as before); the weights and the per-epoch history come back to the caller.
# A model whose loss does not go through its forward (the NER taggers' CRF) cannot be wrapped: one error line.


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
            yield rows, {k: v[local] if torch.is_tensor(v) and v.dim() and len(v) == rows else v
                         for k, v in batch.items()}

    def _loss(self, model, batch):
        try:
            mean = self.inner.loss(model, batch)
        except AttributeError as e:
            raise ConfigError(f"train.processes: this model computes its loss outside its forward pass ({e}); train it "
                              f"with train.processes=1") from None
        weighted = mean * self._share
        whole = weighted.detach().clone()
        dist.all_reduce(whole)  # the whole batch's mean loss, for the history
        # DDP averages the gradients over processes: `world * weighted` makes the average the whole batch's gradient
        return self.world * weighted + (whole - self.world * weighted).detach()


def _run_rank(rank: int, world: int, port: int, backend: str, name: str, model, task: Task, cfg: LoopConfig,
              checkpoints: Path, out: Path) -> None:
    from torch.nn.parallel import DistributedDataParallel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(backend, rank=rank, world_size=world)
    try:
        device = _rank_device(cfg.device)  # as `fit` will choose it in this process
        if device.type == "cuda":
            torch.cuda.set_device(device)
        wrapped = DistributedDataParallel(model.to(device), device_ids=[device.index] if device.type == "cuda"
                                          else None)
        result = fit(name, wrapped, ShardedTask(task, rank, world), cfg, checkpoints)
        if rank == 0:
            out.write_text(json.dumps({"history": result.history, "best_epoch": result.best_epoch,
                                       "resumed": result.resumed_from_epoch,
                                       "device": result.device, "bf16": result.bf16, "precision": result.precision,
                                       "seconds": result.seconds}), encoding="utf-8")
    finally:
        dist.destroy_process_group()


def _run_pickled(rank: int, payload: bytes) -> None:
    """A spawned process's `_run_rank`: its arguments come cloudpickled (a task's batches and loss are closures)."""
    import cloudpickle

    _run_rank(rank, *cloudpickle.loads(payload))


def start_method(cuda: bool) -> str:
    """How the training processes start: forked on CPUs (the model and its data need no pickling), spawned on GPUs,
    since a forked process cannot use CUDA once this one has (a warm process that served a GPU run has)."""
    return "spawn" if cuda else "fork"


def fit_data_parallel(name: str, model, task: Task, cfg: LoopConfig, checkpoints: Path, tracker=None,
                      prefix: str = "") -> FitResult:
    """`fit` on `cfg.processes` processes (`start_method`); returns as `fit` does, the best epoch's weights in
    `model`."""
    import torch.multiprocessing as mp

    world = cfg.processes
    cuda = resolve_device(cfg.device).type == "cuda"  # the device each process takes (`_rank_device`)
    if cuda and torch.cuda.device_count() < world:
        raise ConfigError(f"train.processes={world}: this worker has {torch.cuda.device_count()} GPUs "
                          f"(one process per GPU)")
    backend = "nccl" if cuda else "gloo"
    checkpoints.mkdir(parents=True, exist_ok=True)
    out = checkpoints / "data_parallel.json"
    out.unlink(missing_ok=True)
    log.info("%s: data-parallel training on %d %s processes (%s)", name, world, "GPU" if cuda else "CPU", backend)
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, threads // world))  # the processes share the cores
    args = (world, _free_port(), backend, name, model, task, cfg, checkpoints, out)
    try:
        if start_method(cuda) == "spawn":
            import cloudpickle

            mp.start_processes(_run_pickled, args=(cloudpickle.dumps(args),), nprocs=world, join=True,
                               start_method="spawn")
        else:
            mp.start_processes(_run_rank, args=args, nprocs=world, join=True, start_method="fork")
    except mp.ProcessRaisedException as e:
        last = str(e).strip().splitlines()[-1]
        raise ConfigError(f"train.processes={world}: a training process failed: {last}") from None
    # died before its training began (a spawned process's start-up), or was killed
    except mp.ProcessExitedException as e:
        raise ConfigError(f"train.processes={world}: a training process ended early: {e} "
                          "(what it printed, if anything, is above)") from None
    finally:
        torch.set_num_threads(threads)
    summary = json.loads(out.read_text(encoding="utf-8"))
    model.load_state_dict(torch.load(checkpoints / "best.pt", map_location="cpu", weights_only=True))
    model.eval()
    if tracker is not None:
        for row in summary["history"]:
            tracker.metrics({f"{prefix}{k}": v for k, v in row.items() if k != "epoch"}, step=row["epoch"])
    return FitResult(summary["history"], summary["best_epoch"], summary["resumed"], summary["device"], summary["bf16"],
                     precision=summary["precision"], seconds=summary["seconds"],
                     extra={"processes": world, "backend": backend})
