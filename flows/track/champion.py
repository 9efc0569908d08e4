"""The MLflow Model Registry: after evaluate, the best model (chosen on validation) is registered as
`zhpipe-<pipeline>`, and it becomes `champion` only when it beats the current champion on the same
test split. When the test split changed (a corpus that grows), the champion is scored again on
today's split, loaded from the registry as it is served, and the two scores on that one split
decide."""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

log = logging.getLogger("zhpipe")
ALIAS = "champion"


def registered_name(pipeline: str) -> str:
    return f"zhpipe-{pipeline}"


def _scored() -> tuple[str, ...]:
    from tasks.stages import KINDS

    return ("id", "text", *dict.fromkeys(c for kind in KINDS.values() for c in kind.scored))


# the columns of a test split that its hash and its scoring read (each kind's `scored`)
SCORED = _scored()


def test_frame(test) -> pd.DataFrame:
    """A test split (a frame, or a `tasks.util.io.Rows` read now) with only the columns it is scored
    by."""
    if isinstance(test, pd.DataFrame):
        return test
    import pyarrow.parquet as pq

    names = pq.read_schema(test.path).names
    return test.frame([c for c in SCORED if c in names])


def test_sha256(test) -> str:
    """Content hash of a test split (a frame, or a `tasks.util.io.Rows` read batch by batch): its
    texts and labels (or tags) in id order (not the file's bytes)."""
    if not isinstance(test, pd.DataFrame):
        import pyarrow.parquet as pq

        names = pq.read_schema(test.path).names
        h, last = hashlib.sha256(), None
        for batch in test.batches([c for c in SCORED if c in names]):
            ids = batch["id"].to_numpy()
            if len(ids) and ((last is not None and ids[0] < last) or (ids[1:] < ids[:-1]).any()):
                return test_sha256(test_frame(test))  # not in id order: sorted whole
            last = ids[-1] if len(ids) else last
            _update(h, batch)
        return h.hexdigest()
    h = hashlib.sha256()
    _update(h, test.sort_values("id"))
    return h.hexdigest()


def kept_test_sha256(test, file_sha256: str | None, store) -> str:
    """`test_sha256` of a test split file, kept in the store's cache (`StageStore.derived`) under
    the file's own sha256, which its manifest records, and the columns hashed (a kind that scores
    another column hashes the file again): a rerun over the same split reads none of it again (on
    a large corpus, the one read of a fully cached run that grows with it)."""
    if not file_sha256:
        return test_sha256(test)
    return store.derived(f"test-sha256/{file_sha256}-{'-'.join(SCORED)}", lambda: test_sha256(test))


def _update(h, rows: pd.DataFrame) -> None:
    listed = [
        c
        for c in SCORED[2:]
        if c in rows and len(rows) and isinstance(rows[c].iloc[0], (list, tuple, np.ndarray))
    ]
    rows = rows.assign(**{c: [" ".join(t) for t in rows[c]] for c in listed})  # a tag sequence, say
    for row in rows[[c for c in SCORED if c in rows]].itertuples(index=False):
        h.update(("\x1f".join(map(str, row)) + "\x1e").encode("utf-8"))


def resolve(uri: str) -> tuple[str, str]:
    """(name, version) of `models:/<name>@<alias>` or `models:/<name>/<version>`; one clear error
    when the registry has no such model."""
    from flows.track.trust import version_of

    mv = version_of(uri)
    return mv.name, str(mv.version)


def revision(uri: str) -> str:
    """What a stage key sees of a registered model (`flows.plan.keys.Registry`): `<name>/<version>`;
    a model the registry does not have, or a registry that cannot be read, is one clear error."""
    from tasks.errors import ConfigError

    try:
        return "/".join(resolve(uri))
    except ConfigError:
        raise
    # the store unreadable, say: said in one line, never a key built on it
    except Exception as e:  # noqa: BLE001
        raise ConfigError(
            f"{uri}: the model registry could not be read ({type(e).__name__}: "
            f"{str(e).splitlines()[0][:200]})"
        ) from None


