"""The training loop every PyTorch model shares: AdamW with linear warm-up and decay, gradient
accumulation and clipping, bf16 (or fp16 with a gradient scaler) autocast on CUDA, early stopping,
and a checkpoint per epoch that a killed run resumes from. What differs between models (batches,
loss, validation) comes in as a `Task`."""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from tasks.errors import ConfigError
from tasks.models.base import LOOP
from tasks.models.checkpoints import rng_state, save, set_rng_state

# where models compute; re-exported, as callers import them from here
from tasks.models.devices import amp_dtype, autocast, resolve_device
from tasks.models.racing import (
    ESTIMATE_AFTER,
    NOT_TRAINED,
    BudgetCut,
    judge_race,
    replan,
    say_estimate,
)
from tasks.models.racing import current as current_race
from tasks.util.progress import progress

log = logging.getLogger("zhpipe.train")
Batch = dict[str, torch.Tensor]


def warmup_linear_decay(
    optimizer, epochs: int, warmup_ratio: float, steps_per_epoch: int, plan: dict | None = None
):
    """Learning rate: linear warm-up over `warmup_ratio` of all steps, then linear decay to 0.
    `plan` (filled here) holds the step counts: a budget that shrinks the epochs (`replan`) makes
    the decay end with the last of them."""
    plan = {} if plan is None else plan
    replan(plan, epochs, warmup_ratio, steps_per_epoch)
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: min(
            (step + 1) / max(plan["warmup"], 1),
            max(0.0, (plan["total"] - step) / max(plan["total"] - plan["warmup"], 1)),
        ),
    )


def validation_metrics(probs: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """A classifier's validation loss (mean negative log-likelihood), accuracy and macro-F1 from its
    probabilities."""
    from sklearn.metrics import accuracy_score, f1_score

    pred = probs.argmax(1)
    return {
        "val_loss": float(-np.log(np.clip(probs[np.arange(len(y)), y], 1e-9, 1)).mean()),
        "val_accuracy": float(accuracy_score(y, pred)),
        "val_macro_f1": float(f1_score(y, pred, average="macro")),
    }


@dataclass
class LoopConfig:
    """How to train: the shared `train` settings plus the model's learning rate and what to
    early-stop on."""

    lr: float
    epochs: int
    patience: int
    weight_decay: float = 0.01
    warmup_ratio: float = 0.06
    grad_clip: float | None = 1.0
    grad_accum: int = 1
    device: str = "auto"
    precision: str = "auto"
    seed: int = 7
    # a pretrained encoder's own learning rate (models with `optimizer_groups`)
    encoder_lr: float | None = None
    monitor: str = "val_macro_f1"  # a key of the validation metrics
    mode: str = "max"  # "min" for losses and perplexities
    # data-parallel processes (torch.distributed): gloo on CPU, NCCL with one GPU each
    processes: int = 1

    @classmethod
    def from_train(cls, params, lr: float, **overrides) -> LoopConfig:
        """From the pipeline's `train` section (epochs, patience, optimiser and device settings)."""
        # the loop's own settings of the shared ones a model may read (the budget is the racer's)
        shared = {
            k: getattr(params, k)
            for k in LOOP
            if k not in ("budget", "model_budget") and k not in overrides and hasattr(params, k)
        }
        return cls(lr=lr, **{**shared, **overrides})


@dataclass
class Task:
    """What one model's training needs besides the loop."""

    # one epoch: (rows, tensors)
    batches: Callable[[np.random.Generator], Iterator[tuple[int, Batch]]]
    steps_per_epoch: int  # batches per epoch
    loss: Callable[[nn.Module, Batch], torch.Tensor]
    validate: Callable[[nn.Module], dict[str, float]]  # called in eval mode under no_grad


@dataclass
class FitResult:
    history: list[dict[str, float]]
    best_epoch: int
    resumed_from_epoch: int  # 0 = trained from the start
    device: str
    bf16: bool
    precision: str = "fp32"  # the autocast type: fp32 (none), bfloat16 or float16
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)

    @property
    def samples_per_second(self) -> float:
        return (
            float(np.median([h["samples_per_second"] for h in self.history]))
            if self.history
            else 0.0
        )

    def summary(self) -> dict:
        """What a family's training summary records of the fit, in this order (models.json)."""
        return {
            "history": self.history,
            "best_epoch": self.best_epoch,
            "resumed_from_epoch": self.resumed_from_epoch,
            "device": self.device,
            "precision": self.precision,
            "samples_per_second": self.samples_per_second,
        }


