"""A corpus that grows every night: the bundled reviews as a first night of 70% and six drops of 5%,
one file per night in a partitioned source (data/raw/reviews/*.csv), `zhpipe run` once per night in
one project. Printed per night: new and total rows, seconds per stage, cache hits, the champion
decision with both scores on that night's test split, and how many of the previous night's test rows
are still test rows.

    python benchmarks/bench_nightly.py                       # tfidf_lr + fasttext, 7 nights
    python benchmarks/bench_nightly.py --models tfidf_lr --nights 4 --out \\
        benchmarks/results/nightly.json
    # ordinary nights among bad ones: which check holds each out
    python benchmarks/bench_nightly.py --bad
    # the data stages only, on a second corpus
    python benchmarks/bench_nightly.py --bad --checks-only --corpus resume
    # each night a full export at a new path (grows: snapshot)
    python benchmarks/bench_nightly.py --snapshot

With --bad, a webhook on loopback receives the alerts of Prefect automations made by `zhpipe
alerts`' code, and each night's row says which checks failed, whether it was held out, the alert,
and the champion's version after it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
WORK = Path(tempfile.mkdtemp(prefix="zhpipe-nightly-"))
os.environ["PREFECT_HOME"] = str(WORK / "prefect")
os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{WORK / 'mlflow.db'}"
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
for name in ("ZHPIPE_DATA", "ZHPIPE_STORAGE", "ZHPIPE_PROJECT"):
    os.environ.pop(name, None)

import pandas as pd
import yaml

DATA = ("download", "clean", "split", "segment", "augment")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nights", type=int, default=7)
    ap.add_argument(
        "--first", type=float, default=0.70, help="share of the corpus on the first night"
    )
    ap.add_argument("--drop", type=float, default=0.05, help="share added each later night")
    ap.add_argument("--models", default="tfidf_lr,fasttext")
    ap.add_argument(
        "--bad",
        action="store_true",
        help="bad nights (one class, mojibake, traditional, English, empty, re-sent) "
        "among ordinary ones",
    )
    ap.add_argument(
        "--snapshot",
        action="store_true",
        help="each night the whole corpus so far, as a new export file",
    )
    ap.add_argument("--out", help="write the figures as JSON here")
    ap.add_argument(
        "--corpus",
        choices=("hotel", "resume"),
        default="hotel",
        help="hotel: the bundled reviews (2 labels); resume: Resume NER sentences labelled by "
        "their main entity type",
    )
    ap.add_argument(
        "--checks-only",
        action="store_true",
        help="run download and clean only (where the checks judge each night)",
    )
    args = ap.parse_args()

    from benchmarks.corpora import corpus

    rows = corpus(args.corpus).sample(frac=1.0, random_state=11)
    cuts = [0, int(len(rows) * args.first)] + [
        int(len(rows) * (args.first + args.drop * i)) for i in range(1, args.nights)
    ]
    drops = WORK / "project" / "data" / "raw" / "reviews"
    drops.mkdir(parents=True)
    source = {"path": "data/raw/reviews/*.csv", "text_column": "review", "label_column": "label"}
    if args.snapshot:
        source["grows"] = "snapshot"
    doc = {
        "pipelines": {
            "nightly": {
                "source": source,
                "stages": {
                    "augment": {"method": "eda", "num_aug": 1},
                    "train": {"models": args.models.split(",")},
                },
            }
        }
    }
    (WORK / "project" / "pipelines.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")

    from flows.plan import project

    project.activate(project.Project(WORK / "project"))
    from flows.orchestrate.pipeline import pipeline_flow
    from flows.track.tracker import client

    plan = (
        bad_nights(rows, cuts)
        if args.bad
        else [
            (
                f"night-{n:02d}",
                "ordinary",
                rows.iloc[cuts[n - 1] : cuts[n]] if n < len(cuts) else rows.iloc[cuts[-1] :],
            )
            for n in range(1, args.nights + 1)
        ]
    )
    hook = Hook() if args.bad else None
    nights, previous_test, exported = [], None, None
    for night, (name, what, part) in enumerate(plan, 1):
        exported = (
            part
            if exported is None or not args.snapshot
            else pd.concat([exported, part]).sample(frac=1.0, random_state=night)
        )
        (exported if args.snapshot else part).to_csv(drops / f"{name}.csv", index=False)
        t0 = time.perf_counter()
        try:
            out = pipeline_flow(
                "nightly",
                config_file=str(WORK / "project" / "pipelines.yaml"),
                stages=["download", "clean"] if args.checks_only else None,
            )
        except Exception as e:  # noqa: BLE001 - a failed night is a row of the table too
            print(f"night {night} ({what}) failed: {e}", flush=True)
            nights.append({"night": night, "what": what, "failed": str(e)})
            continue
        if night == 1 and hook is not None:
            hook.subscribe()
        if args.checks_only:
            row = {
                "night": night,
                "what": what,
                "rows_new": len(part),
                "wall_s": time.perf_counter() - t0,
                "checks": client().get_run(out["parent_run_id"]).data.tags.get("zhpipe.checks"),
                "held_tonight": out["attention"]["held"],
                **(checks_of(out["parent_run_id"], hook) if hook else {}),
            }
            nights.append(row)
            print(
                f"night {night} ({what}): {row['wall_s']:.1f} s, checks {row['checks']}, failed "
                f"{row.get('failed_checks')}, "
                f"held tonight {row['held_tonight']}",
                flush=True,
            )
            continue
        wall = time.perf_counter() - t0
        stages = {s["stage"]: s for s in out["stages"]}
        units = {u["stage"]: u for u in out["units"]}
        tags = client().get_run(out["parent_run_id"]).data
        test = set(
            pd.read_parquet(
                project.current().data / "segment" / stages["segment"]["key"] / "test.parquet"
            )["text"]
        )
        kept = len(previous_test & test) / len(previous_test) if previous_test else None
        previous_test = test
        row = {
            "night": night,
            "what": what,
            "rows_new": len(part),
            "rows_total": stages["download"]["rows"],
            "wall_s": wall,
            "seconds": {s: stages[s]["seconds"] for s in stages},
            "data_stage_s": sum(stages[s]["seconds"] for s in DATA),
            "train_s": sum(u["seconds"] for name, u in units.items() if name.startswith("train.")),
            "partition_units_built": sum(
                u["cache"] == "miss" for name, u in units.items() if ":" in name
            ),
            "partition_units_cached": sum(
                u["cache"] == "hit" for name, u in units.items() if ":" in name
            ),
            "old_test_rows_still_test": kept,
            "champion": tags.tags.get("zhpipe.champion"),
            "decision": tags.tags.get("zhpipe.champion_reason"),
            "registered": tags.tags.get("zhpipe.registered"),
            "best_model": tags.tags.get("zhpipe.best_model"),
            "challenger": tags.metrics.get("challenger_test_accuracy"),
            "champion_score": tags.metrics.get("champion_test_accuracy"),
            "checks": tags.tags.get("zhpipe.checks"),
            **(checks_of(out["parent_run_id"], hook) if hook else {}),
        }
        nights.append(row)
        print(
            f"night {night}: +{row['rows_new']} rows ({row['rows_total']} in all), {wall:.1f} s "
            "wall, data stages "
            f"{row['data_stage_s']:.1f} s, partition units {row['partition_units_built']} built / "
            f"{row['partition_units_cached']} cached"
            + (f", {kept:.2%} of last night's test rows still test" if kept is not None else ""),
            flush=True,
        )
        print(f"  champion: {row['decision']}", flush=True)

    if args.bad:
        print_bad(nights)
    if args.checks_only:
        if args.out:
            Path(args.out).write_text(
                json.dumps(nights, indent=2, ensure_ascii=False), encoding="utf-8"
            )
        return
    print(
        "\n| night | new rows | total | data stages s | "
        + " | ".join(DATA)
        + " | train s | units built/cached | old test kept | "
        "challenger acc | champion acc (same split) | champion moved |"
    )
    print("|" + "---|" * (10 + len(DATA)))
    for r in [r for r in nights if "seconds" in r]:
        s = r["seconds"]
        print(
            f"| {r['night']} | {r['rows_new']} | {r['rows_total']} | {r['data_stage_s']:.2f} | "
            + " | ".join(f"{s[x]:.2f}" for x in DATA)
            + f" | {r['train_s']:.1f} | {r['partition_units_built']}/{r['partition_units_cached']} "
            "| "
            + (
                f"{r['old_test_rows_still_test']:.2%}"
                if r["old_test_rows_still_test"] is not None
                else "-"
            )
            + " | "
            + (f"{r['challenger']:.4f}" if r["challenger"] is not None else "-")
            + " | "
            + (f"{r['champion_score']:.4f}" if r["champion_score"] is not None else "-")
            + f" | {r['champion']} |"
        )
    first = nights[0]["data_stage_s"]
    print(
        "\ndata stages relative to night 1: "
        + ", ".join(f"night {r['night']} {r['data_stage_s'] / first:.2f}" for r in nights[1:])
    )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(
            json.dumps(nights, indent=2, ensure_ascii=False), encoding="utf-8"
        )


def bad_nights(rows: pd.DataFrame, cuts: list[int]) -> list[tuple[str, str, pd.DataFrame]]:
    """An ordinary first night and second night, then bad ones among ordinary ones: each (file name,
    what, rows)."""
    import opencc

    drop = cuts[2] - cuts[1]
    fresh = iter(range(cuts[1], len(rows) - drop, drop))

    def ordinary():
        start = next(fresh)
        return rows.iloc[start : start + drop]

    english = pd.read_csv(
        ROOT / "data/raw/tatoeba-cmn-eng/cmn.txt",
        sep="\t",
        header=None,
        usecols=[0],
        names=["review"],
        quoting=3,
    )
    english = (
        english.drop_duplicates()
        .sample(drop, random_state=1)
        .assign(label=[str(i % 2) for i in range(drop)])
    )
    first, second = rows.iloc[: cuts[1]], ordinary()
    to_traditional = opencc.OpenCC("s2t").convert
    import numpy as np

    # every label share kept, every row's label a random one of them
    def shuffled(d: pd.DataFrame) -> pd.DataFrame:
        return d.assign(label=np.random.default_rng(3).permutation(d["label"].to_numpy()))

    # 5% of rows given another label: ordinary labelling noise
    def flipped(d: pd.DataFrame) -> pd.DataFrame:
        labels = sorted(rows["label"].unique())
        return d.assign(
            label=[
                labels[(labels.index(v) + 1) % len(labels)] if i % 20 == 0 else v
                for i, v in enumerate(d["label"])
            ]
        )

    return [
        ("night-01", "ordinary (the first night)", first),
        ("night-02", "ordinary", second),
        ("night-02b", "labels shuffled (shares kept)", shuffled(ordinary())),
        ("night-02c", "5% of labels flipped (noise: must pass)", flipped(ordinary())),
        ("night-02d", "ordinary", ordinary()),
        (
            "night-02e",
            "text cut to 3 characters",
            ordinary().assign(review=lambda d: d["review"].str[:3]),
        ),
        ("night-02f", "duplicates of earlier rows", first.sample(drop, random_state=5)),
        ("night-02g", "ordinary", ordinary()),
        ("night-03", "one class (a broken labeller)", ordinary().assign(label="1")),
        ("night-04", "ordinary", ordinary()),
        (
            "night-05",
            "mojibake (UTF-8 read as Latin-1)",
            ordinary().pipe(
                lambda d: d.assign(
                    review=[t.encode("utf-8").decode("latin-1") for t in d["review"]]
                )
            ),
        ),
        (
            "night-06",
            "traditional script",
            ordinary().pipe(lambda d: d.assign(review=[to_traditional(t) for t in d["review"]])),
        ),
        ("night-07", "English", english[["label", "review"]]),
        ("night-08", "empty file", rows.iloc[:0]),
        ("night-09", "night 2 sent again", second),
        ("night-10", "ordinary", ordinary()),
    ]


class Hook:
    """A webhook on loopback, and the Prefect automations (`zhpipe alerts`) that send zhpipe's
    events to it."""

    def __init__(self):
        import http.server
        import threading

        self.got: list[dict] = []
        got = self.got

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                got.append(json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0)))))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def subscribe(self) -> None:
        from flows.plan.config import Alerts
        from flows.track import alerts

        alerts.setup(
            Alerts(
                webhook=f"http://127.0.0.1:{self.server.server_port}/hook", allow_private_urls=True
            )
        )

    def take(self, wait: float = 5.0) -> list[str]:
        deadline = time.monotonic() + wait
        while not self.got and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(1.0)
        taken = [g["subject"].split(": ", 1)[-1] for g in self.got]
        self.got.clear()
        return taken


def checks_of(run_id: str, hook: Hook) -> dict:
    from flows.plan import held
    from flows.track.tracker import client

    # not a temporary folder nothing removes
    path = client().download_artifacts(run_id, "checks.json", tempfile.mkdtemp(dir=WORK))
    table = json.loads(Path(path).read_text(encoding="utf-8"))
    rows = [dict(zip(table["columns"], r)) for r in table["data"]]
    failed = sorted(
        {
            f"{r['check']}{' (block)' if r['severity'] == 'block' else ''}"
            for r in rows
            if r["result"].startswith("failed")
        }
    )
    try:
        champion = client().get_model_version_by_alias("zhpipe-nightly", "champion")
        version = f"{champion.version} ({champion.tags.get('zhpipe.model', '')})".replace(" ()", "")
    except Exception:  # noqa: BLE001 - --checks-only trains nothing
        version = "-"
    return {
        "failed_checks": failed,
        "held": sorted(held.held("nightly")),
        "alerts": hook.take(15.0 if failed else 5.0),
        "champion_version": version,
    }


def print_bad(nights: list[dict]) -> None:
    print(
        "\n| night | what | rows | checks failed | held out now | alerts received | champion after "
        "|"
    )
    print("|---|---|---|---|---|---|---|")
    for r in nights:
        if "failed" in r:
            print(f"| {r['night']} | {r['what']} | - | run failed: {r['failed'][:80]} | | | |")
            continue
        print(
            f"| {r['night']} | {r['what']} | {r['rows_new']:,} | "
            f"{', '.join(r['failed_checks']) or 'none'} | "
            f"{', '.join(r['held']) or '-'} | {', '.join(r['alerts']) or '-'} | version "
            f"{r['champion_version']} |"
        )


if __name__ == "__main__":
    main()