def download(uri: str, cache: Path, store=None) -> tuple[str, Path]:
    """A registered model's files in `cache/<name>/<version>` (downloaded once, atomically, and only
    when they match the record of the run that logged them in `store` or the project's:
    `trust.verified`): (models:/<name>/<version>, folder)."""
    import shutil
    import tempfile

    from flows.track.trust import trusted, verified

    name, version = trusted(uri).removeprefix("models:/").split("/")
    folder = cache / name / version
    if not (folder / "MLmodel").is_file():
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{version}-"))
        try:
            verified(f"models:/{name}/{version}", tmp, store)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        try:
            tmp.rename(folder)
        except OSError:  # another run put it there first
            shutil.rmtree(tmp, ignore_errors=True)
    return f"models:/{name}/{version}", folder


@dataclass
class Decision:
    """What registering did: the new version, whether it became champion, and why."""

    name: str
    version: str
    champion: bool
    reason: str
    score: float | None = None  # the new version's test score
    # the champion's score on the same test split (stored, or scored again)
    champion_score: float | None = None
    test_sha256: str = ""
    # whether this version is the champion after the decision (promoted now, or already was)
    holds: bool = False
    settled: bool = False  # read back from an earlier decision (nothing was decided now: no news)


def decide(
    new_score: float, new_hash: str, champion: dict | None, metric: str
) -> tuple[bool, str, float | None]:
    """The champion rule from stored test scores alone (the registry without a way to serve models):
    a champion scored on another test split is never compared. Returns (promote, reason, the
    champion's stored score)."""
    if champion is None:
        return True, "first registered model: it becomes champion", None
    old_hash = champion.get("zhpipe.test_sha256", "")
    old_version = champion.get("version", "?")
    if old_hash != new_hash:
        return (
            False,
            (
                f"not compared: champion version {old_version} was scored on another test split "
                f"({old_hash[:12] or 'unknown'} vs {new_hash[:12]}); the alias stays"
            ),
            None,
        )
    old_score = float(champion.get("zhpipe.score", "nan"))
    if round(new_score, 6) > old_score:  # scores are stored with 6 decimals
        return (
            True,
            f"test {metric} {new_score:.4f} beats champion version {old_version} ({old_score:.4f}) "
            "on the "
            f"same test split",
            old_score,
        )
    return (
        False,
        (
            f"test {metric} {new_score:.4f} does not beat champion version {old_version} "
            f"({old_score:.4f}) on "
            f"the same test split; the alias stays"
        ),
        old_score,
    )


DATA_SUSPECT = "the test rows, not the model"
# where that note starts in a decision's reason # what a decision adds when the champion itself fell
# on today's test rows
OWN_DROP = "; the champion itself scores "


def own_drop(champion: dict, today: float, rows: int, proportion: bool) -> str:
    """A note when the champion scores today's test rows worse than its own recorded score beyond
    the noise (three standard errors of a proportion): the same model got worse, so what changed is
    the test rows (new rows with wrong labels, say). Empty otherwise, and for BLEU (not a
    proportion)."""
    import math

    try:
        before = float(champion.get("zhpipe.score", "nan"))
    except (TypeError, ValueError):
        return ""
    if not proportion or not before == before or rows <= 0:
        return ""
    noise = 3 * math.sqrt(max(before * (1 - before), 1e-4) / rows)
    if before - today <= noise:
        return ""
    return (
        f"{OWN_DROP}{today:.4f} on today's test rows against {before:.4f} when it was registered "
        f"(more than {noise:.3f} below): look at {DATA_SUSPECT} (the night's data checks, `zhpipe "
        "hold`)"
    )


# what a decision says when the new version scored below the champion beyond the noise
WORSE = "worse beyond"