def fit(
    name: str,
    model: nn.Module,
    task: Task,
    cfg: LoopConfig,
    checkpoints: Path,
    tracker=None,
    prefix: str = "",
) -> FitResult:
    """Train with early stopping on `cfg.monitor`; leave the best epoch's weights in `model`.

    `checkpoints/last.pt` (model, optimizer, scheduler, RNG states, history) is written after every
    epoch and `checkpoints/best.pt` whenever validation improves; each epoch's row goes to `tracker`
    (the model's run) as `<prefix><metric>` (a pretraining phase takes a prefix of its own); a rerun
    with the same folder resumes after the last finished epoch and ends with the same weights as an
    uninterrupted run (CPU, same thread count).
    """
    if cfg.processes > 1 and not _distributed():
        return fit_data_parallel(name, model, task, cfg, checkpoints, tracker, prefix)
    device = resolve_device(cfg.device) if not _distributed() else _rank_device(cfg.device)
    dtype = amp_dtype(device, cfg.precision)
    bf16 = dtype == torch.bfloat16
    # a DistributedDataParallel wrapper's model: what checkpoints hold
    core = getattr(model, "module", model)
    # fp16 gradients underflow without loss scaling; bf16 has fp32's range and needs none
    scaler = torch.amp.GradScaler(device.type) if dtype == torch.float16 else None
    model.to(device)
    checkpoints.mkdir(parents=True, exist_ok=True)
    trainable = [w for w in model.parameters() if w.requires_grad]
    # a model with a pretrained part may give it its own learning rate (`optimizer_groups`)
    groups = (
        core.optimizer_groups(cfg.lr, cfg.encoder_lr)
        if hasattr(core, "optimizer_groups")
        else trainable
    )
    optimizer = torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay)
    plan = {"race": current_race(), "steps": math.ceil(task.steps_per_epoch / cfg.grad_accum)}
    scheduler = warmup_linear_decay(optimizer, cfg.epochs, cfg.warmup_ratio, plan["steps"], plan)
    rng = np.random.default_rng(cfg.seed)
    sign = 1.0 if cfg.mode == "max" else -1.0
    last, best_file = checkpoints / "last.pt", checkpoints / "best.pt"
    state = _resume(name, last, (core, optimizer, scheduler, rng), device, tracker, prefix)
    resumed_from = state["epoch"]
    t_start = time.perf_counter()
    while not state["done"] and state["epoch"] < plan["epochs"]:
        epoch, t_epoch = state["epoch"] + 1, time.perf_counter()
        row = _train_epoch(
            name,
            model,
            task,
            cfg,
            optimizer,
            scheduler,
            trainable,
            rng,
            device,
            dtype,
            epoch,
            scaler,
            estimate=epoch == resumed_from + 1,
            plan=plan,
        )
        model.eval()
        with torch.no_grad(), autocast(device, dtype):
            # the model itself: validation needs no gradient averaging
            row.update(task.validate(core))
        row["lr"] = scheduler.get_last_lr()[0]
        state["history"].append(row)
        log.info(
            "%s epoch %d/%d: train_loss %.4f, %s %.4f, %.0f samples/s",
            name,
            epoch,
            plan["epochs"],
            row["train_loss"],
            cfg.monitor,
            row[cfg.monitor],
            row["samples_per_second"],
        )
        if tracker is not None:
            tracker.metrics({f"{prefix}{k}": v for k, v in row.items() if k != "epoch"}, step=epoch)
        state["epoch"] = epoch
        _checkpoint(
            state,
            sign * row[cfg.monitor],
            cfg.patience,
            (core, optimizer, scheduler, rng),
            checkpoints,
        )
        if plan["race"] is not None:
            judge_race(name, plan, state, cfg, sign, time.perf_counter() - t_epoch)
    core.load_state_dict(torch.load(best_file, map_location=device, weights_only=True))
    model.eval()
    return FitResult(
        state["history"],
        state["best_epoch"],
        resumed_from,
        str(device),
        bf16,
        precision=str(dtype or "fp32").removeprefix("torch."),
        seconds=time.perf_counter() - t_start,
    )


