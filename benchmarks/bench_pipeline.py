"""zhpipe benchmarks, each side by side with its baseline in one run (medians; ratios are what to
quote).

1. segmentation: the segment stage's logic (process pool, words + chars, Parquet in and out) vs a
   single-process loop of the same backend's cut (`--backend jieba-rs|jieba`), on the bundled corpus
   repeated --repeat times (goal: at least half of the loop's speed times the worker count);
2. cached rerun vs first run of the whole pipeline flow on a fresh store (goal: rerun <= 1/4);
3. orchestration + tracking overhead: the flow's first run vs the same stage `build` functions
   called directly in order with no Prefect and no MLflow (goal <= 10%).

    python benchmarks/bench_pipeline.py [--pipeline chnsenticorp] [--repeat 20] [--rounds 3] \\
        [--flow-rounds 2]
                                        [--set train.epochs=2] [--skip segmentation|flow]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
_TMP = Path(tempfile.mkdtemp(prefix="zhpipe-bench-"))
os.environ.setdefault("PREFECT_HOME", str(_TMP / "prefect"))
os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{_TMP / 'mlflow.db'}"  # never the project's store

import pandas as pd
from rich.console import Console
from rich.table import Table

from flows.plan import project

# Prefect's home and start-up timeout, before Prefect is imported
project.activate(project.Project(ROOT))
from flows.orchestrate.execute import StoreServices
from flows.plan.config import load_pipeline
from flows.plan.store import StageStore
from tasks.core import BuildContext
from tasks.shared.segment import Params as SegmentConfig

console = Console()


def bench_segmentation(repeat: int, rounds: int, backend: str = "jieba-rs") -> dict:
    """Stage logic vs a single-process loop of the same backend's cut, alternating, on the same
    texts."""
    from tasks.shared.segment import segment_file, worker_count
    from tasks.util.io import write_parquet
    from tasks.util.pool import ChunkPool
    from tasks.util.segmenter import Segmenter

    texts = (
        pd.read_csv(ROOT / "data" / "raw" / "ChnSentiCorp_htl_all.csv")["review"]
        .fillna("")
        .astype(str)
        .tolist()
        * repeat
    )
    chars = sum(map(len, texts))
    params = SegmentConfig(backend=backend)
    cut = Segmenter(params).tokenizer.cut
    list(cut("预热"))
    src, dst = _TMP / "segment-in.parquet", _TMP / "segment-out.parquet"
    write_parquet(pd.DataFrame({"id": range(len(texts)), "text": texts}), src)
    stage, loop = [], []
    for r in range(rounds):
        t0 = time.perf_counter()
        segment_file(src, dst, params, ChunkPool(worker_count(params, len(texts))), ROOT)
        stage.append(time.perf_counter() - t0)
        out = {"words": pd.read_parquet(dst, columns=["words"])["words"].tolist()}
        t0 = time.perf_counter()
        base = [list(cut(t)) for t in texts]
        loop.append(time.perf_counter() - t0)
        console.print(
            f"  segmentation round {r + 1}/{rounds}: stage {stage[-1]:.1f} s, {backend} loop "
            f"{loop[-1]:.1f} s"
        )
    same = out["words"] == [" ".join(w for w in ws if w.strip()) for ws in base]
    mb = sum(len(t.encode("utf-8")) for t in texts) / 2**20
    return {
        "backend": backend,
        "texts": len(texts),
        "chars": chars,
        "mb": mb,
        "workers": worker_count(params, len(texts)),
        "stage_mb_per_s": mb / statistics.median(stage),
        "loop_mb_per_s": mb / statistics.median(loop),
        "stage_s": statistics.median(stage),
        "loop_s": statistics.median(loop),
        "stage_chars_per_s": chars / statistics.median(stage),
        "loop_chars_per_s": chars / statistics.median(loop),
        "speedup": statistics.median(loop) / statistics.median(stage),
        "same_words_as_loop": same,
    }


def direct_run(config, root: Path) -> float:
    """The stage build functions in flow order, no Prefect, no MLflow, no store; returns seconds."""
    outputs, infos = {}, {}
    t0 = time.perf_counter()
    services = StoreServices(config, StageStore(root / "store"))
    for spec in config.kind.stages.values():
        stage, deps = spec.name, spec.needs
        out = root / stage
        out.mkdir(parents=True)
        ctx = BuildContext(
            {d: outputs[d] for d in deps},
            {d: infos[d] for d in deps},
            out,
            getattr(config.stages, stage),
            root / f"{stage}-scratch",
            config.name,
            ROOT,
            stages=config.stages,
            source=config.source,
            store=services,
        )
        result = spec.build(ctx)
        outputs[stage], infos[stage] = out, result.facts
    return time.perf_counter() - t0


def bench_flow(pipeline: str, overrides: list[str], rounds: int) -> dict:
    """Per round, alternating: flow first run + cached rerun on a fresh store, then the direct
    run."""
    from flows.orchestrate.pipeline import pipeline_flow

    config = load_pipeline(pipeline, overrides=overrides)
    t0 = time.perf_counter()
    pipeline_flow("smoke", stages=["download"], storage=str(_TMP / "warmup"))
    server_start = time.perf_counter() - t0
    console.print(f"  Prefect ephemeral server + warm-up flow: {server_start:.1f} s")
    first, rerun, direct, hits = [], [], [], True
    for r in range(rounds):
        store = str(_TMP / f"store{r}")
        t0 = time.perf_counter()
        pipeline_flow(pipeline, overrides=overrides, storage=store)
        first.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        again = pipeline_flow(pipeline, overrides=overrides, storage=store)
        rerun.append(time.perf_counter() - t0)
        hits &= all(s["cache"] == "hit" for s in again["stages"])
        direct.append(direct_run(config, _TMP / f"direct{r}"))
        console.print(
            f"  round {r + 1}/{rounds}: flow first run {first[-1]:.1f} s, cached rerun "
            f"{rerun[-1]:.1f} s, "
            f"stage functions called directly {direct[-1]:.1f} s"
        )
    m_first, m_rerun, m_direct = (statistics.median(x) for x in (first, rerun, direct))
    return {
        "pipeline": pipeline,
        "overrides": overrides,
        "rounds": rounds,
        "server_start_s": server_start,
        "first_s": m_first,
        "rerun_s": m_rerun,
        "direct_s": m_direct,
        "first_all": first,
        "direct_all": direct,
        "rerun_over_first": m_rerun / m_first,
        "overhead": m_first / m_direct - 1,
        "overhead_with_server_start": (m_first + server_start) / m_direct - 1,
        "all_hits_on_rerun": hits,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--pipeline", default="chnsenticorp")
    ap.add_argument(
        "--repeat", type=int, default=20, help="copies of the bundled corpus for segmentation"
    )
    ap.add_argument("--rounds", type=int, default=3, help="segmentation rounds")
    ap.add_argument("--flow-rounds", type=int, default=2, help="rounds of (flow, rerun, direct)")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--skip", choices=["segmentation", "flow"], action="append", default=[])
    ap.add_argument(
        "--backend", default="jieba-rs", choices=["jieba-rs", "jieba"], help="segmentation backend"
    )
    args = ap.parse_args()
    results = {"machine": {"cpus": os.cpu_count()}}
    if "segmentation" not in args.skip:
        console.print("[bold]1. segmentation[/]")
        results["segmentation"] = bench_segmentation(args.repeat, args.rounds, args.backend)
    if "flow" not in args.skip:
        console.print("[bold]2-3. flow first run, cached rerun, direct stage calls[/]")
        results["flow"] = bench_flow(args.pipeline, args.overrides, args.flow_rounds)
    table = Table(title="zhpipe benchmarks (medians where repeated)")
    for col in ("measure", "zhpipe", "baseline", "ratio", "goal"):
        table.add_column(col)
    if "segmentation" in results:
        s = results["segmentation"]
        table.add_row(
            f"segmentation ({s['backend']}), {s['mb']:.0f} MB, {s['workers']} workers",
            f"{s['stage_mb_per_s']:.1f} MB/s",
            f"{s['loop_mb_per_s']:.1f} MB/s (one-process {s['backend']} loop)",
            f"{s['speedup']:.2f}x",
            f">= {0.5 * s['workers']:.1f}x",
        )
    if "flow" in results:
        f = results["flow"]
        table.add_row(
            "cached rerun vs first run",
            f"{f['rerun_s']:.1f} s",
            f"{f['first_s']:.1f} s",
            f"{f['rerun_over_first']:.3f}",
            "<= 0.25",
        )
        table.add_row(
            "flow vs direct stage calls",
            f"{f['first_s']:.1f} s",
            f"{f['direct_s']:.1f} s",
            f"{f['overhead'] * 100:+.1f}%",
            "<= +10%",
        )
        table.add_row(
            "  same, counting server start",
            f"{f['first_s'] + f['server_start_s']:.1f} s",
            f"{f['direct_s']:.1f} s",
            f"{f['overhead_with_server_start'] * 100:+.1f}%",
            "",
        )
    console.print(table)
    out = ROOT / "benchmarks" / "results"
    out.mkdir(exist_ok=True)
    path = out / f"bench-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(results, indent=2), encoding="utf-8")
    console.print(f"results: {path}")


if __name__ == "__main__":
    main()