def kept_worse(reason: str) -> bool:
    """Whether a champion decision kept the alias because the new version is worse overall beyond
    the noise, or could not be scored: news for a person, unlike a difference inside the noise or
    one slice below the tolerance."""
    return WORSE in reason or "could not be scored" in reason


def decide_paired(
    version: str, champion: dict | None, metric: str, served: Callable[[str], Any], rule
) -> tuple[bool, str, float | None]:
    """The champion rule on the same test rows: the new version and the champion (its tags; None
    when there is none) are scored as they are served (`served(version)` -> `Outcomes`), and the new
    one replaces the champion only when the paired bootstrap interval of the difference lies above
    zero and no slice is worse beyond the tolerance (`rule`, the `evaluate.champion` section).
    Returns (promote, reason, the champion's score on these rows)."""
    from tasks.util.paired import compare

    if champion is None:
        return True, "first registered model: it becomes champion", None
    old_version = champion.get("version", "?")
    scored = {}
    for who, v in (("version", version), ("champion version", old_version)):
        try:
            scored[who] = served(str(v))
        # any failure to load or score is reported, never a silent replacement
        except Exception as e:  # noqa: BLE001
            text = " ".join(str(e).split())[:200]
            return (
                False,
                (
                    f"{who} {v} could not be scored on today's test split ({type(e).__name__}: "
                    f"{text}); "
                    "the alias stays"
                ),
                None,
            )
    challenger, old = scored["version"], scored["champion version"]
    c = compare(
        old,
        challenger,
        rounds=rule.rounds,
        confidence=rule.confidence,
        tolerance=rule.slice_tolerance,
        min_slice_rows=rule.min_slice_rows,
    )
    # a metric that is not a proportion (BLEU) is in points already
    points = 100 if challenger.proportion else 1
    said = (
        f"test {metric} {c.challenger:.4f} against champion version {old_version}'s "
        f"{c.champion:.4f} on the same "
        f"{c.rows} rows (both as served): {points * c.difference:+.2f}, {c.confidence:.0%} "
        "interval "
        f"{points * c.low:+.2f} to {points * c.high:+.2f} (paired bootstrap)"
    )
    said += own_drop(champion, c.champion, c.rows, challenger.proportion)
    if c.worse_slices:
        return (
            False,
            f"{said}; worse on {'; '.join(c.worse_slices[:3])} "
            "(evaluate.champion.slice_tolerance); "
            f"the alias stays",
            c.champion,
        )
    if c.high < 0:
        return False, f"{said}: {WORSE} the noise; the alias stays", c.champion
    if c.low <= 0:
        return False, f"{said}: the difference is inside the noise; the alias stays", c.champion
    return True, f"{said}: better beyond the noise; it becomes champion", c.champion


def registered_version(name: str, model_key: str, store=None):
    """The model version registered for a trained model's key (its `train.<model>` unit), or None.
    With `store` (the run's), only a version the project's stores vouch for (`trust.vouched`): any
    other can never be loaded here."""
    from mlflow.exceptions import MlflowException

    from flows.track.tracker import client
    from flows.track.trust import vouched

    try:
        found = client().search_model_versions(
            f"name = '{name}' and tags.`zhpipe.model_key` = '{model_key}'"
        )
    except MlflowException:
        return None
    if store is not None:
        found = [v for v in found if vouched(v, store)]
    return min(found, key=lambda v: int(v.version)) if found else None


def _champion(c, name: str) -> dict | None:
    from mlflow.exceptions import MlflowException

    try:
        current = c.get_model_version_by_alias(name, ALIAS)
    except MlflowException:
        return None
    return {**current.tags, "version": current.version}