def _resume(
    name: str, last: Path, parts: tuple, device: torch.device, tracker, prefix: str
) -> dict:
    """The training state to go on from: the last checkpoint's (model, optimizer, scheduler and
    random generator restored, its curves sent to `tracker` again), or a fresh one."""
    core, optimizer, scheduler, rng = parts
    state = {
        "epoch": 0,
        "history": [],
        "best": -math.inf,
        "best_epoch": 0,
        "stale": 0,
        "done": False,
    }
    if last.is_file():
        # a checkpoint never runs code
        ckpt = torch.load(last, map_location=device, weights_only=True)
        core.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        set_rng_state(ckpt["rng"], rng)
        state = ckpt["state"]
        log.info("%s: resuming after epoch %d from %s", name, state["epoch"], last)
        if tracker is not None:  # the interrupted run's curves, so this run shows them whole
            for row in state["history"]:
                tracker.metrics(
                    {f"{prefix}{k}": v for k, v in row.items() if k != "epoch"}, step=row["epoch"]
                )
    return state


def _checkpoint(state: dict, score: float, patience: int, parts: tuple, checkpoints: Path) -> None:
    """After an epoch: early stopping's count, `best.pt` when `score` (higher is better) improved,
    `last.pt` always."""
    core, optimizer, scheduler, rng = parts
    writer = not _distributed() or dist.get_rank() == 0  # one process writes the checkpoints
    if score > state["best"]:
        state.update(best=score, best_epoch=state["epoch"], stale=0)
        if writer:
            save(core.state_dict(), checkpoints / "best.pt")
    else:
        state["stale"] += 1
        state["done"] = state["stale"] >= patience
    if writer:
        save(
            {
                "model": core.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "rng": rng_state(rng),
                "state": state,
            },
            checkpoints / "last.pt",
        )
    if _distributed():
        dist.barrier()  # every process sees this epoch's checkpoints


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank_device(device: str) -> torch.device:
    """A data-parallel process's device: its own GPU (by rank) on CUDA, else the CPU."""
    resolved = resolve_device(device)
    if resolved.type == "cuda":
        return torch.device("cuda", dist.get_rank() % torch.cuda.device_count())
    return torch.device("cpu")


def _train_epoch(
    name,
    model,
    task,
    cfg,
    optimizer,
    scheduler,
    trainable,
    rng,
    device,
    dtype,
    epoch,
    scaler=None,
    estimate: bool = False,
    plan: dict | None = None,
) -> dict:
    """One pass over the training batches; returns the epoch's mean loss and throughput. With
    `estimate`, the time the whole training will take is said once, from the first batches (in the
    log and the progress bar); a model in a race (`plan["race"]`) then plans the epochs that fit its
    share, and ends the epoch when the share runs out."""
    model.train()
    plan = plan or {"epochs": cfg.epochs, "race": None}
    race = plan.get("race")
    t0, total, seen, warm = time.perf_counter(), 0.0, 0, None
    bar = progress(
        total=task.steps_per_epoch,
        desc=f"{name} epoch {epoch}/{plan['epochs']}",
        unit="batch",
        leave=False,
        mininterval=2,
    )
    for i, (rows, batch) in enumerate(task.batches(rng)):
        if race is not None and race.left() <= 0 and i:
            if epoch == 1 and not race.first:  # not one epoch: no model worth evaluating
                raise BudgetCut(
                    f"{NOT_TRAINED} (its share, {race.share:.0f} s, ran out in its first epoch "
                    "after "
                    f"{i} of {task.steps_per_epoch} batches)"
                )
            race.cut = (
                f"stopped in epoch {epoch} after {i} of {task.steps_per_epoch} batches: its share "
                "of the "
                f"budget ({race.share:.0f} s) ran out"
            )
            break
        if i == 1:
            # the first batch pays for warm-up (kernels, caches): the estimate leaves it out
            warm = time.perf_counter()
        # in a race, estimated within a tenth of its share: a share its first epoch cannot fit is
        # given back early
        soon = ESTIMATE_AFTER[1] if race is None else min(ESTIMATE_AFTER[1], race.share / 10)
        if (
            estimate
            and i > 1
            and (
                i >= max(ESTIMATE_AFTER[0], task.steps_per_epoch // 10)
                or time.perf_counter() - t0 >= soon
            )
        ):
            per_batch = (time.perf_counter() - warm) / (i - 1)
            if (
                race is not None
                and epoch == 1
                and per_batch * (task.steps_per_epoch - i) > race.left()
            ):
                race.admit(
                    per_batch * (task.steps_per_epoch - i),
                    f" to end its first epoch ({i} of "
                    f"{task.steps_per_epoch} batches at {per_batch:.2f} s)",
                )
            said = say_estimate(
                name, time.perf_counter() - warm, i - 1, task.steps_per_epoch, epoch, cfg, plan
            )
            bar.set_postfix_str(said)
            estimate = False
        batch = {k: v.to(device) for k, v in batch.items()}
        with autocast(device, dtype):
            loss = task.loss(model, batch)
        (scaler.scale(loss / cfg.grad_accum) if scaler else loss / cfg.grad_accum).backward()
        if (i + 1) % cfg.grad_accum == 0 or i + 1 == task.steps_per_epoch:
            if scaler:
                scaler.unscale_(optimizer)  # clip the true gradients
            if cfg.grad_clip:
                torch.nn.utils.clip_grad_norm_(trainable, cfg.grad_clip)
            if scaler:
                scaler.step(optimizer)  # skipped when the scaled gradients overflowed
                scaler.update()
            else:
                optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
        total += loss.item() * rows
        seen += rows
        bar.update(1)
    bar.close()
    # an epoch shorter than the first batches the estimate waits for (not one the budget cut)
    if estimate and plan["epochs"] > epoch and not (race is not None and race.cut):
        say_estimate(
            name,
            time.perf_counter() - t0,
            task.steps_per_epoch,
            task.steps_per_epoch,
            epoch,
            cfg,
            plan,
        )
    return {
        "epoch": epoch,
        "train_loss": total / max(seen, 1),
        "samples_per_second": seen / (time.perf_counter() - t0),
    }


# ---- data-parallel training (`train.processes`) --------------------------------------------------
# Data-parallel training on the processes of one worker (`train.processes`): torch.distributed with
# NCCL, one GPU per process, on CUDA, else gloo on CPU processes. Each process takes every
# `processes`-th row of each batch (the batches themselves, and their order, are the single-process
# ones: the same seeded RNG in every process), DistributedDataParallel averages the gradients, and
# each process's loss is weighted by its share of the batch's rows, so every step is the step one
# process takes on the whole batch. Process 0 writes the checkpoints (a killed run resumes as
# before); the weights and the per-epoch history come back to the caller. A model whose loss does
# not go through its forward (the NER taggers' CRF) cannot be wrapped: one error line.


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ShardedTask(Task):
    """This process's share of a task: rows `rank::world` of each batch, the loss weighted so that
    the averaged gradient is the whole batch's; the loss it reports is the whole batch's mean
    (summed over processes)."""

    def __init__(self, task: Task, rank: int, world: int):
        self.inner, self.rank, self.world, self._share = task, rank, world, 1.0
        super().__init__(self._batches, task.steps_per_epoch, self._loss, task.validate)

    def _batches(self, rng):
        for rows, batch in self.inner.batches(rng):
            local = torch.arange(self.rank, rows, self.world)
            self._share = len(local) / rows  # loss() follows its batch in the loop
            yield (
                rows,
                {
                    k: v[local] if torch.is_tensor(v) and v.dim() and len(v) == rows else v
                    for k, v in batch.items()
                },
            )

    def _loss(self, model, batch):
        try:
            mean = self.inner.loss(model, batch)
        except AttributeError as e:
            raise ConfigError(
                f"train.processes: this model computes its loss outside its forward pass ({e}); "
                "train it "
                f"with train.processes=1"
            ) from None
        weighted = mean * self._share
        whole = weighted.detach().clone()
        dist.all_reduce(whole)  # the whole batch's mean loss, for the history
        # DDP averages the gradients over processes: `world * weighted` makes the average the whole
        # batch's gradient
        return self.world * weighted + (whole - self.world * weighted).detach()


def _run_rank(
    rank: int,
    world: int,
    port: int,
    backend: str,
    name: str,
    model,
    task: Task,
    cfg: LoopConfig,
    checkpoints: Path,
    out: Path,
) -> None:
    from torch.nn.parallel import DistributedDataParallel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(backend, rank=rank, world_size=world)
    try:
        device = _rank_device(cfg.device)  # as `fit` will choose it in this process
        if device.type == "cuda":
            torch.cuda.set_device(device)
        wrapped = DistributedDataParallel(
            model.to(device), device_ids=[device.index] if device.type == "cuda" else None
        )
        result = fit(name, wrapped, ShardedTask(task, rank, world), cfg, checkpoints)
        if rank == 0:
            out.write_text(
                json.dumps(
                    {
                        "history": result.history,
                        "best_epoch": result.best_epoch,
                        "resumed": result.resumed_from_epoch,
                        "device": result.device,
                        "bf16": result.bf16,
                        "precision": result.precision,
                        "seconds": result.seconds,
                    }
                ),
                encoding="utf-8",
            )
    finally:
        dist.destroy_process_group()


def _run_pickled(rank: int, payload: bytes) -> None:
    """A spawned process's `_run_rank`: its arguments come cloudpickled (a task's batches and loss
    are closures)."""
    import cloudpickle

    _run_rank(rank, *cloudpickle.loads(payload))


def start_method(cuda: bool) -> str:
    """How the training processes start: forked on CPUs (the model and its data need no pickling),
    spawned on GPUs, since a forked process cannot use CUDA once this one has (a warm process that
    served a GPU run has)."""
    return "spawn" if cuda else "fork"


def fit_data_parallel(
    name: str, model, task: Task, cfg: LoopConfig, checkpoints: Path, tracker=None, prefix: str = ""
) -> FitResult:
    """`fit` on `cfg.processes` processes (`start_method`); returns as `fit` does, the best epoch's
    weights in `model`."""
    import torch.multiprocessing as mp

    world = cfg.processes
    # the device each process takes (`_rank_device`)
    cuda = resolve_device(cfg.device).type == "cuda"
    if cuda and torch.cuda.device_count() < world:
        raise ConfigError(
            f"train.processes={world}: this worker has {torch.cuda.device_count()} GPUs "
            f"(one process per GPU)"
        )
    backend = "nccl" if cuda else "gloo"
    checkpoints.mkdir(parents=True, exist_ok=True)
    out = checkpoints / "data_parallel.json"
    out.unlink(missing_ok=True)
    log.info(
        "%s: data-parallel training on %d %s processes (%s)",
        name,
        world,
        "GPU" if cuda else "CPU",
        backend,
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, threads // world))  # the processes share the cores
    args = (world, _free_port(), backend, name, model, task, cfg, checkpoints, out)
    try:
        if start_method(cuda) == "spawn":
            import cloudpickle

            mp.start_processes(
                _run_pickled,
                args=(cloudpickle.dumps(args),),
                nprocs=world,
                join=True,
                start_method="spawn",
            )
        else:
            mp.start_processes(_run_rank, args=args, nprocs=world, join=True, start_method="fork")
    except mp.ProcessRaisedException as e:
        last = str(e).strip().splitlines()[-1]
        raise ConfigError(f"train.processes={world}: a training process failed: {last}") from None
    # died before its training began (a spawned process's start-up), or was killed
    except mp.ProcessExitedException as e:
        raise ConfigError(
            f"train.processes={world}: a training process ended early: {e} "
            "(what it printed, if anything, is above)"
        ) from None
    finally:
        torch.set_num_threads(threads)
    summary = json.loads(out.read_text(encoding="utf-8"))
    model.load_state_dict(
        torch.load(checkpoints / "best.pt", map_location="cpu", weights_only=True)
    )
    model.eval()
    if tracker is not None:
        for row in summary["history"]:
            tracker.metrics(
                {f"{prefix}{k}": v for k, v in row.items() if k != "epoch"}, step=row["epoch"]
            )
    return FitResult(
        summary["history"],
        summary["best_epoch"],
        summary["resumed"],
        summary["device"],
        summary["bf16"],
        precision=summary["precision"],
        seconds=summary["seconds"],
        extra={"processes": world, "backend": backend},
    )