@contextlib.contextmanager
def _registry_lock(name: str):
    """One champion decision at a time per registered model: a file lock beside a SQLite tracking
    store (and a Prefect global concurrency limit when a Prefect server is configured, which spans
    machines)."""
    import os

    from filelock import FileLock

    from flows.plan.project import current

    folder = current().prefect_home
    folder.mkdir(parents=True, exist_ok=True)
    with FileLock(folder / f"registry-{name}.lock"):
        if os.environ.get("PREFECT_API_URL"):
            from flows.pools.slots import global_slot

            with global_slot(
                f"zhpipe-registry-{name}",
                f"registry: another run is deciding the {name} "
                # a decision takes seconds: held longer, a leftover
                f"champion; waiting",
                timeout=300,
            ):
                yield
        else:
            yield


def _register(model_uri: str, name: str, tags: dict[str, str]) -> str:
    """A new version of `name` for `model_uri`, tagged; its number."""
    import mlflow

    from flows.track.tracker import client, tracking_uri

    mlflow.set_tracking_uri(tracking_uri())
    # MLflow's "Successfully registered model ..." print: the run says it
    with contextlib.redirect_stderr(io.StringIO()):
        version = str(mlflow.register_model(model_uri, name).version)
    for key, value in tags.items():
        client().set_model_version_tag(name, version, key, value)
    return version


def _registered_once(name: str, model_uri: str, model_key: str, tags: dict[str, str], store=None):
    """Under the registry lock: (the version registered for `model_key`, that version when it was
    there before, else None). Looked up again here: runs that reused one trained model reach the
    registry together, and only the first registers it (one version per key that `store` vouches
    for)."""
    existing = registered_version(name, model_key, store)
    if existing is None:
        return _register(model_uri, name, tags), None
    return str(existing.version), existing


def _settled(
    c, name: str, existing, model: str, model_key: str, digest: str, score: float
) -> Decision | None:
    """A registered version with nothing to decide: it is the champion, or it was kept against this
    champion on these test rows before (the same two versions, the same rows: not scored again).
    None: decide."""
    version = str(existing.version)
    champion = _champion(c, name)
    # nothing to decide or write: no lock to wait for
    if champion is not None and str(champion["version"]) == version:
        reason = f"already registered as version {version} (key {model_key}); it is the champion"
        log.info("registry: %s version %s (%s): %s", name, version, model, reason)
        return Decision(name, version, False, reason, score, None, digest, holds=True, settled=True)
    kept = _decided(existing.tags, champion, digest)
    if kept is None:
        return None
    reason = f"already registered as version {version} (key {model_key}); {kept}"
    log.info("registry: %s version %s (%s): %s", name, version, model, reason)
    return Decision(
        name,
        version,
        False,
        reason,
        score,
        float(existing.tags["zhpipe.champion_score"]),
        digest,
        settled=True,
    )


def _decided(tags: dict, champion: dict | None, digest: str) -> str | None:
    """Why a registered version was kept against this champion on these test rows, when it was
    decided before."""
    if (
        champion is None
        or tags.get("zhpipe.kept_by") != f"{champion['version']} {digest}"
        or "zhpipe.champion_score" not in tags
    ):
        return None
    return tags.get("zhpipe.kept_because")


def _judged(
    c,
    name: str,
    version: str,
    champion: dict | None,
    scored: tuple[float, str, str],
    served,
    rule,
    store,
) -> tuple[bool, str, float | None]:
    """The champion rule for `version` (`scored`: its test score, the rows' digest, the metric): a
    champion the project's stores do not vouch for is replaced, since it can never be loaded here;
    else the rule decides."""
    from flows.track.trust import vouched

    score, digest, metric = scored
    if (
        champion
        and store is not None
        and not vouched(c.get_model_version(name, champion["version"]), store)
    ):
        return (
            True,
            (
                f"champion version {champion['version']} is not one this project's stage store "
                "vouches for (its "
                "store was removed, or it came from another store or someone else): it can never "
                "be loaded "
                f"here, so version {version} becomes champion"
            ),
            None,
        )
    if served is not None:
        return decide_paired(version, champion, metric, served, rule)
    return decide(score, digest, champion, metric)


def register_best(
    model_uri: str,
    run_id: str,
    pipeline: str,
    model: str,
    test,
    metric: str,
    score: float,
    model_key: str,
    rescore: Callable[[str, pd.DataFrame], Any] | None = None,
    rule=None,
    store=None,
    test_digest: str | None = None,
) -> Decision:
    """Register the best model (the classifier pyfunc logged with its training, `model_uri`) unless
    its key is registered already, then apply the champion rule: the alias moves only if, re-read
    under the registry lock, the champion it was compared with is still the champion
    (compare-and-set). `rescore(model_uri, test)` gives what a registered version does on each row
    of `test` as it is served (`tasks.util.paired.Outcomes`): both are scored on the same rows and
    compared by a paired bootstrap (`rule`: the `evaluate.champion` section). Without `rescore` (the
    registry alone), the stored test scores are compared. `store` (the run's, which vouched for
    `model_uri`): versions it does not vouch for are neither reused nor kept as champion.
    `test_digest`: `test_sha256(test)` when the caller knows it (`kept_test_sha256`)."""

    from flows.track.tracker import client

    name, digest, c = registered_name(pipeline), test_digest or test_sha256(test), client()
    existing = registered_version(name, model_key, store)
    settled = (
        _settled(c, name, existing, model, model_key, digest, score)
        if existing is not None
        else None
    )
    if settled is not None:  # nothing to decide or write: no lock to wait for
        return settled
    # read only if asked
    served = (lambda v: rescore(f"models:/{name}/{v}", test_frame(test))) if rescore else None
    if served is not None and rule is None:
        from tasks.shared.selection import ChampionRule

        rule = ChampionRule()
    champion_score, already = None, False
    with _registry_lock(name):
        version, existing = _registered_once(
            name,
            model_uri,
            model_key,
            {
                "zhpipe.model": model,
                "zhpipe.test_sha256": digest,
                "zhpipe.metric": metric,
                "zhpipe.score": f"{score:.6f}",
                "zhpipe.run_id": run_id,
                "zhpipe.model_key": model_key,
            },
            store,
        )
        settled = (
            _settled(c, name, existing, model, model_key, digest, score)
            if existing is not None
            else None
        )
        if settled is not None:
            return settled
        for _ in range(5):
            champion = _champion(c, name)
            if champion is not None and str(champion["version"]) == version:
                promote, reason, already = (
                    False,
                    f"version {version} ({model}, key {model_key}) is already the champion",
                    True,
                )
                break
            promote, reason, champion_score = _judged(
                c, name, version, champion, (score, digest, metric), served, rule, store
            )
            if not promote:
                break
            # compare-and-set: the champion we compared with must still be the one
            again = _champion(c, name)
            if str((again or {}).get("version")) == str((champion or {}).get("version")):
                c.set_registered_model_alias(name, ALIAS, version)
                break
        else:
            promote, reason = (
                False,
                "the champion kept changing under concurrent runs; the alias stays",
            )
    if champion_score is not None:  # what the decision compared, on the version it decided about
        c.set_model_version_tag(name, version, "zhpipe.champion_score", f"{champion_score:.6f}")
        c.set_model_version_tag(name, version, "zhpipe.compared_on_test_sha256", digest)
        # a decision to keep: the next night on these rows reads it back
        if not promote and champion is not None:
            c.set_model_version_tag(
                name, version, "zhpipe.kept_by", f"{champion['version']} {digest}"
            )
            c.set_model_version_tag(name, version, "zhpipe.kept_because", reason[:4000])
    if existing is not None:
        reason = f"already registered as version {version} (key {model_key}); {reason}"
    c.update_model_version(
        name, version, description=f"{model}, test {metric} {score:.4f}: {reason}"
    )
    log.info("registry: %s version %s (%s): %s", name, version, model, reason)
    return Decision(
        name, version, promote, reason, score, champion_score, digest, holds=promote or already
    )
